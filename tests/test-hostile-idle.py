#!/usr/bin/python3
# Hostile clients against --idle-timeout: a request that outlives the limit
# is not idleness, and clients that stop reading their replies are dropped
# by the idle sweep rather than holding the shard's buffers for ever (bugs
# 7 and 8 in docs/RELIABILITY.md; each check's docstring is the report).
# Run one with: tests/test-hostile-idle.py NAME.  Written as a "pending"
# file while the bugs were open:  When a fix lands, move its check into the
# suite it belongs to (test-hostile-*.py / test-limits-*.sh) and delete it
# here.  Each check's docstring is the bug report: what happens, why, and
# the fix proposed in docs/RELIABILITY.md.
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from hostile import *  # noqa: E402,F401,F403

MiB = 1 << 20
PENDING = []


def pending(name, reason):
    def deco(fn):
        PENDING.append((name, reason, fn))
        return fn
    return deco


def send_bg(sock, data):
    def run():
        try:
            sock.sendall(data)
        except OSError:
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# Fixed in c577f7f and moved into the suites: pool-stall-never-woken
# (test-hostile-requests.py), handshake-output-unbounded
# (test-hostile-handshake.py), pool-starvation-same-shard
# (test-hostile-hangup.py), replies-dropped-on-protocol-error
# (test-hostile-requests.py, test-hostile-handshake.py),
# handshake-timeout-early (test-limits-handshake-timeout.sh).


@pending("idle-timeout-after-long-request",
         "--idle-timeout counts from the last request read, not from the last reply: "
         "a client is dropped right after a long request completes")
def idle_after_long_request():
    """t_active is stamped only in conn_on_read().  A request that runs
    longer than --idle-timeout leaves the connection 'idle' since it was
    read, so as soon as its reply is out (inflight == 0) the next sweep
    drops the connection -- the client gets its reply and, if it sends its
    next request a moment later (here 1.2 s, with --idle-timeout 2), finds
    the connection closed.  Fix: stamp t_active also when output moves
    (send_pending() after a successful send), so idleness counts from the
    last activity either way -- the same change fixes
    hoarders-outlive-idle-timeout (diff in docs/RELIABILITY.md)."""
    if not os.path.exists(os.path.join(FILTERDIR, "nbdkit-delay-filter.so")):
        note("nbdkit delay filter not installed: check not made")
        return
    srv = Server(["memory", "1M", "delay-read=3"],
                 opts=["--idle-timeout", "2", "--filter=delay"])
    c = RawClient(srv, timeout=10)
    c.handshake(structured=False)
    c.send_request(NBD_CMD_READ, 0, 4096, cookie=1)
    check_eq(c.recv_reply(4096)[:2], (1, 0), "a 3 s READ under --idle-timeout 2")
    time.sleep(1.2)
    try:
        c.send_request(NBD_CMD_READ, 0, 4096, cookie=2)
        got = c.recv_reply(4096)[:2]
    except (OSError, EOFError) as e:
        got = repr(e)
    c.close()
    srv.stop()
    check_eq(got, (2, 0), "the next READ, 1.2 s after the reply (idle 1.2 s < 2 s)")


@pending("hoarders-outlive-idle-timeout",
         "clients that stop reading their replies are never idle (inflight > 0), so "
         "four of them hold a shard's pool for ever, --idle-timeout or not")
def hoarders():
    """Since c577f7f one connection may hold a quarter of its shard's pool,
    so four clients that pipeline READs and never read a reply fill it,
    and every other client on the shard waits for buffers.  --idle-timeout
    does not help: it only drops connections with nothing in flight, and
    these have replies queued for ever.  Reproduction: --shards 1
    --iobuf-mem 64M --max-request 4M --idle-timeout 2, four clients send
    1000 x 1 MiB READs each and read nothing; a fifth client's 1 MiB READ
    gets no answer even after 6 s.  Fix: treat a connection whose queued
    output makes no progress for --idle-timeout seconds as idle too: stamp
    t_active when send_pending() moves bytes, let shard_sweep() drop a
    transmission connection that has nothing in flight *or* replies
    queued, once t_active is older than the limit, and call
    conn_wake_waiters() at the end of the sweep (the closed connections'
    buffers are what the others wait for).  Verified: with that diff
    (docs/RELIABILITY.md) this and idle-timeout-after-long-request pass,
    and so does every hostile and limits test."""
    srv = Server(["ram", "size=64M"], opts=["--shards", "1", "--iobuf-mem", "64M",
                                            "--max-request", "4M", "--idle-timeout", "2"])
    hoard = []
    for k in range(4):
        c = RawClient(srv)
        c.handshake(structured=False)
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        send_bg(c.sock, b"".join(RawClient.request(NBD_CMD_READ, (i % 60) * MiB, MiB, cookie=i)
                                 for i in range(1000)))
        hoard.append(c)
    time.sleep(1.0)
    d = RawClient(srv, timeout=6)
    try:
        d.handshake(structured=False)
        d.send_request(NBD_CMD_READ, 0, MiB, cookie=7)
        got = d.recv_reply(MiB)[:2]
    except (OSError, EOFError) as e:
        got = repr(e)
    for c in hoard:
        c.close()
    d.close()
    srv.stop()
    check_eq(got, (7, 0), "a fifth client's READ while four clients hoard the pool "
             "(--idle-timeout 2, waited 6 s)")


if __name__ == "__main__":
    need_server()
    if IS_NBDKIT:
        skip("blkd-specific pending checks")
    names = sys.argv[1:]
    todo = [p for p in PENDING if not names or p[0] in names]
    if not todo:
        print("nothing pending: every hostile check is in its suite")
        sys.exit(0)
    failed = []
    for name, reason, fn in todo:
        print("# %s" % name)
        # fail() exits: run each in a child process so one failure does not
        # hide the others.
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                fn()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException as e:
                print("FAIL: %s raised %r" % (name, e), flush=True)
                code = 1
            for s in sys.modules["blkdtest"]._servers:   # not TMP: the parent's
                try:
                    s.stop()
                except Exception:
                    pass
            sys.stdout.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        print("%s: %s" % ("FIXED" if rc == 0 else "STILL FAILS", name), flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        fail("still failing: %s" % ", ".join(failed))
    print("every pending check passes: move them into the suites")
