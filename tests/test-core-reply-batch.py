#!/usr/bin/python3
# --reply-batch N: a clear-text connection's small replies go out once N
# of them wait, not only after every request read in one go is answered,
# so a client that refills its queue as replies come back is woken while
# the shard still serves the rest.  32 pipelined 2 KiB READs sent in one
# segment are read by the shard in one go and answered inline (memory);
# strace counts the sendmsg calls that carry their replies: 32 / N with
# --reply-batch N (8 by default), one with --reply-batch 0.  Every reply is right either
# way (cookies, data).  A value that is not a count in range is refused
# at start.
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

N = 32
BS = 2048

if IS_NBDKIT:
    skip("--reply-batch is blkd's")
if not shutil.which("strace"):
    skip("strace is not installed")


def sends_for(batch):
    """The server's sendmsg calls that answered one burst of N READs
    (batch None: the default)."""
    opts = ["--shards", "1"] + ([] if batch is None else ["--reply-batch", str(batch)])
    srv = Server(["memory", "1M"], opts=opts)
    c = RawClient(srv)
    c.handshake(structured=False)
    # Known data to read back: one WRITE per block.
    for i in range(N):
        c.send_request(NBD_CMD_WRITE, i * BS, BS, cookie=1000 + i, payload=bytes([i + 1]) * BS)
        cookie, error, _, _ = c.recv_reply()
        check_eq((cookie, error), (1000 + i, 0), "write %d" % i)
    trace = os.path.join(TMP, "strace-%s" % batch)
    st = strace_attach(srv, trace, "sendmsg")
    c.sock.sendall(b"".join(RawClient.request(NBD_CMD_READ, i * BS, BS, cookie=i)
                            for i in range(N)))
    for i in range(N):
        cookie, error, _, data = c.recv_reply(BS)
        check_eq((cookie, error), (i, 0), "reply %d in order, no error" % i)
        check(data == bytes([i + 1]) * BS, "reply %d carries block %d" % (i, i))
    time.sleep(0.5)
    st.send_signal(signal.SIGINT)
    st.wait(timeout=10)
    c.close()
    srv.stop()
    with open(trace) as f:
        calls = [line for line in f if "sendmsg(" in line and "= -1" not in line]
    return len(calls)


for bad in ("-1", "65537", "x", ""):
    r = subprocess.run([BLKD, "--reply-batch", bad, "memory", "1M"], capture_output=True,
                       text=True, timeout=10)
    check(r.returncode == 1 and "--reply-batch" in r.stderr,
          "--reply-batch %r is refused at start" % bad, r.stderr.strip())

for batch, want in ((None, N // 8), (16, N // 16), (0, 1)):
    n = sends_for(batch)
    name = "--reply-batch %d" % batch if batch is not None else "the default (8)"
    print("  %s: %d sendmsg calls for %d replies" % (name, n, N))
    check_eq(n, want, "%s: replies in %d send(s)" % (name, want))
ok("replies go out every --reply-batch, or once per batch with 0")
