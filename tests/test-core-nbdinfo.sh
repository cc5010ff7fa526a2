#!/usr/bin/env bash
# nbdinfo against the server: --json flags as the plugin answers them
# (memory, memory -r, full, pattern), --map before and after writes and a
# trim, --list and the export name given with -e, and the same over a Unix
# socket.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
need_server
need nbdinfo
need jq
need_nbd_py

# json_field URI-or-args... FIELD: one field of the first export.
info_json() { nbdinfo --json "$@" >"$TMP/info.json" || fail "nbdinfo --json $* failed"; }
field() { jq -r ".exports[0][\"$1\"]" "$TMP/info.json"; }

# expect_flags WHAT name=value...: compare each field of the last info_json.
expect_flags() {
  local what=$1 kv; shift
  for kv in "$@"; do expect_eq "$(field "${kv%%=*}")" "${kv#*=}" "$what ${kv%%=*}"; done
}

echo "# memory plugin, 64M, TCP: nbdinfo --json"
start_server memory size=64M
info_json "$URI"
expect_eq "$(jq -r .protocol "$TMP/info.json")" newstyle-fixed "protocol"
expect_eq "$(jq -r .structured "$TMP/info.json")" true "structured replies"
expect_eq "$(jq -r .TLS "$TMP/info.json")" false "TLS"
expect_flags memory export-size=67108864 is_read_only=false can_flush=true can_trim=true \
  can_zero=true can_fua=true can_multi_conn=true can_cache=true can_fast_zero=true can_df=true \
  is_rotational=false
expect_eq "$(jq -r '.exports[0].contexts | index("base:allocation") != null' "$TMP/info.json")" true \
  "base:allocation among the meta contexts"

echo "# nbdinfo --size and --can/--is"
expect_eq "$(nbdinfo --size "$URI")" 67108864 "nbdinfo --size"
nbdinfo --can write "$URI" || fail "nbdinfo --can write says no"
ok "nbdinfo --can write"
nbdinfo --can flush "$URI" || fail "nbdinfo --can flush says no"
ok "nbdinfo --can flush"
if nbdinfo --is read-only "$URI"; then fail "nbdinfo --is read-only says yes"; fi
ok "nbdinfo --is read-only says no"

echo "# --map of a fresh disk: one hole"
nbdinfo --map "$URI" >"$TMP/map0" || fail "nbdinfo --map failed"
cat "$TMP/map0"
expect_eq "$(awk '{print $1, $2, $3}' "$TMP/map0" | tr '\n' ';')" "0 67108864 3;" "map of a fresh disk"

echo "# --map after writing [1M,2M) and [8M,8M+64K), then trimming [1M+512K,2M)"
"$PY" - "$URI" <<'EOF' || fail "writing through libnbd failed"
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\x11" * (1 << 20), 1 << 20)
h.pwrite(b"\x22" * 65536, 8 << 20)
h.trim(512 << 10, (1 << 20) + (512 << 10))
h.flush(); h.shutdown()
EOF
nbdinfo --map "$URI" >"$TMP/map1" || fail "nbdinfo --map failed"
cat "$TMP/map1"
# Merge adjacent entries of the same type so the check does not depend on
# how the server splits extents.
awk '{ if (NR > 1 && $3 == t) { l += $2 } else { if (NR > 1) print o, l, t; o = $1; l = $2; t = $3 } }
     END { print o, l, t }' "$TMP/map1" | tr '\n' ';' >"$TMP/map1m"
expect_eq "$(cat "$TMP/map1m")" \
  "0 1048576 3;1048576 524288 0;1572864 6815744 3;8388608 65536 0;8454144 58654720 3;" \
  "map after writes and a trim"
nbdinfo --map --totals "$URI" >"$TMP/totals"
cat "$TMP/totals"
expect_eq "$(awk '$3 == 0 {print $1}' "$TMP/totals")" $((524288 + 65536)) "bytes of data in --map --totals"

echo "# --list shows the default export; -e names the export"
nbdinfo --list --json "$URI" >"$TMP/list.json" || fail "nbdinfo --list failed"
expect_eq "$(jq -r '.exports | length >= 1' "$TMP/list.json")" true "--list shows an export"
expect_eq "$(jq -r '.exports[0]["export-size"]' "$TMP/list.json")" 67108864 "--list export size"
stop_server

start_server -e blkdtest memory size=16M
nbdinfo --list --json "$URI" >"$TMP/list.json" || fail "nbdinfo --list failed"
jq -r '.exports[]["export-name"]' "$TMP/list.json" | sed 's/^/  listed: /'
if blkd_only "-e NAME is the export --list shows" "nbdkit -e only sets the name for --run/URIs"; then
  expect_eq "$(jq -r '[.exports[]["export-name"]] | index("blkdtest") != null' "$TMP/list.json")" true \
    "export blkdtest listed"
fi
expect_eq "$(nbdinfo --size "$URI/blkdtest")" 16777216 "size of export blkdtest"
stop_server

echo "# read-only (-r): flags and a refused write"
start_server -r memory size=64M
info_json "$URI"
expect_flags "memory -r" export-size=67108864 is_read_only=true can_trim=false can_zero=false \
  can_fast_zero=false
note "memory -r: can_fua=$(field can_fua) can_flush=$(field can_flush) (not checked)"
"$PY" - "$URI" <<'EOF' || fail "write on a read-only export was not refused with EPERM"
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.set_strict_mode(0)
try:
    h.pwrite(b"x" * 512, 0)
    sys.exit("write succeeded")
except nbd.Error as e:
    if e.errno not in ("EPERM", "EROFS"):
        sys.exit("write failed with %s, want EPERM" % e.errno)
    print("ok: write on read-only export fails with %s" % e.errno)
assert h.pread(512, 0) == bytes(512), "read-only export changed"
print("ok: connection still reads after the refused write")
EOF
stop_server

echo "# Unix socket (-U)"
start_server_unix memory size=32M
info_json "$URI"
expect_flags "memory over -U" export-size=33554432 is_read_only=false can_multi_conn=true can_zero=true
nbdinfo --map "$URI" >"$TMP/mapu" || fail "nbdinfo --map over -U failed"
expect_eq "$(awk '{print $1, $2, $3}' "$TMP/mapu" | tr '\n' ';')" "0 33554432 3;" "map over -U"
stop_server

echo "# flags as other plugins answer them"
start_server full size=1M
info_json "$URI"
expect_flags full export-size=1048576 is_read_only=false can_flush=false can_fua=false can_trim=true \
  can_zero=true can_multi_conn=true
stop_server
start_server pattern size=1M
info_json "$URI"
expect_flags pattern export-size=1048576 is_read_only=true can_trim=false can_zero=false can_multi_conn=true
stop_server
start_server sparse-random size=64M
info_json "$URI"
expect_flags sparse-random export-size=67108864 is_read_only=false can_flush=true can_fua=true \
  can_zero=true can_fast_zero=false
stop_server
echo "all nbdinfo checks passed"
