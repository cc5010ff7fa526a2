#!/usr/bin/env bash
# Debian's nbdkit plugins hosted by the server, each checked for exact
# bytes: memory, file, null, pattern, data, sparse-random, zero, full,
# random and info.  A plugin missing from the nbdkit plugin directory is
# reported and left out; one that is installed must pass.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
need_server
need_nbd_py

plugindir=$NBDKIT_PLUGINDIR
have_plugin() { [ -e "$plugindir/nbdkit-$1-plugin.so" ]; }

# pycheck URI CODE: run CODE with h connected to URI (export name from the
# URI), plus helpers: expect_err(fn, errno name...), M.
pycheck() {
  local uri=$1 code=$2
  "$PY" - "$uri" "$code" <<'EOF'
import nbd, sys, hashlib, os
uri, code = sys.argv[1], sys.argv[2]
M = 1024 * 1024
def connect():
    h = nbd.NBD(); h.connect_uri(uri); return h
def expect_err(fn, *names):
    try:
        fn()
    except nbd.Error as e:
        if e.errno not in names:
            sys.exit("FAIL: expected %s, got %s (%s)" % ("/".join(names), e.errno, e.string))
        print("ok: fails with %s as it must" % e.errno)
        return
    sys.exit("FAIL: succeeded but must fail with %s" % "/".join(names))
def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)
    print("ok: " + what)
h = connect()
h.set_strict_mode(0)        # refusals must come from the server, not libnbd
exec(code)
h.shutdown()
EOF
}

tested=() missing=()
plugin() {          # plugin NAME: announce, or skip when not installed
  if have_plugin "$1"; then echo "# plugin $1"; tested+=("$1"); return 0; fi
  note "plugin $1 is not installed in $plugindir: not tested"; missing+=("$1"); return 1
}

if plugin memory; then
  start_server memory size=64M
  pycheck "$URI" '
check(h.get_size() == 64 * M, "memory size 64M")
d = os.urandom(3 * M + 17)
h.pwrite(d, 5 * M + 3)
check(h.pread(len(d), 5 * M + 3) == d, "memory reads back an unaligned 3M+17 write")
check(h.pread(4096, 60 * M) == bytes(4096), "unwritten memory reads zeros")
h.trim(M, 5 * M); h.flush()
check(h.pread(M, 5 * M) == bytes(3) + bytes(M - 3), "trimmed memory reads zeros")
check(h.pread(M, 6 * M) == d[M - 3:2 * M - 3], "data after the trim intact")
'
  stop_server
fi

if plugin file; then
  head -c $((4 * 1024 * 1024)) /dev/urandom >"$TMP/disk.img"
  cp "$TMP/disk.img" "$TMP/orig.img"
  start_server file file="$TMP/disk.img"
  pycheck "$URI" "
orig = open('$TMP/orig.img', 'rb').read()
check(h.get_size() == len(orig), 'file size is the file length')
check(h.pread(len(orig), 0) == orig, 'file plugin reads the file exactly')
check(h.can_flush() and h.can_trim() and h.can_zero(), 'file export can flush, trim, zero')
h.pwrite(b'\x5a' * 65536, M + 100, nbd.CMD_FLAG_FUA)
h.zero(65536, 2 * M)
h.flush()
disk = open('$TMP/disk.img', 'rb').read()
check(disk[M + 100:M + 100 + 65536] == b'\x5a' * 65536, 'write reached the file')
check(disk[2 * M:2 * M + 65536] == bytes(65536), 'write-zeroes reached the file')
check(disk[:M + 100] == orig[:M + 100] and disk[3 * M:] == orig[3 * M:], 'the rest of the file untouched')
expect_err(lambda: h.pwrite(b'x', len(orig)), 'ENOSPC', 'EINVAL')
"
  stop_server
fi

if plugin null; then
  start_server null size=64M
  pycheck "$URI" '
check(h.get_size() == 64 * M, "null size 64M")
h.pwrite(os.urandom(M), 0)
check(h.pread(M, 0) == bytes(M), "null discards writes and reads zeros")
check(h.pread(4096, 64 * M - 4096) == bytes(4096), "null reads zeros at the end")
'
  stop_server
fi

if plugin pattern; then
  start_server pattern size=8M
  pycheck "$URI" '
import struct
check(h.get_size() == 8 * M and h.is_read_only(), "pattern: 8M, read-only")
def expect(off, n):
    start = off - off % 8
    words = b"".join(struct.pack(">Q", o) for o in range(start, off + n + 8, 8))
    return words[off - start:off - start + n]
for off, n in ((0, 4096), (12345, 777), (8 * M - 4096, 4096), (3 * M + 5, M)):
    check(h.pread(n, off) == expect(off, n), "pattern bytes at %d+%d: each 8-byte word is its offset, big-endian" % (off, n))
check(h.pread(16, 0x28) == bytes(7) + b"\x28" + bytes(7) + b"\x30", "word at 0x28 is 0x28 (man page example)")
expect_err(lambda: h.pwrite(b"x", 0), "EPERM", "EROFS")
'
  stop_server
fi

