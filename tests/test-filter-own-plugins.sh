#!/usr/bin/env bash
# blkd's own plugins (ram, rawio) under stacks of Debian's filters, in
# nbdkit and in the server under test, with the same checks: the .so files
# must be ordinary nbdkit plugins as far as any filter can tell.
. "$(dirname "$0")/lib.sh"
. "$TOP/tests/helpers/core.sh"
. "$TOP/tests/helpers/filters.sh"
need nbdkit; need nbdinfo; need nbdcopy; need qemu-io; need_nbd_py
RAM=$TOP/plugins/ram/nbdkit-ram-plugin.so
RAWIO=$TOP/plugins/rawio/nbdkit-rawio-plugin.so
[ -f "$RAM" ] && [ -f "$RAWIO" ] || skip "ram/rawio plugins not built (make all)"
for f in offset stats cow truncate blocksize log; do
  [ -f "$FILTERDIR/nbdkit-$f-filter.so" ] || skip "filter $f is not installed"
done

hosts=(nbdkit)
if server_is_nbdkit; then :
elif grep -q -- '--filter' <<<"$("$BLKD" --help 2>&1)"; then hosts+=(blkd)
else fail "$BLKD has no --filter option"
fi

for host in "${hosts[@]}"; do
  echo "# hosted by $host"
  # ram under offset and stats: a write at 0 lands at 1M in the ram disk,
  # and the stats file counts the requests that passed.
  [ -n "${SERVER_PID:-}" ] && stop_server
  : >"$TMP/server.log"
  start_server "$host" --filter=offset --filter=stats "$RAM" size=8M \
    offset=1M range=4M statsfile="$TMP/stats.$host"
  expect_eq "$(nbd_size "$URI")" 4194304 "$host: ram+offset: size is the range"
  qemu-io -f raw -c 'write -P 0x3c 0 64k' -c 'read -P 0x3c 0 64k' "$URI" >"$TMP/qio" \
    || fail "$host: ram+offset: I/O"
  grep -q 'Pattern verification failed' "$TMP/qio" && fail "$host: ram+offset: read back differs"
  ok "$host: ram+offset: written data reads back"
  stop_server; SERVER_PID=
  grep -qE '^write: 1 ops' "$TMP/stats.$host" || fail "$host: stats: $(cat "$TMP/stats.$host")"
  grep -qE '^read: 1 ops' "$TMP/stats.$host" || fail "$host: stats: $(cat "$TMP/stats.$host")"
  ok "$host: ram+stats: one write and one read counted"

  # rawio under offset: a write at 0 lands at 1M in the file.
  head -c 4M /dev/zero >"$TMP/off.img"
  : >"$TMP/server.log"
  start_server "$host" --filter=offset "$RAWIO" file="$TMP/off.img" offset=1M
  expect_eq "$(nbd_size "$URI")" 3145728 "$host: rawio+offset: size is the file's minus 1M"
  qemu-io -f raw -c 'write -P 0x42 0 4k' -c flush "$URI" >/dev/null || fail "$host: rawio+offset: write"
  expect_eq "$(fill_of "$TMP/off.img" 1048576 4096)" 42 "$host: rawio+offset: the write is at 1M in the file"
  expect_eq "$(fill_of "$TMP/off.img" 0 1048576)" 00 "$host: rawio+offset: nothing before 1M"
  stop_server; SERVER_PID=

  # rawio under cow and truncate: writes read back, the file never changes.
  head -c 4M /dev/urandom >"$TMP/raw.img"
  sum=$(sha "$TMP/raw.img")
  : >"$TMP/server.log"
  start_server "$host" --filter=cow --filter=truncate "$RAWIO" file="$TMP/raw.img" \
    truncate=3M
  expect_eq "$(nbd_size "$URI")" 3145728 "$host: rawio+truncate: size"
  qemu-io -f raw -c 'write -P 0x7e 1M 128k' -c 'read -P 0x7e 1M 128k' "$URI" >"$TMP/qio" \
    || fail "$host: rawio+cow: I/O"
  grep -q 'Pattern verification failed' "$TMP/qio" && fail "$host: rawio+cow: read back differs"
  nbd_get "$URI" "$TMP/got"
  slice "$TMP/raw.img" 0 1048576 >"$TMP/want"; slice "$TMP/got" 0 1048576 >"$TMP/got0"
  same_bytes "$host: rawio+cow: unwritten data is the file's" "$TMP/got0" "$TMP/want"
  expect_eq "$(sha "$TMP/raw.img")" "$sum" "$host: rawio+cow: the file is untouched"
  stop_server; SERVER_PID=

  # rawio under blocksize and log: 1-byte client writes, only 4K I/O below.
  : >"$TMP/server.log"
  start_server "$host" --filter=blocksize --filter=log "$RAWIO" file="$TMP/raw.img" \
    minblock=4096 logfile="$TMP/log.$host"
  qemu-io -f raw -c 'write -P 0x01 4097 1' -c 'read -P 0x01 4097 1' "$URI" >"$TMP/qio" \
    || fail "$host: rawio+blocksize: I/O"
  grep -q 'Pattern verification failed' "$TMP/qio" && fail "$host: rawio+blocksize: read back differs"
  io=$(grep -E ' (Read|Write) id' "$TMP/log.$host" || true)
  [ -n "$io" ] || fail "$host: rawio+blocksize: the log filter recorded no I/O"
  grep -vqE 'count=0x1000 ' <<<"$io" \
    && fail "$host: rawio+blocksize: non-4K I/O below: $(cat "$TMP/log.$host")"
  ok "$host: rawio+blocksize: a 1-byte write is a 4K read-modify-write below"
  stop_server; SERVER_PID=
done
echo "ok"
