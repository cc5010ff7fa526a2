#!/usr/bin/python3
# Lent READ replies count against the connection's share of buffer memory
# until they are sent, as pooled replies do.  A lent reply hands its pool
# buffer back at once, but it pins the plugin's memory instead (a ram
# chunk that a TRIM or a placed WRITE replaced stays alive for it), so a
# client that sends READs and never reads the replies must not get more
# lent than its share (--iobuf-mem / shards / 4, here 16 MiB): else one
# connection could keep up to --max-inflight replaced chunks alive while
# another rewrites the range.  The client sends 64 READs of 2 MiB and reads
# them back one at a time; before each, blkd_lend_bytes must be within the
# share plus one request.  A second connection rewrites the range in place
# meanwhile, and every reply must still carry old or new bytes only.
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from lendtest import MiB, metrics, read_data, read_requests, wait_metric  # noqa: E402

nbd = need_nbd()
if IS_NBDKIT:
    skip("lending is blkd's extension")

SHARE = 16 * MiB                          # 64M / 1 shard / 4
srv = Server(["ram", "size=64M"], opts=["--shards", "1", "--iobuf-mem", "64M", "--max-request", "2M",
                                        "--metrics", "127.0.0.1:0"])
mport = srv.metrics_port
w = nbd_connect(srv)
OLD, NEW = 0x11, 0x22
w.pwrite(bytes([OLD]) * (2 * MiB), 0)
w.flush()

c = RawClient(srv, timeout=60)
c.handshake(structured=False)
ranges = [(0, 2 * MiB)] * 64
base = metrics(mport)["blkd_lend_replies_total"]
read_requests(c, ranges)
# Some READs are lent before anything is read (the first always fits).
wait_metric(mport, lambda m: m["blkd_lend_replies_total"] > base, "first READ lent")
w.pwrite(bytes([NEW]) * (2 * MiB), 0)    # placed: replaces the lent chunks

most = 0
for n in range(len(ranges)):
    lent = metrics(mport)["blkd_lend_bytes"]
    most = max(most, lent)
    if lent > SHARE + 2 * MiB:
        fail("before reply %d: %d MiB lent to one connection that reads nothing, "
             "its share is %d MiB" % (n, lent // MiB, SHARE // MiB))
    i, data = read_data(c, ranges)
    if not set(data) <= {OLD, NEW}:
        fail("reply %d carries bytes %s that are neither old nor new" % (n, sorted(set(data))[:4]))
ok("64 unread READs of 2 MiB: at most %d MiB lent at once (share %d MiB)" % (most // MiB, SHARE // MiB))
check(metrics(mport)["blkd_lend_replies_total"] >= base + 64, "every READ was lent")
c.disconnect()
wait_metric(mport, lambda m: m["blkd_lend_bytes"] == 0 and m["blkd_requests_in_flight"] == 0,
            "lent memory released")
w.shutdown()
srv.check_alive()
srv.stop()
print("lend share checks passed")
