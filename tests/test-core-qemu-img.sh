#!/usr/bin/env bash
# qemu-img against the server: info, convert in both directions (raw and
# qcow2, with parallel out-of-order writes), compare (equal and a planted
# difference), and map --output=json after writing some blocks and
# trimming others: data where written, holes reading as zeros elsewhere.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
need_server
need qemu-img
need qemu-io
need jq

M=$((1024 * 1024))
start_server memory size=64M

echo "# qemu-img info"
qemu-img info -f raw --output=json "$URI" >"$TMP/info.json" || fail "qemu-img info failed"
expect_eq "$(jq -r '."virtual-size"' "$TMP/info.json")" 67108864 "virtual size"

echo "# map after writes and trims"
qemu-io -f raw \
  -c "write -P 0x01 1M 1M" \
  -c "write -P 0x02 8M 64k" \
  -c "write -P 0x03 20M 4M" \
  -c "discard 1M 512k" \
  -c "discard 21M 2M" \
  -c "write -z -u 8M 32k" \
  -c "flush" "$URI" >"$TMP/qio.out" 2>&1 || { cat "$TMP/qio.out"; fail "qemu-io setup failed"; }
qemu-img map -f raw --output=json "$URI" >"$TMP/map.json" || fail "qemu-img map failed"
cat "$TMP/map.json"
# Merge neighbours with the same data flag, list the data ranges.
data_ranges=$(jq -c '[.[] | {s: .start, l: .length, d: .data}]
  | reduce .[] as $e ([]; if length > 0 and .[-1].d == $e.d and (.[-1].s + .[-1].l) == $e.s
                          then .[-1].l += $e.l else . + [$e] end)
  | map(select(.d) | [.s, .l])' "$TMP/map.json")
expect_eq "$data_ranges" \
  "[[$((M + M / 2)),$((M / 2))],[$((8 * M + 32768)),32768],[$((20 * M)),$M],[$((23 * M)),$M]]" \
  "data ranges in qemu-img map"
expect_eq "$(jq '[.[] | select(.data == false and .zero == false)] | length' "$TMP/map.json")" 0 \
  "ranges that are neither data nor zero"
expect_eq "$(jq '[.[] | .length] | add' "$TMP/map.json")" 67108864 "map covers the disk"
if ! qemu-io -f raw -c "read -P 0 1M 512k" -c "read -P 0x01 $((M + M / 2)) 512k" -c "read -P 0 8M 32k" \
     -c "read -P 0x02 $((8 * M + 32768)) 32k" -c "read -P 0 21M 2M" -c "read -P 0x03 23M 1M" \
     "$URI" >"$TMP/qio.out" 2>&1 || grep -q 'verification failed' "$TMP/qio.out"; then
  cat "$TMP/qio.out"; fail "the mapped ranges do not hold the expected bytes"
fi
ok "holes read as zeros and data ranges hold their patterns"

echo "# convert a local image into the export, compare"
head -c $((16 * M)) /dev/urandom >"$TMP/rand"
truncate -s 64M "$TMP/src.img"
dd if="$TMP/rand" of="$TMP/src.img" bs=1M count=8 conv=notrunc status=none
dd if="$TMP/rand" of="$TMP/src.img" bs=1M skip=8 seek=40 count=8 conv=notrunc status=none
qemu-img convert -n -f raw -O raw -m 8 -W "$TMP/src.img" "$URI" || fail "qemu-img convert into the export failed"
ok "qemu-img convert -n -m 8 -W into the export"
qemu-img compare -f raw -F raw "$TMP/src.img" "$URI" >"$TMP/cmp.out" 2>&1 \
  || { cat "$TMP/cmp.out"; fail "qemu-img compare finds a difference after convert"; }
ok "qemu-img compare: identical"

echo "# convert the export out to qcow2 and raw, compare each with the source"
qemu-img convert -f raw -O qcow2 "$URI" "$TMP/out.qcow2" || fail "qemu-img convert to qcow2 failed"
qemu-img compare -f qcow2 -F raw "$TMP/out.qcow2" "$TMP/src.img" >"$TMP/cmp.out" 2>&1 \
  || { cat "$TMP/cmp.out"; fail "qcow2 copy differs from the source"; }
ok "export -> qcow2 equals the source"
qemu-img convert -f raw -O raw "$URI" "$TMP/out.raw" || fail "qemu-img convert to raw failed"
expect_eq "$(sha "$TMP/out.raw")" "$(sha "$TMP/src.img")" "sha256 of export -> raw"

echo "# a planted one-byte difference is found"
printf '\x42' | dd of="$TMP/src.img" bs=1 seek=$((40 * M + 12345)) conv=notrunc status=none
set +e
qemu-img compare -f raw -F raw "$TMP/src.img" "$URI" >"$TMP/cmp.out" 2>&1
rc=$?
set -e
cat "$TMP/cmp.out"
expect_eq "$rc" 1 "qemu-img compare exit status with a difference"
# qemu-img reports the start of the 512-byte sector holding the difference.
expect_eq "$(sed -n 's/.*mismatch at offset \([0-9]*\).*/\1/p' "$TMP/cmp.out")" $((40 * M + 12345 / 512 * 512)) \
  "offset compare reports"

echo "# qcow2 image converted back into the export over a Unix socket"
start_server_unix memory size=64M
qemu-img convert -n -f qcow2 -O raw "$TMP/out.qcow2" "$URI" || fail "qemu-img convert over -U failed"
qemu-img compare -f raw -F qcow2 "$URI" "$TMP/out.qcow2" >"$TMP/cmp.out" 2>&1 \
  || { cat "$TMP/cmp.out"; fail "export over -U differs from the qcow2"; }
ok "qcow2 -> export over -U: identical"
check_alive
echo "all qemu-img checks passed"
