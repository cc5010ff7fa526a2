#!/usr/bin/env bash
# TLS with real clients: libnbd (nbdinfo, nbdcopy) over X.509 and PSK, in
# TLS 1.3 and (forced through GnuTLS's system priority file) TLS 1.2; qemu
# (qemu-img, qemu-io) with tls-creds-x509 and tls-creds-psk; nbd-client's
# TLS handshake; --tls=require refusing clear text and --tls=on serving
# both; nbdkit_is_tls() as a plugin sees it (nbdkit's eval plugin passes it
# to its open method).  Certificates and keys are made here, never committed.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
. "$(dirname "$0")/helpers/tls.sh"
need_tls_server nbdinfo nbdcopy
server_is_nbdkit && skip "TLS tests run against blkd only (nbdkit cannot mix --tls-psk and certificates)"

T=$TMP/tls
make_tls_material "$T"
ok "CA, server, client, foreign and expired certificates and PSK files made"

tls_up() { grep -c "TLS up: $1" "$TMP/server.log" || true; }

echo "# --tls=require with certificates and PSK"
start_server -v --tls=require --tls-certificates="$T/server" --tls-psk="$T/keys.psk" memory 32M
grep -q "blkd: TLS required: TLS 1.2-1.3 with X.509 certificates from $T/server and pre-shared keys" \
  "$TMP/server.log" || fail "no TLS start-up line"
grep -q "kernel TLS" "$TMP/server.log" || fail "start-up line does not say whether kernel TLS is used"
ok "start-up line names the credentials and the kTLS path"
XURI="nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca"
PURI="nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$T/keys.psk"

expect_eq "$(nbdinfo --size "$XURI")" 33554432 "nbdinfo over X.509 (TLS 1.3): size"
grep -q "with TLS" <<<"$(nbdinfo "$XURI")" || fail "nbdinfo does not report TLS"
ok "nbdinfo reports a TLS connection"
expect_eq "$(nbdinfo --size "$PURI")" 33554432 "nbdinfo over PSK, username in the URI: size"
# libnbd 1.14's URIs take the username only as user@; the API has its own call.
if "$PY" -c 'import nbd' 2>/dev/null; then
  expect_eq "$("$PY" -c '
import nbd, sys
h = nbd.NBD()
h.set_tls(nbd.TLS_REQUIRE)
h.set_tls_psk_file(sys.argv[1])
h.set_tls_username("alice")
h.connect_tcp("127.0.0.1", sys.argv[2])
print(h.get_size())
h.shutdown()' "$T/keys.psk" "$PORT")" 33554432 "libnbd set_tls_username + set_tls_psk_file: size"
fi
[ "$(tls_up 'TLSv1.3 .*PSK identity alice')" -ge 2 ] || fail "server did not log TLS 1.3 PSK sessions"
ok "server logged TLS 1.3 PSK sessions for alice"

echo "# nbdcopy through TLS, both ways, X.509 and PSK"
head -c $((12 * 1024 * 1024)) /dev/urandom >"$TMP/in.img"
nbdcopy "$TMP/in.img" "$XURI" || fail "nbdcopy to the server over X.509"
nbdcopy "$PURI" "$TMP/out.img" --request-size=262144 || fail "nbdcopy from the server over PSK"
head -c $((12 * 1024 * 1024)) "$TMP/out.img" >"$TMP/out12.img"
expect_eq "$(sha "$TMP/out12.img")" "$(sha "$TMP/in.img")" "data written over X.509 read back over PSK"
nbdcopy "$XURI" "$TMP/out4k.img" --request-size=4096 --requests=64 || fail "nbdcopy 4k from the server"
expect_eq "$(sha "$TMP/out4k.img")" "$(sha "$TMP/out.img")" "the same data in 4 KiB requests"

[ "$(tls_up 'TLSv1.3 .*records: sent sealed by OpenSSL,')" -ge 1 ] \
  || fail "TLS 1.3 sessions are not sealed by OpenSSL by default"
ok "OpenSSL seals the records by default"

