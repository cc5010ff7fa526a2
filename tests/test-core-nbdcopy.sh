#!/usr/bin/env bash
# nbdcopy round trips checked by sha256: a random 32 MiB file into the
# server and back, with the defaults and with 4 connections x 64 requests,
# a sparse file (holes must come back as zeros), and server-to-server.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
need_server
need nbdcopy
need sha256sum

head -c $((32 * 1024 * 1024)) /dev/urandom >"$TMP/in.img"
want=$(sha "$TMP/in.img")

echo "# file -> nbd -> file, defaults"
start_server memory size=32M
nbdcopy "$TMP/in.img" "$URI" || fail "nbdcopy to the server failed"
nbdcopy "$URI" "$TMP/out1.img" || fail "nbdcopy from the server failed"
expect_eq "$(stat -c %s "$TMP/out1.img")" 33554432 "size copied back"
expect_eq "$(sha "$TMP/out1.img")" "$want" "sha256 after a default round trip"
stop_server

echo "# file -> nbd -> file with --connections=4 --requests=64"
start_server memory size=32M
nbdcopy --connections=4 --requests=64 "$TMP/in.img" "$URI" || fail "nbdcopy -C4 -R64 to the server failed"
nbdcopy --connections=4 --requests=64 "$URI" "$TMP/out2.img" || fail "nbdcopy -C4 -R64 from the server failed"
expect_eq "$(sha "$TMP/out2.img")" "$want" "sha256 after a 4-connection round trip"

echo "# the same export read again with small requests (--request-size=65536)"
nbdcopy --request-size=65536 --requests=64 "$URI" "$TMP/out3.img" || fail "nbdcopy with 64K requests failed"
expect_eq "$(sha "$TMP/out3.img")" "$want" "sha256 read back in 64 KiB requests"

echo "# overwrite with a sparse image: data islands in zeros"
truncate -s 32M "$TMP/sparse.img"
for mb in 0 5 17 31; do
  head -c 1048576 /dev/urandom | dd of="$TMP/sparse.img" bs=1M seek=$mb conv=notrunc status=none
done
nbdcopy --connections=4 "$TMP/sparse.img" "$URI" || fail "nbdcopy of the sparse image failed"
nbdcopy "$URI" "$TMP/sparse-out.img" || fail "nbdcopy of the sparse image back failed"
expect_eq "$(sha "$TMP/sparse-out.img")" "$(sha "$TMP/sparse.img")" "sha256 of the sparse image round trip"
if command -v nbdinfo >/dev/null; then
  nbdinfo --map --totals "$URI" | sed 's/^/  /'
fi

echo "# server to server: export A -> export B with 4 connections"
URI_A=$URI
start_server memory size=32M
nbdcopy --connections=4 --requests=64 "$URI_A" "$URI" || fail "nbdcopy server to server failed"
nbdcopy "$URI" "$TMP/b.img" || fail "nbdcopy from server B failed"
expect_eq "$(sha "$TMP/b.img")" "$(sha "$TMP/sparse.img")" "sha256 of export B after the copy from A"
check_alive
echo "all nbdcopy checks passed"
