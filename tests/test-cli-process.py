"""blkd's process model on nbdkit's terms: -s with libnbd's connect_command,
--exit-with-parent, -u/-g, -U -, --print-uri, --vsock, --selinux-label, and
--help and the README covering every option blkd accepts."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import (BLKD, IS_NBDKIT, TMP, TOP, check, check_eq, fail, need_nbd,  # noqa: E402
                      need_server, note, ok, skip)

need_server()
if IS_NBDKIT:
    skip("tests blkd's own process model (the table test compares it with nbdkit)")
nbd = need_nbd()
HELPERS = os.path.join(TOP, "tests", "helpers")
LIMIT = 120                     # generous: the machine may be loaded


def wait_for(cond, what, secs=LIMIT):
    deadline = time.time() + secs
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    fail("%s: not within %ds" % (what, secs))


def gone(pid):
    """Exited (a zombie counts: its parent has not reaped it yet)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def children():
    """Our live child processes (connect_command forks the server)."""
    pids = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open("/proc/%s/stat" % p).read().rsplit(")", 1)[1].split()
        except OSError:
            continue                   # exited while we looked
        if fields[1] == str(os.getpid()) and fields[0] != "Z":
            pids.append(int(p))
    return pids


print("# -s: libnbd's connect_command reads and writes, and blkd leaves with its client")
r = subprocess.run([sys.executable, os.path.join(HELPERS, "cli-connect-command.py"),
                    "size,write-read,read", "--", BLKD, "-s", "memory", "8M"],
                   capture_output=True, text=True, timeout=LIMIT)
check_eq((r.returncode, r.stdout), (0, "8388608\nok\n4141414141414141\nserver exited\n"),
         "connect_command with blkd -s (stderr: %s)" % r.stderr.strip())

h = nbd.NBD()
h.connect_command([BLKD, "-s", "memory", "1M"])
h.pwrite(b"\x5a" * 512, 4096)
check_eq(h.pread(512, 4096), b"\x5a" * 512, "write then read over -s")
pids = children()
check(len(pids) == 1, "connect_command forked one server", str(pids))
h.shutdown()
wait_for(lambda: gone(pids[0]), "blkd -s exits once its client disconnected")
ok("blkd -s exited after NBD_CMD_DISC")
del h

for name, stdin in (("/dev/null", subprocess.DEVNULL), ("a pipe", subprocess.PIPE)):
    p = subprocess.run([BLKD, "-s", "memory", "1M"], input="" if stdin == subprocess.PIPE
                       else None, stdin=None if stdin == subprocess.PIPE else stdin,
                       capture_output=True, text=True, timeout=LIMIT)
    check(p.returncode == 1 and "same socket" in p.stderr,
          "-s with stdin on %s: exit 1 and says what it needs" % name, p.stderr)

print("# --exit-with-parent: the parent dies, blkd exits cleanly and removes its socket")
# As a subreaper we inherit blkd once its parent dies, and can read its
# exit status: 0 is the clean path (a signal death would not be).
import ctypes  # noqa: E402
PR_SET_CHILD_SUBREAPER = 36
subreaper = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
for flag in (True, False):
    sock = os.path.join(TMP, "ewp%d.sock" % flag)
    pidfile = os.path.join(TMP, "ewp%d.pid" % flag)
    opts = "--exit-with-parent" if flag else "-f"
    # The shell is the parent: it starts blkd, records its pid, waits.
    parent = subprocess.Popen(["sh", "-c", '"$0" %s -U "$1" memory 1M 2>/dev/null & '
                               'echo $! > "$2.tmp"; mv "$2.tmp" "$2"; wait' % opts,
                               BLKD, sock, pidfile])
    wait_for(lambda: os.path.exists(sock) and os.path.exists(pidfile),
             "blkd %s listening" % opts)
    child = int(open(pidfile).read())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    if not flag:
        time.sleep(1)
        check(not gone(child), "without --exit-with-parent blkd outlives its parent")
        os.kill(child, signal.SIGTERM)
    wait_for(lambda: gone(child), "blkd %s exits" % ("after its parent was killed" if flag
                                                    else "on SIGTERM"))
    if subreaper:
        status = os.waitpid(child, 0)[1]
        check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
              "blkd %s: exit status 0" % opts, "wait status %#x" % status)
    else:
        note("not a subreaper here: blkd's exit status not checked")
    check(not os.path.exists(sock), "blkd %s: socket removed at exit" % opts)

