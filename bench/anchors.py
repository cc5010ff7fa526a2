#!/usr/bin/python3
"""Side-by-side anchors for blkd's I/O engine, with fio's nbd engine.

Each workload runs against every server in turn, the order reversed on
alternate rounds (A B C, C B A, ...), for ROUNDS rounds; we report medians,
the spread (min-max) and ratios against nbdkit hosting the same plugin.
Server CPU comes from /proc/PID/stat (utime+stime) around each run, the
machine's user/system/idle split from /proc/stat.  The machine is shared
and noisy: read the ratios, not the absolute numbers.

Honesty rules built in: before each cell the script samples the machine for
a moment with nothing of its own running; a cell that starts while something
else keeps the CPUs busy (more than --max-busy percent) waits and is retried,
and if the machine never quiets down the cell is marked with "*" in the table.
The 1-minute load average before each cell is recorded too.  Reads run on
prefilled data.  QD1 is reported twice: unpinned, and with the server pinned
to the last CPU and fio to the first.

Usage: bench/anchors.py [--rounds N] [--seconds S]
                        [--part anchors|targets|switches|all]
                        [--blkd NAME=PATH ...] [--out FILE] [--json FILE]
"""

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLKD = os.path.join(TOP, "blkd")
CLK_TCK = os.sysconf("SC_CLK_TCK")
DISK = "1G"
NCPU = os.cpu_count() or 1
MAX_BUSY = 10.0          # percent of the machine others may use before a cell
EXTRA_BLKD = []          # (name, path): other blkd builds to run beside ./blkd


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, proc, secs=20):
    deadline = time.time() + secs
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("server exited at start-up: %s" % proc.args)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not listen: %s" % proc.args)


