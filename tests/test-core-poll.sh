#!/usr/bin/env bash
# --poll-us: after a read the shard looks again without sleeping for a
# bounded window.  Data stays right at QD1, an idle server stops spinning
# (its CPU time stands still), and SIGTERM still stops it.
. "$(dirname "$0")/lib.sh"
need qemu-io
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import nbd' 2>/dev/null || skip "python3 nbd module missing"

start_server_unix --poll-us 200 ram size=16M

echo "# pattern write and read back through qemu-io"
qemu-io -f raw -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M' -c 'read -P 0 1M 1M' "$URI" \
  >"$TMP/qemu-io.log" 2>&1 || { cat "$TMP/qemu-io.log"; fail "qemu-io pattern check"; }
grep -q "Pattern verification failed" "$TMP/qemu-io.log" && fail "pattern mismatch"

echo "# 2000 requests one at a time (QD1), each checked"
/usr/bin/python3 - "$SOCK" <<'PY' || fail "QD1 read/write loop"
import sys, nbd
h = nbd.NBD()
h.connect_unix(sys.argv[1])
for i in range(1000):
    off = (i * 7919 % 4096) * 4096
    data = bytes([i & 0xff]) * 4096
    h.pwrite(data, off)
    assert h.pread(4096, off) == data, "read back at %d" % off
h.shutdown()
PY

cpu() { awk '{print $14 + $15}' "/proc/$SERVER_PID/stat"; }
echo "# idle: the poll window ends, the shard sleeps"
sleep 1
c0=$(cpu); sleep 3; c1=$(cpu)
echo "  server CPU while idle for 3 s: $((c1 - c0)) ticks"
[ $((c1 - c0)) -lt 30 ] || fail "an idle server with --poll-us kept spinning ($((c1 - c0)) ticks in 3 s)"

echo "# SIGTERM stops a polling server"
kill -TERM "$SERVER_PID"
for ((i = 0; i < 200; i++)); do server_alive || break; sleep 0.05; done
server_alive && fail "blkd --poll-us did not stop on SIGTERM"
[ -e "$SOCK" ] && fail "Unix socket left behind"
echo ok
