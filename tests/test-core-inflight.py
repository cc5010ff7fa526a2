#!/usr/bin/python3
# Deep queues and multi-conn through libnbd: 128 requests in flight on one
# connection (writes, then reads, then a mix) all completing with exact
# data; and multi-conn consistency: what connection A wrote and flushed,
# connection B reads.
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

nbd = need_nbd()
need_server()
MiB = 1024 * 1024
DEPTH = 128
BS = 64 * 1024

srv = Server(["memory", "size=64M"])


def run_all(h, cookies, what):
    """Wait until every cookie completes; all must succeed."""
    peak = h.aio_in_flight()
    while h.aio_in_flight() > 0:
        h.poll(-1)
    failed = 0
    for c in cookies:
        try:
            if not h.aio_command_completed(c):
                fail("%s: command %d still not complete" % (what, c))
        except nbd.Error as e:
            failed += 1
            print("  command %d failed: %s" % (c, e.string))
    check_eq(failed, 0, "%s: failed commands" % what)
    return peak


h = nbd.NBD()
h.connect_uri(srv.uri)

print("# %d writes of %d KiB in flight on one connection" % (DEPTH, BS // 1024))
# Each block gets distinct content; block i goes to a scattered offset.
blocks = [os.urandom(BS) for _ in range(DEPTH)]
offsets = [((i * 37) % DEPTH) * BS * 3 for i in range(DEPTH)]     # 192 KiB stride, shuffled
bufs = [nbd.Buffer.from_bytearray(bytearray(b)) for b in blocks]
cookies = [h.aio_pwrite(bufs[i], offsets[i]) for i in range(DEPTH)]
peak = run_all(h, cookies, "128 writes")
print("  in flight when issued: %d" % peak)
check(peak > 1, "writes were really in flight together", "peak=%d" % peak)

print("# %d reads in flight, each with a completion callback; exact data" % DEPTH)
done = []
rbufs = [nbd.Buffer(BS) for _ in range(DEPTH)]


def completed(i):
    def cb(err):
        done.append((i, err.value))
        return 1            # retire the command
    return cb


for i in range(DEPTH):
    h.aio_pread(rbufs[i], offsets[i], completion=completed(i))
check(h.aio_in_flight() > 1, "reads were really in flight together",
      "in flight=%d" % h.aio_in_flight())
while h.aio_in_flight() > 0:
    h.poll(-1)
check_eq(len(done), DEPTH, "completion callbacks run")
check_eq(sorted(i for i, _ in done), list(range(DEPTH)), "each read completed once")
check_eq([e for _, e in done if e], [], "read errors")
bad = [i for i in range(DEPTH) if rbufs[i].to_bytearray() != blocks[i]]
check_eq(bad, [], "reads whose data differ from what was written")

print("# a mix of writes, reads, zeroes and a flush in flight")
mix_cookies, expect = [], {}
new = [os.urandom(BS) for _ in range(DEPTH // 2)]
mbufs = []
for i in range(DEPTH // 2):                       # overwrite even blocks
    b = nbd.Buffer.from_bytearray(bytearray(new[i]))
    mbufs.append(b)
    mix_cookies.append(h.aio_pwrite(b, offsets[2 * i]))
    expect[offsets[2 * i]] = new[i]
for i in range(DEPTH // 2):                       # zero half of the odd blocks
    if i % 2 == 0:
        mix_cookies.append(h.aio_zero(BS, offsets[2 * i + 1]))
        expect[offsets[2 * i + 1]] = bytes(BS)
    else:
        expect[offsets[2 * i + 1]] = blocks[2 * i + 1]
run_all(h, mix_cookies, "mixed writes and zeroes")
mix_cookies = [h.aio_flush()]
rb = {off: nbd.Buffer(BS) for off in expect}
mix_cookies += [h.aio_pread(rb[off], off) for off in expect]
run_all(h, mix_cookies, "flush and reads")
bad = [off for off in expect if rb[off].to_bytearray() != expect[off]]
check_eq(bad, [], "offsets whose data differ after the mixed batch")

print("# 128 reads of 4 KiB with DF, in flight, structured")
small = [nbd.Buffer(4096) for _ in range(DEPTH)]
nchunks = [0] * DEPTH


def chunk_counter(i):
    def cb(subbuf, off, status, err):
        nchunks[i] += 1
        return 0
    return cb


cookies = [h.aio_pread_structured(small[i], offsets[i] + 4096, chunk_counter(i),
                                  flags=nbd.CMD_FLAG_DF) for i in range(DEPTH)]
run_all(h, cookies, "128 DF reads")
check_eq(sorted(set(nchunks)), [1], "chunks per DF read")
bad = [i for i in range(DEPTH)
       if small[i].to_bytearray() != expect.get(offsets[i], blocks[i])[4096:8192]]
check_eq(bad, [], "DF reads whose data differ")
h.shutdown()

# ---------------------------------------------------------------------------
print("# multi-conn: write + flush on A is seen by B")
a = nbd_connect(srv)
b = nbd_connect(srv)
check(a.can_multi_conn() and b.can_multi_conn(), "memory export advertises multi-conn")
for round_ in range(8):
    off = 40 * MiB + round_ * 1 * MiB
    payload = os.urandom(256 * 1024)
    b.pread(len(payload), off)        # B has looked at the range before
    a.pwrite(payload, off)
    a.flush()
    got = b.pread(len(payload), off)
    if got != payload:
        fail("round %d: connection B does not see A's flushed write" % round_)
ok("8 rounds: B read exactly what A wrote and flushed")
payload = os.urandom(65536)
a.pwrite(payload, 50 * MiB, nbd.CMD_FLAG_FUA)
check(b.pread(65536, 50 * MiB) == payload, "B sees A's FUA write")
b.trim(65536, 50 * MiB)
b.flush()
check(a.pread(65536, 50 * MiB) == bytes(65536), "A sees B's flushed trim")
a.shutdown()
b.shutdown()

print("# four connections writing disjoint ranges in flight, each verified by another")
conns = [nbd_connect(srv) for _ in range(4)]
data = {}
all_cookies = []
keep = []
for n, c in enumerate(conns):
    cs = []
    for j in range(32):
        off = n * 8 * MiB + j * BS
        d = os.urandom(BS)
        data[off] = d
        buf = nbd.Buffer.from_bytearray(bytearray(d))
        keep.append(buf)
        cs.append(c.aio_pwrite(buf, off))
    all_cookies.append(cs)
for c, cs in zip(conns, all_cookies):
    run_all(c, cs, "32 writes on one of four connections")
    c.flush()
for n, c in enumerate(conns):
    other = (n + 1) % 4
    for j in range(32):
        off = other * 8 * MiB + j * BS
        if c.pread(BS, off) != data[off]:
            fail("connection %d reads wrong data at %d written by connection %d" % (n, off, other))
ok("every connection reads the others' flushed writes exactly")
for c in conns:
    c.shutdown()
srv.check_alive()
print("all in-flight and multi-conn checks passed")
