#!/usr/bin/env bash
# The in-tree rawio plugin under the reference server (nbdkit): buffered on
# tmpfs, O_DIRECT on a filesystem that allows it, read-only; data checked
# in the backing file itself, holes checked against SEEK_DATA/SEEK_HOLE.
. "$(dirname "$0")/lib.sh"
# The same checks run with the plugin hosted by nbdkit (this file) and by
# blkd (test-plugin-rawio-blkd.sh sets PLUGIN_HOST=blkd).
PLUGIN_HOST=${PLUGIN_HOST:-nbdkit}
need nbdkit; need nbdinfo; need nbdcopy; need qemu-io
PY=/usr/bin/python3
$PY -c 'import nbd' 2>/dev/null || skip "python3-libnbd (module nbd) is not installed"
SO=$TOP/plugins/rawio/nbdkit-rawio-plugin.so
[ -f "$SO" ] || skip "$SO is not built (make plugins/rawio/nbdkit-rawio-plugin.so)"

grep -qx 'rawio_direct=yes' <<<"$(nbdkit "$SO" --dump-plugin)" \
  || fail "--dump-plugin lacks rawio_direct=yes"

# map URI: nbdinfo --map as "offset length type" lines.
map() { nbdinfo --map "$1" | awk '{print $1, $2, $3}'; }

# filemap FILE: the same lines computed from the file with SEEK_DATA/HOLE.
filemap() {
  $PY - "$1" <<'EOF'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY); size = os.fstat(fd).st_size
pos, out = 0, []
while pos < size:
    try: d = os.lseek(fd, pos, os.SEEK_DATA)
    except OSError: d = size
    if d > pos: out.append((pos, d - pos, 3)); pos = d
    if pos >= size: break
    h = os.lseek(fd, pos, os.SEEK_HOLE)
    out.append((pos, h - pos, 0)); pos = h
for o, l, t in out: print(o, l, t)
EOF
}

# expect_bytes FILE OFF LEN BYTE: every byte of the range equals BYTE.
expect_bytes() {
  $PY - "$@" <<'EOF' || fail "$1 [$2, +$3) is not all $4"
import sys
def num(s):
    m = {"k": 1 << 10, "M": 1 << 20}.get(s[-1], 1)
    return int(s[:-1] if m > 1 else s, 0) * m
f, off, n, b = sys.argv[1], num(sys.argv[2]), num(sys.argv[3]), int(sys.argv[4], 0)
with open(f, "rb") as fh:
    fh.seek(off); d = fh.read(n)
sys.exit(0 if d == bytes([b]) * n else 1)
EOF
}

# check_flags URI READONLY: size 64M, multi-conn, and the write flags.
check_flags() {
  nbdinfo --json "$1" >"$TMP/info.json"
  $PY - "$TMP/info.json" "$2" <<'EOF' || fail "nbdinfo --json mismatch: $(cat "$TMP/info.json")"
import json, sys
e = json.load(open(sys.argv[1]))["exports"][0]
ro = sys.argv[2] == "ro"
want = {"export-size": 64 << 20, "is_read_only": ro, "is_rotational": False,
        "can_multi_conn": True, "can_flush": True, "can_cache": True}
if not ro:
    want.update(can_fua=True, can_trim=True, can_zero=True, can_fast_zero=True)
bad = {k: (e.get(k), v) for k, v in want.items() if e.get(k) != v}
if bad:
    print("got/want:", bad); sys.exit(1)
EOF
}

