#!/usr/bin/python3
# A shard whose connections cannot time out (all past their handshake, no
# --idle-timeout) sleeps in epoll_wait with no timeout: the once-a-second
# timeout sweep runs only while some connection may need it, so the
# kernel arms no timer for each sleep.  strace shows the shard's
# epoll_wait timeouts: -1 while one connection sends requests; a finite
# one while a second connection stands in its handshake; and that
# connection is still closed by --handshake-timeout.
import os
import re
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

if IS_NBDKIT:
    skip("the shard's loop is blkd's")
if not shutil.which("strace"):
    skip("strace is not installed")


def timeouts(trace):
    """The timeout argument of every epoll_wait in an strace -f file
    (a call cut in two by another thread's line has it in the resumed
    half)."""
    out = []
    for line in open(trace):
        if "epoll_wait" in line:
            m = re.search(r", (\d+), (-?\d+)\) += ", line)
            if m:
                out.append(int(m.group(2)))
    return out


def traced(srv, trace, c, n):
    """n requests from c, a few ms apart, with the server's epoll_wait
    calls traced; returns their timeouts."""
    st = strace_attach(srv, trace, "epoll_wait")
    for i in range(n):
        c.send_request(NBD_CMD_READ, i * 4096, 4096, cookie=i)
        cookie, err, _, _ = c.recv_reply(4096)
        check_eq((cookie, err), (i, 0), "request %d answered" % i)
        time.sleep(0.01)
    st.send_signal(signal.SIGINT)
    st.wait(30)
    return timeouts(trace)


tmp = os.environ.get("TMPDIR") or "/tmp"
srv = Server(["memory", "size=8M"], opts=["--shards", "1", "--handshake-timeout", "2"])
a = RawClient(srv, timeout=30)
a.handshake(structured=False)
time.sleep(1.5)                     # the sweep after a's arrival found nobody to watch

t1 = traced(srv, os.path.join(tmp, "blkd-sleep-timer.%d.1" % os.getpid()), a, 20)
check(len(t1) >= 5, "the shard slept between requests (%d epoll_wait calls)" % len(t1))
check(all(t == -1 for t in t1),
      "every sleep without a timeout while no connection can time out", str(sorted(set(t1))))

b = RawClient(srv, timeout=30)
b.greeting()                        # and no more: its handshake stands open
t2 = traced(srv, os.path.join(tmp, "blkd-sleep-timer.%d.2" % os.getpid()), a, 20)
check(any(0 <= t <= 1000 for t in t2),
      "a connection in its handshake brings the sweep back (a timeout up to 1 s)",
      str(sorted(set(t2))))
check(peer_closed(b.sock, timeout=10), "--handshake-timeout still closes that connection")
a.send_request(NBD_CMD_READ, 0, 4096, cookie=77)
check_eq(a.recv_reply(4096)[:2], (77, 0), "the first connection still works")
a.close()
srv.check_alive()
srv.stop()