# blkd once had a TLS 1.3 sealer of its own (--tls-seal=blkd); an older
# command line that names it must still start, say why it is ignored,
# and serve the same data with OpenSSL sealing.
echo "# an older command line with --tls-seal=blkd"
stop_server
start_server -v --tls=require --tls-certificates="$T/server" --tls-psk="$T/keys.psk" \
  --tls-seal=blkd memory 32M
grep -q "warning: --tls-seal=blkd is no longer available" "$TMP/server.log" \
  || fail "no warning that --tls-seal=blkd is ignored"
XURI="nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca"
PURI="nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$T/keys.psk"
nbdcopy "$TMP/in.img" "$PURI" || fail "nbdcopy to the server over PSK (--tls-seal=blkd)"
nbdcopy "$XURI" "$TMP/out-b.img" --request-size=262144 || fail "nbdcopy from the server (--tls-seal=blkd)"
head -c $((12 * 1024 * 1024)) "$TMP/out-b.img" >"$TMP/out12-b.img"
expect_eq "$(sha "$TMP/out12-b.img")" "$(sha "$TMP/in.img")" "the data read back (--tls-seal=blkd ignored)"
ok "--tls-seal=blkd: warned, OpenSSL seals"

echo "# TLS 1.2 (GnuTLS told to disable TLS 1.3 via its system priority file)"
printf '[overrides]\ndisabled-version = tls1.3\n' >"$T/gnutls-tls12.cfg"
expect_eq "$(GNUTLS_SYSTEM_PRIORITY_FILE=$T/gnutls-tls12.cfg nbdinfo --size "$PURI")" 33554432 \
  "nbdinfo over TLS 1.2 PSK"
expect_eq "$(GNUTLS_SYSTEM_PRIORITY_FILE=$T/gnutls-tls12.cfg nbdinfo --size "$XURI")" 33554432 \
  "nbdinfo over TLS 1.2 X.509"
[ "$(tls_up 'TLSv1.2 .*PSK identity alice')" -ge 1 ] || fail "no TLS 1.2 PSK session in the log"
[ "$(tls_up 'TLSv1.2 ECDHE')" -ge 1 ] || fail "no TLS 1.2 certificate session in the log"
ok "server logged TLS 1.2 sessions, PSK and certificate"

echo "# kernel TLS is decided per session: TLS 1.2 only (test-build knob, no tls module needed)"
stop_server
BLKD_TLS_TEST_KTLS=1 BLKD_TLS_REKEY_RECORDS=1000000 start_server -v --tls=require \
  --tls-certificates="$T/server" --tls-psk="$T/keys.psk" memory 32M
XURI="nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca"
PURI="nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$T/keys.psk"
if grep -q "only test builds" "$TMP/server.log"; then
  note "$BLKD is not a test build (make check, or make TEST_HOOKS=1): kTLS decision not checked"
else
  expect_eq "$(nbdinfo --size "$XURI")" 33554432 "TLS 1.3 client, kTLS allowed"
  grep -q "the client offers TLS 1.3: no kernel TLS for this session" "$TMP/server.log" \
    || fail "a TLS 1.3 session was not kept off kernel TLS"
  ok "a TLS 1.3 session is kept off kernel TLS"
  expect_eq "$(GNUTLS_SYSTEM_PRIORITY_FILE=$T/gnutls-tls12.cfg nbdinfo --size "$PURI")" 33554432 \
    "TLS 1.2 client, kTLS allowed"
  grep -q "a TLS 1.2 client: kernel TLS where the suite allows, no read-ahead" "$TMP/server.log" \
    || fail "a TLS 1.2 session was not offered kernel TLS"
  [ "$(grep -c "the client offers TLS 1.3" "$TMP/server.log")" = 1 ] \
    || fail "the TLS 1.2 client was taken for a TLS 1.3 one"
  ok "a TLS 1.2 session may use kernel TLS, without read-ahead"
  nbdcopy "$TMP/in.img" "$PURI" || fail "nbdcopy over TLS 1.3 with kTLS allowed"
  GNUTLS_SYSTEM_PRIORITY_FILE=$T/gnutls-tls12.cfg nbdcopy "$XURI" "$TMP/out-k.img" \
    || fail "nbdcopy over TLS 1.2 with kTLS allowed"
  head -c $((12 * 1024 * 1024)) "$TMP/out-k.img" >"$TMP/out12-k.img"
  expect_eq "$(sha "$TMP/out12-k.img")" "$(sha "$TMP/in.img")" "data exact over TLS 1.2 without read-ahead"
