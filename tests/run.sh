#!/usr/bin/env bash
# Test runner: runs unit binaries and test scripts, several at a time, one
# line per result, and ends with the summary line
# "N passed, N failed, N skipped".
# Exit status 77 from a test means skipped; its last output line is the reason.
#
# Jobs: TEST_JOBS=N, else the -j of the make that called us (`make -j2
# check`: two at a time; a bare -j: one per CPU), else 1.  A test whose
# first 30 lines hold "# run.sh: serial" (heavy, CPU-timing or container
# tests) runs alone, after the others.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
export TOP="$top" BLKD="${BLKD:-$top/blkd}" BLKPERF="${BLKPERF:-$top/blkperf}"
export PYTHON=/usr/bin/python3
# Where nbdkit's plugins live on this machine, for tests that load them by
# path (the multiarch directory differs per architecture).
: "${NBDKIT_PLUGINDIR:=$(pkg-config --variable=plugindir nbdkit 2>/dev/null)}"
export NBDKIT_PLUGINDIR
logdir=${TEST_LOGDIR:-$top/build/test-logs}; mkdir -p "$logdir"
per_test_timeout=${TEST_TIMEOUT:-600}

jobs_from_makeflags() {
  local w
  for w in ${MAKEFLAGS:-}; do
    case $w in
      --jobserver*|--jobs=) ;;
      -j|--jobs) nproc; return ;;
      -j[0-9]*) echo "${w#-j}"; return ;;
      --jobs=[0-9]*) echo "${w#--jobs=}"; return ;;
    esac
  done
  echo 1
}
jobs=${TEST_JOBS:-$(jobs_from_makeflags)}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || jobs=1
# A make started by a test (the fuzz harness) must not inherit our make's
# jobserver, whose file descriptors it does not have.
unset MAKEFLAGS MFLAGS MAKELEVEL

# Sanitizer reports (SANITIZE=1 builds) go to files, one directory per test,
# not to whichever log a test happens to keep: a report from any process
# fails the test that produced it -- even one from a server the test killed
# at its end, and even with other tests running alongside.
# Only this run's tests' directories are cleared (in run_one), so two
# runners on different tests in one tree do not wipe each other's reports.
sanroot="$logdir/sanitizer"
mkdir -p "$sanroot"
user_asan=${ASAN_OPTIONS:+:$ASAN_OPTIONS}
user_ubsan=${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}

if [ $# -gt 0 ]; then
  tests=("$@")
else
  mapfile -t tests < <(ls tests/unit-* tests/test-*.sh tests/test-*.py 2>/dev/null \
                       | grep -v '\.c$' | sort)
fi

is_serial() { [ -f "$1" ] && grep -q '^# run.sh: serial' <<<"$(head -n 30 "$1")"; }

# run_one TEST: the test with its log and sanitizer directory; exits with
# the test's status, or 99 when a sanitizer reported anything.
run_one() {
  local t=$1 name; name=$(basename "$t")
  local log="$logdir/$name.log" sandir="$sanroot/$name" rc
  rm -rf "$sandir"; mkdir -p "$sandir"
  export ASAN_OPTIONS="log_path=$sandir/asan:detect_leaks=1:abort_on_error=0$user_asan"
  export UBSAN_OPTIONS="log_path=$sandir/ubsan:print_stacktrace=1:halt_on_error=1$user_ubsan"
  case "$t" in
    *.py) timeout -k 10 "$per_test_timeout" "$PYTHON" "$t" >"$log" 2>&1 ;;
    *)    timeout -k 10 "$per_test_timeout" "$t" >"$log" 2>&1 ;;
  esac
  rc=$?
  if compgen -G "$sandir/*" >/dev/null; then
    echo "sanitizer report(s) while running $name (kept in ${sandir#$top/}):" >>"$log"
    cat "$sandir"/* >>"$log"
    if [ $rc -eq 0 ] || [ $rc -eq 77 ]; then rc=99; fi
  else
    rmdir "$sandir" 2>/dev/null || true
  fi
  exit $rc
}

pass=0 fail=0 skip=0 failed=()
declare -A started_at=() test_of=()

report() {
  local t=$1 rc=$2 name log secs
  name=$(basename "$t"); log="$logdir/$name.log"
  secs=$(printf '%.1f' "$(echo "$(date +%s.%N) - ${started_at[$t]}" | bc)")
  if [ "$rc" -eq 0 ]; then
    pass=$((pass+1)); printf 'PASS  %-40s %6ss\n' "$name" "$secs"
  elif [ "$rc" -eq 77 ]; then
    skip=$((skip+1)); printf 'SKIP  %-40s %s\n' "$name" "$(tail -n1 "$log")"
  else
    fail=$((fail+1)); failed+=("$name")
    printf 'FAIL  %-40s (exit %d) log: %s\n' "$name" "$rc" "${log#$top/}"
    # The failed checks first: the tail is often the servers' logs, and a
    # CI excerpt that cuts the middle must still say what failed.
    grep -m 5 '^FAIL: ' "$log" | sed 's/^/      ! /'
    tail -n 25 "$log" | sed 's/^/      | /'
  fi
}

# wait_one: reap whichever running test finishes first and report it.
wait_one() {
  local pid rc
  wait -n -p pid; rc=$?
  report "${test_of[$pid]}" "$rc"
  unset "test_of[$pid]"
}

start() {
  started_at[$1]=$(date +%s.%N)
  run_one "$1" &
  test_of[$!]=$1
}

serial=()
for t in "${tests[@]}"; do
  if [ "$jobs" -gt 1 ] && is_serial "$t"; then serial+=("$t"); continue; fi
  while [ ${#test_of[@]} -ge "$jobs" ]; do wait_one; done
  start "$t"
done
while [ ${#test_of[@]} -gt 0 ]; do wait_one; done
for t in "${serial[@]}"; do
  start "$t"; wait_one
done

[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
