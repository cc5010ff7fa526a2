#!/usr/bin/env bash
# Tracing filters: log (every request the client made appears with its
# offset and length; on blkd, one session's log equals nbdkit's) and stats
# (the counts in the stats file, written when the server unloads its
# filters at shutdown, are the requests made).
. "$(dirname "$0")/lib.sh"
. "$TOP/tests/helpers/core.sh"
. "$TOP/tests/helpers/filters.sh"
need_filter_server; need qemu-io; need_nbd_py

if have_filter log; then
  serve --filter=log memory 1M logfile="$TMP/trace.log"
  qemu-io -f raw -c 'write -P 0x1 8k 4k' -c 'read -P 0x1 8k 4k' -c 'flush' \
    -c 'discard 64k 64k' "$URI" >/dev/null || fail "log: client I/O"
  stop_server
  SERVER_PID=
  cat "$TMP/trace.log"
  grep -qE 'Connect .*export=' "$TMP/trace.log" || fail "log: no Connect line"
  grep -qE ' Write id=[0-9]+ offset=0x2000 count=0x1000 ' "$TMP/trace.log" || fail "log: the write is missing"
  grep -qE ' Read id=[0-9]+ offset=0x2000 count=0x1000 ' "$TMP/trace.log" || fail "log: the read is missing"
  grep -qE ' Flush id=[0-9]+' "$TMP/trace.log" || fail "log: the flush is missing"
  grep -qE ' Trim id=[0-9]+ offset=0x10000 count=0x10000 ' "$TMP/trace.log" || fail "log: the trim is missing"
  grep -qE ' \.\.\.Write id=[0-9]+ return=0' "$TMP/trace.log" || fail "log: no write result"
  grep -q 'Disconnect' "$TMP/trace.log" || fail "log: no Disconnect line"
  ok "log: connect, write, read, flush, trim and disconnect are logged with offsets"
fi

if have_filter log && ! server_is_nbdkit; then
  # The same client session under nbdkit and under blkd must leave the same
  # log, timestamps aside: the log filter sees every call the stack makes
  # below it (can_* answers in Connect, flags, extents, ids).
  session() {
    qemu-io -f raw -c 'write -P 0x1 8k 4k' -c 'read 8k 4k' -c 'write -z 0 4k' \
      -c 'discard 64k 64k' -c flush "$URI" >/dev/null || fail "log: session I/O"
    nbdinfo --map "$URI" >/dev/null || fail "log: session map"
  }
  # Alone, and below cow (what cow asks of the layer below it).
  for stack in "--filter=log" "--filter=cow --filter=log"; do
    for host in nbdkit blkd; do
      : >"$TMP/server.log"
      rm -f "$TMP/session.$host"
      # shellcheck disable=SC2086
      start_server "$host" $stack memory 1M logfile="$TMP/session.$host"
      session
      stop_server; SERVER_PID=
      # When connection 1's Disconnect is logged against connection 2's
      # start is a race in both servers: compare per connection (a stable
      # sort on the first word keeps each connection's own order).
      sed -E 's/^[0-9-]+ [0-9:.]+ //' "$TMP/session.$host" | sort -s -k1,1 \
        >"$TMP/session.$host.txt"
    done
    diff "$TMP/session.nbdkit.txt" "$TMP/session.blkd.txt" \
      || fail "log ($stack): blkd's stack made other calls than nbdkit's for the same session"
    ok "log ($stack): the same session logs the same calls under nbdkit and blkd"
  done
fi

if have_filter stats; then
  serve --filter=stats memory 1M statsfile="$TMP/stats.txt"
  "$PY" - "$URI" <<'PYEOF' || fail "stats: client I/O"
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
for i in range(7):
    h.pread(4096, i * 4096)
for i in range(3):
    h.pwrite(b"s" * 65536, i * 65536)
h.shutdown()
PYEOF
  stop_server          # the stats file is written when the filter unloads
  SERVER_PID=
  [ -s "$TMP/stats.txt" ] || fail "stats: no stats file after shutdown"
  cat "$TMP/stats.txt"
  grep -qE '^read: 7 ops, .*, 28.00 KiB' "$TMP/stats.txt" || fail "stats: read count is not 7 x 4K"
  grep -qE '^write: 3 ops, .*, 192.00 KiB' "$TMP/stats.txt" || fail "stats: write count is not 3 x 64K"
  ok "stats: the file counts the 7 reads and 3 writes made"
fi
echo "ok"
