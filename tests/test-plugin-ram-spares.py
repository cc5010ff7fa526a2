#!/usr/bin/python3
# ram keeps chunks whose last reference went as spares and hands them
# out again (a stream of placed WRITEs frees a chunk for every one it
# allocates).  A spare still holds the bytes of the chunk it was, so
# every caller must fill it whole before anyone reads it.  Checks: after
# a trim and after a placed payload cut off half way (both leave spares
# full of old data), partial writes into chunks never written before
# read back as the piece with zeros around it, and whole-chunk rewrites
# cycling through the spares read back exactly, each time.
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

nbd = need_nbd()
K = 1024
MiB = 1024 * K
CHUNK = 64 * K

srv = Server(["ram", "size=256M"])
h = nbd_connect(srv)


def fresh_pieces(base, n, what):
    """n partial writes, each into a chunk never written before: the
    chunk must read back as zeros around the piece."""
    for i in range(n):
        chunk = base + i * CHUNK
        at = 1000 + 37 * i
        piece = os.urandom(4 * K)
        h.pwrite(piece, chunk + at)
        got = h.pread(CHUNK, chunk)
        want = bytes(at) + piece + bytes(CHUNK - at - len(piece))
        if got != want:
            stale = sum(1 for b in got[:at] + got[at + len(piece):] if b)
            fail("%s: fresh chunk %d reads back %d stale non-zero bytes" % (what, i, stale))
    ok("%s: %d partial writes into fresh chunks read back with zero margins" % (what, n))


# Old data everywhere in 4 MiB (64 chunks, whole-chunk writes), then
# trimmed: those chunks become spares still full of 0xee.
h.pwrite(b"\xee" * (4 * MiB), 0)
h.trim(4 * MiB, 0)
check_eq(h.pread(4 * MiB, 0), bytes(4 * MiB), "the trimmed range reads as zeros")
fresh_pieces(64 * MiB, 80, "after a trim")

# A placed payload cut off half way: its fresh chunks (spares, then
# filled with 0xdd) go back unpublished.
if not IS_NBDKIT:
    for cut in (CHUNK + 1, 3 * CHUNK, MiB - 1):
        c = RawClient(srv)
        c.handshake(structured=False)
        c.sock.sendall(RawClient.request(NBD_CMD_WRITE, 16 * MiB, MiB, cookie=3) + b"\xdd" * cut)
        c.close()
    check_eq(h.pread(MiB, 16 * MiB), bytes(MiB), "cut-off payloads left nothing behind")
    fresh_pieces(96 * MiB, 80, "after cut-off placed payloads")

# Whole-chunk rewrites of one range: each frees the chunks it replaces,
# which the next one takes.
for i in range(12):
    data = os.urandom(MiB)
    h.pwrite(data, 32 * MiB)
    if h.pread(MiB, 32 * MiB) != data:
        fail("rewrite %d does not read back" % i)
ok("12 whole-chunk rewrites of one range read back exactly")
fresh_pieces(128 * MiB, 40, "after rewrites")

h.shutdown()
srv.check_alive()
print("ram spare checks passed")
