#!/usr/bin/python3
# Live restart (SIGUSR2) in the ways blkd is deployed:
# - socket activation (LISTEN_FDS, as blkd.socket + blkd.service): the new
#   image serves the activated socket and binds none of its own;
# - an upgrade (the binary replaced by rename): the new file runs, in the
#   same process;
# - a writeback cache: dirty blocks reach the file before the exec;
# - forked into the background with a pidfile (no -f), on rawio: the pid
#   in the file stays right, the daemon does not fork again;
# a libnbd client writes and reads through each restart without an error.
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from restarttest import *  # noqa: E402,F401,F403

nbd = need_live_restart()

MiB = 1024 * 1024
BS = 4096
DONE_RE = re.compile(DONE)



def text(log_path):
    with open(log_path, "rb") as f:
        return f.read().decode(errors="replace")


def wait_for(log_path, pattern, n, pid, what, secs=30):
    deadline = time.time() + secs
    while time.time() < deadline:
        if len(re.findall(pattern, text(log_path))) >= n:
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            fail("%s: server %d is gone" % (what, pid))
        time.sleep(0.05)
    print(text(log_path)[-3000:])
    fail("%s: %r not logged %d times within %d s" % (what, pattern, n, secs))


def through_restarts(h, pid, log_path, rounds, what):
    expect = {}
    for n in range(1, rounds + 1):
        for b in range(n * 8, n * 8 + 8):
            expect[b] = os.urandom(BS)
            h.pwrite(expect[b], b * BS)
        os.kill(pid, signal.SIGUSR2)
        for b, data in expect.items():     # some of these wait out the pause
            if h.pread(BS, b * BS) != data:
                fail("%s: block %d read back wrong around restart %d" % (what, b, n))
        wait_for(log_path, DONE, n, pid, "%s: restart %d" % (what, n))
    ok("%s: %d restarts, every block read back right, no client error" % (what, rounds))
    return expect


def on_disk(path, expect, what):
    """Every {block: data} of expect is in the file at path."""
    with open(path, "rb") as f:
        for b, data in expect.items():
            f.seek(b * BS)
            if f.read(BS) != data:
                check_failed("%s: block %d differs in the file" % (what, b))
                return
    ok("%s is in the file" % what)


def gone(pid, secs=10):
    deadline = time.time() + secs
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


# ---- socket activation ------------------------------------------------------
print("# socket activation (LISTEN_FDS), the file plugin")
path = disk("activated.img", 8 * MiB)
lsock = socket.socket()
lsock.bind(("127.0.0.1", 0))
lsock.listen(16)
port = lsock.getsockname()[1]
log_path = os.path.join(TMP, "activated.log")


def activated_child():
    os.dup2(lsock.fileno(), 3)
    os.set_inheritable(3, True)
    os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1", LISTEN_FDNAMES="blkd")


with open(log_path, "wb") as log:
    proc = subprocess.Popen([private_exe(), "-f", "file", "file=" + path],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=activated_child, close_fds=False)
lsock.close()
pid = proc.pid
deadline = time.time() + 20
h = None
while h is None and time.time() < deadline and proc.poll() is None:
    try:
        h = nbd.NBD()
        h.connect_uri("nbd://127.0.0.1:%d" % port)
    except nbd.Error:
        h = None
        time.sleep(0.1)
if h is None:
    print(text(log_path))
    fail("the activated server does not answer")
through_restarts(h, pid, log_path, 2, "socket activation")
check(proc.poll() is None, "same process after the restarts")
check_eq(len(re.findall(r"serving file on nbd://localhost/", text(log_path))), 3,
         "every image says it serves the activated socket")
h2 = nbd.NBD()
h2.connect_uri("nbd://127.0.0.1:%d" % port)
check_eq(h2.get_size(), 8 * MiB, "a new client on the activated socket")
h2.shutdown()
h.shutdown()
proc.terminate()
check_eq(proc.wait(10), 0, "exit status on SIGTERM")

# ---- an upgrade: the file now at the path runs --------------------------------
print("# upgrade: the binary replaced by rename, as a package manager does")
path = disk("upgrade.img", 8 * MiB)
srv = restart_server(["file", "file=" + path], unix=True)
h = nbd.NBD()
h.connect_uri(srv.uri)
real = EXE + ".real"
shutil.copy2(EXE, real)
marker = os.path.join(TMP, "upgraded")
new = EXE + ".new"
with open(new, "w") as f:            # the "new version": marks that it ran
    f.write('#!/bin/sh\necho "$$" > %s\nexec %s "$@"\n' % (marker, real))
os.chmod(new, 0o755)
os.rename(new, EXE)                  # the running image's file is unlinked
expect = through_restarts(h, srv.proc.pid, srv.log_path, 1, "upgrade")
check(os.path.exists(marker), "the file at the binary's path ran, not the old image")
with open(marker) as f:
    check_eq(int(f.read()), srv.proc.pid, "it ran in the same process")
h.shutdown()
srv.stop()
os.rename(real, EXE)

# ---- writeback cache ---------------------------------------------------------
print("# --cache-mode=writeback: dirty blocks reach the file before the exec")
path = disk("cached.img", 8 * MiB)
srv = restart_server(["file", "file=" + path],
                     opts=["--cache=4M", "--cache-mode=writeback"])
h = nbd.NBD()
h.connect_uri(srv.uri)
expect = through_restarts(h, srv.proc.pid, srv.log_path, 2, "writeback cache")
# No flush: the restarts wrote the dirty blocks back.
on_disk(path, expect, "writeback: every block written before a restart")
h.shutdown()
srv.stop()

# ---- a daemon with a pidfile, rawio ----------------------------------------
print("# forked into the background (-P pidfile, --log=stderr), rawio")
rawio = os.path.join(TOP, "plugins", "rawio", "nbdkit-rawio-plugin.so")
if not os.path.exists(rawio):
    skip("rawio plugin not built at %s" % rawio)
path = disk("daemon.img", 8 * MiB)
sock = os.path.join(TMP, "daemon.sock")
pidfile = os.path.join(TMP, "daemon.pid")
log_path = os.path.join(TMP, "daemon.log")
with open(log_path, "wb") as log:
    r = subprocess.run([private_exe(), "-U", sock, "-P", pidfile,
                        "--log=stderr", rawio, "file=" + path],
                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                       timeout=30)
check_eq(r.returncode, 0, "the parent exits 0 once the daemon serves")
with open(pidfile) as f:
    pid = int(f.read())
h = nbd.NBD()
h.connect_uri("nbd+unix:///?socket=" + sock)
expect = through_restarts(h, pid, log_path, 2, "daemon")
with open(pidfile) as f:
    check_eq(int(f.read()), pid, "the pidfile still names the server")
check_eq(len(re.findall(r"live restart \d+: exec", text(log_path))), 2,
         "two execs, no fork: the same PID serves")
h.flush()
on_disk(path, expect, "daemon: every block")
h.shutdown()
os.kill(pid, signal.SIGTERM)
check(gone(pid), "the daemon exits on SIGTERM")
check(not os.path.exists(pidfile), "the pidfile is removed at the final exit")
check(not os.path.exists(sock), "the socket is removed at the final exit")
print("live restart deployment checks done")
