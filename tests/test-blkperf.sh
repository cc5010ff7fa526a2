#!/usr/bin/env bash
# blkperf: every test type runs and reports consistent --json, the table has
# netperf's shape, options take effect, and bad input fails cleanly.
. "$(dirname "$0")/lib.sh"
[ -x "$BLKPERF" ] || skip "blkperf is not built (make blkperf)"

# The server under test: blkd once it is built, nbdkit until then (and when
# BLKD names nbdkit, as tests/run.sh allows).  blkd serves its in-tree ram
# plugin; nbdkit the equivalent memory plugin.
if [ -x "$BLKD" ] && [ "$(basename "$BLKD")" != nbdkit ]; then
  SRV=(); MEM=(ram size=1G)
else
  need nbdkit; SRV=(nbdkit); MEM=(memory size=1G)
fi
PY=/usr/bin/python3

start_server "${SRV[@]}" "${MEM[@]}"
MEM_URI=$URI

# check_json FILE TEST [PYTHON-CONDITIONS...]: parse blkperf's JSON and
# assert the fields every run must have and their mutual consistency.
check_json() {
  local file=$1 test=$2; shift 2
  "$PY" - "$file" "$test" "$@" <<'EOF'
import json, math, sys
path, test, *extra = sys.argv[1:]
d = json.load(open(path))
def ok(cond, what):
    if not cond:
        print("check failed: %s\n%s" % (what, json.dumps(d, indent=1)[:3000]))
        sys.exit(1)
for k in ("test", "uri", "throughput_mib_s", "throughput_mbit_s", "iops",
          "latency_us", "cpu", "iterations", "ci", "bytes", "requests", "errors"):
    ok(k in d, "field %s present" % k)
ok(d["test"] == test, "test is " + test)
ok(d["errors"] == 0, "no errors")
ok(d["iops"] > 0 and d["requests"] > 0, "iops and requests positive")
lat = d["latency_us"]
ok(0 < lat["p50"] <= lat["p99"] <= lat["p999"] <= lat["max"], "latency percentiles ordered")
ok(d["requests"] == d["reads"] + d["writes"] + d["trims"], "requests add up")
ok(d["bytes"] == (d["reads"] + d["writes"]) * d["block_size"], "bytes = data requests x bs")
ok(abs(d["throughput_mbit_s"] - d["throughput_mib_s"] * 8 * 1.048576) < 0.01 * d["throughput_mbit_s"] + 1e-6,
   "Mbit/s and MiB/s agree")
if d["trims"] == 0:
    # Every data request moves block_size bytes: iops x bs is the throughput.
    ok(d["throughput_mib_s"] > 0, "throughput positive")
    ok(abs(d["iops"] * d["block_size"] / 2**20 - d["throughput_mib_s"])
       <= 0.01 * d["throughput_mib_s"], "iops x bs = throughput")
ok(d["iterations"] == len(d["samples"]) >= 1, "one sample per iteration")
ok(set(d["ci"]) >= {"level", "width_pct", "met"}, "ci fields")
ok(isinstance(d["ci"]["met"], bool), "ci.met is a boolean")
ok(set(d["cpu"]) == {"local", "remote"}, "cpu has local and remote")
env = dict(d=d, math=math)
for cond in extra:
    ok(eval(cond, env), cond)
EOF
}

run_json() {   # run_json NAME ARGS...: blkperf --json into $TMP/NAME.json
  local name=$1 rc=0; shift
  "$BLKPERF" --json "$@" >"$TMP/$name.json" 2>"$TMP/$name.err" || rc=$?
  [ $rc -eq 0 ] || { cat "$TMP/$name.err" >&2; fail "blkperf $* exited $rc"; }
}

# --- every test type, short, against the RAM disk -------------------------
for t in STREAM_READ STREAM_WRITE RR RAND_READ RAND_WRITE RAND_RW SEQ_REWRITE CHURN; do
  run_json "$t" -t "$t" -l 1 "$MEM_URI"
  check_json "$TMP/$t.json" "$t"
  echo "ok $t: $("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.0f MiB/s %.0f IOPS p99 %.0f us" % (d["throughput_mib_s"], d["iops"], d["latency_us"]["p99"]))' "$TMP/$t.json")"
