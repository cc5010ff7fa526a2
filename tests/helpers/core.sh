# Helpers shared by the tests/test-core-*.sh integration tests. Source it
# after lib.sh. These tests run against blkd, or against nbdkit when
# BLKD=/usr/bin/nbdkit, so the checks that only blkd must pass are guarded
# with blkd_only.

# The server under test must exist before anything else is worth trying.
need_server() {
  if [ "${BLKD#*/}" = "$BLKD" ]; then BLKD=$(command -v "$BLKD" || echo "$BLKD"); fi
  [ -x "$BLKD" ] || skip "no server binary at $BLKD (build blkd, or set BLKD=/usr/bin/nbdkit)"
}

server_is_nbdkit() { [ "$(basename "$BLKD")" = nbdkit ]; }

ok()   { echo "ok: $*"; }
note() { echo "note: $*"; }

# blkd_only WHAT WHY: true when the server is blkd; on nbdkit prints a note
# saying which check is not made and why, and returns false.
blkd_only() {
  if server_is_nbdkit; then note "blkd-only check not made on nbdkit: $1 ($2)"; return 1; fi
  return 0
}

# expect_eq ACTUAL EXPECTED WHAT
expect_eq() {
  [ "$1" = "$2" ] || fail "$3: expected '$2', got '$1'"
  ok "$3 = $2"
}

# expect_fail WHAT CMD...: the command must exit non-zero.
expect_fail() {
  local what=$1; shift
  if "$@" >"$TMP/expect_fail.out" 2>&1; then
    cat "$TMP/expect_fail.out"; fail "$what: succeeded but must fail"
  fi
  ok "$what fails as it must"
}

# A server that died takes the evidence with it: show its log.
check_alive() {
  if ! server_alive "${1:-$SERVER_PID}"; then
    tail -n 30 "$TMP/server.log" >&2 || true
    fail "server process ${1:-$SERVER_PID} is gone"
  fi
  ok "server still running"
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

PY=/usr/bin/python3
# python3-libnbd only exists for the system interpreter.
need_nbd_py() { "$PY" -c 'import nbd' 2>/dev/null || skip "python3-libnbd (nbd module) is not installed"; }
