#!/usr/bin/python3
# A socket that refuses SO_RCVLOWAT while the receive low-water mark is
# raised (the rest of a big WRITE's payload, or the acknowledgement mark
# of a big-write stream) keeps that mark.  The shard must then not sleep
# on it: a lone small request after the stream would never wake it.  It
# answers what came and closes instead.  strace fails the shard's second
# setsockopt after it attaches, which is always one from a raised mark
# (the first one raises it from the kernel's default of one byte).  The
# client's stream is answered or the connection closed, within the
# socket timeout, never a hang; another client is served after.
import os
import shutil
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

if IS_NBDKIT:
    skip("the receive low-water mark is blkd's")
if not shutil.which("strace"):
    skip("strace is not installed")

K = 1024
BS = 256 * K
N = 16
TIMEOUT = 20


def send_stream(c, stream):
    try:
        c.sock.sendall(stream)
    except OSError:
        pass                      # closed: the server gave up on the connection


# memory copies a payload out of a pool buffer; ram receives it into
# chunks of its own (placed), which a close mid-payload must give back.
for plugin in (["memory", "64M"], ["ram", "size=64M"]):
    srv = Server(plugin, opts=["--shards", "1", "--poll-us", "0"])
    c = RawClient(srv, timeout=TIMEOUT)
    c.handshake(structured=False)
    trace = os.path.join(TMP, "strace-lowat-" + plugin[0])
    st = strace_attach(srv, trace, "setsockopt", inject="setsockopt:error=ENOBUFS:when=2")

    stream = b"".join(RawClient.request(NBD_CMD_WRITE, i * BS, BS, cookie=i) + os.urandom(BS)
                      for i in range(N))

    sender = threading.Thread(target=send_stream, args=(c, stream), daemon=True)
    sender.start()
    answered, closed = 0, False
    try:
        for _ in range(N):
            hdr = c.sock.recv(16, socket.MSG_WAITALL)
            if len(hdr) < 16:
                closed = True
                break
            magic, err, cookie = struct.unpack(">IIQ", hdr)
            check_eq((magic, err), (NBD_SIMPLE_REPLY_MAGIC, 0), "write %d answered" % cookie)
            answered += 1
        if not closed:
            c.send_request(NBD_CMD_READ, 0, 4096, cookie=999)
            hdr = c.sock.recv(16, socket.MSG_WAITALL)
            closed = len(hdr) < 16
            if not closed:
                check_eq(struct.unpack(">IIQ", hdr)[2], 999, "the lone READ answered")
    except socket.timeout:
        fail("after %d of %d writes answered, nothing for %d s: the shard sleeps on a "
             "mark it could not lower" % (answered, N, TIMEOUT))
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    sender.join(TIMEOUT)
    c.close()
    st.terminate()
    st.wait(timeout=10)
    with open(trace) as f:
        injected = [line for line in f if "INJECTED" in line]
    check(any("SO_RCVLOWAT" in line for line in injected), "a SO_RCVLOWAT setsockopt was failed")
    print("  %d of %d writes answered, then %s" % (answered, N, "closed" if closed else "a lone READ"))
    ok("%s: a refused SO_RCVLOWAT: answered or closed, never asleep on the mark" % plugin[0])

    h = nbd_connect(srv)
    check_eq(len(h.pread(4096, 0)), 4096, "another client is served after")
    h.shutdown()
    srv.check_alive()
    srv.stop()
