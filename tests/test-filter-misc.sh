#!/usr/bin/env bash
# The remaining filters: nofilter (a pure pass-through), exportname (export
# names listed and enforced), extentlist (block status from a file),
# ddrescue (bad regions of a ddrescue map fail with EIO), readahead and
# scan (prefetchers: the data must come back unchanged).
. "$(dirname "$0")/lib.sh"
. "$TOP/tests/helpers/core.sh"
. "$TOP/tests/helpers/filters.sh"
need_filter_server; need nbdinfo; need nbdcopy; need qemu-io; need_nbd_py

head -c 2M /dev/urandom >"$TMP/disk.img"

for f in nofilter readahead scan; do
  have_filter "$f" || continue
  serve --filter="$f" file "$TMP/disk.img"
  nbd_get "$URI" "$TMP/got"
  same_bytes "$f: the data comes through unchanged" "$TMP/got" "$TMP/disk.img"
  qemu-io -f raw -c 'write -P 0x61 4k 4k' -c 'read -P 0x61 4k 4k' "$URI" >"$TMP/qio" \
    || fail "$f: write"
  grep -q 'Pattern verification failed' "$TMP/qio" && fail "$f: read after write differs"
  expect_eq "$(fill_of "$TMP/disk.img" 4096 4096)" 61 "$f: a write reaches the file"
done

if have_filter exportname; then
  serve --filter=exportname memory 1M exportname=alpha exportname=beta \
    exportname-list=explicit exportname-strict=true default-export=alpha
  nbdinfo --list --json "$URI" >"$TMP/list.json" || fail "exportname: --list"
  "$PY" - "$TMP/list.json" <<'PYEOF' || fail "exportname: the listed names are not alpha, beta"
import json, sys
names = sorted(e["export-name"] for e in json.load(open(sys.argv[1]))["exports"])
assert names == ["alpha", "beta"], names
PYEOF
  ok "exportname: LIST shows exactly the names given"
  expect_eq "$(nbd_size "$URI/beta")" 1048576 "exportname: a listed name opens"
  expect_fail "exportname-strict: an unlisted name is refused" nbdinfo --size "$URI/gamma"
fi

if have_filter extentlist; then
  printf '0 64K\n1M 64K hole\n1088K 960K hole,zero\n' >"$TMP/extents"
  serve -r --filter=extentlist file "$TMP/disk.img" extentlist="$TMP/extents"
  nbdinfo --map "$URI" | awk '{print $1, $2, $3}' >"$TMP/map"
  printf '%s\n' "0 65536 0" "65536 983040 3" "1048576 65536 1" "1114112 983040 3" >"$TMP/want"
  same_bytes "extentlist: the map is the file's (gaps are holes)" "$TMP/map" "$TMP/want"
fi

if have_filter ddrescue; then
  cat >"$TMP/rescue.map" <<'MAP'
# Mapfile. Created by GNU ddrescue version 1.27
# current_pos  current_status  current_pass
0x00000000     +               1
#      pos        size  status
0x00000000  0x00010000  +
0x00010000  0x00010000  -
0x00020000  0x001E0000  +
MAP
  serve -r --filter=ddrescue file "$TMP/disk.img" ddrescue-mapfile="$TMP/rescue.map"
  "$PY" - "$URI" "$TMP/disk.img" <<'PYEOF' || fail "ddrescue"
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
img = open(sys.argv[2], "rb").read()
assert h.pread(65536, 0) == img[:65536], "rescued region differs"
assert h.pread(65536, 131072) == img[131072:196608], "rescued region differs"
PYEOF
  ok "ddrescue: the rescued regions read as the image"
  nbd_must_fail "ddrescue: a read in the bad region gets EIO" EIO "$URI" 'h.pread(4096, 65536 + 8192)'
fi
check_alive
echo "ok"
