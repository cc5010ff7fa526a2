#!/usr/bin/env python3
"""Block cache isolation: a cache is shared only between connections the
plugin says see the same data (can_multi_conn), and never across exports.

- perconn (tests/plugins): each connection has its own disk, filled with
  its own byte; a second connection must never read the first one's.
- tmpdisk: each connection gets a fresh empty disk; 0xAB written and
  flushed by one connection must not show through to another (the
  reported reproduction).
- ondemand and `file dir=`: two exports; export a's blocks must never
  answer a read of export b, and a reconnect to a still sees its data.
- memory (multi-conn): the connections share one cache (a second
  connection's read of a block the first one loaded is a hit) and see each
  other's writes.
"""

import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import (Server, TMP, TOP, check, check_eq, fail,  # noqa: E402
                      need_nbd, nbd_connect, ok, skip, IS_NBDKIT)

if IS_NBDKIT:
    skip("--cache is a blkd option")
nbd = need_nbd()

BLOCK = 64 << 10
PERCONN = os.path.join(TOP, "tests", "plugins", "nbdkit-perconn-plugin.so")


def stats(mport):
    with urllib.request.urlopen("http://127.0.0.1:%d/stats" % mport, timeout=20) as r:
        return json.loads(r.read())


def cache_server(args, extra=()):
    opts = ["--cache", "8M", "--cache-block", str(BLOCK), "--metrics",
            "127.0.0.1:0"] + list(extra)
    srv = Server(args, opts=opts)
    return srv, srv.metrics_port


# ---- perconn: the data depends on the connection ----------------------
srv, _ = cache_server([PERCONN, "size=4M"])
a = nbd_connect(srv)
first = a.pread(BLOCK, 0)
check(len(set(first)) == 1, "perconn: connection 1 sees one byte everywhere")
b = nbd_connect(srv)
second = b.pread(BLOCK, 0)
check(second[:1] != first[:1],
      "perconn: connection 2 reads its own disk, not connection 1's cached block",
      "both read %r" % second[:4])
check(not b.can_multi_conn(), "perconn: multi-conn not advertised")
# Writes stay private too: a's write must not be what b reads next.
a.pwrite(b"\xee" * BLOCK, BLOCK)
check(b.pread(BLOCK, BLOCK)[:1] == second[:1],
      "perconn: connection 2 does not read connection 1's write")
check(a.pread(BLOCK, BLOCK) == b"\xee" * BLOCK, "perconn: connection 1 reads its write back")
a.shutdown()
b.shutdown()
srv.stop()

# Private caches share the one --cache budget, and go with their connection.
srv, mport = cache_server([PERCONN, "size=4M"], extra=["--cache", "1M"])
hs = [nbd_connect(srv) for _ in range(3)]
for i, h in enumerate(hs):
    mine = bytes(h.pread(1, 0))
    for off in range(0, 4 << 20, 256 << 10):
        if bytes(h.pread(BLOCK, off)) != mine * BLOCK:
            fail("budget: connection %d read another disk's data at %d" % (i + 1, off))
    ok("budget: connection %d reads only its own data" % (i + 1))
c = stats(mport)["cache"]
check(c["bytes"] <= 1 << 20, "budget: three private caches hold %d bytes, within --cache 1M"
      % c["bytes"])
check_eq(c["instances"], 3, "budget: one private instance per connection")
for h in hs:
    h.shutdown()
for _ in range(600):                    # closes are asynchronous: wait, no deadline check
    if stats(mport)["cache"]["instances"] == 0:
        break
    time.sleep(0.1)
check_eq(stats(mport)["cache"]["instances"], 0, "budget: private instances freed at close")
srv.stop()

# A plugin that says multi-conn shares one cache: reconnects reuse it.
srv, mport = cache_server([PERCONN, "size=4M", "multi_conn=true"])
a = nbd_connect(srv)
a.pread(BLOCK, 0)
b = nbd_connect(srv)
b.pread(BLOCK, 0)
hits = stats(mport)["cache"]["hits"]
check(hits >= 1, "perconn multi_conn=true: the second connection hit the shared cache",
      "hits %d" % hits)
a.shutdown()
b.shutdown()
srv.stop()

# ---- tmpdisk: a fresh disk per connection -----------------------------
srv, _ = cache_server(["tmpdisk", "64M"])
a = nbd_connect(srv)
a.pwrite(b"\xab" * BLOCK, 1 << 20)         # a whole cache block: write-through caches it
a.flush()
check_eq(bytes(a.pread(4, 1 << 20)), b"\xab" * 4, "tmpdisk: connection 1 reads its write")
b = nbd_connect(srv)
check_eq(bytes(b.pread(4, 1 << 20)), b"\0" * 4,
         "tmpdisk: connection 2 reads its own empty disk")
a.shutdown()
b.shutdown()
srv.stop()

# ---- ondemand: one disk per export ------------------------------------
odir = os.path.join(TMP, "ondemand")
os.mkdir(odir)
srv, _ = cache_server(["ondemand", "dir=" + odir, "size=8M"])
a = nbd_connect(srv, export="a")
a.pwrite(b"\xaa" * BLOCK, 0)
a.flush()
check_eq(bytes(a.pread(4, 0)), b"\xaa" * 4, "ondemand: export a reads its write")
a.shutdown()
b = nbd_connect(srv, export="b")
check_eq(bytes(b.pread(4, 0)), b"\0" * 4, "ondemand: export b does not read export a's block")
b.shutdown()
a = nbd_connect(srv, export="a")
check_eq(bytes(a.pread(4, 0)), b"\xaa" * 4, "ondemand: export a still holds its data")
a.shutdown()
srv.stop()

