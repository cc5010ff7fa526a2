#!/usr/bin/python3
# While the shard works through a stream of big WRITEs it raises the
# socket's receive low-water mark far above anything queued, so that TCP
# acknowledges arriving segments at once instead of when the shard reads
# them, and puts the mark back (the rest of a payload, or one byte)
# before it sleeps: a shard asleep with the raised mark would wait for
# bytes the client may never send.  strace shows the order of the
# shard's setsockopt(SO_RCVLOWAT) and epoll_wait calls: the raised mark
# appears during a pipelined stream of 256 KiB WRITEs, and every sleep
# comes after a mark of at most one payload's rest.  Every write reads
# back, and a lone request after the stream is answered.
import os
import re
import shutil
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

if IS_NBDKIT:
    skip("the acknowledgement mark is blkd's")
if not shutil.which("strace"):
    skip("strace is not installed")

K = 1024
MiB = 1024 * K
BS = 256 * K
N = 32
RAISED = 8 * MiB
PAYLOAD_MARK_MAX = MiB            # conn.c's LOWAT_MAX


def stream(srv, trace):
    """N pipelined big WRITEs, then a lone READ, with the shard's
    setsockopt and epoll_wait calls traced; returns the blocks written."""
    st = strace_attach(srv, trace, "setsockopt,epoll_wait")
    c = RawClient(srv)
    c.handshake(structured=False)
    blocks = [os.urandom(BS) for _ in range(N)]
    data = b"".join(RawClient.request(NBD_CMD_WRITE, i * BS, BS, cookie=i) + blocks[i]
                    for i in range(N))
    # Send from a thread: the replies come back while the stream is still
    # being written, and both directions must move.
    sender = threading.Thread(target=c.sock.sendall, args=(data,))
    sender.start()
    for _ in range(N):
        cookie, err, _, _ = c.recv_reply()
        check_eq(err, 0, "write %d answered without error" % cookie)
    sender.join(60)
    check(not sender.is_alive(), "the whole stream was sent")
    # A lone small request after the stream: answered, so the shard did not
    # sleep with a mark the client never reaches.
    c.send_request(NBD_CMD_READ, 0, 4096, cookie=999)
    cookie, err, _, data = c.recv_reply(4096)
    check_eq((cookie, err), (999, 0), "a lone READ after the stream is answered")
    check(data == blocks[0][:4096], "it reads the stream's first block")
    c.close()
    time.sleep(0.5)
    st.send_signal(signal.SIGINT)
    st.wait(timeout=10)
    return blocks


srv = Server(["memory", "64M"], opts=["--shards", "1", "--poll-us", "0"])
h = nbd_connect(srv)
trace = os.path.join(TMP, "strace-ackmark")
blocks = stream(srv, trace)

for i in range(N):
    if h.pread(BS, i * BS) != blocks[i]:
        fail("write %d does not read back" % i)
ok("%d pipelined 256 KiB writes read back" % N)
h.shutdown()
srv.stop()

# Per thread, in order: each mark set, and each sleep with the mark then.
marks = {}
raised = 0
bad = []
sleeps = 0
with open(trace) as f:
    for line in f:
        m = re.match(r"(\d+)\s+setsockopt\(\d+, SOL_SOCKET, SO_RCVLOWAT, \[(\d+)\]", line)
        if m:
            marks[m.group(1)] = int(m.group(2))
            raised += int(m.group(2)) == RAISED
            continue
        m = re.match(r"(\d+)\s+epoll_wait\(", line)
        if m and m.group(1) in marks:
            sleeps += 1
            if marks[m.group(1)] > PAYLOAD_MARK_MAX:
                bad.append(marks[m.group(1)])
print("  %d raised marks, %d sleeps of the shard after its first mark" % (raised, sleeps))
check(raised > 0, "the mark is raised while the shard works through the stream")
check(sleeps > 0, "the shard slept during the test (the trace covers it)")
check_eq(bad, [], "the shard never sleeps with a mark above one payload's rest")
ok("acknowledgement mark raised while working, lowered before every sleep")

# A Unix socket has no acknowledgements to hurry (and its poll ignores
# the mark): a stream there never raises it.
srv = Server(["memory", "64M"], unix=True, opts=["--shards", "1", "--poll-us", "0"])
trace = os.path.join(TMP, "strace-ackmark-unix")
stream(srv, trace)
srv.stop()
with open(trace) as f:
    raised = sum(1 for line in f if "SO_RCVLOWAT, [%d]" % RAISED in line)
check_eq(raised, 0, "no raised mark on a Unix socket")
ok("Unix socket: the stream is answered without the acknowledgement mark")
