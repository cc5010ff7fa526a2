#!/usr/bin/python3
# rawio sends READ data with sendfile from the page cache.  When the file
# shrinks under replies already queued (another program truncates it),
# sendfile runs out of file before the bytes the reply header promised.
# rawio's pread reads past the end of the file as zeros, so a client must
# get the same from a sendfile reply: the file's bytes up to the new end,
# then zeros, never stale pool bytes, and the connection must go on (a
# closed connection would fail every other request in flight on it).
# The warning about it is logged once per connection, not per reply.
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from lendtest import MiB, metrics, read_data, read_requests, wait_metric, need_cachestat  # noqa: E402

nbd = need_nbd()
if IS_NBDKIT:
    skip("sendfile replies are blkd's extension")

SIZE = 32 * MiB
N = 512 * 1024
path = os.path.join(TMP, "disk.img")
golden = os.urandom(SIZE)
with open(path, "wb") as f:
    f.write(golden)
need_cachestat(path)
srv = Server(["rawio", "file=" + path], opts=["--metrics", "127.0.0.1:0"])
mport = srv.metrics_port


def file_then_zeros(data, off):
    """True when data is the file's bytes at off up to some point, then zeros."""
    want = golden[off:off + len(data)]
    k = 0
    while k < len(data) and data[k] == want[k]:
        k += 1
    return data[k:].count(0) == len(data) - k


for structured in (False, True):
    with open(path, "wb") as f:                # whole again, and in the page cache
        f.write(golden)
    with open(path, "rb") as f:
        f.read()
    c = RawClient(srv, timeout=60)
    c.handshake(structured=structured)
    base = metrics(mport)["blkd_sendfile_replies_total"]
    ranges = [(i * N, N) for i in range(SIZE // N)]
    read_requests(c, ranges)
    # The client reads nothing, so most replies wait behind a full socket.
    m = wait_metric(mport, lambda m: m["blkd_sendfile_replies_total"] >= base + len(ranges),
                    "every READ answered with sendfile")
    os.truncate(path, MiB)
    shape = "structured" if structured else "simple"
    zeros = 0
    for _ in ranges:
        try:
            i, data = read_data(c, ranges)
        except EOFError as e:
            fail("%s: the connection closed after the file shrank (%s)" % (shape, e))
        if not file_then_zeros(data, ranges[i][0]):
            fail("%s: reply at %d carries bytes that are neither the file's nor zeros"
                 % (shape, ranges[i][0]))
        zeros += data.count(0) == len(data)
    check(zeros > 0, "%s: replies past the new end of the file read as zeros (%d of %d)"
          % (shape, zeros, len(ranges)))
    # The connection goes on.
    c.sock.sendall(RawClient.request(NBD_CMD_READ, 0, 4096, cookie=999))
    cookie, err, chunks, data = c.recv_reply(4096)
    if chunks is not None:
        data = read_via_chunks(chunks, 0, 4096)[0]
    check(cookie == 999 and err == 0 and data == golden[:4096],
          "%s: the connection still answers after the short file" % shape)
    c.disconnect()

wait_metric(mport, lambda m: m["blkd_requests_in_flight"] == 0, "nothing in flight")
# Many replies ran out of file on each connection; the warning is said
# once per connection, not once per reply.
with open(srv.log_path, "rb") as f:
    warned = f.read().count(b"file ended")
check_eq(warned, 2, "the short-file warning is logged once per connection (2 connections)")
srv.check_alive()
srv.stop()
print("sendfile shrink checks passed")
