#!/usr/bin/env bash
# Which TLS 1.3 suite blkd picks: its own order (AES-128-GCM first) over
# the client's, except that a client listing ChaCha20-Poly1305 first (one
# without AES hardware) gets ChaCha20 (SSL_OP_PRIORITIZE_CHACHA); and
# --tls-suites, which replaces the order (checked at start-up).  The client is OpenSSL's
# (tests/helpers/tls-keyupdate, TLS_KU_SUITES in the client's order); the
# suite is read from blkd's "TLS up:" log line.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
. "$(dirname "$0")/helpers/tls.sh"
need_tls_server nbdinfo
server_is_nbdkit && skip "blkd's suite order"
need_ku_client
start_server -v --tls=require --tls-certificates="$T/server" memory 8M

# suite_for CLIENT-ORDER: the suite blkd chose for a client offering that.
suite_for() {
  local before; before=$(grep -c "TLS up:" "$TMP/server.log" || true)
  TLS_KU_SUITES=$1 "$KU" "$PORT" "$T/client-ca/ca-cert.pem" 1 0 >/dev/null \
    || fail "client offering $1"
  grep "TLS up:" "$TMP/server.log" | sed -n "$((before + 1))p" \
    | sed -n 's/.*TLS up: TLSv1.3 \([A-Z0-9_]*\).*/\1/p'
}

expect_eq "$(suite_for TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256)" \
  TLS_AES_128_GCM_SHA256 "a client preferring AES-256-GCM gets the server's AES-128-GCM"
expect_eq "$(suite_for TLS_AES_256_GCM_SHA384)" TLS_AES_256_GCM_SHA384 \
  "a client offering only AES-256-GCM gets it"
expect_eq "$(suite_for TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384)" \
  TLS_CHACHA20_POLY1305_SHA256 "a client listing ChaCha20 first gets ChaCha20"
server_alive || fail "server died"
stop_server

echo "# --tls-suites: AES-256-GCM first"
: >"$TMP/server.log"
start_server -v --tls=require --tls-certificates="$T/server" \
  --tls-suites=TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256 memory 8M
expect_eq "$(suite_for TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384)" TLS_AES_256_GCM_SHA384 \
  "the server's order from --tls-suites wins"
stop_server

echo "# --tls-suites: ChaCha20 only"
: >"$TMP/server.log"
start_server -v --tls=require --tls-certificates="$T/server" \
  --tls-suites=TLS_CHACHA20_POLY1305_SHA256 memory 8M
expect_eq "$(suite_for TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256)" \
  TLS_CHACHA20_POLY1305_SHA256 "only ChaCha20 is offered"
expect_eq "$(nbdinfo --size "nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca")" 8388608 \
  "GnuTLS (nbdinfo) connects"
stop_server

echo "# --tls-suites mistakes stop start-up"
for bad in TLS_AES_128_GCM_SHA256:FOO "" TLS_AES_128_GCM_SHA256:TLS_AES_128_GCM_SHA256 \
           TLS_AES_128_CCM_SHA256; do
  if timeout 60 "$BLKD" -f -i 127.0.0.1 -p 0 --tls=require --tls-certificates="$T/server" --tls-suites="$bad" \
       memory 1M >"$TMP/bad.log" 2>&1; then
    fail "blkd started with --tls-suites=$bad"
  fi
  grep -q "blkd: --tls-suites: " "$TMP/bad.log" || fail "no message for --tls-suites=$bad: $(cat "$TMP/bad.log")"
done
ok "unknown, empty, repeated and unsealable suites refused"
if timeout 60 "$BLKD" -f -i 127.0.0.1 -p 0 --tls=require --tls-psk="$T/keys.psk" --tls-suites=TLS_AES_256_GCM_SHA384 \
     memory 1M >"$TMP/bad.log" 2>&1; then
  fail "blkd started with PSK and a SHA-384 suite first"
fi
grep -q "first suite must be a SHA-256 one" "$TMP/bad.log" || fail "PSK: $(cat "$TMP/bad.log")"
ok "PSK with a SHA-384 suite first refused"
