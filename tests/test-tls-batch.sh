#!/usr/bin/env bash
# The TLS send path collects OpenSSL's small records in a buffer of its
# own and sends several per send(2); a full record with nothing queued
# ahead goes straight from OpenSSL's buffer.  Checked here:
# - multi-MiB replies queued against a reader with a tiny receive window
#   that pauses arrive intact, with KeyUpdate requests from the client in
#   the middle of a reply answered under the new keys;
# - the server's own KeyUpdates (test-build knob BLKD_TLS_REKEY_RECORDS),
#   which OpenSSL puts ahead of a record into the same buffer while the
#   socket is full, keep the stream decryptable;
# - GnuTLS (nbdcopy) reads 4 MiB replies exact, over TLS 1.3 and 1.2
#   (its KeyUpdates with blkd's are in test-tls-keyupdate.sh: GnuTLS
#   takes at most 8 a second);
# - full records are sent whole: a 64 MiB read of 256 KiB requests costs
#   about one send per 16 KiB record, never more (strace counts the
#   server's sending system calls; small records' batching is in
#   test-tls-send-batch.py).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
. "$(dirname "$0")/helpers/tls.sh"
need_tls_server nbdcopy
server_is_nbdkit && skip "blkd's TLS send path"
need_ku_client
CA=$T/client-ca/ca-cert.pem
XURI() { echo "nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca"; }
fail_log() { tail -n 20 "$TMP/server.log" >&2; fail "$@"; }

echo "# 32 MiB of 4 MiB replies queued against a 4 KiB receive window, a pausing reader"
start_server -v --tls=require --tls-certificates="$T/server" memory 64M
out=$(TLS_KU_BIG=32 TLS_KU_RCVBUF=4096 TLS_KU_PAUSE_MS=2 "$KU" "$PORT" "$CA" 0 0) \
  || fail_log "large replies to a slow reader: $out"
expect_eq "$out" "rounds 9, key updates sent 0, received 0" "32 MiB read back exact"
grep -q "TLS up: TLSv1.3 .*records: sent sealed by OpenSSL," "$TMP/server.log" \
  || fail "the session was not on the default path (OpenSSL seals)"
ok "the default path (OpenSSL seals) carried it"

echo "# the same with a KeyUpdate request after every 3 MiB read (mid-reply)"
out=$(TLS_KU_BIG=32 TLS_KU_RCVBUF=4096 TLS_KU_PAUSE_MS=2 "$KU" "$PORT" "$CA" 0 3) \
  || fail_log "large replies with key updates: $out"
sent=$(echo "$out" | sed -n 's/.*sent \([0-9]*\),.*/\1/p')
received=$(echo "$out" | sed -n 's/.*received \([0-9]*\)$/\1/p')
expect_eq "$sent" 10 "the client asked for 10 key updates"
# Requests the server reads together may be answered by one KeyUpdate
# (RFC 8446 4.6.3), so at least one, at most one each.
[ "${received:-0}" -ge 1 ] && [ "$received" -le "$sent" ] \
  || fail "expected 1 to $sent KeyUpdates back: $out"
ok "data exact across $received KeyUpdates the server answered mid-transfer"
head -c $((16 * 1024 * 1024)) /dev/urandom >"$TMP/in.img"
nbdcopy "$TMP/in.img" "$(XURI)" || fail "nbdcopy to the server"
nbdcopy "$(XURI)" "$TMP/out.img" --request-size=4194304 || fail "nbdcopy of 4 MiB requests"
cmp -n $((16 * 1024 * 1024)) "$TMP/in.img" "$TMP/out.img" || fail "nbdcopy read other bytes"
ok "GnuTLS (nbdcopy) reads 4 MiB replies exact"
# TLS 1.2 records carry 29 bytes of overhead (an explicit nonce), more
# than TLS 1.3's 22: the buffer must take them whole too.
printf '[overrides]\ndisabled-version = tls1.3\n' >"$T/gnutls-tls12.cfg"
GNUTLS_SYSTEM_PRIORITY_FILE=$T/gnutls-tls12.cfg nbdcopy "$(XURI)" "$TMP/out12.img" \
  --request-size=4194304 || fail "nbdcopy over TLS 1.2"
