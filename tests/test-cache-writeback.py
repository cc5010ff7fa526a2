#!/usr/bin/env python3
"""Writeback cache over a real file (the in-tree rawio plugin, with and
without O_DIRECT): data stays in the cache until FLUSH, a FUA write is on
the file when acknowledged, a block dirtied by a connection that has gone
is still readable by the next one and written by its FLUSH, and data
written without any flush reaches the file when blkd is stopped with
SIGTERM -- checked by reading the file itself and by serving it again
without a cache."""

import json
import os
import random
import signal
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import (Server, check, check_eq, fail, need_nbd, nbd_connect,  # noqa: E402
                      ok, skip, IS_NBDKIT, TOP)

if IS_NBDKIT:
    skip("--cache is a blkd option")
nbd = need_nbd()
RAWIO = os.path.join(TOP, "plugins", "rawio", "nbdkit-rawio-plugin.so")
if not os.path.exists(RAWIO):
    skip("rawio plugin not built (%s)" % RAWIO)

SIZE = 16 << 20
MiB = 1 << 20


def file_bytes(path, off, n):
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(n)


def stats(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/stats" % port, timeout=10) as r:
        return json.loads(r.read())["cache"]


def direct_ok(dirname):
    try:
        fd = os.open(os.path.join(dirname, ".odirect-probe"), os.O_CREAT | os.O_RDWR | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    os.unlink(os.path.join(dirname, ".odirect-probe"))
    return True


def run(direct, ctor, seed):
    what = "rawio direct=%s ctor=%s" % (direct, ctor)
    tmpdir = "/var/tmp" if direct_ok("/var/tmp") else None
    if direct and not tmpdir:
        print("note: no O_DIRECT filesystem at /var/tmp: %s not run" % what)
        return
    fd, path = tempfile.mkstemp(prefix="blkd-cache-wb.", dir=tmpdir)
    try:
        rng = random.Random(seed)
        base = rng.randbytes(SIZE)
        os.write(fd, base)
        os.close(fd)
        model = bytearray(base)
        srv = Server([RAWIO, "file=" + path, "direct=" + ("true" if direct else "false")],
                     opts=["--cache", "8M", "--cache-mode", "writeback", "--cache-ctor", ctor,
                           "--metrics", "127.0.0.1:0"])
        mport = srv.metrics_port

        # 1. Written but not flushed: in the cache, not in the file.
        h = nbd_connect(srv)
        a = rng.randbytes(MiB)
        h.pwrite(a, 0)
        model[0:MiB] = a
        check_eq(h.pread(MiB, 0), a, "%s: read back from the cache" % what)
        check(stats(mport)["dirty_bytes"] >= MiB, "%s: 1 MiB dirty before FLUSH" % what)
        check(file_bytes(path, 0, MiB) != a, "%s: not yet in the file (writeback)" % what)
        h.flush()
        check_eq(file_bytes(path, 0, MiB), a, "%s: in the file after FLUSH" % what)
        check_eq(stats(mport)["dirty_bytes"], 0, "%s: nothing dirty after FLUSH" % what)

        # 2. FUA: on the file when acknowledged (also a partial block).
        b = rng.randbytes(64 * 1024 + 4096)
        h.pwrite(b, 2 * MiB + 8192, nbd.CMD_FLAG_FUA)
        model[2 * MiB + 8192:2 * MiB + 8192 + len(b)] = b
        check_eq(file_bytes(path, 2 * MiB + 8192, len(b)), b, "%s: FUA write in the file" % what)
        check_eq(file_bytes(path, 2 * MiB, 8192), bytes(model[2 * MiB:2 * MiB + 8192]),
                 "%s: the rest of the FUA write's block intact" % what)

        # 3. A connection writes and goes away; the next one reads its data
        #    and its FLUSH puts it in the file.
        c = rng.randbytes(256 * 1024)
        h.pwrite(c, 3 * MiB + 4096)
        model[3 * MiB + 4096:3 * MiB + 4096 + len(c)] = c
        h.shutdown()
        h2 = nbd_connect(srv)
        check_eq(h2.pread(len(c), 3 * MiB + 4096), c, "%s: next connection reads the data" % what)
        h2.flush()
        check_eq(file_bytes(path, 3 * MiB + 4096, len(c)), c,
                 "%s: its FLUSH wrote the first connection's blocks" % what)

        # 4. Write-zeroes and trim over dirty data, then more dirty data,
        #    no flush, SIGTERM: everything must reach the file.
        d = rng.randbytes(2 * MiB)
        h2.pwrite(d, 8 * MiB)
        model[8 * MiB:10 * MiB] = d
        h2.zero(64 * 1024, 8 * MiB + 4096)
        model[8 * MiB + 4096:8 * MiB + 4096 + 64 * 1024] = bytes(64 * 1024)
        e = rng.randbytes(4096)
        h2.pwrite(e, 12 * MiB + 12288)
        model[12 * MiB + 12288:12 * MiB + 16384] = e
        check_eq(h2.pread(2 * MiB, 8 * MiB), bytes(model[8 * MiB:10 * MiB]),
                 "%s: zeroed range over dirty data reads right" % what)
        dirty = stats(mport)["dirty_bytes"]
        check(dirty > 0, "%s: %d bytes dirty before SIGTERM" % (what, dirty))
        h2.shutdown()   # closed without FLUSH
        srv.proc.send_signal(signal.SIGTERM)
        try:
            srv.proc.wait(30)
        except Exception:
            fail("%s: blkd did not exit after SIGTERM" % what)
        check_eq(srv.proc.returncode, 0, "%s: clean exit after SIGTERM" % what)
        srv.log.flush()
        with open(srv.log_path) as lf:
            log = lf.read()
        check("dirty bytes back at shutdown" in log, "%s: shutdown wrote dirty blocks" % what,
              log[-500:])
        with open(path, "rb") as f:
            on_disk = f.read()
        if on_disk != bytes(model):
            bad = next(i for i in range(SIZE) if on_disk[i] != model[i])
            fail("%s: file differs from what was written at byte %d" % (what, bad))
        ok("%s: the whole file holds every acknowledged write" % what)

        # 5. Served again without a cache: the same bytes.
        srv2 = Server([RAWIO, "file=" + path])
        h3 = nbd_connect(srv2)
        check_eq(h3.pread(SIZE, 0) == bytes(model), True, "%s: re-served file reads back exact" % what)
        h3.shutdown()
        srv2.stop()
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


run(False, "no", 1)
run(True, "no", 2)
run(True, "yes", 3)

# memory serves one disk under every export name; a name it does not
# list is served uncached.  Such a connection must still see, after its
# own flush, a write another connection had acknowledged into the
# writeback cache (multi-conn), and its own writes must not be undone or
# hidden by the cached copies.
BLOCK = 64 << 10
srv = Server(["memory", "16M"], opts=["--cache", "8M", "--cache-block", str(BLOCK),
                                      "--cache-mode", "writeback"])
a = nbd_connect(srv)
x = nbd_connect(srv, export="x")
check(x.can_multi_conn(), "memory writeback: multi-conn advertised")
a.pwrite(b"\x77" * BLOCK, 0)
x.flush()
check_eq(bytes(x.pread(4, 0)), b"\x77" * 4,
         "memory writeback: export x sees the default export's write after its flush")
check_eq(bytes(a.pread(4, BLOCK)), b"\0" * 4, "memory writeback: block 1 is cached clean")
x.pwrite(b"\x66" * BLOCK, BLOCK)
x.flush()
a.flush()
check_eq(bytes(a.pread(4, BLOCK)), b"\x66" * 4,
         "memory writeback: the default export sees export x's write after flush")
a.shutdown()
x.shutdown()
srv.stop()

# A budget that does not fill every stripe (100 blocks over 64 stripes of
# 2): a stripe that never got a slab and has nothing to evict must still
# take writes (straight to the plugin), not fail them with ENOMEM.
srv = Server(["memory", "64M"], opts=["--cache", str(100 * BLOCK), "--cache-block", str(BLOCK),
                                      "--cache-mode", "writeback"])
a = nbd_connect(srv)
for i in range(512):
    a.pwrite(bytes([i % 251 + 1]) * BLOCK, i * BLOCK)
ok("memory writeback, 100-block budget: 512 block writes all succeed")
b = nbd_connect(srv)
b.flush()
for i in range(512):
    if bytes(b.pread(BLOCK, i * BLOCK)) != bytes([i % 251 + 1]) * BLOCK:
        fail("memory writeback, 100-block budget: block %d reads back wrong" % i)
ok("memory writeback, 100-block budget: every block reads back")
a.shutdown()
b.shutdown()
srv.stop()
print("all writeback checks passed")