done
check_json "$TMP/STREAM_READ.json" STREAM_READ 'd["reads"] > 0 and d["writes"] == 0' \
  'd["block_size"] == 262144 and d["queue_depth"] == 16' 'd["io"] == "wire"'
check_json "$TMP/STREAM_WRITE.json" STREAM_WRITE 'd["writes"] > 0 and d["reads"] == 0'
check_json "$TMP/RR.json" RR 'd["queue_depth"] == 1 and d["block_size"] == 4096'
check_json "$TMP/RAND_READ.json" RAND_READ 'd["queue_depth"] == 32'
check_json "$TMP/RAND_RW.json" RAND_RW 'd["reads"] > 0 or d["writes"] > 0'
check_json "$TMP/SEQ_REWRITE.json" SEQ_REWRITE 'd["span"] == 256 << 20'
# Counted runs for the checks that need numbers, not a loaded machine's
# luck: RAND_RW is sysbench's rndrw, 60/40 by default, and has no errors
# on a RAM disk; CHURN writes its 16 MiB region (256 x 64 KiB) and trims
# it, pass after pass, so 1024 requests are exactly two cycles.
run_json rndrw -t RAND_RW -n 20000 "$MEM_URI"
check_json "$TMP/rndrw.json" RAND_RW 'd["requests"] == 20000' \
  'abs(d["reads"] / d["requests"] - 0.60) < 0.03'
run_json churn -t CHURN -n 1024 "$MEM_URI"
check_json "$TMP/churn.json" CHURN 'd["writes"] == 512 and d["trims"] == 512' \
  'd["span"] == 16 << 20 and d["block_size"] == 65536'

# --- options take effect ---------------------------------------------------
# -n is exact, split over connections; --rw-mix moves the share.
run_json n -t RAND_RW -n 5000 -C 3 -q 4 --rw-mix 80/20 -b 8k "$MEM_URI"
check_json "$TMP/n.json" RAND_RW 'd["requests"] == 5000' 'd["connections"] == 3' \
  'd["block_size"] == 8192' 'd["read_pct"] == 80' 'abs(d["reads"] / 5000 - 0.8) < 0.05'
# Iterations with a CI goal that cannot be met keep going to MAX.
run_json iter -t RAND_READ -n 2000 -i 3,3 -I 99,0.0001 "$MEM_URI"
check_json "$TMP/iter.json" RAND_READ 'd["iterations"] == 3' \
  'd["ci"]["width_pct"] is not None and d["ci"]["met"] is False' 'd["ci"]["level"] == 99'
# An easy goal stops at MIN.
run_json iter2 -t STREAM_READ -n 200 -i 10,2 -I 95,1000 "$MEM_URI"
check_json "$TMP/iter2.json" STREAM_READ '2 <= d["iterations"] < 10' 'd["ci"]["met"] is True'
# Span, offset, warm-up, seed, local CPU.
run_json span -t RAND_WRITE -l 1 -w 0.5 --span 1M --offset 4M -s 7 -c "$MEM_URI"
check_json "$TMP/span.json" RAND_WRITE 'd["span"] == 1 << 20 and d["offset"] == 4 << 20' \
  'd["seed"] == 7 and d["warmup_s"] == 0.5' \
  'd["cpu"]["local"] is not None and d["cpu"]["remote"] is None' \
  'abs(sum(d["cpu"]["local"][k] for k in ("user", "system", "idle", "steal")) - 100) < 1' \
  'd["cpu"]["local"]["service_demand_us_per_kb"] > 0'
run_json conns -t STREAM_READ -l 1 -C 2 -q 4 -b 64k "$MEM_URI"
check_json "$TMP/conns.json" STREAM_READ 'd["connections"] == 2 and d["queue_depth"] == 4'
# --prefill writes the span first (a sparse server answers unwritten reads
# with holes, which is not the read path one meant to measure).
run_json prefill -t RAND_READ -l 1 --prefill --span 8M -C 3 "$MEM_URI"
check_json "$TMP/prefill.json" RAND_READ 'd["prefill"] is True and d["span"] == 8 << 20'

# --- the table -------------------------------------------------------------
"$BLKPERF" -t RR -l 1 -c "$MEM_URI" >"$TMP/table.txt" 2>"$TMP/table.err"
cat "$TMP/table.txt"
grep -q "^NBD RR TEST to $MEM_URI (export \"\", 1073741824 bytes)" "$TMP/table.txt" \
  || fail "banner line missing"
