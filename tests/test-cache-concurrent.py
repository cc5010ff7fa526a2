#!/usr/bin/env python3
"""Block cache under concurrency: four connections, 32 requests in flight
each, on worker threads, with a cache far smaller than the data.  The
connections share every cache block but never a byte: connection i owns the
4 KiB "lanes" whose index is i mod 4, so partial writes, trims and zeroes of
one connection race with the others' loads, read-modify-writes, evictions
and write-backs of the same blocks.  Every read must see exactly its own
connection's data, and at the end the whole span reads back exact."""

import os
import random
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import Server, check, fail, need_nbd, nbd_connect, ok, skip, IS_NBDKIT  # noqa: E402

if IS_NBDKIT:
    skip("--cache is a blkd option")
nbd = need_nbd()

LANE = 4096
CONNS = 4
SPAN = 4 << 20
ROUNDS = 120
DEPTH = 32


def worker(srv, idx, seed, model, errors):
    try:
        h = nbd_connect(srv)
        rng = random.Random(seed)
        lanes = [n for n in range(SPAN // LANE) if n % CONNS == idx]
        for _ in range(ROUNDS):
            picks = rng.sample(lanes, DEPTH)          # distinct offsets in a round
            cmds = []
            for lane in picks:
                base = lane * LANE
                r = rng.random()
                if r < 0.4:
                    # whole lane or a 512-byte-aligned piece of it
                    if rng.random() < 0.5:
                        off, n = base, LANE
                    else:
                        off = base + rng.randrange(0, LANE // 512) * 512
                        n = 512 * rng.randint(1, (base + LANE - off) // 512)
                    data = bytearray(rng.randbytes(n))
                    model[off:off + n] = data
                    cmds.append(("w", h.aio_pwrite(nbd.Buffer.from_bytearray(data), off), None))
                elif r < 0.85:
                    buf = nbd.Buffer(LANE)
                    cmds.append(("r", h.aio_pread(buf, base), (buf, base)))
                elif r < 0.93:
                    model[base:base + LANE] = bytes(LANE)
                    cmds.append(("t", h.aio_trim(LANE, base), None))
                else:
                    model[base:base + LANE] = bytes(LANE)
                    cmds.append(("z", h.aio_zero(LANE, base), None))
            # Reads were issued against the model as it stands after this
            # round's writes to *other* lanes only, so compare after all done.
            while h.aio_in_flight() > 0:
                h.poll(-1)
            for kind, cookie, extra in cmds:
                h.aio_command_completed(cookie)
                if kind == "r":
                    buf, base = extra
                    got = buf.to_bytearray()
                    if bytes(got) != bytes(model[base:base + LANE]):
                        errors.append("conn %d: lane at %d read wrong data" % (idx, base))
                        return
        h.flush()
        h.shutdown()
    except Exception as e:  # noqa: BLE001
        errors.append("conn %d: %r" % (idx, e))


def run(mode, block, cache, seed):
    what = "%s block=%d cache=%d" % (mode, block, cache)
    srv = Server(["ram", "size=%d" % SPAN],
                 opts=["--cache", str(cache), "--cache-block", str(block), "--cache-mode", mode,
                       "--dispatch", "worker", "--threads", "8"])
    model = bytearray(SPAN)
    errors = []
    # Each lane is written by one connection only, so one shared model is
    # safe: threads never touch each other's bytes.
    ts = [threading.Thread(target=worker, args=(srv, i, seed * 10 + i, model, errors))
          for i in range(CONNS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        fail("%s: %s" % (what, "; ".join(errors[:5])))
    ok("%s: %d connections x %d rounds x %d in flight, every read exact"
       % (what, CONNS, ROUNDS, DEPTH))
    h = nbd_connect(srv)
    got = h.pread(SPAN, 0)
    if got != bytes(model):
        bad = next(i for i in range(SPAN) if got[i] != model[i])
        fail("%s: final read differs at byte %d" % (what, bad))
    ok("%s: the whole span reads back exact" % what)
    h.shutdown()
    srv.check_alive()
    srv.stop()
    check(srv.proc.returncode == 0, "%s: clean exit" % what)


seed = 1
for mode in ("writethrough", "writeback"):
    run(mode, 65536, 1 << 20, seed)       # 16 blocks: one per stripe
    run(mode, 4096, 256 << 10, seed + 1)  # 64 stripes of one 4 KiB block
    seed += 2
print("all concurrent cache checks passed")
