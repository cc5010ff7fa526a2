# blkd under valgrind's memcheck for the tests/test-*valgrind* tests.
# Source after lib.sh; valgrind_wrap makes start_server (which runs $BLKD)
# start blkd under memcheck, so the pid it records is valgrind's, which is
# blkd's; valgrind_stop WHAT stops that server and fails the test unless
# memcheck found no error, no definite or indirect leak, and no descriptor
# blkd opened left open at exit.  An ASan build cannot run under valgrind:
# the SANITIZE=1 suite skips these tests.

valgrind_wrap() {
  need valgrind
  [ "$(basename "$BLKD")" = nbdkit ] && skip "valgrind checks blkd's own memory (nbdkit is the reference server here)"
  if built_with_asan "$BLKD"; then
    skip "blkd is built with AddressSanitizer (SANITIZE=1): it cannot run under valgrind"
  fi
  VALGRIND_BLKD=$BLKD
  BLKD=$TMP/blkd-valgrind
  cat >"$BLKD" <<WRAP
#!/bin/sh
exec valgrind --quiet --log-file="$TMP/vg.%p.log" --error-exitcode=99 \\
  --leak-check=full --show-leak-kinds=definite,indirect \\
  --errors-for-leak-kinds=definite,indirect --track-fds=yes \\
  --track-origins=yes --num-callers=30 "$VALGRIND_BLKD" "\$@"
WRAP
  chmod +x "$BLKD"
  # memcheck starts blkd (OpenSSL, librbd) many times slower; and the log of
  # a blkd that died mid-test holds the stack trace the test never read.
  START_TIMEOUT=120
  SHOW_ON_FAILURE+=("$TMP/vg.*.log")
}

# valgrind_stop WHAT [SECONDS]: SIGTERM to $SERVER_PID, wait (memcheck's
# leak search at exit takes a while), then read its verdict.
valgrind_stop() {
  local what=$1 secs=${2:-120} log=$TMP/vg.$SERVER_PID.log rc=0 i report
  # Already gone (a crash): wait below reports how it ended.
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  for ((i = 0; i < secs * 10; i++)); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$SERVER_PID" 2>/dev/null && fail "$what: blkd under valgrind still running ${secs}s after SIGTERM"
  wait "$SERVER_PID" || rc=$?
  forget_server "$SERVER_PID"
  [ -s "$log" ] || fail "$what: no memcheck log at $log (--track-fds always writes one)"
  # A failing test prints the log (SHOW_ON_FAILURE); a clean one is
  # removed below, so only logs that explain something are printed.
  if [ "$rc" != 0 ]; then
    tail -20 "$TMP/server.log"
    fail "$what: blkd under valgrind exited $rc"
  fi
  # --quiet leaves only errors and leaks in the log, and --track-fds's
  # list of descriptors open at exit, of which only those blkd opened
  # count (what it inherited, the log's own among them, does not).
  # Captured, not piped into `grep -q`: grep's early exit would kill awk
  # with SIGPIPE and, under pipefail, read as a clean log.
  report=$(awk '/FILE DESCRIPTORS: [0-9]+ open/ { next }
          /Open (file descriptor|AF_[A-Z0-9]+ socket)/ { blk = $0; infd = 1; next }
          infd && /<inherited from parent>/ { infd = 0; blk = ""; next }
          infd && /^==[0-9]+== ?$/ { print blk; infd = 0; next }
          infd { blk = blk "\n" $0; next }
          !/^==[0-9]+== ?$/ { print }
          END { if (infd) print blk }' "$log")
  [ -z "$report" ] || fail "$what: memcheck reported what its log below shows"
  rm -f "$log"
  ok "$what: no memcheck error, no leak, no descriptor left open"
}
