#!/usr/bin/env python3
"""Block cache (--cache): every mode and constructor setting returns exactly
the data written, across two connections (multi-conn coherence), with a
cache small enough that blocks are evicted (dirty ones written back first),
with requests that straddle blocks or cover part of one, and after TRIM,
WRITE_ZEROES and FLUSH.  The same load runs with the plugin called on the
shard thread (ram: inline) and on worker threads (--dispatch worker), and
the counters the cache exports must show hits, misses and evictions."""

import json
import os
import random
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import (Server, check, check_eq, fail, need_nbd, nbd_connect,  # noqa: E402
                      ok, skip, IS_NBDKIT)

if IS_NBDKIT:
    skip("--cache is a blkd option")
nbd = need_nbd()

SIZE = 16 << 20
BLOCK = 64 << 10


def stats(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/stats" % port, timeout=10) as r:
        return json.loads(r.read())


def run(mode, ctor, cache, dispatch, seed):
    opts = ["--cache", str(cache), "--cache-block", str(BLOCK), "--cache-mode", mode,
            "--cache-ctor", ctor, "--metrics", "127.0.0.1:0"]
    if dispatch:
        opts += ["--dispatch", dispatch, "--threads", "4"]
    srv = Server(["ram", "size=%d" % SIZE], opts=opts)
    mport = srv.metrics_port
    what = "%s ctor=%s cache=%d%s" % (mode, ctor, cache, " " + dispatch if dispatch else "")
    a = nbd_connect(srv)
    b = nbd_connect(srv)
    check(a.can_multi_conn(), "%s: multi-conn advertised" % what)
    rng = random.Random(seed)
    model = bytearray(SIZE)

    def verify(h, off, n, label):
        got = h.pread(n, off)
        if got != bytes(model[off:off + n]):
            bad = next(i for i in range(n) if got[i] != model[off + i])
            fail("%s: %s: read of %d at %d differs first at byte %d (+%d)"
                 % (what, label, n, off, off + bad, bad))

    # Fill: whole blocks, then a pass of odd sizes over block edges.
    for off in range(0, 4 << 20, 1 << 20):
        data = rng.randbytes(1 << 20)
        a.pwrite(data, off)
        model[off:off + len(data)] = data
    for _ in range(200):
        n = rng.choice([512, 4096, 5000, BLOCK - 512, BLOCK, BLOCK + 4096, 3 * BLOCK + 100])
        off = rng.randrange(0, SIZE - n)
        data = rng.randbytes(n)
        (a if rng.random() < 0.5 else b).pwrite(data, off)
        model[off:off + n] = data
        # Read back through the *other* connection at once: coherence.
        verify(b if rng.random() < 0.5 else a, max(0, off - 1000), min(n + 2000, SIZE - max(0, off - 1000)),
               "read-after-write")
    ok("%s: 200 random writes read back exact on both connections" % what)

    # Mixed load including trim, zero, flush and FUA.
    for i in range(400):
        h = a if rng.random() < 0.5 else b
        op = rng.random()
        n = rng.choice([4096, 8192, BLOCK, 2 * BLOCK, 300 * 1024])
        off = rng.randrange(0, SIZE - n) & ~511
        if op < 0.35:
            data = rng.randbytes(n)
            h.pwrite(data, off, nbd.CMD_FLAG_FUA if rng.random() < 0.1 else 0)
            model[off:off + n] = data
        elif op < 0.75:
            verify(h, off, n, "mixed read")
        elif op < 0.85:
            h.trim(n, off)
            model[off:off + n] = bytes(n)          # ram reads trimmed ranges as zero
        elif op < 0.95:
            h.zero(n, off)
            model[off:off + n] = bytes(n)
        else:
            h.flush()
    ok("%s: 400 mixed reads/writes/trims/zeroes/flushes exact" % what)

    # Everything, block by block, through both connections.
    for off in range(0, SIZE, 1 << 20):
        verify(a, off, 1 << 20, "final sweep A")
        verify(b, off, 1 << 20, "final sweep B")
    ok("%s: whole disk reads back exact through both connections" % what)

    st = stats(mport)
    c = st["cache"]
    check(c is not None and c["mode"] == mode and c["ctor"] == (ctor == "yes"),
          "%s: /stats shows the cache's mode and ctor setting" % what)
    check(c["hits"] > 0 and c["misses"] > 0, "%s: hits %d, misses %d" % (what, c["hits"], c["misses"]))
    if cache < SIZE:
        check(c["evictions"] > 0, "%s: the small cache evicted (%d)" % (what, c["evictions"]))
        if mode == "writeback":
            check(c["writebacks"] > 0, "%s: dirty blocks were written back (%d)" % (what, c["writebacks"]))
    check(c["entries"] * BLOCK <= c["capacity_bytes"],
          "%s: %d entries within the bound" % (what, c["entries"]))
    a.flush()
    if mode == "writeback":
        check_eq(stats(mport)["cache"]["dirty_bytes"], 0, "%s: dirty bytes after FLUSH" % what)
    a.shutdown()
    b.shutdown()
    srv.stop()
    check_eq(srv.proc.returncode, 0, "%s: clean exit" % what)


seed = 1
for mode in ("writethrough", "writeback"):
    for ctor in ("no", "yes"):
        run(mode, ctor, 1 << 20, None, seed)          # 16 blocks: eviction all the time
        seed += 1
    run(mode, "no", 32 << 20, "worker", seed)         # everything fits; worker threads
    seed += 1
    run(mode, "yes", 2 << 20, "worker", seed)
    seed += 1
print("all cache data checks passed")