print("# -u nobody -g nogroup: the serving process has those ids")
if os.geteuid() != 0:
    note("not root: -u/-g checks not made")
else:
    import grp
    import pwd
    try:
        uid, gid = pwd.getpwnam("nobody").pw_uid, grp.getgrnam("nogroup").gr_gid
    except KeyError:
        skip("no user nobody or group nogroup on this machine")
    sock = os.path.join("/tmp", "blkd-cli-ug.%d.sock" % os.getpid())
    log = open(os.path.join(TMP, "ug.log"), "w")
    srv = subprocess.Popen([BLKD, "-f", "-u", "nobody", "-g", "nogroup", "-U", sock,
                            "--shards", "2", "memory", "1M"], stdout=log, stderr=log)
    try:
        wait_for(lambda: os.path.exists(sock), "blkd -u nobody listening")
        h = nbd.NBD()
        h.connect_unix(sock)
        h.pwrite(b"u" * 512, 0)            # a client is served: ids are final
        for task in os.listdir("/proc/%d/task" % srv.pid):
            status = open("/proc/%d/task/%s/status" % (srv.pid, task)).read()
            ids = {k: v.split() for k, v in re.findall(r"^(Uid|Gid|Groups):\s*(.*)$",
                                                       status, re.M)}
            if ids["Uid"] != [str(uid)] * 4 or ids["Gid"] != [str(gid)] * 4 \
               or ids["Groups"] != [str(gid)]:
                fail("task %s of blkd runs as %r, want uid %d gid %d groups [%d]"
                     % (task, ids, uid, gid, gid))
        ok("every thread of the serving blkd has uid %d, gid %d, groups %d" % (uid, gid, gid))
        h.shutdown()
        del h
    finally:
        srv.send_signal(signal.SIGTERM)
        rc = srv.wait(timeout=LIMIT)
        left = os.path.exists(sock)
        if left:
            os.unlink(sock)
    check(rc == 0 and not left, "-u nobody: SIGTERM exits 0 and nobody removes the "
          "socket in /tmp", "exit %d, socket left: %s" % (rc, left))
    secret = os.path.join("/tmp", "blkd-cli-secret.%d" % os.getpid())
    with open(secret, "wb") as f:
        f.write(b"\0" * 4096)
    os.chmod(secret, 0o600)
    try:
        r = subprocess.run([BLKD, "-u", "nobody", "-g", "nogroup", "-U", "-", "-r", "file",
                            secret, "--run", 'nbdinfo --size "$uri"'],
                           capture_output=True, text=True, timeout=LIMIT)
    finally:
        os.unlink(secret)
    check(r.returncode != 0 and "Permission denied" in r.stderr,
          "the file plugin opens its file after the drop (root-only file refused)",
          r.stderr)

print("# -U -: a private directory, removed at exit")
r = subprocess.run([BLKD, "-U", "-", "memory", "1M", "--run",
                    'stat -c %a "$(dirname "$unixsocket")"; echo "$unixsocket"'],
                   capture_output=True, text=True, timeout=LIMIT)
mode, path = r.stdout.split()
check_eq(mode, "700", "the private directory's mode")
check(not os.path.exists(os.path.dirname(path)), "private directory removed at exit", path)

print("# --print-uri: the URI, on stdout, once bound (also when forking)")
sock = os.path.join(TMP, "pu.sock")
pidfile = os.path.join(TMP, "pu.pid")
# stderr to a file: the daemon keeps it open, so a pipe would never end.
r = subprocess.run([BLKD, "--print-uri", "-P", pidfile, "-U", sock, "memory", "3M"],
                   stdout=subprocess.PIPE, stderr=open(os.path.join(TMP, "pu.log"), "w"),
                   text=True, timeout=LIMIT)