def proc_cpu(pid):
    """(user, system) seconds of a process, its threads and its reaped
    children (nbd-server serves each client in a forked child)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return ((int(fields[11]) + int(fields[13])) / CLK_TCK,
            (int(fields[12]) + int(fields[14])) / CLK_TCK)


def machine_cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = v[:7]
    return user + nice, system + irq + softirq, idle + iowait


class Server:
    def __init__(self, name, argv_fn, tmp, export=""):
        self.name = name
        self.port = free_port()
        argv = argv_fn(self.port, tmp)
        self.log = open(os.path.join(tmp, name + ".log"), "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.pidfile = os.path.join(tmp, "nbd-server.pid") if name.startswith("nbd-server") else None
        if self.pidfile:
            # nbd-server forks into the background; its children serve.
            self.proc.wait(10)
            time.sleep(0.3)
            with open(self.pidfile) as f:
                self.pid = int(f.read().strip())
            wait_port(self.port, None)
        else:
            self.pid = self.proc.pid
            wait_port(self.port, self.proc)
        self.uri = "nbd://127.0.0.1:%d/%s" % (self.port, export)

    def stop(self):
        if self.pidfile:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def fio(uri, rw, bs, iodepth, numjobs, seconds, extra=()):
    cmd = ["fio", "--name=b", "--ioengine=nbd", "--uri=" + uri, "--rw=" + rw, "--bs=" + bs,
           "--iodepth=%d" % iodepth, "--numjobs=%d" % numjobs, "--size=" + DISK,
           "--time_based", "--runtime=%g" % seconds, "--group_reporting",
           "--output-format=json"] + list(extra)
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise RuntimeError("fio failed: %s\n%s" % (" ".join(cmd), out.stderr))
    j = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    io = j["read"] if j["read"]["io_bytes"] else j["write"]
    pct = io["clat_ns"].get("percentile", {})
    return {
        "iops": io["iops"], "mib_s": io["bw"] / 1024.0, "bytes": io["io_bytes"],
        # usr/sys are percentages of the job's run time (ms); "elapsed"
        # is whole seconds and includes the set-up.
        "fio_cpu_s": (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * j.get("job_runtime",
                                                                   j["elapsed"] * 1000) / 1000.0,
        "fio_ctx": j.get("ctx", 0), "ios": io.get("total_ios", 0),
        "p50_us": pct.get("50.000000", 0) / 1000.0, "p99_us": pct.get("99.000000", 0) / 1000.0,
    }


def prefill(uri):
    """Write the whole disk so reads hit real data, not holes."""
    subprocess.run(["fio", "--name=fill", "--ioengine=nbd", "--uri=" + uri, "--rw=write",
                    "--bs=1M", "--iodepth=8", "--size=" + DISK, "--output=/dev/null"],
                   check=True, cwd=tempfile.gettempdir())


def busy_pct(secs=0.5):
    """Share of the machine that something else uses while we run nothing."""
    m0 = machine_cpu()
    time.sleep(secs)
    m1 = machine_cpu()
    tot = sum(m1) - sum(m0) or 1
    return 100.0 * (tot - (m1[2] - m0[2])) / tot


def wait_quiet(tries=6):
    """Wait (bounded) until the machine is quiet; returns (busy %, quiet?)."""
    busy = busy_pct()
    for _ in range(tries):
        if busy <= MAX_BUSY:
            return busy, True
        time.sleep(2)
        busy = busy_pct()
    return busy, busy <= MAX_BUSY


def pin(pid, cpus):
    """Move every thread of pid to the CPU list (taskset -a)."""
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True,
                   stdout=subprocess.DEVNULL)


def measure(server, wl, seconds):
    busy, quiet = wait_quiet()
    load1 = os.getloadavg()[0]
    extra = ["--rate_iops=%d" % wl["rate_iops"]] if wl.get("rate_iops") else []
    if wl.get("pinned") and NCPU > 1:
        pin(server.pid, str(NCPU - 1))
        extra.append("--cpus_allowed=0")
    u0, s0 = proc_cpu(server.pid)
    m0 = machine_cpu()
    try:
        r = fio(server.uri, wl["rw"], wl["bs"], wl["iodepth"], wl["numjobs"], seconds, extra)
    finally:
        u1, s1 = proc_cpu(server.pid)
        m1 = machine_cpu()
        if wl.get("pinned") and NCPU > 1:
            pin(server.pid, "0-%d" % (NCPU - 1))
    r["busy_before_pct"], r["quiet"], r["load1"] = busy, quiet, load1
    mib = r["bytes"] / 1048576.0
    cpu = (u1 - u0) + (s1 - s0)
    r["cpu_us_per_mib"] = cpu * 1e6 / mib if mib else 0
    r["user_us_per_mib"] = (u1 - u0) * 1e6 / mib if mib else 0
    r["srv_user_s"], r["srv_sys_s"] = u1 - u0, s1 - s0
    tot = sum(m1) - sum(m0) or 1
    r["machine_user_pct"] = 100.0 * (m1[0] - m0[0]) / tot
    r["machine_sys_pct"] = 100.0 * (m1[1] - m0[1]) / tot
    r["machine_idle_pct"] = 100.0 * (m1[2] - m0[2]) / tot
    return r


def iperf3_mib_s(seconds):
    port = free_port()
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(int(seconds)),
                          "-J"], capture_output=True, text=True)
    srv.wait(10)
    j = json.loads(out.stdout)
    return j["end"]["sum_received"]["bits_per_second"] / 8 / 1048576.0


WORKLOADS = [
    ("4k randread QD32", dict(rw="randread", bs="4k", iodepth=32, numjobs=1)),
    ("4k randwrite QD32", dict(rw="randwrite", bs="4k", iodepth=32, numjobs=1)),
    ("4x QD16 4k randread", dict(rw="randread", bs="4k", iodepth=16, numjobs=4)),
    ("QD1 4k randread", dict(rw="randread", bs="4k", iodepth=1, numjobs=1)),
    ("QD1 4k randread, pinned apart", dict(rw="randread", bs="4k", iodepth=1, numjobs=1,
                                           pinned=True)),
    ("256k read QD16", dict(rw="read", bs="256k", iodepth=16, numjobs=1)),
    ("256k write QD16", dict(rw="write", bs="256k", iodepth=16, numjobs=1)),
    # A client that waits between requests: what an idle-ish connection
    # costs the server (CPU per MiB), e.g. with --poll-us.
    ("QD1 4k randread at 2000 IOPS", dict(rw="randread", bs="4k", iodepth=1, numjobs=1,
                                          rate_iops=2000)),
]


def blkd_server(path, *args):
    return lambda p, t: [path, "-f", "-i", "127.0.0.1", "-p", str(p)] + list(args)


def target_servers(tmp):
    """The single-connection targets: nbdkit and blkd on Debian's memory
    plugin, blkd's ram, and any other blkd builds named with --blkd."""
    s = [
        ("nbdkit memory", lambda p, t: ["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(p),
                                        "memory", DISK]),
        ("blkd memory", blkd_server(BLKD, "memory", DISK)),
        ("blkd ram", blkd_server(BLKD, "ram", DISK)),
    ]
    for name, path in EXTRA_BLKD:
        s.append((name + " memory", blkd_server(path, "memory", DISK)))
        s.append((name + " ram", blkd_server(path, "ram", DISK)))
    return s, None


