#!/usr/bin/env bash
# TLS 1.3 key updates: a client that asks for updates (OpenSSL's
# SSL_key_update, from tests/helpers/tls-keyupdate.c) must get one KeyUpdate
# back per request and keep reading exact data under the new keys; blkd's
# own updates (every BLKD_TLS_REKEY_RECORDS records, a test-build knob that
# make check builds with; 2^24 in production) must be followed by OpenSSL
# and by GnuTLS (nbdcopy) alike.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
. "$(dirname "$0")/helpers/tls.sh"
need_tls_server nbdcopy nbdinfo
server_is_nbdkit && skip "blkd's key update policy"
need_ku_client
XURI() { echo "nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca"; }

echo "# the client asks for key updates"
start_server -v --tls=require --tls-certificates="$T/server" memory 8M
out=$("$KU" "$PORT" "$T/client-ca/ca-cert.pem" 40 5) || fail "client with key updates"
expect_eq "$out" "rounds 40, key updates sent 7, received 7" "one KeyUpdate answered per request"
grep -q "TLS up: TLSv1.3 .*records: sent sealed by OpenSSL" "$TMP/server.log" \
  || fail "the log does not say OpenSSL seals the records"
stop_server

echo "# a client that limits records to 512 bytes (max_fragment_length)"
start_server -v --tls=require --tls-certificates="$T/server" memory 8M
out=$(TLS_KU_MFL=512 "$KU" "$PORT" "$T/client-ca/ca-cert.pem" 10 3) \
  || fail "client with max_fragment_length 512"
expect_eq "$out" "rounds 10, key updates sent 3, received 3" "512-byte records, exact data, key updates"
stop_server

echo "# a flood of 2000 update requests, then data"
start_server -v --tls=require --tls-certificates="$T/server" memory 8M
out=$("$KU" "$PORT" "$T/client-ca/ca-cert.pem" 4 0 2000) || fail "client after a key update flood"
received=$(echo "$out" | sed -n 's/.*received \([0-9]*\)$/\1/p')
[ "${received:-0}" -ge 1 ] && [ "$received" -le 2000 ] || fail "flood: $out"
ok "2000 requests answered with $received KeyUpdates, data exact afterwards"
expect_eq "$(nbdinfo --size "$(XURI)")" 8388608 "another client served after the flood"
stop_server

echo "# the server's own key updates, every 64 records"
BLKD_TLS_REKEY_RECORDS=64 start_server -v --tls=require --tls-certificates="$T/server" memory 16M
grep -q "only test builds" "$TMP/server.log" \
  && skip "$BLKD was built without test hooks (make check, or make TEST_HOOKS=1)"
out=$("$KU" "$PORT" "$T/client-ca/ca-cert.pem" 60 0) || fail "OpenSSL client through key updates"
# 60 rounds read 60 x 4 records and get 120 short replies: >= 3 updates.
received=$(echo "$out" | sed -n 's/.*received \([0-9]*\)$/\1/p')
[ "${received:-0}" -ge 3 ] || fail "expected the server to update its key at least 3 times: $out"
ok "OpenSSL followed $received key updates the server started"
stop_server

# A key update after every record: the last reply's record leaves one
# due.  The client then waits without disconnecting; the server ends the
# session (--idle-timeout) and its close_notify must still come, after
# that KeyUpdate, under the new key.
echo "# the server closes with its own key update due"
BLKD_TLS_REKEY_RECORDS=1 start_server -v --idle-timeout=1 --tls=require \
  --tls-certificates="$T/server" memory 8M
out=$(TLS_KU_NO_DISC=1 TLS_KU_CAPTURE="$TMP/close" timeout 120 \
        "$KU" "$PORT" "$T/client-ca/ca-cert.pem" 2 0 2>&1) \
  || fail "session closed by the server with a key update due: $out"
ok "close_notify after the server's last key update"
stop_server
# GnuTLS accepts at most 8 KeyUpdates per second per session; 256 records
# per key keeps a 16 MiB copy under that on any one connection.
BLKD_TLS_REKEY_RECORDS=256 start_server -v --tls=require --tls-certificates="$T/server" \
  memory 16M
head -c $((16 * 1024 * 1024)) /dev/urandom >"$TMP/in.img"
nbdcopy "$TMP/in.img" "$(XURI)" || fail "nbdcopy to the server"
nbdcopy "$(XURI)" "$TMP/out.img" --request-size=262144 || fail "nbdcopy through blkd's key updates"
expect_eq "$(sha "$TMP/out.img")" "$(sha "$TMP/in.img")" "GnuTLS (nbdcopy) reads exact data across blkd's key updates"
[ "$(grep -c 'records under this key: key update' "$TMP/server.log")" -ge 4 ] \
  || fail "blkd logged fewer than 4 key updates of its own"
ok "blkd updated its key $(grep -c 'records under this key: key update' "$TMP/server.log") times during the copy"
server_alive || fail "server died"
ok "server alive"
