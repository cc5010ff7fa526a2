#!/usr/bin/python3
"""The invariant that lets the buffer pool skip memset (--iobuf=pool): no byte of
an earlier request, of any client, ever reaches a reply.

Client A writes a secret pattern through every buffer size class, so the
pool's recycled buffers hold it.  Client B then reads from the `partial`
test plugin, which fills only half of some reads before failing with EIO,
and reports a hole over the first quarter of the disk.  B must see the
plugin's bytes, zeros, or errors -- never A's secret -- with structured
replies (holes as OFFSET_HOLE chunks) and with simple replies, under
--iobuf=pool and --iobuf=calloc, inline and on workers.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import (TOP, Server, check, check_eq, fail, need_nbd, nbd_connect,
                      nbd_errno, ok, skip, IS_NBDKIT)

nbd = need_nbd()
if IS_NBDKIT:
    skip("tests blkd's buffer pool")
PLUGIN = os.path.join(TOP, "plugins", "partial", "nbdkit-partial-plugin.so")
if not os.path.exists(PLUGIN):
    skip("partial test plugin not built (make all)")

SIZE = 64 << 20
SECRET = 0xC3
SIZES = [4096, 65536, 256 << 10, 1 << 20, 4 << 20]


def poison_pool(srv):
    """Client A: writes and reads that leave SECRET in buffers of every size."""
    a = nbd_connect(srv)
    for n in SIZES:
        buf = bytes([SECRET]) * n
        for i in range(4):
            # Writes are discarded by the plugin, but their payloads sat in
            # pool buffers, which is all this needs.
            a.pwrite(buf, (SIZE // 4) + i * n)
    a.shutdown()


def no_secret(data, what):
    if bytes([SECRET]) in data:
        fail("%s: a byte of another client's write reached this reply" % what)


def check_reads(srv, structured):
    b = nbd.NBD()
    b.set_request_structured_replies(structured)
    b.connect_uri(srv.uri)
    mode = "structured" if structured else "simple"
    for n in SIZES:
        poison_pool(srv)
        # Hole region: zeros, never the secret.
        d = b.pread(n, 0)
        no_secret(d, "%s read of a hole (%d bytes)" % (mode, n))
        check(d == bytes(n), "%s read of %d hole bytes is zeros" % (mode, n))
        # Data region in the first half: the plugin's bytes.
        d = b.pread(n, SIZE // 4)
        check(d == bytes([0x5A]) * n, "%s read of %d data bytes is the plugin's" % (mode, n))
        # Straddling hole and data.
        d = b.pread(n, SIZE // 4 - n // 2)
        no_secret(d, "%s read across hole and data" % mode)
        check(d == bytes(n // 2) + bytes([0x5A]) * (n - n // 2),
              "%s read of %d bytes across the hole's end" % (mode, n))
        # Second half: the plugin fills half, then fails -- an error, no data.
        poison_pool(srv)
        try:
            d = b.pread(n, SIZE // 2 + n)
            no_secret(d, "%s read that the plugin failed" % mode)
            fail("%s read of %d bytes that the plugin failed returned data" % (mode, n))
        except nbd.Error as e:
            check_eq(nbd_errno(e), 5, "%s partial read of %d bytes fails with EIO" % (mode, n))
    # The connection is still in step after all those errors.
    check(b.pread(4096, SIZE // 4) == bytes([0x5A]) * 4096, "%s connection still usable" % mode)
    b.shutdown()


for opts in (["--iobuf=pool"], ["--iobuf=calloc"], ["--iobuf=pool", "--dispatch=worker"],
             ["--iobuf=pool", "--shards=1"]):
    print("# blkd %s" % " ".join(opts))
    srv = Server([PLUGIN, "size=%d" % SIZE], opts=opts)
    check_reads(srv, structured=True)
    check_reads(srv, structured=False)
    srv.check_alive()
    srv.stop()
ok("no stale bytes reached any reply")