def anchor_servers(tmp):
    img = os.path.join("/dev/shm", "blkd-bench-%d.img" % os.getpid())
    subprocess.run(["truncate", "-s", DISK, img], check=True)
    nbd_conf = os.path.join(tmp, "nbd-server.conf")

    def nbd_server(port, t):
        with open(nbd_conf, "w") as f:
            f.write("[generic]\nport = %d\nlistenaddr = 127.0.0.1\n"
                    "allowlist = true\n[disk]\nexportname = %s\n" % (port, img))
        return ["nbd-server", "-C", nbd_conf, "-p", os.path.join(t, "nbd-server.pid")]

    s = [
        ("nbdkit memory", lambda p, t: ["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(p),
                                        "memory", DISK]),
        ("blkd memory", blkd_server(BLKD, "memory", DISK)),
        ("blkd ram", blkd_server(BLKD, "ram", DISK)),
        ("blkd rawio (tmpfs)", blkd_server(BLKD, "rawio", "file=" + img)),
        ("qemu-nbd (tmpfs)", lambda p, t: ["qemu-nbd", "-f", "raw", "-b", "127.0.0.1", "-p",
                                           str(p), "-x", "", "-t", "-e", "64", img]),
        ("nbd-server (tmpfs)", nbd_server),
    ]
    return s, img


DISK_FILE = "/var/tmp/blkd-bench-disk.img"


def rawio_servers(tmp):
    """O_DIRECT on a file on the machine's own disk: blkd's rawio against
    qemu-nbd with the cache off and io_uring.  The file must be written well
    before the run (a fresh file's write-back skews the first minutes)."""
    if not os.path.exists(DISK_FILE):
        raise SystemExit("write %s first, well before the run: dd if=/dev/zero of=%s "
                         "bs=1M count=1024 oflag=direct" % (DISK_FILE, DISK_FILE))
    return [
        ("qemu-nbd io_uring direct", lambda p, t: [
            "qemu-nbd", "-f", "raw", "--cache=none", "--aio=io_uring", "-b", "127.0.0.1",
            "-p", str(p), "-x", "", "-t", "-e", "64", DISK_FILE]),
        ("blkd rawio direct", blkd_server(BLKD, "rawio", "file=" + DISK_FILE, "direct=true")),
    ], None


RAWIO_WORKLOADS = [
    ("4k randread QD32 (disk)", dict(rw="randread", bs="4k", iodepth=32, numjobs=1)),
    ("256k read QD16 (disk)", dict(rw="read", bs="256k", iodepth=16, numjobs=1)),
]


def switch_servers(tmp):
    def b(*opts):
        return lambda p, t: [BLKD, "-f", "-i", "127.0.0.1", "-p", str(p)] + list(opts) + \
            ["memory", DISK]
    return [
        ("iobuf=pool", b("--iobuf=pool")),
        ("iobuf=calloc", b("--iobuf=calloc")),
        ("queue=split (workers)", b("--queue=split", "--dispatch=worker")),
        ("queue=global", b("--queue=global")),
    ], None


def run_part(title, servers_fn, workloads, rounds, seconds, baseline, fill=True):
    tmp = tempfile.mkdtemp(prefix="blkd-bench.")
    specs, img = servers_fn(tmp)
    servers = []
    try:
        for name, fn in specs:
            try:
                servers.append(Server(name, fn, tmp, "disk" if name.startswith("nbd-server") else ""))
            except Exception as e:
                print("skipping %s: %s" % (name, e), file=sys.stderr)
        for s in servers:
            if fill:
                prefill(s.uri)
        results = {wl: {s.name: [] for s in servers} for wl, _ in workloads}
        for rnd in range(rounds):
            order = servers if rnd % 2 == 0 else list(reversed(servers))
            for wl, spec in workloads:
                for s in order:
                    r = measure(s, spec, seconds)
                    results[wl][s.name].append(r)
                    print("%-8s round %d  %-30s %-22s %9.0f IOPS %8.1f MiB/s  p99 %8.0f us  "
                          "%6.0f us-CPU/MiB  load %.2f busy %.0f%%%s" % (
                              title, rnd + 1, wl, s.name, r["iops"], r["mib_s"], r["p99_us"],
                              r["cpu_us_per_mib"], r["load1"], r["busy_before_pct"],
                              "" if r["quiet"] else " NOT QUIET"),
                          file=sys.stderr, flush=True)
        return results
    finally:
        for s in servers:
            s.stop()
        if img:
            os.unlink(img)
        shutil.rmtree(tmp, ignore_errors=True)


def med(xs):
    return statistics.median(xs) if xs else 0


