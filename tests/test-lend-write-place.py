#!/usr/bin/python3
# WRITE payloads received in place (ram, blkd's plugin extension): an
# aligned whole-chunk WRITE is read from the socket straight into fresh
# chunks, swapped in only once the payload is complete.  Checks: placed
# writes read back; unaligned writes still work (copied); writes and
# payloads pipelined back to back stay in step; a client cut off in the
# middle of a placed payload leaves the old bytes of the whole request
# (none of the partial payload); a READ lent before a placed WRITE of the
# same range keeps sending the old chunk (the swap never writes into it).
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from lendtest import MiB, metrics, read_data, read_requests, wait_metric  # noqa: E402

nbd = need_nbd()
if IS_NBDKIT:
    skip("write-in-place is blkd's extension")
K = 1024

mport = free_port()
srv = Server(["ram", "size=64M"], opts=["--metrics", "127.0.0.1:%d" % mport])
h = nbd_connect(srv)


def placed():
    return metrics(mport)["blkd_write_placed_total"]


# Placed and copied writes read back.
p0 = placed()
data = os.urandom(256 * K)
h.pwrite(data, 2 * MiB)
check_eq(h.pread(256 * K, 2 * MiB), data, "aligned 256 KiB write reads back")
check(placed() == p0 + 1, "aligned 256 KiB write was received in place")
odd = os.urandom(256 * K)
h.pwrite(odd, 4 * MiB + 4096)
check_eq(h.pread(256 * K, 4 * MiB + 4096), odd, "unaligned write reads back")
check(placed() == p0 + 1, "unaligned write was copied, not placed")
big = os.urandom(4 * MiB)
h.pwrite(big, 8 * MiB)
check_eq(h.pread(4 * MiB, 8 * MiB), big, "4 MiB write (too many chunks to place) reads back")

# Pipelined: placed and small writes back to back on one raw connection.
c = RawClient(srv)
c.handshake(structured=True)
expect = {}
stream = b""
for i in range(24):
    off = 16 * MiB + i * 128 * K
    n = 128 * K if i % 3 else 4 * K
    payload = os.urandom(n)
    expect[off] = payload
    stream += RawClient.request(NBD_CMD_WRITE, off, n, cookie=100 + i) + payload
c.sock.sendall(stream)
for i in range(24):
    cookie, err, _, _ = c.recv_reply()
    if err:
        fail("pipelined write %d failed: %d" % (cookie, err))
c.close()
for off, payload in expect.items():
    if h.pread(len(payload), off) != payload:
        fail("pipelined write at %d does not read back" % off)
ok("24 pipelined writes (placed and copied) read back")

# Cut off in the middle of a placed payload: the old bytes stay.
old = os.urandom(MiB)
h.pwrite(old, 32 * MiB)
for cut in (1, 64 * K, 64 * K + 1, MiB // 2, MiB - 1):
    c = RawClient(srv)
    c.handshake(structured=False)
    c.sock.sendall(RawClient.request(NBD_CMD_WRITE, 32 * MiB, MiB, cookie=7) + b"\xee" * cut)
    wait_metric(mport, lambda m: m["blkd_write_placed_bytes"] > 0, "payload placed")
    c.close()
    wait_metric(mport, lambda m: m["blkd_write_placed_bytes"] == 0, "placed payload discarded")
    check_eq(h.pread(MiB, 32 * MiB), old, "cut after %d of %d payload bytes: old data kept" % (cut, MiB))

# A placed WRITE swaps chunks: a READ lent earlier keeps the old ones.
lent0 = metrics(mport)["blkd_lend_replies_total"]
c = RawClient(srv)
c.handshake(structured=True)
ranges = [(32 * MiB, MiB)] * 48
read_requests(c, ranges)
wait_metric(mport, lambda m: m["blkd_lend_replies_total"] >= lent0 + 48 and m["blkd_lend_bytes"] > 0,
            "48 READs lent")
base = placed()
new = os.urandom(MiB)
h.pwrite(new, 32 * MiB)
check(placed() == base + 1, "the overwrite was placed")
for i in range(48):
    cookie, got = read_data(c, ranges)
    if got != old and got != new:
        fail("READ %d lent before a placed overwrite is neither old nor new" % cookie)
    if got != old:
        fail("READ %d lent before the placed overwrite carries new bytes" % cookie)
c.close()
ok("48 READs lent before a placed overwrite all carry the old data")
check_eq(h.pread(MiB, 32 * MiB), new, "the next READ sees the new data")
wait_metric(mport, lambda m: m["blkd_lend_bytes"] == 0, "lent memory released")
h.shutdown()
srv.check_alive()
print("write-in-place checks passed")