# ---- file dir=: each file its own export ------------------------------
fdir = os.path.join(TMP, "files")
os.mkdir(fdir)
for name, byte in (("a", b"\x61"), ("b", b"\x62")):
    with open(os.path.join(fdir, name), "wb") as f:
        f.write(byte * (1 << 20))
srv, mport = cache_server(["file", "dir=" + fdir])
a = nbd_connect(srv, export="a")
b = nbd_connect(srv, export="b")
check_eq(bytes(a.pread(4, 0)), b"aaaa", "file dir=: export a")
check_eq(bytes(b.pread(4, 0)), b"bbbb", "file dir=: export b is not served export a's block")
a.pwrite(b"A" * BLOCK, BLOCK)
check_eq(bytes(b.pread(4, BLOCK)), b"bbbb", "file dir=: a write to a leaves b's view alone")
a2 = nbd_connect(srv, export="a")
check_eq(bytes(a2.pread(4, BLOCK)), b"AAAA", "file dir=: a second connection to a sees the write")
check_eq(stats(mport)["cache"]["instances"], 2, "file dir=: one shared cache per export")
for h in (a, b, a2):
    h.shutdown()
srv.stop()

# Two listed names, one disk (hard links): two shared caches of it.  A
# write under one name drops the other's clean copy of the block, from
# connections on both shards at once (writes walk the shared list
# without the registry lock).
ldir = os.path.join(TMP, "links")
os.mkdir(ldir)
with open(os.path.join(ldir, "p"), "wb") as f:
    f.write(b"\x70" * (4 << 20))
os.link(os.path.join(ldir, "p"), os.path.join(ldir, "q"))
srv, mport = cache_server(["file", "dir=" + ldir], extra=["--shards", "2"])
hp = [nbd_connect(srv, export="p") for _ in range(2)]
hq = [nbd_connect(srv, export="q") for _ in range(2)]
check_eq(stats(mport)["cache"]["instances"], 2, "hard links: two shared caches of one disk")
stale = 0
for rnd in range(16):
    blk = (rnd % 8) * BLOCK
    byte = bytes([0x80 + rnd])
    # Both names cache the block, then each connection in turn writes it.
    for h in hp + hq:
        h.pread(4, blk)
    w = (hp + hq)[rnd % 4]
    w.pwrite(byte * BLOCK, blk)
    w.flush()
    for h in hp + hq:
        h.flush()
        if bytes(h.pread(4, blk)) != byte * 4:
            stale += 1
check(stale == 0, "hard links: every write under one name is seen under the other after flush",
      "%d stale reads" % stale)
for h in hp + hq:
    h.shutdown()
srv.stop()

# ---- memory: multi-conn, one shared cache -----------------------------
srv, mport = cache_server(["memory", "16M"])
a = nbd_connect(srv)
b = nbd_connect(srv)
check(a.can_multi_conn(), "memory: multi-conn advertised")
a.pwrite(b"\x5a" * BLOCK, 0)
before = stats(mport)["cache"]["hits"]
check_eq(bytes(b.pread(4, 0)), b"\x5a" * 4, "memory: connection 2 sees connection 1's write")
check(stats(mport)["cache"]["hits"] > before, "memory: ... from the shared cache")
check_eq(stats(mport)["cache"]["instances"], 1, "memory: one instance for the export")
a.shutdown()
b.shutdown()
srv.stop()

# memory ignores the export name: every name is the same disk.  Two names
# must not get two caches of it, or a block cached under one name would
# go stale when written under another, even after both flush (multi-conn).
srv, mport = cache_server(["memory", "16M"])
a = nbd_connect(srv, export="x")
b = nbd_connect(srv)
check_eq(bytes(a.pread(4, 0)), b"\0" * 4, "memory, export x: reads zeroes")
b.pwrite(b"\x77" * BLOCK, 0)
b.flush()
a.flush()
check_eq(bytes(a.pread(4, 0)), b"\x77" * 4,
         "memory, export x: sees the default export's write after flush")
# ... and the other way: the default export's cached block goes when the
# same block is written under the name x.
check_eq(bytes(b.pread(4, BLOCK)), b"\0" * 4, "memory: default export reads zeroes")
a.pwrite(b"\x66" * BLOCK, BLOCK)
a.flush()
b.flush()
check_eq(bytes(b.pread(4, BLOCK)), b"\x66" * 4,
         "memory: the default export sees export x's write after flush")
# Names the plugin does not list do not get an instance: a client
# cannot make the server hold one cache per name it invents.
hs = [nbd_connect(srv, export="name%d" % i) for i in range(8)]
check(stats(mport)["cache"]["instances"] <= 1,
      "memory: unlisted export names get no cache instance of their own",
      "%d instances" % stats(mport)["cache"]["instances"])
for h in hs + [a, b]:
    h.shutdown()
srv.stop()
ok("cache isolation")