def table(results, baseline):
    """One row per workload and server; ratios against baseline.  "*" marks
    a row with a cell that began while the machine was not quiet."""
    lines = ["| workload | server | IOPS (median) | spread | MiB/s | p50 µs | p99 µs | "
             "server CPU µs/MiB (user) | machine idle % | load1 | × " + baseline +
             " IOPS | × CPU/MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for wl, by_server in results.items():
        base = med([r["iops"] for r in by_server.get(baseline, [])])
        base_cpu = med([r["cpu_us_per_mib"] for r in by_server.get(baseline, [])])
        for name, rs in by_server.items():
            if not rs:
                continue
            iops = [r["iops"] for r in rs]
            m = med(iops)
            cpu = med([r["cpu_us_per_mib"] for r in rs])
            mark = "" if all(r.get("quiet", True) for r in rs) else " *"
            lines.append("| %s%s | %s | %.0f | %.0f–%.0f | %.1f | %.0f | %.0f | %.0f (%.0f) | %.0f | "
                         "%.2f | %s | %s |" % (
                wl, mark, name, m, min(iops), max(iops), med([r["mib_s"] for r in rs]),
                med([r["p50_us"] for r in rs]), med([r["p99_us"] for r in rs]),
                cpu, med([r["user_us_per_mib"] for r in rs]),
                med([r["machine_idle_pct"] for r in rs]), max(r["load1"] for r in rs),
                "%.2f" % (m / base) if base else "–",
                "%.2f" % (cpu / base_cpu) if base_cpu else "–"))
    return "\n".join(lines)


def client_table(results):
    """What each server costs the client: fio's own CPU and context
    switches per request (fio's one thread is the limit at QD32, so a
    server that makes fio cheaper raises the ceiling)."""
    lines = ["| workload | server | fio CPU µs/request | fio context switches/request |",
             "|---|---|---|---|"]
    for wl, by_server in results.items():
        for name, rs in by_server.items():
            rs = [r for r in rs if r.get("ios")]
            if not rs:
                continue
            lines.append("| %s | %s | %.1f | %.2f |" % (
                wl, name, med([r["fio_cpu_s"] * 1e6 / r["ios"] for r in rs]),
                med([r["fio_ctx"] / r["ios"] for r in rs])))
    return "\n".join(lines)


def main():
    global MAX_BUSY
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--part", default="all", choices=["anchors", "targets", "rawio", "switches", "all"])
    ap.add_argument("--workloads", default=None,
                    help="comma-separated substrings: run only the matching workloads")
    ap.add_argument("--blkd", action="append", default=[], metavar="NAME=PATH",
                    help="another blkd build to run beside ./blkd (targets part)")
    ap.add_argument("--max-busy", type=float, default=MAX_BUSY,
                    help="percent of the machine others may use before a cell")
    ap.add_argument("--out", default=None, help="write the markdown tables here")
    ap.add_argument("--json", default=None, help="write raw results here")
    a = ap.parse_args()
    MAX_BUSY = a.max_busy
    for spec in a.blkd:
        name, path = spec.split("=", 1)
        EXTRA_BLKD.append((name, os.path.abspath(path)))
    workloads = WORKLOADS
    if a.workloads:
        keys = a.workloads.split(",")
        workloads = [w for w in WORKLOADS if any(k in w[0] for k in keys)]

    cpu_model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    header = ["Machine: %s, %d CPUs, kernel %s; %s; %d rounds of %gs, medians; "
              "load average at start %.2f; a cell starts only when others use "
              "under %.0f%% of the machine (\"*\": one did not)." % (
        cpu_model, os.cpu_count(), platform.release(), time.strftime("%Y-%m-%d %H:%M UTC",
                                                                         time.gmtime()),
        a.rounds, a.seconds, os.getloadavg()[0], MAX_BUSY)]
    raw = {}
    md = list(header)
    if a.part in ("anchors", "all"):
        iperf = [iperf3_mib_s(3) for _ in range(a.rounds)]
        md.append("\niperf3, one TCP stream over loopback: median %.0f MiB/s (%.0f–%.0f)\n" % (
            med(iperf), min(iperf), max(iperf)))
        res = run_part("anchors", anchor_servers, workloads, a.rounds, a.seconds, "nbdkit memory")
        raw["anchors"] = res
        raw["iperf3_mib_s"] = iperf
        md.append(table(res, "nbdkit memory"))
    if a.part == "rawio":
        res = run_part("rawio", rawio_servers, RAWIO_WORKLOADS, a.rounds, a.seconds,
                       "qemu-nbd io_uring direct", fill=False)
        raw["rawio"] = res
        md.append(table(res, "qemu-nbd io_uring direct"))
    if a.part == "targets":
        res = run_part("targets", target_servers, workloads, a.rounds, a.seconds, "nbdkit memory")
        raw["targets"] = res
        md.append(table(res, "nbdkit memory"))
        md.append("\n" + client_table(res))
    if a.part in ("switches", "all"):
        sw = []
        for conns in (1, 4, 16, 64):
            depth = max(1, 64 // conns)
            sw.append(("%d conn × QD%d 4k randread" % (conns, depth),
                       dict(rw="randread", bs="4k", iodepth=depth, numjobs=conns)))
        res = run_part("switches", switch_servers, sw, a.rounds, a.seconds, "iobuf=pool")
        raw["switches"] = res
        md.append("\n" + table(res, "iobuf=pool"))
    text = "\n".join(md) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
