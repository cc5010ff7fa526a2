#!/usr/bin/env bash
# tests/run.sh and the test helpers, on tests made up for the purpose: the
# job count comes from make's -j, tests really overlap, a serial test runs
# alone, a sanitizer report fails the test that caused it (and only it)
# while others run alongside, skips are counted, the summary line keeps
# its form, and a Python test reports every failed check, not the first.
. "$(dirname "$0")/lib.sh"
# The job count must come from the MAKEFLAGS given below, not from ours.
unset TEST_JOBS
d=$TMP/t; mkdir -p "$d"
export TEST_LOGDIR=$TMP/logs

# Each made-up test notes when it starts and ends in $d/trace; the
# overlapping ones wait (generously) for their partner to have started,
# so overlap is shown by order, never by timing.
cat >"$d/common.sh" <<'EOS'
trace() { echo "$1 $2" >>"$D/trace"; }
wait_for() { for _ in $(seq 600); do grep -q "^$1 start" "$D/trace" 2>/dev/null && return 0; sleep 0.05; done; return 1; }
EOS
mk() { printf '#!/usr/bin/env bash\n. "$D/common.sh"\n%s\n' "$2" >"$d/$1"; chmod +x "$d/$1"; }
export D=$d
mk selftest-a.sh 'trace a start; wait_for b || exit 1; trace a end'
mk selftest-b.sh 'trace b start; wait_for a || exit 1; trace b end'
# A "sanitizer report": written where run.sh told ASan to write.
mk selftest-san.sh 'trace san start; p=${ASAN_OPTIONS#log_path=}; p=${p%%:*}; echo "ERROR: AddressSanitizer: made up" >"$p.$$"; trace san end'
mk selftest-skip.sh 'echo "skipped: on purpose"; exit 77'
mk selftest-serial.sh '# run.sh: serial (checks it runs alone)
trace serial start; sleep 0.5; trace serial end'
cat >"$d/selftest-checks.py" <<'EOS'
import os, sys
sys.path.insert(0, os.path.join(os.environ["TOP"], "tests", "helpers"))
from blkdtest import check, check_eq
check(1 == 2, "first failing check")
check_eq(3, 4, "second failing check")
check(True, "a passing check")
EOS

out=$(MAKEFLAGS=' -j2 --jobserver-auth=3,4' "$TOP/tests/run.sh" \
        "$d/selftest-a.sh" "$d/selftest-serial.sh" "$d/selftest-b.sh" "$d/selftest-san.sh" \
        "$d/selftest-skip.sh" "$d/selftest-checks.py" 2>&1) && fail "run.sh passed with failing tests: $out"
echo "$out"
last=$(tail -n1 <<<"$out")
[ "$last" = "3 passed, 2 failed, 1 skipped" ] || fail "summary line: '$last'"
grep -q '^FAIL  selftest-san.sh .*(exit 99)' <<<"$out" || fail "the sanitizer report did not fail selftest-san.sh"
grep -q '^PASS  selftest-a.sh' <<<"$out" || fail "selftest-a.sh (alongside the report) did not pass"
grep -q '^FAIL  selftest-checks.py' <<<"$out" || fail "the Python checks did not fail their test"
log=$(cat "$TEST_LOGDIR/selftest-checks.py.log")
grep -q "first failing check" <<<"$log" && grep -q "second failing check" <<<"$log" ||
  fail "the Python test did not report both failed checks: $log"
grep -q "2 check(s) failed" <<<"$log" || fail "no closing count of failed checks: $log"
[ -d "$TEST_LOGDIR/sanitizer/selftest-san.sh" ] || fail "no sanitizer directory kept for selftest-san.sh"
[ -d "$TEST_LOGDIR/sanitizer/selftest-a.sh" ] && fail "an empty sanitizer directory was kept"
echo "ok: summary, sanitizer attribution, skips and Python checks"

# a and b overlapped (each waited for the other), and serial ran alone:
# nothing else started between its start and its end.
trace=$(cat "$d/trace")
awk '/^serial start/ { s = 1; next } /^serial end/ { s = 0; next } s && / start/ { bad = 1 } END { exit bad }' \
  <<<"$trace" || fail "another test started while the serial one ran: $trace"
[ "$(tail -n2 <<<"$trace" | head -n1)" = "serial start" ] || fail "the serial test did not run last: $trace"
echo "ok: -j2 ran tests side by side, the serial test alone and last"

# One job (no -j): a waits for b, which has not started, and gives up; b
# then finds a's start and passes -- proof that -j1 runs one at a time.
rm -f "$d/trace"
sed -i 's/seq 600/seq 20/' "$d/common.sh"
out=$(MAKEFLAGS= "$TOP/tests/run.sh" "$d/selftest-a.sh" "$d/selftest-b.sh" 2>&1) && fail "-j1 ran a and b together"
[ "$(tail -n1 <<<"$out")" = "1 passed, 1 failed, 0 skipped" ] || fail "-j1: $out"
grep -q '^FAIL  selftest-a.sh' <<<"$out" || fail "-j1: a should have waited in vain: $out"
echo "ok: without -j, one test at a time"
