#!/usr/bin/env bash
# Filters that keep data of their own above the plugin: cow (writes go to an
# overlay, the plugin is never written), cache (writethrough and writeback
# reach the plugin when they must) and cacheextents (a cached block status
# answer must not survive a write).
. "$(dirname "$0")/lib.sh"
. "$TOP/tests/helpers/core.sh"
. "$TOP/tests/helpers/filters.sh"
need_filter_server; need nbdinfo; need nbdcopy; need qemu-io

head -c 4M /dev/urandom >"$TMP/base.img"
base_sum=$(sha "$TMP/base.img")

if have_filter cow; then
  cp "$TMP/base.img" "$TMP/cow.img"
  serve --filter=cow file "$TMP/cow.img"
  qemu-io -f raw -c 'write -P 0x11 64k 64k' -c 'read -P 0x11 64k 64k' \
          -c 'write -z 1M 128k' -c 'read -P 0 1M 128k' -c 'discard 2M 64k' \
          -c flush "$URI" >"$TMP/qio" || fail "cow: writes: $(cat "$TMP/qio")"
  grep -q 'Pattern verification failed' "$TMP/qio" && fail "cow: read back differs"
  ok "cow: writes, zeroes and trims read back"
  expect_eq "$(sha "$TMP/cow.img")" "$base_sum" "cow: the plugin's file is untouched"
  nbd_get "$URI" "$TMP/got"
  slice "$TMP/base.img" 0 65536 >"$TMP/want"
  slice "$TMP/got" 0 65536 >"$TMP/got0"
  same_bytes "cow: unwritten blocks still come from the plugin" "$TMP/got0" "$TMP/want"
  # The overlay lives as long as the server: a new one shows the base again.
  serve --filter=cow file "$TMP/cow.img"
  nbd_get "$URI" "$TMP/got"
  same_bytes "cow: a restarted server shows the plugin's data" "$TMP/got" "$TMP/base.img"
fi

if have_filter cache; then
  # writethrough: each write is in the file when the client has its reply.
  cp "$TMP/base.img" "$TMP/wt.img"
  serve --filter=cache file "$TMP/wt.img" cache=writethrough
  qemu-io -f raw -c 'write -P 0x22 128k 64k' "$URI" >/dev/null || fail "cache: write"
  expect_eq "$(fill_of "$TMP/wt.img" 131072 65536)" 22 "cache=writethrough: the write is in the file"
  # writeback: after a flush the file holds the data; reads come back right
  # whether cached or not.
  cp "$TMP/base.img" "$TMP/wb.img"
  serve --filter=cache file "$TMP/wb.img" cache=writeback
  qemu-io -f raw -c 'write -P 0x33 256k 64k' -c 'read -P 0x33 256k 64k' -c flush \
    "$URI" >"$TMP/qio" || fail "cache=writeback: $(cat "$TMP/qio")"
  grep -q 'Pattern verification failed' "$TMP/qio" && fail "cache=writeback: read back differs"
  expect_eq "$(fill_of "$TMP/wb.img" 262144 65536)" 33 "cache=writeback: the write is in the file after flush"
  nbd_get "$URI" "$TMP/got"
  same_bytes "cache=writeback: the whole disk reads as the file" "$TMP/got" "$TMP/wb.img"
fi

if have_filter cacheextents; then
  # A sparse file: 64K of data at 1M, holes elsewhere.
  truncate -s 4M "$TMP/sparse.img"
  head -c 64K /dev/urandom | dd of="$TMP/sparse.img" bs=64K seek=16 conv=notrunc status=none
  serve file "$TMP/sparse.img"
  nbdinfo --map "$URI" | awk '{print $1, $2, $3}' >"$TMP/map.plain"
  serve --filter=cacheextents file "$TMP/sparse.img"
  nbdinfo --map "$URI" | awk '{print $1, $2, $3}' >"$TMP/map.cached"
  same_bytes "cacheextents: the map is the plugin's" "$TMP/map.cached" "$TMP/map.plain"
  grep -q '^0 1048576 3$' "$TMP/map.cached" || fail "cacheextents: no leading hole: $(cat "$TMP/map.cached")"
  # Write into the leading hole on the same server: the cached answer (one
  # hole from 0) must be dropped, so the map now starts with data.
  "$PY" - "$URI" <<'PYEOF' || fail "cacheextents: a write did not invalidate the cached extents"
import nbd, sys
h = nbd.NBD(); h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(sys.argv[1])
seen = []
def cb(ctx, off, ents, err):
    seen.append(list(ents))
    return 0
h.block_status(1 << 20, 0, cb)
assert seen[0][1] & 1, "leading hole not reported: %r" % seen
h.pwrite(b"\x44" * 4096, 0)
seen.clear()
h.block_status(1 << 20, 0, cb)
assert not seen[0][1] & 1, "stale hole after the write: %r" % seen
print("cacheextents: stale answer dropped after a write")
PYEOF
  ok "cacheextents: a write drops the cached answer"
fi
check_alive
echo "ok"
