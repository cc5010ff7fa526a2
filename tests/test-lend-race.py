#!/usr/bin/python3
# ram lends its chunks to READ replies (blkd's plugin extension).  A chunk
# lent to a reply the client has not read yet must never be freed or
# reused: a TRIM, WRITE_ZEROES or overwrite of the same range from another
# connection meanwhile may change what the reply carries only to the old
# or the new bytes of that range, never to anyone else's.  The reader
# sends 64 READs of 1 MiB and reads nothing until the server has lent
# them all (blkd_lend_bytes); then the other connection trims, zeroes and
# overwrites the range and fills fresh memory elsewhere with 0xEE (malloc
# would hand it the freed chunks); only then are the replies read.
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from lendtest import MiB, metrics, read_data, read_requests, wait_metric  # noqa: E402

nbd = need_nbd()
if IS_NBDKIT:
    skip("lending is blkd's extension; nbdkit copies")

mport = free_port()
srv = Server(["ram", "size=256M"], opts=["--metrics", "127.0.0.1:%d" % mport])
R = 16 * MiB                             # the raced range: four 4 MiB quarters
FOREIGN = 64 * MiB                       # where 0xEE goes
OLD, NEW, JUNK = 0x11, 0x22, 0xEE
# What each quarter may read back: trimmed, zeroed, overwritten, untouched.
ALLOWED = [{OLD, 0}, {OLD, 0}, {OLD, NEW}, {OLD}]

w = nbd_connect(srv)


def one_round(structured, rnd):
    w.pwrite(bytes([OLD]) * R, 0)
    w.zero(32 * MiB, FOREIGN)            # the junk region starts as a hole
    base = metrics(mport)
    c = RawClient(srv)
    c.handshake(structured=structured)
    ranges = [((i % 16) * MiB, MiB) for i in range(64)]
    read_requests(c, ranges)
    # Every READ lent; most of it is still unsent (the client reads nothing).
    wait_metric(mport, lambda m: m["blkd_lend_replies_total"] >= base["blkd_lend_replies_total"] + 64
                and m["blkd_lend_bytes"] > 0, "64 READs lent")

    w.trim(4 * MiB, 0)
    w.zero(4 * MiB, 4 * MiB)
    w.pwrite(bytes([NEW]) * (4 * MiB), 8 * MiB)
    for i in range(32):                  # fresh chunks: malloc reuses freed ones
        w.pwrite(bytes([JUNK]) * MiB, FOREIGN + i * MiB)
    w.flush()

    seen = set()
    for _ in ranges:
        i, data = read_data(c, ranges)
        off = ranges[i][0]
        got = set(data)
        seen |= got
        if JUNK in got:
            fail("round %d: READ at %d MiB carries 0xEE from elsewhere on the disk: "
                 "a lent chunk was freed and reused" % (rnd, off // MiB))
        allowed = ALLOWED[off // (4 * MiB)]
        if not got <= allowed:
            fail("round %d: READ at %d MiB has bytes %s, only %s are old or new there"
                 % (rnd, off // MiB, sorted(got - allowed), sorted(allowed)))
    c.close()
    ok("round %d (%s): 64 lent READs raced TRIM/WRITE_ZEROES/overwrite: old or new "
       "bytes only (saw %s)" % (rnd, "structured" if structured else "simple", sorted(seen)))
    wait_metric(mport, lambda m: m["blkd_lend_bytes"] == 0, "lent memory released")
    # Later reads see the new state.
    check_eq(set(w.pread(4 * MiB, 0)), {0}, "trimmed quarter reads zeros")
    check_eq(set(w.pread(4 * MiB, 8 * MiB)), {NEW}, "overwritten quarter reads new data")


for rnd, structured in enumerate([False, True, False, True]):
    one_round(structured, rnd)
w.shutdown()
srv.check_alive()
srv.stop()

# The same with plugin calls on worker threads: lent there, released on
# the connection's shard thread.
mport = free_port()
srv = Server(["ram", "size=256M"], opts=["--dispatch=worker", "--metrics", "127.0.0.1:%d" % mport])
w = nbd_connect(srv)
for rnd, structured in enumerate([True, False], start=4):
    one_round(structured, rnd)
w.shutdown()
srv.stop()

# A cache between protocol and plugin must see the data: nothing is lent
# or placed, and the data is right.
mport = free_port()
srv = Server(["ram", "size=64M"], opts=["--cache", "8M", "--metrics", "127.0.0.1:%d" % mport])
w = nbd_connect(srv)
data = os.urandom(4 * MiB)
w.pwrite(data, 0)
check_eq(w.pread(4 * MiB, 0), data, "--cache: data reads back")
m = metrics(mport)
check_eq((m["blkd_lend_replies_total"], m["blkd_write_placed_total"]), (0, 0),
         "--cache: nothing lent or placed")
w.shutdown()
print("lend race checks passed")
