#!/usr/bin/python3
"""Host side of the guest harness: starts, signals and inspects NBD servers
on the host when the guest asks, one text command per TCP connection.

The guest reaches this service at 192.0.2.2:PORT: qemu's user networking
maps that address to the host's loopback; on a tap link in a network
namespace (bench/kernel.sh) the service and the servers bind 192.0.2.2.
Commands (reply: "OK ..." or "ERR reason"):

  start ID KIND ARGS...  KIND blkd|nbdkit|nbd-server|qemu-nbd, or blkd:NAME
                         for a --variant; -> OK PORT MPORT
  stop ID [SECS]         SIGTERM, wait SECS (default 20) -> OK RC | ERR hung
  signal ID SIG          send SIG (TERM, KILL, USR2, ...) -> OK
  wait ID SECS           wait for exit -> OK RC | ERR running
  alive ID               -> OK 1 | OK 0
  pid ID                 -> OK PID
  metric ID SERIES       sum of /metrics samples whose name{labels} starts
                         with SERIES -> OK VALUE
  count ID REGEX         lines of the server's request log (@LOG@) matching
                         REGEX -> OK N
  grep ID REGEX          lines of the server's own output matching REGEX -> OK N
  cpu ID                 the server's CPU time: utime+stime of it and its
                         children in clock ticks, and its CPU clock in ns
                         (every thread's run time, exited threads' too, and
                         its live children's) -> OK TICKS NS
  fds ID                 open file descriptors of the server -> OK N
  settle ID FDS SECS     wait until the server holds at most FDS descriptors
                         and (blkd) /metrics shows no connection, nothing in
                         flight, lent or being placed -> OK summary | ERR ...
  restart ID [SECS]      stop (SIGKILL if SIGTERM takes over SECS), then start
                         again with the same arguments on the same port
                         -> OK PORT MPORT ["killed"]
  killvm ID              kill qemu (SIGKILL) now; then settle ID against its
                         descriptors at start and print the result line
                         "CASE kill KIND PASS|FAIL ..." on stderr
  mkfile NAME SIZE       a sparse host file @TMP@/NAME -> OK
  stopall                stop every server -> OK
  trace ID start LABEL   run --trace's tool on the server until "trace ID
                         stop"; its output goes to --trace-dir as
                         LABEL.ID.TOOL (perf.data, or text) -> OK
  trace ID stop          -> OK
  sdstart ID SIZE        blkd as the shipped blkd.service (--fdstore) with
                         systemd as PID 1 of a podman container on the host's
                         network (--sd-image), rawio on a SIZE-byte file in
                         its StateDirectory, blkd.socket on a free port
                         -> OK PORT 0 | SKIP reason; then pid ID is blkd's
                         MainPID, grep ID searches its journal
  sdrestart ID           systemctl restart blkd.service; checks that MainPID
                         changed and the file descriptor store is empty
                         again -> OK OLDPID NEWPID | ERR ...

In ARGS, @TMP@ is the run's directory, @LOG@ the server's request log
(@TMP@/ID.req.log) and @TLS@ the server's TLS material.
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "helpers"))
from blkdtest import listen_ports  # noqa: E402  (the tests' /proc port finder)


def log(msg):
    print("control: " + msg, file=sys.stderr, flush=True)


class Server:
    def __init__(self, sid, kind, proc, logpath, reqlog, args):
        self.sid, self.kind, self.proc = sid, kind, proc
        self.logpath, self.reqlog, self.args = logpath, reqlog, args
        self.port = self.mport = self.fds0 = 0
        self.pid = proc.pid   # a daemon's (nbd-server's) from its pidfile


class Unit:
    """blkd.service in a podman container with systemd as PID 1."""
    def __init__(self, sid, name, port):
        self.sid, self.name, self.port = sid, name, port


class Control:
    def __init__(self, args):
        self.a = args
        self.servers = {}
        self.units = {}
        self.tracers = {}
        # --variant NAME=PATH [OPTION...]: kind blkd:NAME runs PATH OPTIONs.
        self.variants = {}
        for v in args.variant:
            name, _, rest = v.partition("=")
            if not name or not rest.split():
                raise SystemExit("control: --variant %r: NAME=PATH [OPTION...]" % v)
            self.variants[name] = rest.split()

    def subst(self, s, sid):
        return (s.replace("@TMP@", self.a.tmp).replace("@TLS@", self.a.tls or "")
                .replace("@LOG@", os.path.join(self.a.tmp, sid + ".req.log"))
                .replace("@TOP@", self.a.top))

    def wait_for(self, cond, secs):
        end = time.monotonic() + secs
        while time.monotonic() < end:
            v = cond()
            if v:
                return v
            time.sleep(0.05)
        return None

    def start(self, sid, kind, *args, port="0"):
        if sid in self.servers and self.servers[sid].proc.poll() is None:
            return "ERR %s is running" % sid
        orig = args
        args = [self.subst(x, sid) for x in args]
        logpath = os.path.join(self.a.tmp, sid + ".log")
        reqlog = os.path.join(self.a.tmp, sid + ".req.log")
        if kind == "blkd" or kind.startswith("blkd:"):
            # A variant: another binary, or the same with other options
            # (bench/kernel.sh's VARIANTS, for an A/B in one guest run).
            exe, extra = self.a.blkd, []
            if kind != "blkd":
                v = self.variants.get(kind[5:])
                if v is None:
                    return "ERR unknown blkd variant " + kind[5:]
                exe, extra = v[0], v[1:]
            cmd = [exe, "-f", "-i", self.a.bind, "-p", port,
                   "--metrics", "127.0.0.1:0"] + extra + args
        elif kind == "nbdkit":
            cmd = ["nbdkit", "-f", "-i", self.a.bind, "-p", port] + args
        elif kind == "qemu-nbd":
            cmd = ["qemu-nbd", "-b", self.a.bind, "-p", port, "--persistent",
                   "--shared=8"] + args
        elif kind == "nbd-server":
            # nbd-server takes its port and file from a config file, and
            # port 0 there means "no TCP listener", not "any port": ask
            # the kernel for a free one (meant for bench/kernel.sh, whose
            # network namespace has no other user to take it meanwhile).
            if port == "0":
                probe = socket.socket()
                probe.bind((self.a.bind, 0))
                port = str(probe.getsockname()[1])
                probe.close()
            conf = os.path.join(self.a.tmp, sid + ".conf")
            with open(conf, "w") as f:
                f.write("[generic]\nlistenaddr = %s\nport = %s\n"
                        "allowlist = true\n[%s]\nexportname = %s\n"
                        % (self.a.bind, port, sid, args[0]))
                for kv in args[1:]:
                    f.write(kv.replace("=", " = ", 1) + "\n")
            # In the foreground (-d) it serves one client and exits: let
            # it fork and find it by its pidfile.
            pidfile = os.path.join(self.a.tmp, sid + ".pid")
            cmd = ["nbd-server", "-C", conf, "-p", pidfile]
        else:
            return "ERR unknown server kind " + kind
        logf = open(logpath, "ab")
        from_ = logf.tell()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=subprocess.STDOUT, start_new_session=True)
        logf.close()
        srv = Server(sid, kind, proc, logpath, reqlog, orig)
        self.servers[sid] = srv
        log("%s: %s (pid %d)" % (sid, " ".join(cmd), proc.pid))
        if kind == "nbd-server":
            def ports():
                try:
                    srv.pid = int(open(pidfile).read())
                except (OSError, ValueError):
                    return None
                p = listen_ports(srv.pid)
                return (p[0], 0) if p else None
        elif kind.startswith("blkd"):
            def ports():
                if proc.poll() is not None:
                    return "dead"
                with open(logpath, "rb") as f:
                    f.seek(from_)
                    text = f.read().decode(errors="replace")
                p = re.search(r"serving .* on nbds?://[^ ]*:(\d+)/", text)
                m = re.search(r"metrics on http://[^ ]*:(\d+)/metrics", text)
                return (int(p.group(1)), int(m.group(1))) if p and m else None
        else:
            def ports():
                if proc.poll() is not None:
                    return "dead"
                p = listen_ports(proc.pid)
                return (p[0], 0) if p else None
        got = self.wait_for(ports, 30)
        if got is None or got == "dead":
            tail = open(logpath, errors="replace").read()[-400:].replace("\n", " | ")
            self.kill(srv)
            return "ERR %s did not start: %s" % (sid, tail)
        srv.port, srv.mport = got
        srv.fds0 = self.nfds(srv)
        return "OK %d %d" % got

    def kill(self, srv):
        if srv.pid != srv.proc.pid:
            try:
                os.kill(srv.pid, signal.SIGKILL)
            except OSError:
                pass
        if srv.proc.poll() is None:
            try:
                os.killpg(srv.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            srv.proc.wait()

    # ---- blkd.service under systemd (sdstart, sdrestart)

    def podman(self, *args, timeout=60):
        r = subprocess.run([self.a.podman] + list(args), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout.strip(), r.stderr.strip()

    def sd(self, unit, *args, timeout=60):
        return self.podman("exec", unit.name, *args, timeout=timeout)

    def show(self, unit, prop):
        return self.sd(unit, "systemctl", "show", "-p", prop, "--value",
                       "blkd.service")[1]

    def journal(self, unit):
        return self.sd(unit, "journalctl", "-u", "blkd.service", "-u", "blkd.socket",
                       "--no-pager", "-o", "cat")[1]

    def sdstart(self, sid, size):
        if not self.a.sd_image:
            return "SKIP " + (self.a.sd_why or "no systemd test image")
        if sid in self.units:
            return "ERR %s is running" % sid
        # The host's network: blkd.socket listens on the host's loopback,
        # which the guest reaches as 192.0.2.2.  A free port, not 10809,
        # which another server on this machine may hold.
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        env = os.path.join(self.a.tmp, sid + ".env")
        with open(env, "w") as f:
            f.write("BLKD_PLUGIN=/usr/local/lib/blkd/plugins/nbdkit-rawio-plugin.so\n"
                    "BLKD_PLUGIN_ARGS=\"file=/var/lib/blkd/disk.img\"\n"
                    "BLKD_OPTIONS=\"-v --shards 2\"\n")
        dropin = os.path.join(self.a.tmp, sid + ".socket.conf")
        with open(dropin, "w") as f:
            f.write("[Socket]\nListenStream=\nListenStream=127.0.0.1:%d\n" % port)
        units = self.a.sd_units
        rawio = os.path.join(self.a.top, "plugins/rawio/nbdkit-rawio-plugin.so")
        unit = Unit(sid, "blkd-vm-%d-%s" % (os.getpid(), sid), port)
        rc, out, err = self.podman(
            "run", "-d", "--name", unit.name, "--systemd=always", "--network", "host",
            "-v", self.a.blkd + ":/usr/local/bin/blkd:ro",
            "-v", rawio + ":/usr/local/lib/blkd/plugins/nbdkit-rawio-plugin.so:ro",
            "-v", units + "/blkd.service:/etc/systemd/system/blkd.service:ro",
            "-v", units + "/blkd.socket:/etc/systemd/system/blkd.socket:ro",
            "-v", dropin + ":/etc/systemd/system/blkd.socket.d/port.conf:ro",
            "-v", env + ":/etc/default/blkd:ro", self.a.sd_image)
        if rc != 0:
            return "ERR podman run: " + err[-300:]
        self.units[sid] = unit
        log("%s: container %s, blkd.socket on 127.0.0.1:%d" % (sid, unit.name, port))
        state = self.wait_for(lambda: self.sd(unit, "systemctl", "is-system-running")[1]
                              in ("running", "degraded"), 30)
        if not state:
            return "ERR systemd in the container is not up after 30 s"
        # The disk in the state directory systemd hands to the dynamic user.
        rc, out, err = self.sd(unit, "sh", "-c", "mkdir -p /var/lib/private/blkd && "
                               "chmod 0700 /var/lib/private && truncate -s %d "
                               "/var/lib/private/blkd/disk.img" % int(size))
        if rc != 0:
            return "ERR creating the disk: " + err[-300:]
        rc, out, err = self.sd(unit, "systemctl", "start", "blkd.socket")
        if rc != 0:
            return "ERR systemctl start blkd.socket: " + err[-300:]
        return "OK %d 0" % port

    def sdrestart(self, sid, secs="30"):
        unit = self.units[sid]
        pid0 = self.show(unit, "MainPID")
        rc, out, err = self.sd(unit, "systemctl", "restart", "blkd.service",
                               timeout=float(secs) + 30)
        if rc != 0:
            return "ERR systemctl restart: rc %d: %s" % (rc, err[-300:])
        pid1 = self.show(unit, "MainPID")
        if pid1 in ("", "0") or pid1 == pid0:
            return "ERR MainPID %s -> %s: not a new process" % (pid0, pid1)
        # The new blkd removes what it took from the store as it starts.
        stored = self.wait_for(lambda: self.show(unit, "NFileDescriptorStore") == "0", 10)
        if not stored:
            return "ERR %s fd(s) still in the store after the restart" % (
                self.show(unit, "NFileDescriptorStore"))
        return "OK %s %s" % (pid0, pid1)

    def sdstop(self, unit):
        """Keeps the journal in @TMP@/ID.log, then removes the container."""
        try:
            with open(os.path.join(self.a.tmp, unit.sid + ".log"), "w") as f:
                f.write(self.journal(unit) + "\n")
        except (OSError, subprocess.TimeoutExpired) as e:
            log("%s: journal: %s" % (unit.sid, e))
        self.podman("rm", "-f", "-t", "0", unit.name)
        del self.units[unit.sid]

    def get(self, sid):
        srv = self.servers.get(sid)
        if srv is None:
            raise KeyError("no server " + sid)
        return srv

    def stop(self, sid, secs="20"):
        srv = self.get(sid)
        if srv.proc.poll() is None:
            srv.proc.send_signal(signal.SIGTERM)
            try:
                srv.proc.wait(float(secs))
            except subprocess.TimeoutExpired:
                self.kill(srv)
                return "ERR hung: still running %ss after SIGTERM, killed" % secs
        return "OK %d" % srv.proc.returncode

    def signal(self, sid, sig):
        srv = self.get(sid)
        os.kill(srv.proc.pid, getattr(signal, "SIG" + sig.upper()))
        return "OK"

    def wait(self, sid, secs):
        srv = self.get(sid)
        try:
            return "OK %d" % srv.proc.wait(float(secs))
        except subprocess.TimeoutExpired:
            return "ERR running"

    def alive(self, sid):
        return "OK %d" % (self.get(sid).proc.poll() is None)

    def pid(self, sid):
        if sid in self.units:
            return "OK " + self.show(self.units[sid], "MainPID")
        return "OK %d" % self.get(sid).proc.pid

    def metric(self, sid, series):
        srv = self.get(sid)
        if not srv.mport:
            return "ERR %s has no metrics" % sid
        url = "http://127.0.0.1:%d/metrics" % srv.mport
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        total, found = 0.0, False
        for line in text.splitlines():
            if line.startswith(series) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        if not found:
            return "ERR no sample %s in /metrics" % series
        return "OK %g" % total

    def count(self, sid, regex):
        srv = self.get(sid)
        try:
            text = open(srv.reqlog, errors="replace").read()
        except OSError:
            return "OK 0"
        return "OK %d" % len(re.findall(regex, text, re.M))

    def cpu(self, sid):
        srv = self.get(sid)
        ticks, ns = self.cputime(srv.pid)
        return "OK %d %d" % (ticks, ns)

    @staticmethod
    def cpuclock_ns(pid):
        """The process's CPU clock, as clock_getcpuclockid(3) names it for
        another process: the kernel's sum of its threads' run time in ns
        (what /proc/PID/task/*/schedstat shows first, for the living
        ones) plus what its exited threads ran, which it keeps.  Exact,
        where utime+stime are counted in clock ticks."""
        return time.clock_gettime_ns(((~pid) << 3) | 2)   # CPUCLOCK_SCHED

    def cputime(self, pid):
        """(ticks, ns): utime+stime of PID, its reaped children
        (cutime+cstime) and its living descendants (nbd-server forks a
        process per client), and the CPU clock of PID and of those
        descendants (a reaped child's run time is in ticks only)."""
        def stat(p):
            return open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()
        kids = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    kids.setdefault(int(stat(int(d))[1]), []).append(int(d))
                except (OSError, IndexError):
                    pass
        f = stat(pid)
        ticks = sum(int(x) for x in f[11:15])
        ns = self.cpuclock_ns(pid)
        todo = list(kids.get(pid, []))
        while todo:
            p = todo.pop()
            try:
                g = stat(p)
                ns += self.cpuclock_ns(p)
            except OSError:
                continue
            ticks += int(g[11]) + int(g[12])
            todo += kids.get(p, [])
        return ticks, ns

    # What each --trace tool runs on a server's process, and whether its
    # output is perf's binary file (-o) or text (strace -o, perf stat -o).
    TRACE_TOOLS = {
        "perf-record": ["perf", "record", "-q", "-F", "4999", "-g", "-p", "{pid}", "-o", "{out}"],
        "perf-dwarf": ["perf", "record", "-q", "-F", "999", "--call-graph", "dwarf,16384",
                       "-p", "{pid}", "-o", "{out}"],
        "perf-stat": ["perf", "stat", "-e", "task-clock,context-switches,cpu-migrations,"
                      "page-faults,cycles,instructions", "-p", "{pid}", "-o", "{out}"],
        "strace-c": ["strace", "-c", "-f", "-p", "{pid}", "-o", "{out}"],
        "strace": ["strace", "-f", "-tt", "-T", "-s", "0", "-p", "{pid}", "-o", "{out}"],
    }

    def trace(self, sid, what, label=""):
        """Profiles a server over one benchmark run (bench/kernel.sh's
        TRACE): the tool attaches to its process and threads, and stops
        (SIGINT, so it writes its summary) when the run ends."""
        srv = self.get(sid)
        if what == "start":
            tool = self.a.trace
            if tool not in self.TRACE_TOOLS or not self.a.trace_dir:
                return "ERR no --trace tool (or --trace-dir)"
            if sid in self.tracers:
                return "ERR %s is being traced" % sid
            out = os.path.join(self.a.trace_dir, "%s.%s.%s" % (
                re.sub(r"[^\w.-]", "_", label), sid, tool))
            cmd = [x.format(pid=srv.pid, out=out) for x in self.TRACE_TOOLS[tool]]
            errf = open(out + ".err", "wb")
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=errf, stderr=errf)
            errf.close()
            self.tracers[sid] = p
            time.sleep(0.5)               # attached before the run starts
            if p.poll() is not None:
                del self.tracers[sid]
                return "ERR %s exited at once (%s.err)" % (tool, out)
            return "OK"
        if what == "stop":
            p = self.tracers.pop(sid, None)
            if p is None:
                return "ERR %s is not being traced" % sid
            p.send_signal(signal.SIGINT)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                return "ERR the tracer did not stop in 60 s; killed"
            return "OK"
        return "ERR trace ID start LABEL | trace ID stop"

    def grep(self, sid, regex):
        if sid in self.units:
            text = self.journal(self.units[sid])
        else:
            text = open(self.get(sid).logpath, errors="replace").read()
        return "OK %d" % len(re.findall(regex, text, re.M))

    def nfds(self, srv):
        return len(os.listdir("/proc/%d/fd" % srv.proc.pid))

    def fds(self, sid):
        return "OK %d" % self.nfds(self.get(sid))

    def settle(self, sid, fds0, secs):
        """Waits until the server is back to its idle state."""
        srv = self.get(sid)
        def state():
            n = self.nfds(srv)
            s = "fds %d (baseline %s)" % (n, fds0)
            ok = n <= int(fds0)
            if srv.kind.startswith("blkd"):
                # Connections, requests, and the plugin memory lent to
                # replies or taking in WRITE payloads (the request buffer
                # pool keeps its buffers for reuse by design).
                v = [float(self.metric(sid, m + " ").split()[-1]) for m in
                     ("blkd_connections", "blkd_requests_in_flight",
                      "blkd_lend_bytes", "blkd_write_placed_bytes")]
                s += (", /metrics connections %g, in flight %g, lent %g B, "
                      "write-placed %g B" % tuple(v))
                ok = ok and not any(v)
            return ok, s
        end = time.monotonic() + float(secs)
        while True:
            if srv.proc.poll() is not None:
                return "ERR %s exited with %d" % (sid, srv.proc.returncode)
            ok, s = state()
            if ok:
                return "OK " + s
            if time.monotonic() > end:
                return "ERR after %ss: %s" % (secs, s)
            time.sleep(0.2)

    def restart(self, sid, secs="20"):
        """What a service manager does: SIGTERM, SIGKILL after SECS, start."""
        srv = self.get(sid)
        stopped = self.stop(sid, secs)
        r = self.start(sid, srv.kind, *srv.args, port=str(srv.port))
        if r.startswith("OK") and not stopped.startswith("OK"):
            r += " killed"
        return r

    def killvm(self, sid):
        """Kills the guest with I/O in flight; the verdict is ours to print."""
        srv = self.get(sid)
        pid = int(open(os.path.join(self.a.tmp, "qemu.pid")).read())
        os.kill(pid, signal.SIGKILL)
        r = self.settle(sid, str(srv.fds0), "30")
        print("CASE kill %s %s %s" % (srv.kind, "PASS" if r.startswith("OK") else "FAIL",
                                      "guest killed under load; server " + r[3:]),
              file=sys.stderr, flush=True)
        return "OK"

    def mkfile(self, name, size):
        path = os.path.join(self.a.tmp, os.path.basename(name))
        with open(path, "wb") as f:
            f.truncate(int(size))
        return "OK"

    def stopall(self):
        for unit in list(self.units.values()):
            self.sdstop(unit)
        for srv in self.servers.values():
            if srv.pid != srv.proc.pid:
                self.kill(srv)
            if srv.proc.poll() is None:
                srv.proc.send_signal(signal.SIGTERM)
        for srv in self.servers.values():
            try:
                srv.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill(srv)
        return "OK"

    def handle(self, line):
        words = line.split()
        if words and words[0] in ("count", "grep", "metric"):
            words = line.split(None, 2)   # the regex or series may hold spaces
        if not words:
            return "ERR empty"
        fn = {"start": self.start, "stop": self.stop, "signal": self.signal,
              "wait": self.wait, "alive": self.alive, "pid": self.pid,
              "metric": self.metric, "count": self.count, "cpu": self.cpu,
              "mkfile": self.mkfile, "stopall": self.stopall, "grep": self.grep,
              "fds": self.fds, "settle": self.settle, "restart": self.restart,
              "killvm": self.killvm, "sdstart": self.sdstart, "trace": self.trace,
              "sdrestart": self.sdrestart}.get(words[0])
        if fn is None:
            return "ERR unknown command " + words[0]
        try:
            return fn(*words[1:])
        except Exception as e:  # reported to the guest, which fails its case
            return "ERR %s: %s" % (type(e).__name__, e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--tls", default="")
    ap.add_argument("--top", required=True)
    ap.add_argument("--blkd", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--bind", default="127.0.0.1",
                    help="address the servers and this service listen on")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=PATH [OPTION...]: server kind blkd:NAME runs this "
                    "binary with these options")
    ap.add_argument("--trace", default="", help="tool for the trace command: "
                    "perf-record, perf-dwarf, perf-stat, strace-c or strace")
    ap.add_argument("--trace-dir", default="", help="where trace outputs go")
    ap.add_argument("--podman", default="podman")
    ap.add_argument("--sd-image", default="",
                    help="the systemd test image (tests/helpers/systemd-image.sh)")
    ap.add_argument("--sd-units", default="", help="the installed units' directory")
    ap.add_argument("--sd-why", default="", help="why there is no --sd-image")
    a = ap.parse_args()
    ctl = Control(a)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((a.bind, 0))
    ls.listen(8)
    with open(a.port_file + ".tmp", "w") as f:
        f.write("%d\n" % ls.getsockname()[1])
    os.rename(a.port_file + ".tmp", a.port_file)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            c, _ = ls.accept()
            c.settimeout(30)
            try:
                data = b""
                while b"\n" not in data and len(data) < 4096:
                    chunk = c.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                line = data.decode(errors="replace").strip()
                reply = ctl.handle(line)
                log("%s -> %s" % (line, reply))
                c.sendall((reply + "\n").encode())
            except OSError as e:
                log("connection: %s" % e)
            finally:
                c.close()
    finally:
        for sid in list(ctl.tracers):
            ctl.trace(sid, "stop")
        ctl.stopall()


if __name__ == "__main__":
    main()
