#!/usr/bin/env bash
# blkperf compare: a server against itself comes out not significant, a
# server against a slowed-down one comes out significant, in both outputs.
# run.sh: serial (timed benchmark iterations)
. "$(dirname "$0")/lib.sh"
[ -x "$BLKPERF" ] || skip "blkperf is not built (make blkperf)"
need nbdkit        # the slowed-down B is nbdkit's delay filter
PY=/usr/bin/python3

# The server under test: blkd once it is built, nbdkit until then.
if [ -x "$BLKD" ] && [ "$(basename "$BLKD")" != nbdkit ]; then
  SRV=(); MEM=(ram size=1G)
else
  SRV=(nbdkit); MEM=(memory size=1G)
fi
start_server "${SRV[@]}" "${MEM[@]}"
A=$URI

# check_compare FILE: the compare JSON has its fields and they agree;
# prints the verdict; exits 3 when significant, 0 when not.
check_compare() {
  "$PY" - "$1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
def ok(cond, what):
    if not cond:
        print("check failed: " + what); print(json.dumps(d, indent=1)[:4000]); sys.exit(1)
for k in ("a", "b", "improvement_pct", "ci_pct", "significant"):
    ok(k in d, "field " + k)
ok(isinstance(d["significant"], bool), "significant is a boolean")
lo, hi = d["ci_pct"]
ok(lo <= d["improvement_pct"] <= hi, "the interval holds the estimate")
ok(d["significant"] == (lo > 0 or hi < 0), "significant iff the interval excludes 0")
ok(d["a"]["iterations"] == d["b"]["iterations"] >= 2, "same iterations on both sides")
ok(d["a"]["errors"] == 0 and d["b"]["errors"] == 0, "no errors")
for side in ("a", "b"):
    ok(d[side]["iops"] > 0 and d[side]["test"] == d["test"], side + " has results")
print("improvement %+.2f%% CI [%+.2f%%, %+.2f%%] p=%s -> %s, %d iterations" % (
    d["improvement_pct"], lo, hi, d["p_value"],
    "significant" if d["significant"] else "not significant", d["a"]["iterations"]))
sys.exit(3 if d["significant"] else 0)
EOF
}

# --- a server against itself -----------------------------------------------
# Fixed-count iterations (-n) at 99%: a correct test still calls noise
# "significant" 1% of the time by construction, so one retry keeps that
# from flaking while a real bias (A favoured by going first, say) would
# show up in both tries and fail.
self_ok=no
for try in 1 2; do
  "$BLKPERF" compare -t RR -n 3000 -i 12,12 -I 99,5 --json "$A" "$A" >"$TMP/self.json" \
    || fail "self compare exited $?"
  rc=0; check_compare "$TMP/self.json" || rc=$?
  [ $rc -eq 1 ] && fail "self compare JSON is wrong"
  [ $rc -eq 0 ] && { self_ok=yes; break; }
  echo "try $try: self compare came out significant; once in a hundred is expected"
done
[ $self_ok = yes ] || fail "a server compared with itself is significant, twice"

# The table says the same in words.
"$BLKPERF" compare -t RAND_READ -n 2000 -i 4,4 "$A" "$A" >"$TMP/self.txt" || fail "compare table run"
cat "$TMP/self.txt"
for w in "Before (A)" "After (B)" "Improvement" "Verdict on IOPS" "Welch" "lower" "higher"; do
  grep -q "$w" "$TMP/self.txt" || fail "compare table lacks '$w'"
done
grep -q "NBD RAND_READ COMPARE, 4 iterations each" "$TMP/self.txt" || fail "compare banner"

# --- against a server that is clearly slower ----------------------------------
start_server nbdkit --filter=delay memory size=1G rdelay=2ms
B=$URI
# Time-based iterations: a fixed count small enough for B would leave A's
# iterations a few milliseconds long and at the mercy of the scheduler.
# Ten pairs: on a loaded 2-core machine A's own spread can exceed its
# mean, and the verdict must still see a 40x slowdown.
"$BLKPERF" compare -t RR -l 0.5 -i 10,10 --json "$A" "$B" >"$TMP/slow.json" || fail "slow compare exited $?"
rc=0; check_compare "$TMP/slow.json" || rc=$?
[ $rc -eq 3 ] || fail "A against a 2 ms-per-read B is not significant"
"$PY" - "$TMP/slow.json" <<'EOF' || fail "slow compare numbers"
import json, sys
d = json.load(open(sys.argv[1]))
m = d["metrics"]
assert d["improvement_pct"] < -50, d["improvement_pct"]
assert m["latency_mean_us"]["better"] == "lower" and m["iops"]["better"] == "higher"
assert m["latency_mean_us"]["b"] > 2000, m["latency_mean_us"]
assert m["latency_mean_us"]["improvement_pct"] > 100 and m["latency_mean_us"]["significant"]
EOF
"$BLKPERF" compare -t RR -l 0.5 -i 4,4 "$A" "$B" >"$TMP/slow.txt" || fail "slow compare table"
cat "$TMP/slow.txt"
# Four pairs may or may not reach significance under load; the estimate
# must say B lost nearly everything either way.
grep -Eq "^Verdict on IOPS: -9[0-9]\.[0-9]+% .*(significant \(B is worse|not significant)" "$TMP/slow.txt" \
  || fail "table verdict for a slower B"

# An interrupt ends with 130 and compares whole pairs only.  2 s iterations
# run A, B, then B, A: at 5 s the interrupt lands in pair 2's first side,
# whose lone iteration must not be compared.
"$BLKPERF" compare -t RR -l 2 -i 10,10 --json "$A" "$A" >"$TMP/int.json" 2>"$TMP/int.err" &
bp=$!; sleep 5; kill -INT $bp
rc=0; wait $bp || rc=$?
[ $rc -eq 130 ] || { cat "$TMP/int.err"; fail "interrupted compare: exit $rc, not 130"; }
"$PY" - "$TMP/int.json" <<'EOF2' || fail "interrupted compare compared unequal sides"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["a"]["iterations"] == d["b"]["iterations"] >= 1, (d["a"]["iterations"], d["b"]["iterations"])
print("interrupted compare: %d iterations a side" % d["a"]["iterations"])
EOF2
# Interrupted in the first warm-up: nothing measured, nothing reported.
"$BLKPERF" compare -t RR -l 1 -w 5 -i 10,10 --json "$A" "$A" >"$TMP/int0.json" 2>"$TMP/int0.err" &
bp=$!; sleep 1.5; kill -INT $bp
rc=0; wait $bp || rc=$?
[ $rc -eq 130 ] || fail "compare interrupted in warm-up: exit $rc, not 130"
[ ! -s "$TMP/int0.json" ] || fail "compare interrupted in warm-up reported: $(head -c 300 "$TMP/int0.json")"

# Compare needs two URIs and at least two iterations a side.
rc=0; "$BLKPERF" compare -l 1 "$A" 2>"$TMP/err" || rc=$?
[ $rc -eq 2 ] && grep -q "two URIs" "$TMP/err" || fail "compare with one URI: exit $rc"
rc=0; "$BLKPERF" compare -i 1 "$A" "$A" 2>"$TMP/err" || rc=$?
[ $rc -eq 2 ] || fail "compare -i 1: exit $rc"
echo "compare checks passed"