try:
    check_eq(r.stdout, "nbd+unix:///?socket=%s\n" % sock, "--print-uri output")
    size = subprocess.run(["nbdinfo", "--size", r.stdout.strip()], capture_output=True,
                          text=True, timeout=LIMIT).stdout
    check_eq(size, "3145728\n", "the printed URI reaches the export")
finally:
    if os.path.exists(pidfile):
        os.kill(int(open(pidfile).read()), signal.SIGTERM)

print("# --vsock")


def vsock_loopback():
    """None when a vsock client here reaches a vsock server here, else why not."""
    try:
        srv = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        srv.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
        srv.listen()
        c = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        c.settimeout(5)
        c.connect((1, srv.getsockname()[1]))     # VMADDR_CID_LOCAL
        c.close()
        srv.close()
        return None
    except (AttributeError, OSError) as e:
        return str(e)


try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close()
    have_vsock = True
except (AttributeError, OSError) as e:
    note("vsock checks not made: no AF_VSOCK sockets here (%s)" % e)
    have_vsock = False
if have_vsock:
    port = str(20000 + os.getpid() % 40000)     # libnbd's URIs take 16-bit ports
    loop_why = vsock_loopback()
    client = 'timeout 60 nbdinfo --size "$uri"' if loop_why is None else "true"
    r = subprocess.run([BLKD, "--vsock", "-p", port, "memory", "1M", "--run",
                        'echo "$uri $port"; ' + client],
                       capture_output=True, text=True, timeout=LIMIT)
    check_eq(r.stdout.split("\n")[0], "nbd+vsock://1:%s/ %s" % (port, port),
             "--vsock binds and gives $uri and $port")
    if loop_why is None:
        check_eq((r.returncode, r.stdout.split("\n")[1]), (0, "1048576"),
                 "served over vsock loopback")
    else:
        note("vsock serving check not made: the kernel has no vsock loopback "
             "transport (vsock_loopback) here: %s" % loop_why)

print("# --selinux-label")
r = subprocess.run([BLKD, "-U", "-", "--selinux-label=system_u:object_r:svirt_socket_t:s0",
                    "memory", "1M", "--run", 'nbdinfo --size "$uri"'],
                   capture_output=True, text=True, timeout=LIMIT)
if os.path.exists("/sys/fs/selinux/enforce"):
    check_eq((r.returncode, r.stdout), (0, "1048576\n"), "--selinux-label on an SELinux host")
else:
    check(r.returncode == 1 and "--selinux-label" in r.stderr and "SELinux" in r.stderr
          or "libselinux" in r.stderr, "--selinux-label without SELinux: a clear message",
          r.stderr)

print("# --mask-handshake=0: a client without fixed newstyle may only send EXPORT_NAME")
PROBE = r"""
import socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(60)
s.connect(sys.argv[1])
def rd(n):
    b = b""
    while len(b) < n:
        x = s.recv(n - len(b))
        if not x:
            break
        b += x
    return b
gflags = struct.unpack(">H", rd(18)[16:])[0]
s.sendall(struct.pack(">I", int(sys.argv[2])))
s.sendall(struct.pack(">QII", 0x49484156454F5054, 3, 0))          # NBD_OPT_LIST
r = rd(20)
print(gflags, hex(struct.unpack(">I", r[12:16])[0]) if len(r) == 20 else "EOF")
"""
servers = [BLKD] + ([shutil.which("nbdkit")] if shutil.which("nbdkit") else [])
for server in servers:
    for mask, cflags, want in (("0", "0", "0 0x80000003"), ("3", "3", "3 0x2")):
        env = dict(os.environ, PROBE=PROBE, PROBE_PY=sys.executable, CFLAGS=cflags)
        r = subprocess.run([server, "-U", "-", "--mask-handshake=" + mask, "memory", "1M",
                            "--run", '"$PROBE_PY" -c "$PROBE" "$unixsocket" "$CFLAGS"'],
                           env=env, capture_output=True, text=True, timeout=LIMIT)
        # LIST answers ERR_INVALID without fixed newstyle, else a first SERVER reply.
        check_eq(r.stdout.strip(), want, "%s --mask-handshake=%s, client flags %s: "
                 "global flags and LIST's reply" % (os.path.basename(server), mask, cflags))

