#!/usr/bin/env bash
# Test runner: runs unit binaries and test scripts, one line per result, and
# ends with the summary line "N passed, N failed, N skipped".
# Exit status 77 from a test means skipped; its last output line is the reason.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
export TOP="$top" BLKD="${BLKD:-$top/blkd}" BLKPERF="${BLKPERF:-$top/blkperf}"
export PYTHON=/usr/bin/python3
logdir="$top/build/test-logs"; mkdir -p "$logdir"
per_test_timeout=${TEST_TIMEOUT:-600}

# Sanitizer reports (SANITIZE=1 builds) go to files, not to whichever log a
# test happens to keep, so a report from any process fails the test that
# produced it -- even one from a server the test killed at its end.
sandir="$logdir/sanitizer"
rm -rf "$sandir"; mkdir -p "$sandir"
export ASAN_OPTIONS="log_path=$sandir/asan:detect_leaks=1:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="log_path=$sandir/ubsan:print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

if [ $# -gt 0 ]; then
  tests=("$@")
else
  mapfile -t tests < <(ls tests/unit-* tests/test-*.sh tests/test-*.py 2>/dev/null \
                       | grep -v '\.c$' | sort)
fi

pass=0 fail=0 skip=0 failed=()
for t in "${tests[@]}"; do
  name=$(basename "$t")
  log="$logdir/$name.log"
  start=$(date +%s.%N)
  case "$t" in
    *.py) timeout -k 10 "$per_test_timeout" "$PYTHON" "$t" >"$log" 2>&1 ;;
    *)    timeout -k 10 "$per_test_timeout" "$t" >"$log" 2>&1 ;;
  esac
  rc=$?
  if compgen -G "$sandir/*" >/dev/null; then
    echo "sanitizer report(s) while running $name:" >>"$log"
    cat "$sandir"/* >>"$log"
    mkdir -p "$logdir/sanitizer-$name"; mv "$sandir"/* "$logdir/sanitizer-$name/"
    [ $rc -eq 0 ] || [ $rc -eq 77 ] && rc=99
  fi
  secs=$(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)")
  if [ $rc -eq 0 ]; then
    pass=$((pass+1)); printf 'PASS  %-40s %6ss\n' "$name" "$secs"
  elif [ $rc -eq 77 ]; then
    skip=$((skip+1)); printf 'SKIP  %-40s %s\n' "$name" "$(tail -n1 "$log")"
  else
    fail=$((fail+1)); failed+=("$name")
    printf 'FAIL  %-40s (exit %d) log: %s\n' "$name" "$rc" "${log#$top/}"
    tail -n 25 "$log" | sed 's/^/      | /'
  fi
done
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