cmp -n $((16 * 1024 * 1024)) "$TMP/in.img" "$TMP/out12.img" || fail "TLS 1.2: nbdcopy read other bytes"
grep -q "TLS up: TLSv1.2 .*records: sent sealed by OpenSSL," "$TMP/server.log" \
  || fail "no TLS 1.2 session on the default path in the log"
ok "TLS 1.2 (GnuTLS) reads 4 MiB replies exact"
server_alive || fail "server died"
stop_server

echo "# the server's own KeyUpdates every 64 records while the socket is full"
: >"$TMP/server.log"
BLKD_TLS_REKEY_RECORDS=64 start_server -v --tls=require --tls-certificates="$T/server" memory 64M
grep -q "only test builds" "$TMP/server.log" \
  && skip "$BLKD was built without test hooks (make check, or make TEST_HOOKS=1)"
out=$(TLS_KU_BIG=32 TLS_KU_RCVBUF=4096 TLS_KU_PAUSE_MS=2 "$KU" "$PORT" "$CA" 0 5) \
  || fail_log "large replies through the server's key updates: $out"
received=$(echo "$out" | sed -n 's/.*received \([0-9]*\)$/\1/p')
# 32 MiB is 2048 records: about 32 updates of the server's own.
[ "${received:-0}" -ge 20 ] || fail "expected the server to update its key 20+ times: $out"
ok "OpenSSL's client followed $received KeyUpdates, data exact"
server_alive || fail "server died"
stop_server

echo "# full records whole: sending system calls per MiB of a 256 KiB-request read"
if ! command -v strace >/dev/null; then
  echo "# (strace not installed: not counted)"
else
  : >"$TMP/server.log"
  start_server --tls=require --tls-certificates="$T/server" memory 64M
  nbdcopy -- [ nbdkit pattern 64M ] "$(XURI)" || fail "filling the disk"
  strace -f -qq -e trace=write,writev,sendto,sendmsg -o "$TMP/strace" -p "$SERVER_PID" &
  st=$!
  # strace says nothing when it is attached; its first line is a thread's
  # system call, or wait for the file to exist (generous, not timed).
  for ((i = 0; i < 100; i++)); do [ -e "$TMP/strace" ] && break; sleep 0.1; done
  sleep 1
  if ! kill -0 "$st" 2>/dev/null; then
    echo "# (strace cannot attach here: not counted)"
  else
    nbdcopy "$(XURI)" null: --request-size=262144 --connections=1 || fail "nbdcopy to null"
    kill -INT "$st"
    wait "$st" || true
    # Successful writes to any descriptor but stderr (the log), bytes summed.
    read -r calls bytes < <(awk '
      /^[0-9]+ +(write|writev|sendto|sendmsg)\(/ {
        split($2, a, "("); fd = a[2] + 0
        n = $NF + 0
        if (fd > 2 && n > 0) { calls++; bytes += n }
      }
      END { printf "%d %d\n", calls, bytes }' "$TMP/strace")
    mib=$((bytes / 1048576))
    [ "$mib" -ge 64 ] || fail "strace saw only $bytes bytes sent (expected 64 MiB and more)"
    per=$((calls / mib))
    echo "# $calls sending calls for $mib MiB: $per per MiB"
    # 64 records per MiB; a reply's header is a small record of its own,
    # sent together with the full records queued behind it.
    [ "$per" -le 68 ] || fail "$per sending calls per MiB: records are split (one per 16 KiB record is 64)"
    ok "$per sending calls per MiB (one per 16 KiB record would be 64)"
  fi
fi
