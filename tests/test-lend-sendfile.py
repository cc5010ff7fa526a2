#!/usr/bin/python3
# rawio without direct=true: blkd sends READ data from the page cache with
# sendfile (blkd's plugin extension), on clear-text connections, in simple
# replies and in the data chunk of structured ones.  Reads must equal the
# file, pipelined replies must stay in order around their headers, a
# client hanging up mid-send must not hurt, and TLS or direct=true must
# keep the copying path (no sendfile).
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from lendtest import MiB, metrics, read_data, read_requests, wait_metric, need_cachestat  # noqa: E402

nbd = need_nbd()
if IS_NBDKIT:
    skip("sendfile replies are blkd's extension")

SIZE = 32 * MiB
path = os.path.join(TMP, "disk.img")
golden = bytearray(os.urandom(SIZE))
with open(path, "wb") as f:
    f.write(golden)

need_cachestat(path)
srv = Server(["rawio", "file=" + path], opts=["--metrics", "127.0.0.1:0"])
mport = srv.metrics_port
rng = random.Random(17)
cases = [(0, MiB), (5 * MiB, 256 * 1024), (SIZE - 4096, 4096), (12345, 100000), (1, 1)]
cases += [(o, rng.randint(1, 2 * MiB)) for o in (rng.randrange(0, SIZE - 2 * MiB) for _ in range(20))]

for structured in (True, False):
    h = nbd.NBD()
    h.set_request_structured_replies(structured)
    h.connect_uri(srv.uri)
    before = metrics(mport)["blkd_sendfile_replies_total"]
    for off, n in cases:
        if h.pread(n, off) != golden[off:off + n]:
            fail("%s read at %d+%d differs from the file" % ("structured" if structured else "simple", off, n))
    sent = metrics(mport)["blkd_sendfile_replies_total"] - before
    # A page the kernel evicted meanwhile makes its read go by pread: most,
    # not necessarily all, are sent with sendfile.
    check(sent > 0, "%s replies: %d reads equal the file, %d sent with sendfile"
          % ("structured" if structured else "simple", len(cases), sent))

    # Pipelined: many replies queued, headers and file data interleaved.
    c = RawClient(srv)
    c.handshake(structured=structured)
    ranges = [(rng.randrange(0, SIZE - MiB), rng.choice([512, 4096, 65536, MiB])) for _ in range(48)]
    read_requests(c, ranges)
    answered = set()
    for _ in ranges:
        i, data = read_data(c, ranges)
        off, n = ranges[i]
        answered.add(i)
        if data != golden[off:off + n]:
            fail("pipelined read %d at %d+%d differs" % (i, off, n))
    check_eq(len(answered), len(ranges), "every pipelined read answered once")
    c.close()
    ok("48 pipelined %s reads equal the file" % ("structured" if structured else "simple"))
    h.pwrite(b"\x5a" * 8192, 8192)
    golden[8192:16384] = b"\x5a" * 8192
    check_eq(h.pread(8192, 8192), bytes(golden[8192:16384]), "a write is seen by the next sendfile read")
    h.shutdown()

# Hang up with sendfile replies unsent: the server goes on serving.
c = RawClient(srv)
c.handshake(structured=True)
read_requests(c, [((i % 30) * MiB, MiB) for i in range(64)])
c.close()
wait_metric(mport, lambda m: m["blkd_requests_in_flight"] == 0, "hung-up requests finished")
h = nbd_connect(srv)
check_eq(h.pread(MiB, 3 * MiB), bytes(golden[3 * MiB:4 * MiB]), "read after a hang-up mid-sendfile")
h.shutdown()
srv.check_alive()
srv.stop()

# Only ranges in the page cache are sent with sendfile (a miss would stall
# the event loop on the disk); a cold range is read by pread, which caches
# it, so the next READ of it goes out with sendfile.  tmpfs cannot drop
# pages, so this uses a file under build/.
dpath = os.path.join(TOP, "build", "lend-direct-%d.img" % os.getpid())
with open(dpath, "wb") as f:
    f.write(golden[:4 * MiB])
    f.flush()
    os.fsync(f.fileno())
fd = os.open(dpath, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
srv = Server(["rawio", "file=" + dpath], opts=["--metrics", "127.0.0.1:0"])
mport = srv.metrics_port
h = nbd_connect(srv)
cold = subprocess.run(["fincore", "-nb", "-o", "RES", dpath], capture_output=True, text=True).stdout.strip()
if cold == "0":
    n0 = metrics(mport)["blkd_sendfile_replies_total"]
    check_eq(h.pread(MiB, 2 * MiB), bytes(golden[2 * MiB:3 * MiB]), "cold range reads back")
    check_eq(metrics(mport)["blkd_sendfile_replies_total"], n0, "cold range: copied, no sendfile")
    check_eq(h.pread(MiB, 2 * MiB), bytes(golden[2 * MiB:3 * MiB]), "the same range again")
    check_eq(metrics(mport)["blkd_sendfile_replies_total"], n0 + 1, "now cached: sendfile")
else:
    note("could not drop %s from the page cache (%r resident): cold path not checked" % (dpath, cold))
h.shutdown()
srv.stop()

# direct=true keeps the pool path (where the filesystem has O_DIRECT).
try:
    fd = os.open(dpath, os.O_RDONLY | os.O_DIRECT)
    os.close(fd)
    direct_ok = True
except OSError:
    direct_ok = False
if direct_ok:
    srv = Server(["rawio", "file=" + dpath, "direct=true"], opts=["--metrics", "127.0.0.1:0"])
    mport = srv.metrics_port
    h = nbd_connect(srv)
    check_eq(h.pread(MiB, MiB), bytes(golden[MiB:2 * MiB]), "direct=true read")
    check_eq(metrics(mport)["blkd_sendfile_replies_total"], 0, "direct=true: no sendfile")
    h.shutdown()
    srv.stop()
else:
    note("no O_DIRECT on %s: direct=true not checked" % os.path.dirname(dpath))
os.unlink(dpath)
print("sendfile checks passed")
