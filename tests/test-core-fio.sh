#!/usr/bin/env bash
# fio's nbd engine with verification, 4 jobs = 4 connections: random 4k
# writes then crc32c verification; a second fio process re-verifies the
# same data (--verify_only) on new connections; a time-based phase checks
# writes as it goes (verify_backlog); and a planted corruption must make
# the verify fail, so the check is known to bite.
# run.sh: serial (fio load)
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
need_server
need fio
need jq
need_nbd_py
fio --enghelp=nbd >/dev/null 2>&1 || skip "fio has no nbd engine"

M=$((1024 * 1024))
# fio leaves *-verify.state files in the current directory: keep them in $TMP.
cd "$TMP"
start_server memory size=64M

# run_fio NAME ARGS...: JSON to $TMP/NAME.json, fails on fio failure or any
# job error; prints write/read totals.
run_fio() {
  local name=$1; shift
  if ! fio --name="$name" --ioengine=nbd --uri="$URI" --numjobs=4 --iodepth=16 --group_reporting --verify_state_save=0 \
         --output-format=json --output="$TMP/$name.json" "$@" >"$TMP/$name.log" 2>&1; then
    cat "$TMP/$name.log"; head -n 50 "$TMP/$name.json" 2>/dev/null || true
    fail "fio $name failed"
  fi
  expect_eq "$(jq '[.jobs[].error] | add' "$TMP/$name.json")" 0 "fio $name job errors"
  echo "  $name: wrote $(jq '.jobs[0].write.io_bytes' "$TMP/$name.json") B," \
       "read $(jq '.jobs[0].read.io_bytes' "$TMP/$name.json") B," \
       "write IOPS $(jq '.jobs[0].write.iops | floor' "$TMP/$name.json")," \
       "read IOPS $(jq '.jobs[0].read.iops | floor' "$TMP/$name.json")"
}
job=(--rw=randwrite --bs=4k --size=16M --offset_increment=16M --verify=crc32c --verify_fatal=1
     --randrepeat=1 --randseed=1234)

echo "# 4 connections x 16 deep: 4k random writes over 64 MiB, then crc32c verify"
run_fio vw "${job[@]}"
expect_eq "$(jq '.jobs[0].write.io_bytes' "$TMP/vw.json")" $((64 * M)) "bytes written"
expect_eq "$(jq '.jobs[0].read.io_bytes' "$TMP/vw.json")" $((64 * M)) "bytes read back and verified"

echo "# a new fio process re-verifies the same data on new connections"
run_fio vw "${job[@]}" --verify_only
expect_eq "$(jq '.jobs[0].read.io_bytes' "$TMP/vw.json")" $((64 * M)) "bytes re-verified"

echo "# time-based: 4k random writes for 6 s, verified as they go (verify_backlog)"
# (serialize_overlap: a looping job must not race its own writes; see
# test-restart-fio.sh.)
run_fio tb --rw=randwrite --bs=4k --size=16M --offset_increment=16M --verify=crc32c \
  --verify_backlog=256 --verify_fatal=1 --time_based --runtime=6 --serialize_overlap=1
reads=$(jq '.jobs[0].read.io_bytes' "$TMP/tb.json")
[ "$reads" -gt 0 ] || fail "time-based run verified nothing"
ok "time-based run verified $reads bytes while writing"

echo "# 256k sequential writes + md5 verify"
run_fio seq --rw=write --bs=256k --size=16M --offset_increment=16M --verify=md5 --verify_fatal=1
expect_eq "$(jq '.jobs[0].read.io_bytes' "$TMP/seq.json")" $((64 * M)) "bytes verified (256k)"

echo "# planted corruption: verify_only must now fail"
"$PY" - "$URI" <<'EOF' || fail "could not plant the corruption"
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\xde\xad" * 2048, 5 * 1024 * 1024 + 8192)     # inside job 0's region
h.flush(); h.shutdown()
EOF
if fio --name=seq --ioengine=nbd --uri="$URI" --numjobs=4 --iodepth=16 --verify_state_save=0 --rw=write --bs=256k --size=16M \
     --offset_increment=16M --verify=md5 --verify_fatal=1 --verify_only >"$TMP/bad.log" 2>&1; then
  cat "$TMP/bad.log"; fail "fio verify did not notice a corrupted block"
fi
grep -q 'verify' "$TMP/bad.log" || { cat "$TMP/bad.log"; fail "fio failed, but not on verification"; }
ok "fio verify catches the planted corruption"
check_alive
echo "all fio checks passed"
