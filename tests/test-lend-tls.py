#!/usr/bin/python3
# TLS reads of lent ram chunks: OpenSSL seals the plaintext straight from
# the lent memory.
# Reads of every shape must equal what was written, the replies must
# really have been lent (blkd_lend_replies_total), a hang-up with lent TLS
# replies unsent must release them, and rawio over TLS must not use
# sendfile (the kernel cannot seal) yet read the same bytes.
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from lendtest import MiB, metrics, wait_metric  # noqa: E402

nbd = need_nbd()
if IS_NBDKIT:
    skip("lending is blkd's extension")

T = tls_material()
PSK = os.path.join(T, "keys.psk")


def tls_connect(srv, structured=True):
    h = nbd.NBD()
    h.set_tls(nbd.TLS_REQUIRE)
    h.set_tls_username("alice")
    h.set_tls_psk_file(PSK)
    h.set_request_structured_replies(structured)
    h.connect_uri(srv.uri)
    return h


rng = random.Random(5)
golden = bytearray(os.urandom(16 * MiB))
shapes = [(0, MiB), (MiB + 17, 300000), (4096, 4096), (5, 70000), (15 * MiB, MiB)]
shapes += [(o, rng.randint(1, 2 * MiB)) for o in (rng.randrange(0, 14 * MiB) for _ in range(12))]

srv = Server(["ram", "size=64M"], opts=["--tls=require", "--tls-psk", PSK,
                                        "--metrics", "127.0.0.1:0"])
mport = srv.metrics_port
h = tls_connect(srv)
for i in range(16):
    h.pwrite(bytes(golden[i * MiB:(i + 1) * MiB]), i * MiB)
for structured in (True, False):
    c = h if structured else tls_connect(srv, structured=False)
    before = metrics(mport)["blkd_lend_replies_total"]
    for off, n in shapes:
        if c.pread(n, off) != golden[off:off + n]:
            fail("%s read at %d+%d differs" % ("structured" if structured else "simple", off, n))
    lent = metrics(mport)["blkd_lend_replies_total"] - before
    check(lent >= len(shapes), "%s: %d reads of lent chunks equal the data"
          % ("structured" if structured else "simple", len(shapes)))
    if c is not h:
        c.shutdown()
# Many lent reads in flight, then a hang-up without reading them all.
c = tls_connect(srv)
bufs = [nbd.Buffer(MiB) for _ in range(32)]
for i, b in enumerate(bufs):
    c.aio_pread(b, (i % 16) * MiB)
while c.aio_in_flight() == 32 and metrics(mport)["blkd_lend_bytes"] == 0:
    c.poll(1)                        # sends the requests, reads a little
del c                                # closes the socket, replies unread
wait_metric(mport, lambda m: m["blkd_lend_bytes"] == 0 and m["blkd_requests_in_flight"] == 0,
            "lent TLS replies released after a hang-up")
ok("hang-up with lent TLS replies released them")
check_eq(h.pread(MiB, 3 * MiB), bytes(golden[3 * MiB:4 * MiB]), "read after the hang-up")
h.shutdown()
srv.check_alive()
srv.stop()

# rawio over TLS: copied (no sendfile), same bytes.
path = os.path.join(TMP, "disk.img")
with open(path, "wb") as f:
    f.write(golden)
srv = Server(["rawio", "file=" + path], opts=["--tls=require", "--tls-psk", PSK,
                                              "--metrics", "127.0.0.1:0"])
mport = srv.metrics_port
h = tls_connect(srv)
for off, n in shapes:
    if h.pread(n, off) != golden[off:off + n]:
        fail("rawio over TLS: read at %d+%d differs" % (off, n))
check_eq(metrics(mport)["blkd_sendfile_replies_total"], 0, "rawio over TLS reads without sendfile")
h.shutdown()
print("lend TLS checks passed")