if plugin data; then
  start_server data data="1 2 3 @0x1000 4"
  pycheck "$URI" '
check(h.get_size() == 0x1001, "data \"1 2 3 @0x1000 4\": size 0x1001")
check(h.pread(0x1001, 0) == b"\x01\x02\x03" + bytes(0x1000 - 3) + b"\x04", "data bytes exact")
h.pwrite(b"\xff\xfe", 1)
check(h.pread(4, 0) == b"\x01\xff\xfe\x00", "data is writable in memory")
'
  stop_server
  start_server data raw=hello-blkd
  pycheck "$URI" '
check(h.get_size() == 10 and h.pread(10, 0) == b"hello-blkd", "data raw=hello-blkd")
'
  stop_server
fi

if plugin sparse-random; then
  # percent/runlength make sure the first 8 MiB hold both data and holes.
  start_server sparse-random size=64M seed=1 percent=50 runlength=1048576
  pycheck "$URI" '
check(h.get_size() == 64 * M, "sparse-random size 64M")
a = h.pread(8 * M, 0)
h2 = connect()
check(h2.pread(8 * M, 0) == a, "sparse-random: two connections read the same 8 MiB")
check(0 < a.count(0) < len(a), "sparse-random: both data and zeros in the first 8 MiB")
first = next(i for i in range(0, len(a), 4096) if a[i])
h.pwrite(a[first:first + M], first)
h.flush()
check(h.pread(M, first) == a[first:first + M] and h2.pread(M, first) == a[first:first + M],
      "sparse-random: writing the bytes it serves succeeds and they read back (both connections)")
expect_err(lambda: h.pwrite(bytes(range(256)) * 16, first), "EIO")
check(h.pread(8 * M, 0) == a, "sparse-random: the refused write changed nothing")
h3 = nbd.NBD(); h3.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION); h3.connect_uri(uri)
ext = []
h3.block_status(8 * M, 0, lambda ctx, off, e, err: ext.extend(zip(e[0::2], e[1::2])) or 0)
pos = 0
for ln, st in ext:
    ln = min(ln, 8 * M - pos)
    if st & 1:
        check(a[pos:pos + ln] == bytes(ln), "hole extent at %d (+%d) reads zeros" % (pos, ln))
    else:
        check(a[pos:pos + ln].count(0) == 0, "data extent at %d (+%d) has no zero bytes" % (pos, ln))
    pos += ln
    if pos >= 8 * M:
        break
check(pos == 8 * M, "extents cover the first 8 MiB")
h2.shutdown(); h3.shutdown()
'
  stop_server
fi

if plugin zero; then
  start_server zero
  pycheck "$URI" '
check(h.get_size() == 0, "zero plugin: a 0-byte disk")
check(h.is_read_only(), "zero plugin: read-only")
h.set_strict_mode(0)
expect_err(lambda: h.pread(512, 0), "EINVAL")
'
  stop_server
fi

if plugin full; then
  start_server full size=16M
  pycheck "$URI" '
check(h.get_size() == 16 * M, "full size 16M")
check(h.pread(M, 0) == bytes(M), "full reads zeros")
expect_err(lambda: h.pwrite(b"x" * 4096, 0), "ENOSPC")
expect_err(lambda: h.zero(4096, 0), "ENOSPC")
check(h.pread(4096, 0) == bytes(4096), "connection still reads after ENOSPC")
'
  stop_server
fi

if plugin random; then
  start_server random size=16M seed=42
  pycheck "$URI" '
check(h.get_size() == 16 * M, "random size 16M")
a = h.pread(4 * M, 0)
h2 = connect()
check(h2.pread(4 * M, 0) == a, "random: same seed, same bytes on another connection")
check(h.pread(4096, 1000) == a[1000:5096], "random: unaligned read agrees")
check(a.count(0) < len(a) // 100, "random: looks random")
h.pwrite(a[8192:16384], 8192)
print("ok: writing back the same bytes succeeds")
expect_err(lambda: h.pwrite(b"\0" * 4096, 0), "EIO")
h2.shutdown()
'
  "$PY" - "$URI" >"$TMP/seed42" <<'PYEOF'
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1]); print(h.pread(65536, 0).hex()); h.shutdown()
PYEOF
  stop_server
  start_server random size=16M seed=43
  pycheck "$URI" "
check(h.pread(65536, 0).hex() != open('$TMP/seed42').read().strip(), 'random: another seed gives other bytes')
"
  stop_server
fi

if plugin info; then
  start_server info mode=exportname
  pycheck "$URI/blkd-export-7" '
check(h.get_size() == len("blkd-export-7"), "info: size is the export name length")
check(h.pread(h.get_size(), 0) == b"blkd-export-7", "info mode=exportname reads the export name")
check(h.is_read_only(), "info is read-only")
'
  stop_server
fi

echo "plugins tested: ${tested[*]}"
[ ${#missing[@]} -eq 0 ] || note "plugins not installed: ${missing[*]}"
[ ${#tested[@]} -gt 0 ] || skip "none of the Debian nbdkit plugins is installed"
echo "all plugin checks passed"
