#!/usr/bin/env bash
# blkperf's own request loop (client/wire.c): fewer syscalls per request
# than libnbd's loop, and every reply shape a server may send parsed right:
# structured data, holes, error chunks, simple replies.
. "$(dirname "$0")/lib.sh"
[ -x "$BLKPERF" ] || skip "blkperf is not built (make blkperf)"
need nbdkit
need strace
PY=/usr/bin/python3

# field FILE EXPR: a value from blkperf's JSON.
field() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$@"; }

# syscalls NAME ARGS...: runs blkperf under strace -c and prints the I/O
# syscalls (send*, recv*, poll, read, write) per request.  Counts, not
# times: strace slows everything alike and the ratio stays meaningful.
syscalls() {
  local name=$1; shift
  # LeakSanitizer cannot run under ptrace: off for these runs only.
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    strace -f -c -o "$TMP/$name.strace" "$BLKPERF" --json --quiet "$@" >"$TMP/$name.json" \
    2>"$TMP/$name.err" || { cat "$TMP/$name.err"; fail "blkperf $* failed under strace"; }
  "$PY" - "$TMP/$name.strace" "$TMP/$name.json" <<'EOF'
import json, re, sys
calls = 0
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 5 and re.match(r"^(sendto|sendmsg|recvfrom|recvmsg|poll|ppoll|read|write)$", f[-1]):
        calls += int(f[3])
d = json.load(open(sys.argv[2]))
print("%.3f" % (calls / d["requests"]))
EOF
}

# --- syscalls per request: wire.c against libnbd's loop ------------------
start_server nbdkit null 8G
# TEST: wire.c's ceiling, and how many times fewer than libnbd it must make.
# 4k reads: many replies per recv and one sendmsg per batch of refills.
# 256k reads: a header recv and a payload recv per reply, one sendmsg per
# refill; libnbd makes four recvs, a send and a poll.
for t in "RAND_READ -b 4k -q 32:1.5:3" "STREAM_READ -b 256k -q 16:3.5:1.5"; do
  IFS=: read -r args most times <<<"$t"
  # shellcheck disable=SC2086
  w=$(syscalls wire -t $args -n 20000 "$URI")
  # shellcheck disable=SC2086
  l=$(syscalls libnbd --io=libnbd -t $args -n 20000 "$URI")
  [ "$(field "$TMP/wire.json" 'd["io"]')" = wire ] && [ "$(field "$TMP/libnbd.json" 'd["io"]')" = libnbd ] \
    || fail "the JSON does not say which request loop ran"
  echo "$args: syscalls per request: wire $w, libnbd $l"
  "$PY" -c "import sys; sys.exit(0 if $w <= $most and $w * $times <= $l else 1)" \
    || fail "$args: wire.c made $w syscalls per request (libnbd $l)"
done

# --- reply shapes ---------------------------------------------------------
# Structured replies with data chunks (nbdkit), every test type's requests.
start_server nbdkit memory 1G
for t in STREAM_READ STREAM_WRITE RAND_RW CHURN; do
  "$BLKPERF" --json --quiet -t $t -n 3000 "$URI" >"$TMP/sr.json" || fail "$t over structured replies"
  [ "$(field "$TMP/sr.json" 'd["requests"] == 3000 and d["errors"] == 0')" = True ] \
    || fail "$t: requests or errors wrong"
done

# Large writes fill the socket: sendmsg sends part of a batch and the
# rest waits for POLLOUT while new requests queue behind it.
for t in "STREAM_WRITE -b 1M -q 8" "RAND_RW -b 256k -q 32"; do
  # shellcheck disable=SC2086
  "$BLKPERF" --json --quiet -t $t --span 256M -n 1500 "$URI" >"$TMP/big.json" \
    || fail "$t: large writes failed"
  [ "$(field "$TMP/big.json" 'd["requests"] == 1500 and d["errors"] == 0')" = True ] \
    || fail "$t: requests or errors wrong"
done

# Simple replies only (nbdkit --no-sr): reads carry their data inline.
start_server nbdkit --no-sr memory 1G
for t in STREAM_READ RAND_READ RAND_WRITE; do
  "$BLKPERF" --json --quiet -t $t -n 3000 "$URI" >"$TMP/simple.json" || fail "$t over simple replies"
  [ "$(field "$TMP/simple.json" 'd["requests"] == 3000 and d["errors"] == 0')" = True ] \
    || fail "$t over simple replies: requests or errors wrong"
done

# Error replies: counted as failed requests, the stream stays in step.
for sr in "" --no-sr; do
  # shellcheck disable=SC2086
  start_server nbdkit $sr --filter=error memory 1G error=EIO error-rate=30%
  rc=0
  "$BLKPERF" --json --quiet -t RAND_READ -n 4000 "$URI" >"$TMP/err.json" 2>"$TMP/err.txt" || rc=$?
  cat "$TMP/err.txt"
  [ $rc -eq 1 ] || fail "error replies ($sr): exit $rc, expected 1"
  grep -q "requests failed, first with: Input/output error" "$TMP/err.txt" \
    || fail "error replies ($sr): no count of failed requests"
  grep -q "protocol error" "$TMP/err.txt" && fail "error replies ($sr) broke the framing"
  [ "$(field "$TMP/err.json" '600 < d["errors"] < 2000 and d["requests"] + d["errors"] == 4000')" = True ] \
    || fail "error replies ($sr): $(field "$TMP/err.json" 'd["errors"]') errors of 4000"
done

# Holes: blkd sends unwritten parts of a RAM disk as OFFSET_HOLE chunks.
if [ -x "$BLKD" ] && [ "$(basename "$BLKD")" != nbdkit ]; then
  start_server blkd --sparse-reads yes ram size=64M
  for t in "RAND_READ -b 4k" "STREAM_READ -b 256k"; do
    # shellcheck disable=SC2086
    "$BLKPERF" --json --quiet -t $t -n 3000 "$URI" >"$TMP/holes.json" || fail "$t over holes"
    [ "$(field "$TMP/holes.json" 'd["requests"] == 3000 and d["errors"] == 0')" = True ] \
      || fail "$t over holes: requests or errors wrong"
  done
  # Half written, half holes: data and hole chunks within one reply.
  "$BLKPERF" --json --quiet -t STREAM_WRITE -b 4k --span 32M -n 4096 "$URI" >/dev/null \
    || fail "writing the first half"
  "$BLKPERF" --json --quiet -t STREAM_READ -b 1M --span 64M -n 256 "$URI" >"$TMP/mixed.json" \
    || fail "reads across data and holes"
  [ "$(field "$TMP/mixed.json" 'd["errors"] == 0')" = True ] || fail "mixed reads had errors"
else
  echo "note: blkd not built, hole replies not tested"
fi

echo "all wire checks passed"