print("# --shards by default: one event loop per CPU the process may run on")


def shard_threads(pid):
    """How many of blkd's threads are event loops (named blkd.sN)."""
    names = []
    for task in os.listdir("/proc/%d/task" % pid):
        try:
            names.append(open("/proc/%d/task/%s/comm" % (pid, task)).read().strip())
        except OSError:
            pass
    return sum(1 for n in names if re.fullmatch(r"blkd\.s\d+", n))


def shards_started(args, cpus, what):
    """Start blkd with args on the CPU set cpus; (its "(N shards)" count,
    its threads named blkd.sN once that many have named themselves)."""
    sock = os.path.join(TMP, "shards.%d.sock" % shards_started.n)
    logpath = os.path.join(TMP, "shards.%d.log" % shards_started.n)
    shards_started.n += 1
    with open(logpath, "w") as log:
        srv = subprocess.Popen([BLKD, "-f", "-U", sock] + args + ["memory", "1M"],
                               stdout=log, stderr=log,
                               preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    try:
        # The "serving ... (N shards)" line comes once the shards run, after
        # the socket is bound.
        count = re.compile(r"\((\d+) shards\)")
        wait_for(lambda: count.search(open(logpath).read()) or srv.poll() is not None,
                 "%s: blkd serving" % what)
        if srv.poll() is not None:
            fail("%s: blkd exited %d: %s" % (what, srv.returncode, open(logpath).read()))
        n = int(count.search(open(logpath).read()).group(1))
        # Each loop names itself when its thread first runs.
        wait_for(lambda: shard_threads(srv.pid) >= n, "%s: %d loops named" % (what, n))
        return n, shard_threads(srv.pid), open(logpath).read()
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(timeout=LIMIT)


shards_started.n = 0
mine = set(os.sched_getaffinity(0))
one = {min(mine)}
for cpus in (mine, one):
    what = "blkd started on %d CPU(s) of %d" % (len(cpus), len(mine))
    n, threads, _ = shards_started([], cpus, what)
    check_eq(n, len(cpus), what + ": shards")
    check_eq(threads, len(cpus), what + ": event-loop threads")
if len(mine) == 1:
    note("this process may run on one CPU only: both cases expect one loop")

print("# --shards by default gives way to --iobuf-mem; one that is given does not")
# 1G holds 2 x 512M for one shard only.
n, threads, log = shards_started(["--max-request", "512M"], mine, "--max-request 512M")
check(n == 1 and threads == 1, "--max-request 512M on %d CPU(s): starts, with one shard"
      % len(mine), "%d shards, %d threads" % (n, threads))
if len(mine) > 1:
    check("holds 2 x --max-request for 1 shards" in log, "and its log says why", log)
r = subprocess.run([BLKD, "--shards", "2", "--max-request", "512M", "-U", "-", "memory", "1M",
                    "--run", "true"], capture_output=True, text=True, timeout=LIMIT)
check(r.returncode != 0 and "--iobuf-mem must be at least" in r.stderr,
      "--shards 2 --max-request 512M: refused", r.stderr)

print("# --help and README cover every option blkd accepts")
src = open(os.path.join(TOP, "server", "main.c")).read()
table = src[src.index("long_opts[] = {"):]
longs = re.findall(r'\{ "([a-z0-9-]+)",', table[:table.index("{ NULL")])
shorts = re.search(r'getopt_long \(argc, argv, "([^"]+)"', src).group(1).replace(":", "")
help_text = subprocess.run([BLKD, "--help"], capture_output=True, text=True).stdout
readme = open(os.path.join(TOP, "README.md")).read()
missing = [o for o in longs if "--" + o not in help_text]
check(not missing, "--help names every long option", str(missing))
missing = [o for o in longs if "--" + o not in readme]
check(not missing, "README names every long option", str(missing))
missing = [c for c in shorts if "-" + c not in help_text or "-" + c not in readme]
check(not missing, "--help and README name every short option", str(missing))
