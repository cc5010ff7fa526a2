#!/usr/bin/env bash
# Which TLS 1.3 suite blkd picks: its own order (AES-128-GCM first) over
# the client's, except that a client listing ChaCha20-Poly1305 first (one
# without AES hardware) gets ChaCha20 (SSL_OP_PRIORITIZE_CHACHA).  The
# client is OpenSSL's (tests/helpers/tls-keyupdate, TLS_KU_SUITES in the
# client's order); the suite is read from blkd's "TLS up:" log line.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
. "$(dirname "$0")/helpers/tls.sh"
need_server
need openssl
server_is_nbdkit && skip "blkd's suite order"
KU=$TOP/tests/helpers/tls-keyupdate
[ -x "$KU" ] || fail "no $KU (make check builds it)"

T=$TMP/tls
make_tls_material "$T"
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