grep -q "10^6bits/s" "$TMP/table.txt" || fail "throughput header missing"
grep -q "p99.9" "$TMP/table.txt" || fail "latency header missing"
grep -q "^Local " "$TMP/table.txt" || fail "local CPU row missing"
grep -q "^Remote .*n/a" "$TMP/table.txt" || fail "unmeasured remote CPU should say n/a"
# Not a terminal: no progress line on stderr.
[ ! -s "$TMP/table.err" ] || { cat "$TMP/table.err"; fail "unexpected stderr output"; }

# --- Unix socket URIs ------------------------------------------------------
start_server_unix "${SRV[@]}" "${MEM[@]}"
run_json unix -t RAND_READ -l 1 "$URI"
check_json "$TMP/unix.json" RAND_READ 'd["uri"].startswith("nbd+unix://")'

# --- TLS, from options and from the URI -------------------------------------
if [ ${#SRV[@]} -eq 0 ] || grep -q '^tls=yes' <<<"$(nbdkit --dump-config 2>/dev/null)"; then
  printf 'alice:%s\n' "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >"$TMP/keys.psk"
  start_server "${SRV[@]}" --tls=require --tls-psk="$TMP/keys.psk" "${MEM[@]}"
  run_json tls -t RAND_RW -l 1 --tls-psk "$TMP/keys.psk" --tls-username alice "$URI"
  check_json "$TMP/tls.json" RAND_RW 'd["uri"].startswith("nbds://")' \
    'd["io"] == "libnbd"'   # TLS lives inside libnbd: its loop runs
  run_json tlsuri -t RR -l 1 "nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$TMP/keys.psk"
  check_json "$TMP/tlsuri.json" RR
  if "$BLKPERF" -t RR -l 1 "$URI" >/dev/null 2>"$TMP/notls.err"; then
    fail "plain connection to a TLS-only server succeeded"
  fi
  grep -q "cannot connect" "$TMP/notls.err" || fail "no clear TLS error"
else
  echo "note: nbdkit without GnuTLS, TLS part skipped"
fi

# --- errors ----------------------------------------------------------------
expect_fail() {   # expect_fail STATUS PATTERN ARGS...
  local want=$1 pat=$2 rc=0; shift 2
  "$BLKPERF" "$@" >"$TMP/err.out" 2>"$TMP/err.txt" || rc=$?
  cat "$TMP/err.txt"
  [ "$rc" -eq "$want" ] || fail "blkperf $* exited $rc, expected $want"
  grep -q -- "$pat" "$TMP/err.txt" || fail "blkperf $*: no '$pat' in the error"
}
expect_fail 1 "cannot connect to foo://x" -l 1 foo://x
expect_fail 1 "cannot connect to not a uri" -l 1 "not a uri"
dead_port
expect_fail 1 "Connection refused" -l 1 "nbd://127.0.0.1:$DEAD_PORT"
expect_fail 2 "unknown test" -t NOPE "$MEM_URI"
expect_fail 2 "expected one URI" -l 1
expect_fail 2 "RR keeps one request" -t RR -q 8 "$MEM_URI"
expect_fail 2 "exclude each other" -l 1 -n 10 "$MEM_URI"
expect_fail 1 "beyond the export" --offset 2G "$MEM_URI"
expect_fail 1 "holds no whole" -t RAND_READ --span 1k -b 4k "$MEM_URI"
start_server "${SRV[@]}" -r "${MEM[@]}"
expect_fail 1 "read-only" -t RAND_WRITE -l 1 "$URI"
expect_fail 1 "prefill writes, but the export is read-only" -t RAND_READ --prefill "$URI"

# A server that dies mid-run: an error naming the connection, status 1, no hang.
start_server "${SRV[@]}" "${MEM[@]}"
rc=0
( sleep 2; kill "$SERVER_PID" ) &
killer=$!
timeout 60 "$BLKPERF" -t RAND_READ -l 10 "$URI" >"$TMP/died.out" 2>"$TMP/died.err" || rc=$?
wait "$killer"
cat "$TMP/died.err"
[ "$rc" -eq 1 ] || fail "server death: exit $rc, expected 1"
grep -q "connection 0: connection lost" "$TMP/died.err" || fail "server death: no connection error"

echo "all blkperf checks passed"
