#!/usr/bin/env bash
# qemu-io -f raw against the server: pattern writes and verified reads,
# FUA writes (-f), discard, write -z (with and without -u/-n), unaligned
# byte ranges, vectored and async I/O, flush.  The same command list is
# then replayed on a local raw file and the two images must be equal byte
# for byte.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
need_server
need qemu-io
need nbdcopy

# qio TARGET CMD...: run qemu-io commands, fail on any error or pattern
# mismatch (qemu-io prints those without always failing).
qio() {
  local target=$1; shift
  local args=() c
  for c in "$@"; do args+=(-c "$c"); done
  if ! qemu-io -f raw "${args[@]}" "$target" >"$TMP/qio.out" 2>&1; then
    cat "$TMP/qio.out"; fail "qemu-io failed on $target: $*"
  fi
  if grep -Eiq 'verification failed|error|failed|not supported' "$TMP/qio.out"; then
    cat "$TMP/qio.out"; fail "qemu-io reported a problem on $target: $*"
  fi
}

M=$((1024 * 1024))
writes=(
  "write -P 0xa5 0 1M"
  "write -P 0x5a 1M 64k"
  "write -f -P 0x11 2M 64k"
  "writev -P 0x22 3M 4k 8k 12k"
  "aio_write -P 0x33 4M 64k"
  "aio_write -P 0x44 5M 64k"
  "aio_write -f -P 0x55 6M 64k"
  "aio_flush"
  "write -P 0x66 7M 1M"
  "discard 7M 512k"
  "write -P 0x77 8M 128k"
  "write -z 8M 32k"
  "write -z -u 8M+64k 32k"
  "write -P 0x88 9M 64k"
  "write -z -n 9M 64k"
  "write -P 0x99 12345 1000"
  "flush"
)
# Offsets qemu-io understands: it does not do arithmetic, so expand.
expand() { local s=$1; s=${s//8M+64k/$((8 * M + 65536))}; echo "$s"; }
cmds=()
for c in "${writes[@]}"; do cmds+=("$(expand "$c")"); done

echo "# writes through qemu-io, 64M memory export"
start_server memory size=64M
for c in "${cmds[@]}"; do echo "  qemu-io: $c"; done
qio "$URI" "${cmds[@]}"
ok "all qemu-io writes, discards, zeroes and flushes succeeded"

echo "# verified reads (read -P checks every byte)"
reads=(
  "read -P 0xa5 0 12345"
  "read -P 0x99 12345 1000"
  "read -P 0xa5 13345 $((M - 13345))"
  "read -P 0x5a 1M 64k"
  "read -P 0x11 2M 64k"
  "readv -P 0x22 3M 16k 8k"
  "read -P 0x33 4M 64k"
  "read -P 0x44 5M 64k"
  "read -P 0x55 6M 64k"
  "read -P 0 7M 512k"
  "read -P 0x66 $((7 * M + 524288)) 512k"
  "read -P 0 8M 32k"
  "read -P 0x77 $((8 * M + 32768)) 32k"
  "read -P 0 $((8 * M + 65536)) 32k"
  "read -P 0x77 $((8 * M + 98304)) 32k"
  "read -P 0 9M 64k"
  "read -P 0 10M 54M"
)
qio "$URI" "${reads[@]}"
ok "${#reads[@]} pattern reads verified"

echo "# a wrong pattern must be caught (the checker can fail)"
qemu-io -f raw -c "read -P 0x5a 0 4k" "$URI" >"$TMP/wrong.out" 2>&1 || true
if grep -q 'verification failed' "$TMP/wrong.out"; then
  ok "read -P with the wrong pattern reports a mismatch"
else
  fail "read -P 0x5a over 0xa5 data did not report a mismatch"
fi

echo "# the same commands on a local raw file give the same image"
truncate -s 64M "$TMP/local.img"
qio "$TMP/local.img" "${cmds[@]}"
nbdcopy "$URI" "$TMP/remote.img" || fail "nbdcopy of the export failed"
expect_eq "$(sha "$TMP/remote.img")" "$(sha "$TMP/local.img")" "sha256 of export vs local replay"
cmp "$TMP/remote.img" "$TMP/local.img" || fail "images differ"

echo "# over a Unix socket"
start_server_unix memory size=16M
qio "$URI" "write -P 0x3c 0 1M" "write -f -P 0xc3 1M 4k" "flush" "read -P 0x3c 0 1M" "read -P 0xc3 1M 4k" \
  "discard 0 1M" "read -P 0 0 1M"
ok "qemu-io over -U: write, FUA write, flush, verified reads, discard"
check_alive
echo "all qemu-io checks passed"