fi
stop_server
start_server -v --tls=require --tls-certificates="$T/server" --tls-psk="$T/keys.psk" memory 32M
XURI="nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca"
PURI="nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$T/keys.psk"

echo "# qemu: tls-creds-x509 and tls-creds-psk objects"
if command -v qemu-img >/dev/null && command -v qemu-io >/dev/null; then
  qemu-img info --object tls-creds-x509,id=tls0,dir="$T/client-ca",endpoint=client \
    --image-opts "driver=nbd,host=127.0.0.1,port=$PORT,tls-creds=tls0" >"$TMP/qinfo" \
    || { cat "$TMP/qinfo"; fail "qemu-img info over X.509"; }
  grep -q "virtual size: 32 MiB" "$TMP/qinfo" || { cat "$TMP/qinfo"; fail "qemu-img info size"; }
  ok "qemu-img info over X.509"
  mkdir -p "$T/qemu-psk" && cp "$T/keys.psk" "$T/qemu-psk/keys.psk"
  QPSK=(--object "tls-creds-psk,id=tls0,dir=$T/qemu-psk,username=alice,endpoint=client"
        --image-opts "driver=nbd,host=127.0.0.1,port=$PORT,tls-creds=tls0")
  qemu-io "${QPSK[@]}" -c 'write -P 0xa5 1M 2M' >"$TMP/qio" 2>&1 || { cat "$TMP/qio"; fail "qemu-io write over PSK"; }
  qemu-io "${QPSK[@]}" -c 'read -P 0xa5 1M 2M' >"$TMP/qio" 2>&1 || { cat "$TMP/qio"; fail "qemu-io read over PSK"; }
  grep -q "read 2097152/2097152" "$TMP/qio" || { cat "$TMP/qio"; fail "qemu-io pattern check"; }
  ok "qemu-io wrote and verified a pattern over PSK"
else
  note "qemu-utils not installed: qemu checks not made"
fi

echo "# nbd-client: the kernel client's TLS handshake (list exports)"
NBDC=$(command -v nbd-client || echo /usr/sbin/nbd-client)
if [ -x "$NBDC" ]; then
  "$NBDC" -l 127.0.0.1 "$PORT" -A "$T/client-ca/ca-cert.pem" -H localhost -x >"$TMP/nbdc" 2>&1 \
    || { cat "$TMP/nbdc"; fail "nbd-client -l with TLS"; }
  grep -q '^Negotiation: \.\.' "$TMP/nbdc" || fail "nbd-client did not negotiate"
  ok "nbd-client -l over TLS"
  expect_fail "nbd-client -l in clear against --tls=require" "$NBDC" -l 127.0.0.1 "$PORT"
fi

echo "# --tls=require: clear text reaches nothing"
expect_fail "nbdinfo nbd:// (clear) against --tls=require" nbdinfo --size "nbd://127.0.0.1:$PORT"
expect_fail "nbdinfo --list in clear against --tls=require" nbdinfo --list "nbd://127.0.0.1:$PORT"
check_alive
stop_server

echo "# --tls=on: clear text and TLS both work; nbdkit_is_tls() tells them apart"
# eval's open gets the tls flag as \$4 and returns it as the handle;
# get_size answers 2M over TLS and 1M in clear.
start_server --tls=on --tls-certificates="$T/server" eval \
  open='echo $4' get_size='if [ "$2" = true ]; then echo 2M; else echo 1M; fi' \
  pread='head -c $3 /dev/zero'
expect_eq "$(nbdinfo --size "nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca")" 2097152 \
  "size over TLS (plugin saw is_tls true)"
expect_eq "$(nbdinfo --size "nbd://127.0.0.1:$PORT")" 1048576 "size in clear (plugin saw is_tls false)"
check_alive
stop_server
echo "all TLS client checks passed"
