#!/usr/bin/python3
# Read-only exports (-r) refuse every write-like command -- WRITE, TRIM,
# WRITE_ZEROES, with and without FUA/NO_HOLE/FAST_ZERO, in range, past the
# end, oversized, zero-length -- with EPERM (proto.md: "NBD_EPERM ... MUST
# be returned for write-like commands on a read-only export"), the WRITE
# payload is skipped so the connection stays in sync, and the file behind
# the export is byte-for-byte unchanged.  Reads, FLUSH, CACHE and
# BLOCK_STATUS still work.  Runs on rawio (a real file) and ram.
import hashlib
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from hostile import *  # noqa: E402,F401,F403

need_server()
MiB = 1 << 20
SIZE = 16 * MiB
NBD_CMD_FLAG_NO_HOLE = 1 << 1
NBD_CMD_FLAG_FAST_ZERO = 1 << 4
NBD_EPERM = 1

path = os.path.join(TMP, "ro.img")
content = os.urandom(SIZE)
with open(path, "wb") as f:
    f.write(content)
digest = hashlib.sha256(content).hexdigest()

rawio = os.path.join(TOP, "plugins/rawio/nbdkit-rawio-plugin.so")
servers = []
if os.path.exists(rawio) and not IS_NBDKIT:
    servers.append(("rawio", Server([rawio, "file=" + path], opts=["-r"] + EXTRA_OPTS)))
else:
    servers.append(("file", Server(["file", path], opts=["-r"])))
servers.append(("ram" if not IS_NBDKIT else "memory",
                Server(["ram" if not IS_NBDKIT else "memory", "size=16M"], opts=["-r"] + EXTRA_OPTS)))

for name, srv in servers:
    print("# %s -r" % name)
    for structured in (False, True):
        c = RawClient(srv)
        c.handshake(structured=structured, meta=structured)
        check(c.eflags & NBD_FLAG_READ_ONLY, "%s: READ_ONLY advertised" % name)
        for bit, what in ((NBD_FLAG_SEND_TRIM, "TRIM"), (NBD_FLAG_SEND_WRITE_ZEROES, "WRITE_ZEROES"),
                          (NBD_FLAG_SEND_FUA, "FUA"), (NBD_FLAG_SEND_FAST_ZERO, "FAST_ZERO")):
            check(not c.eflags & bit, "%s: %s not advertised on a read-only export" % (name, what))
        n = 0
        cases = []
        for off, count in ((0, 4096), (SIZE - 4096, 4096), (SIZE, 4096), (4096, 1),
                           (0, MiB), (1 << 62, 512)):
            for flags in (0, NBD_CMD_FLAG_FUA):
                cases.append((NBD_CMD_WRITE, off, count, flags, b"\x5a" * count))
                cases.append((NBD_CMD_TRIM, off, count, flags, b""))
                for zf in (0, NBD_CMD_FLAG_NO_HOLE, NBD_CMD_FLAG_FAST_ZERO):
                    cases.append((NBD_CMD_WRITE_ZEROES, off, count, flags | zf, b""))
        for cmd, off, count, flags, payload in cases:
            n += 1
            c.send_request(cmd, off, count, cookie=n, flags=flags, payload=payload)
            cookie, err, _, _ = c.recv_reply()
            if (cookie, err) != (n, NBD_EPERM):
                fail("%s: cmd %d offset %#x count %d flags %#x: got cookie %d error %d, want EPERM"
                     % (name, cmd, off, count, flags, cookie, err))
        ok("%s (%s replies): %d write-like requests refused with EPERM"
           % (name, "structured" if structured else "simple", n))
        # Still usable: READ, FLUSH, CACHE, BLOCK_STATUS.
        c.send_request(NBD_CMD_READ, 0, 8192, cookie=900)
        cookie, err, chunks, data = c.recv_reply(8192)
        if chunks is not None:
            data, _ = read_via_chunks(chunks, 0, 8192)
        check_eq((cookie, err), (900, 0), "%s: READ after the refusals" % name)
        if name in ("rawio", "file"):
            check(data == content[:8192], "%s: READ returns the file's bytes" % name)
        if c.eflags & NBD_FLAG_SEND_FLUSH:
            c.send_request(NBD_CMD_FLUSH, cookie=901)
            check_eq(c.recv_reply()[:2], (901, 0), "%s: FLUSH on a read-only export" % name)
        if c.eflags & NBD_FLAG_SEND_CACHE:
            c.send_request(NBD_CMD_CACHE, 0, 65536, cookie=902)
            check_eq(c.recv_reply()[:2], (902, 0), "%s: CACHE on a read-only export" % name)
        if structured:
            c.send_request(NBD_CMD_BLOCK_STATUS, 0, 65536, cookie=903)
            check_eq(c.recv_reply()[:2], (903, 0), "%s: BLOCK_STATUS on a read-only export" % name)
        c.disconnect()
    srv.check_alive()

with open(path, "rb") as f:
    check_eq(hashlib.sha256(f.read()).hexdigest(), digest, "file unchanged after every refusal")
print("read-only checks passed")
