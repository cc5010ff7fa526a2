#!/usr/bin/python3
# Live restart (SIGUSR2) of a connection that negotiated extended headers:
# the new image keeps answering its 32-byte requests with extended
# replies (a WRITE, a READ and a 64-bit BLOCK_STATUS after the restart),
# and a 32-byte header half sent when the signal comes is read whole by
# the old image, answered, and only then handed over.  Without the
# extended flag in the handed-over state the new image would parse the
# client's 32-byte requests as 28-byte compact ones and lose the stream.
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from restarttest import *  # noqa: E402,F401,F403

need_server()
if IS_NBDKIT:
    skip("live restart (SIGUSR2) and extended headers are blkd's")

KiB = 1024
img = disk("ext.img", 4 * 1024 * KiB)
srv = restart_server(["file", "file=" + img])
c = RawClient(srv)
c.handshake(extended=True, meta=True)
check(c.extended, "extended headers negotiated")

cookie = [0]


def write(off, data):
    cookie[0] += 1
    c.send_request(NBD_CMD_WRITE, off, len(data), cookie[0], payload=data)
    got, err, chunks, _ = c.recv_reply()
    check_eq((got, err), (cookie[0], 0), "WRITE at %d answered" % off)
    check(chunks is not None, "WRITE at %d: an extended (chunked) reply" % off)


def read(off, n):
    cookie[0] += 1
    c.send_request(NBD_CMD_READ, off, n, cookie[0])
    got, err, chunks, _ = c.recv_reply()
    check_eq((got, err), (cookie[0], 0), "READ at %d answered" % off)
    data, _types = read_via_chunks(chunks, off, n)
    return data


a = bytes((i * 7) & 0xff for i in range(64 * KiB))
write(0, a)
restart(srv)
check_eq(read(0, len(a)), a, "data written before the restart, read after it")
b = bytes((i * 13 + 1) & 0xff for i in range(64 * KiB))
write(1024 * KiB, b)
check_eq(read(1024 * KiB, len(b)), b, "data written after the restart")

cookie[0] += 1
c.send_request(NBD_CMD_BLOCK_STATUS, 0, 4 * 1024 * KiB, cookie[0])
got, err, chunks, _ = c.recv_reply()
check_eq((got, err), (cookie[0], 0), "BLOCK_STATUS after the restart answered")
check_eq([t for t, _f, _p in chunks], [NBD_REPLY_TYPE_BLOCK_STATUS_EXT],
         "BLOCK_STATUS after the restart: one 64-bit extents chunk")

# Half a 32-byte header in the socket when the signal comes: the old image
# waits for the rest (well within --restart-timeout), answers it, then
# hands the connection over at the request boundary.
cookie[0] += 1
hdr = c.ext_request(NBD_CMD_READ, 0, 4 * KiB, cookie[0])
c.sock.sendall(hdr[:20])
n = count(srv, DONE) + 1
os.kill(srv.proc.pid, signal.SIGUSR2)
time.sleep(0.5)
c.sock.sendall(hdr[20:])
got, err, chunks, _ = c.recv_reply()
check_eq((got, err), (cookie[0], 0), "READ whose header straddled the signal answered")
check_eq(read_via_chunks(chunks, 0, 4 * KiB)[0], a[:4 * KiB],
         "READ whose header straddled the signal: right data")
wait_log(srv, DONE, n, 30, "the restart after the split header")
check_eq(read(0, 4 * KiB), a[:4 * KiB], "a READ after that restart")

c.close()
srv.stop()
print("live restart with extended headers done")
