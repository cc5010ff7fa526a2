#!/usr/bin/env bash
# Block cache options: writeback is refused for a plugin that is not
# multi-conn safe (its handles may not see each other's writes, and the
# cache writes through a handle of its own), with a message that says so;
# writethrough over the same plugin works; sizes that make no sense are
# refused at start-up, loudly.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
need_server
server_is_nbdkit && skip "--cache is a blkd option"
need nbdkit
need nbdinfo

out=$TMP/out
if timeout 20 "$BLKD" -f -p 0 --cache 1M --cache-mode writeback example1 >"$out" 2>&1; then
  fail "writeback over example1 (not multi-conn) started"
fi
grep -q "can_multi_conn" "$out" || { cat "$out"; fail "refusal does not say why"; }
ok "writeback refused for a plugin without multi-conn: $(head -c 120 "$out")"

if timeout 20 "$BLKD" -f -p 0 --cache 1M --cache-mode writeback \
     eval get_size='echo 1048576' pread='dd if=/dev/zero count=$3 iflag=count_bytes status=none' \
     >"$out" 2>&1; then
  fail "writeback over eval (no can_multi_conn) started"
fi
grep -q "can_multi_conn" "$out" || { cat "$out"; fail "refusal does not say why"; }
ok "writeback refused for eval without can_multi_conn"

start_server --cache 1M --cache-mode writethrough example1
nbdinfo --size "$URI" >"$out"
expect_eq "$(cat "$out")" 104857600 "writethrough over example1: size"
nbdcopy "$URI" "$TMP/copy1"
nbdcopy "$URI" "$TMP/copy2"
cmp "$TMP/copy1" "$TMP/copy2" || fail "two reads through the cache differ"
nbdkit -U "$TMP/ref.sock" -f example1 & ref=$!
SERVER_PIDS+=("$ref")
wait_socket "$TMP/ref.sock"
nbdcopy "nbd+unix:///?socket=$TMP/ref.sock" "$TMP/ref"
cmp "$TMP/copy1" "$TMP/ref" || fail "cached example1 differs from nbdkit's"
ok "writethrough over example1 reads what nbdkit serves"
check_alive
stop_server

if timeout 20 "$BLKD" -f -p 0 --cache 32K --cache-block 64K ram size=1M >"$out" 2>&1; then
  fail "--cache smaller than one block started"
fi
grep -q "smaller than one --cache-block" "$out" || { cat "$out"; fail "no reason given"; }
ok "--cache below one block refused"

if timeout 20 "$BLKD" -f -p 0 --cache 1M --cache-block 48K ram size=1M >"$out" 2>&1; then
  fail "--cache-block 48K started"
fi
ok "--cache-block that is not a power of two refused"

for v in --cache-mode=sideways --cache-ctor=maybe; do
  if timeout 20 "$BLKD" -f -p 0 --cache 1M "$v" ram size=1M >"$out" 2>&1; then
    fail "$v accepted"
  fi
  ok "$v refused"
done
echo "cache option checks passed"