# common_checks URI FILE: pattern I/O, trim/zero, FUA, file contents and
# sparseness.  The file starts as a 64 MiB hole.
common_checks() {
  local uri=$1 file=$2
  [ "$(map "$uri")" = "0 67108864 3" ] || fail "fresh file not a hole: $(map "$uri")"

  qemu-io -f raw -c 'write -P 0xab 1M 1M' -c 'read -P 0xab 1M 1M' \
          -c 'write -f -P 0xcd 3M 64k' -c 'read -P 0xcd 3M 64k' -c flush \
          "$uri" >"$TMP/qio.log" || fail "pattern I/O: $(cat "$TMP/qio.log")"
  expect_bytes "$file" 1M 1M 0xab
  expect_bytes "$file" 3M 64k 0xcd
  expect_bytes "$file" 0 1M 0
  [ "$(map "$uri")" = "$(filemap "$file")" ] || fail "map != file: $(map "$uri") vs $(filemap "$file")"
  want=$'0 1048576 3\n1048576 1048576 0\n2097152 1048576 3\n3145728 65536 0\n3211264 63897600 3'
  [ "$(map "$uri")" = "$want" ] || fail "map after writes: $(map "$uri")"

  # Trim punches a hole in the file; zero with unmap too; zero without
  # unmap keeps zeros in place (ZERO_RANGE or server emulation).
  qemu-io -f raw -c 'discard 1M 64k' -c 'read -P 0 1M 64k' \
          -c 'write -z -u 1216k 64k' -c 'read -P 0 1216k 64k' \
          -c 'write -z 1152k 4k' -c 'read -P 0 1152k 4k' -c 'read -P 0xab 1156k 60k' \
          "$uri" >"$TMP/qio2.log" || fail "trim/zero: $(cat "$TMP/qio2.log")"
  expect_bytes "$file" 1M 64k 0
  expect_bytes "$file" 1152k 4k 0
  expect_bytes "$file" 1156k 60k 0xab
  expect_bytes "$file" 1216k 64k 0
  $PY - "$file" <<'EOF' || fail "trim did not punch a hole in $file"
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
assert os.lseek(fd, 1 << 20, os.SEEK_HOLE) == 1 << 20, "no hole at 1M"
assert os.lseek(fd, 1 << 20, os.SEEK_DATA) == (1 << 20) + (64 << 10), "hole size"
assert os.lseek(fd, 1216 << 10, os.SEEK_HOLE) == 1216 << 10, "no hole at 1216k"
EOF
  [ "$(map "$uri")" = "$(filemap "$file")" ] || fail "map != file after trim: $(map "$uri") vs $(filemap "$file")"

  # FAST_ZERO without permission to punch must either succeed with zeros
  # or fail with ENOTSUP -- never be slow and never another error.
  $PY - "$uri" "$file" <<'EOF' || fail "fast zero"
import errno, nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\x77" * 65536, 5 << 20)
try:
    h.zero(65536, 5 << 20, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
    assert h.pread(65536, 5 << 20) == bytes(65536), "fast zero left data"
    print("fast zero: done natively")
except nbd.Error as e:
    assert e.errnum == errno.ENOTSUP, f"fast zero failed with {e}"
    assert h.pread(65536, 5 << 20) == b"\x77" * 65536, "failed fast zero changed data"
    print("fast zero: ENOTSUP (would be slow)")
h.shutdown()
EOF
}

# parallel_writers URI FILE: 4 connections write disjoint 8 MiB regions at
# once, 32 requests in flight each; the file must then hold all four.
parallel_writers() {
  $PY - "$1" "$2" <<'EOF' || fail "parallel writers"
import nbd, os, sys, threading
uri, path, region, piece = sys.argv[1], sys.argv[2], 8 << 20, 128 << 10
base = 16 << 20
data = [os.urandom(region) for _ in range(4)]
errors = []
def writer(i):
    try:
        h = nbd.NBD(); h.connect_uri(uri)
        assert h.can_multi_conn(), "no multi-conn"
        cookies = []
        for off in range(0, region, piece):
            b = nbd.Buffer.from_bytearray(bytearray(data[i][off:off + piece]))
            cookies.append((h.aio_pwrite(b, base + i * region + off), b))
            while h.aio_in_flight() >= 32:
                h.poll(-1)
        while h.aio_in_flight() > 0:
            h.poll(-1)
        for c, _ in cookies:
            h.aio_command_completed(c)
        h.flush(); h.shutdown()
    except Exception as e:
        errors.append(f"writer {i}: {e}")
ts = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
for t in ts: t.start()
for t in ts: t.join()
if errors: sys.exit("\n".join(errors))
with open(path, "rb") as f:
    f.seek(base)
    for i in range(4):
        if f.read(region) != data[i]:
            sys.exit(f"file region {i} mismatch")
print("parallel writers ok")
EOF
}

# --- 1. buffered, on tmpfs (falls back to $TMP if /dev/shm is missing) ---
shmdir=/dev/shm; [ -d "$shmdir" ] && [ -w "$shmdir" ] || shmdir=$TMP
F=$(mktemp "$shmdir/blkd-rawio.XXXXXX"); trap 'rc=$?; rm -f "$F" "${D:-}"; cleanup "$rc"' EXIT
truncate -s 64M "$F"
start_server "$PLUGIN_HOST" "$SO" "$F"
check_flags "$URI" rw
common_checks "$URI" "$F"
parallel_writers "$URI" "$F"
stop_server

# nbdcopy round trip: the file itself must equal the source afterwards.
truncate -s 0 "$F"; truncate -s 32M "$F"
head -c 32M /dev/urandom >"$TMP/rand"
start_server "$PLUGIN_HOST" "$SO" file="$F"
nbdcopy "$TMP/rand" "$URI" || fail "nbdcopy file -> nbd"
cmp "$TMP/rand" "$F" || fail "backing file differs from nbdcopy source"
nbdcopy "$URI" "$TMP/back" || fail "nbdcopy nbd -> file"
a=$(sha256sum <"$TMP/rand" | cut -d' ' -f1); b=$(sha256sum <"$TMP/back" | cut -d' ' -f1)
[ "$a" = "$b" ] || fail "nbdcopy round trip: sha256 $a != $b"
stop_server

# readonly=true: flagged read-only, writes refused, file untouched.
start_server "$PLUGIN_HOST" "$SO" file="$F" readonly=true
grep -q '"is_read_only": true' <<<"$(nbdinfo --json "$URI")" || fail "readonly=true not read-only"
if qemu-io -f raw -c 'write -P 0x01 0 4k' "$URI" >/dev/null 2>&1; then
  fail "write to readonly=true export succeeded"
fi
cmp -n 4096 "$TMP/rand" "$F" || fail "readonly export changed the file"
stop_server

# --- 2. direct=true on a filesystem that takes O_DIRECT ---
# dio_ok DIR: can a file in DIR be opened O_DIRECT?  (tmpfs could not
# before Linux 6.6; ext4, xfs and overlay can.)
dio_ok() {
  $PY - "$1" <<'EOF'
import os, sys, tempfile
fd, p = tempfile.mkstemp(dir=sys.argv[1]); os.close(fd)
try:
    os.close(os.open(p, os.O_RDWR | os.O_DIRECT)); ok = True
except OSError:
    ok = False
os.unlink(p); sys.exit(0 if ok else 1)
EOF
}

# Where O_DIRECT is refused, direct=true must fail loudly at start-up.
if ! dio_ok "$shmdir"; then
  if nbdkit -U "$TMP/x.sock" "$SO" "$F" direct=true --run true >"$TMP/dio.log" 2>&1; then
    fail "direct=true started on $shmdir, which refuses O_DIRECT"
  fi
  grep -q 'does not support O_DIRECT' "$TMP/dio.log" || fail "no O_DIRECT message: $(cat "$TMP/dio.log")"
  echo "direct=true refused on $shmdir as expected"
fi

# Prefer a disk-backed filesystem: on tmpfs O_DIRECT works (6.6+) but
# the page-cache check below means nothing there.
ddir=
for d in "${TMPDIR:-}" /var/tmp "$TOP/build" /tmp "$shmdir"; do
  [ -n "$d" ] && [ -d "$d" ] && [ -w "$d" ] || continue
  if dio_ok "$d"; then ddir=$d; break; fi
done
if [ -z "$ddir" ]; then
  echo "no filesystem here accepts O_DIRECT: direct=true part not run"
  echo ok; exit 0
fi
dfs=$(stat -f -c %T "$ddir")
echo "direct=true on $ddir ($dfs)"

D=$(mktemp "$ddir/blkd-rawio.XXXXXX")
truncate -s 64M "$D"
start_server "$PLUGIN_HOST" "$SO" file="$D" direct=true
check_flags "$URI" rw
nbdinfo --json "$URI" >"$TMP/dinfo.json"
$PY - "$TMP/dinfo.json" "$PLUGIN_HOST" <<'EOF' || fail "block size not advertised: $(cat "$TMP/dinfo.json")"
import json, sys
e = json.load(open(sys.argv[1]))["exports"][0]
mn, pr, mx = e["block_size_minimum"], e["block_size_preferred"], e["block_size_maximum"]
assert mn >= 512 and mn & (mn - 1) == 0 and mn <= 65536, mn
assert pr >= 4096 and pr >= mn, pr
# blkd caps the maximum at its own --max-request (32 MiB by default).
assert mx == (0xffffffff if sys.argv[2] == "nbdkit" else 32 << 20), mx
print("block size", mn, pr, mx)
EOF
common_checks "$URI" "$D"
# Direct writes bypass the page cache.  Drop what the checks above read
# (through the test's own buffered reads), write through NBD, and check
# that nothing of the file is cached afterwards.
$PY - "$D" <<'EOF'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
EOF
qemu-io -f raw -c 'write -P 0x5c 40M 4M' "$URI" >/dev/null || fail "direct write"
if command -v fincore >/dev/null && [ "$dfs" != tmpfs ]; then
  res=$(fincore --bytes --noheadings --output RES "$D" | tr -d ' ')
  [ "$res" = 0 ] || fail "direct=true write left $res bytes in the page cache"
fi
expect_bytes "$D" 40M 4M 0x5c
parallel_writers "$URI" "$D"

# Unaligned requests (a client ignoring the block size): nbdkit passes
# them to the plugin, which serves them through its buffered fd, coherent
# with the direct fd.  blkd enforces the advertised minimum instead and
# answers EINVAL (proto.md: a server SHOULD), leaving the connection usable.
if [ "$PLUGIN_HOST" = blkd ]; then
$PY - "$URI" <<'EOF' || fail "blkd: unaligned I/O under direct=true"
import errno, nbd, sys
h = nbd.NBD(); h.set_strict_mode(h.get_strict_mode() & ~nbd.STRICT_ALIGN)
h.connect_uri(sys.argv[1])
for fn in (lambda: h.pwrite(b"x" * 1000, 8 * 4096 + 7), lambda: h.pread(1000, 8 * 4096 + 7)):
    try:
        fn(); raise SystemExit("misaligned request accepted")
    except nbd.Error as e:
        assert "EINVAL" in str(e), e
assert len(h.pread(4096, 8 * 4096)) == 4096
h.shutdown()
EOF
else
$PY - "$URI" "$D" <<'EOF' || fail "unaligned I/O under direct=true"
import nbd, os, sys
h = nbd.NBD(); h.set_strict_mode(h.get_strict_mode() & ~nbd.STRICT_ALIGN)
h.connect_uri(sys.argv[1])
payload = os.urandom(1000)
h.pwrite(payload, 8 * 4096 + 7)
got = h.pread(3 * 4096, 7 * 4096)         # aligned: O_DIRECT read
assert got[4096 + 7:4096 + 1007] == payload, "direct read missed buffered write"
assert h.pread(1000, 8 * 4096 + 7) == payload, "unaligned read"
with open(sys.argv[2], "rb") as f:
    f.seek(8 * 4096 + 7); assert f.read(1000) == payload, "file content"
h.shutdown()
EOF
fi
stop_server
echo ok
