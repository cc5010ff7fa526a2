#!/usr/bin/env bash
# Live restart under fio's load: 4 connections x 32 deep of 4k random
# reads and writes with crc32c verification as they go (verify_backlog) on
# the rawio plugin, while blkd gets SIGUSR2 four times; fio must finish
# without an error (every write is read back and checked, the last ones
# when the job ends) and the server must be the same process.
# run.sh: serial (fio load)
. "$(dirname "$0")/lib.sh"
need fio
need jq
[ -x "$BLKD" ] || skip "no server binary at $BLKD"
case "$(basename "$BLKD")" in nbdkit) skip "live restart (SIGUSR2) is blkd's" ;; esac
fio --enghelp=nbd >/dev/null 2>&1 || skip "fio has no nbd engine"
RAWIO=$TOP/plugins/rawio/nbdkit-rawio-plugin.so
[ -f "$RAWIO" ] || skip "rawio plugin not built"

cd "$TMP"                           # fio's verify state files
truncate -s 64M disk.img
start_server --restart-timeout 5 "$RAWIO" file="$TMP/disk.img"
pid=$SERVER_PID

# serialize_overlap: a time-based job loops over its range, so without it
# fio may read a block while its next write to it is in flight, and NBD
# orders no two requests in flight, so the torn block that read returns
# would be fio's race (a mismatch was seen once under ASan and a parallel
# make check, most likely that).  With it, a mismatch can only be the
# server's.
job=(--ioengine=nbd --uri="$URI" --numjobs=4 --iodepth=32 --bs=4k --size=16M
     --offset_increment=16M --verify=crc32c --verify_fatal=1 --group_reporting
     --serialize_overlap=1 --verify_state_save=0 --output-format=json)

echo "# fio randrw with verify_backlog for 8 s; SIGUSR2 once a second, four times"
fio --name=load --rw=randrw --time_based --runtime=8 --verify_backlog=64 "${job[@]}" \
    --output="$TMP/load.json" >"$TMP/load.log" 2>&1 &
fio_pid=$!
for n in 1 2 3 4; do
  sleep 1
  kill -USR2 "$pid"
  for ((i = 0; i < 300; i++)); do
    [ "$(grep -c 'live restart [0-9]* done: serving again' "$TMP/server.log")" -ge "$n" ] && break
    server_alive "$pid" || { cat "$TMP/server.log"; fail "server gone at restart $n"; }
    sleep 0.1
  done
  [ "$(grep -c 'live restart [0-9]* done: serving again' "$TMP/server.log")" -ge "$n" ] ||
    { tail -20 "$TMP/server.log"; fail "restart $n did not finish in 30 s"; }
done
rc=0; timeout 120 tail --pid="$fio_pid" -f /dev/null || true
wait "$fio_pid" || rc=$?
if [ "$rc" != 0 ]; then
  cat "$TMP/load.log"; tail -30 "$TMP/server.log"
  fail "fio failed across the restarts (status $rc)"
fi
errors=$(jq '[.jobs[].error] | add' "$TMP/load.json")
[ "$errors" = 0 ] || fail "fio job errors: $errors"
echo "ok: fio finished, no error, $(jq '.jobs[0].write.io_bytes' "$TMP/load.json") B written," \
     "$(jq '.jobs[0].read.io_bytes' "$TMP/load.json") B read and verified"
server_alive "$pid" || fail "server gone"
echo "ok: same process ($pid) after 4 restarts"
n=$(grep -c 'live restart [0-9]*: exec .* with 4 connection(s)' "$TMP/server.log" || true)
[ "$n" -ge 3 ] || { grep 'live restart' "$TMP/server.log"; fail "only $n restarts handed over 4 connections"; }
echo "ok: $n of the restarts handed over all 4 connections"

kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
[ "$rc" = 0 ] || fail "server exit status $rc"
echo "live restart under fio passed"
