"""Helpers for the live restart tests (tests/test-restart-*.py): a server
run from a private copy of the binary (so a test may rename it away), the
SIGUSR2 that restarts it, and waits on what its log says.

A restart re-executes the same process: the Server object's Popen stays
valid, and both images write to the one log file."""

import os
import re
import shutil
import signal
import time

import blkdtest
from blkdtest import IS_NBDKIT, TMP, Server, fail, need_nbd, need_server, skip

BIN_DIR = os.path.join(TMP, "bin")
EXE = os.path.join(BIN_DIR, "blkd")


def need_live_restart():
    """Skip unless the server under test is blkd; the nbd module."""
    nbd = need_nbd()
    need_server()
    if IS_NBDKIT:
        skip("live restart (SIGUSR2) is blkd's")
    return nbd


def disk(name, size=16 * 1024 * 1024):
    """A sparse file of size bytes in TMP, for the file and rawio plugins."""
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def private_exe():
    """EXE, made a copy of the binary under test if it is not yet."""
    if not os.path.exists(EXE):
        os.makedirs(BIN_DIR, exist_ok=True)
        shutil.copy2(blkdtest.BLKD, EXE)
    return EXE


def restart_server(args, unix=False, opts=()):
    """A Server running EXE, a copy of the binary under test."""
    private_exe()
    saved = blkdtest.BLKD
    blkdtest.BLKD = EXE
    try:
        return Server(args, unix=unix, opts=opts)
    finally:
        blkdtest.BLKD = saved


def log_text(srv):
    with open(srv.log_path, "rb") as f:
        return f.read().decode(errors="replace")


def count(srv, pattern):
    return len(re.findall(pattern, log_text(srv)))


DONE = r"live restart \d+ done: serving again"


def wait_log(srv, pattern, n=1, secs=30, what=None):
    """Wait until pattern appears n times in the log; fail on timeout or
    if the server exits."""
    deadline = time.time() + secs
    while time.time() < deadline:
        if count(srv, pattern) >= n:
            return
        if not srv.alive():
            fail("%s: server exited with status %s" % (what or pattern, srv.proc.returncode))
        time.sleep(0.05)
    fail("%s: not in the log after %d s (%r x%d)" % (what or pattern, secs, pattern, n))


def restart(srv, secs=30):
    """SIGUSR2, then wait for the new image to say it serves again."""
    n = count(srv, DONE) + 1
    os.kill(srv.proc.pid, signal.SIGUSR2)
    wait_log(srv, DONE, n, secs, "live restart %d" % n)
    return n


def metrics_port(srv):
    """The metrics port the latest image bound (port 0 picks a new one)."""
    ports = re.findall(r"metrics on http://\S*:(\d+)/metrics", log_text(srv))
    return int(ports[-1]) if ports else None


def wait_server_read(sock, timeout=10):
    """Wait until the server has read everything sock sent it (its socket's
    receive queue, in /proc/net/tcp, is empty): a restart decides on what
    the server has read, and bytes still in its socket would simply travel
    with the descriptor to the next image.  Fails after timeout seconds."""
    host, port = sock.getsockname()[:2]
    deadline = time.time() + timeout
    while time.time() < deadline:
        queued = None
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    rows = f.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                fields = row.split()
                remote_port = int(fields[2].split(":")[1], 16)
                if remote_port == port and fields[3] == "01":    # ESTABLISHED
                    queued = int(fields[4].split(":")[1], 16)
        if queued == 0:
            return
        time.sleep(0.01)
    fail("the server did not read what %s:%d sent within %d s" % (host, port, timeout))
