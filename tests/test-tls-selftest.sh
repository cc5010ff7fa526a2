#!/usr/bin/env bash
# The start-up self-test of --tls-seal=blkd: with certificates and with
# PSK only it passes and blkd seals; when it fails (a test-build knob,
# BLKD_TLS_SELFTEST_CORRUPT, flips a bit of the self-test's key, as a
# changed OpenSSL key log would) blkd says so in one warning, OpenSSL seals
# every record, and clients get exact data.  Without --tls-seal, OpenSSL
# seals (the default) and no self-test runs.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
. "$(dirname "$0")/helpers/tls.sh"
need_tls_server nbdinfo nbdcopy
server_is_nbdkit && skip "blkd's record sealing"

T=$TMP/tls
make_tls_material "$T"
XURI() { echo "nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca"; }
PURI() { echo "nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$T/keys.psk"; }
head -c $((4 * 1024 * 1024)) /dev/urandom >"$TMP/in.img"

# copy_back URI WHAT: write in.img, read it back, compare.
copy_back() {
  nbdcopy "$TMP/in.img" "$1" || fail "nbdcopy to the server ($2)"
  nbdcopy "$1" "$TMP/out.img" --request-size=65536 || fail "nbdcopy from the server ($2)"
  expect_eq "$(sha "$TMP/out.img")" "$(sha "$TMP/in.img")" "data read back ($2)"
}
sealed_by() { grep -c "TLS up: TLSv1.3 .*records: sent sealed by $1," "$TMP/server.log" || true; }

echo "# default: OpenSSL seals, no self-test"
: >"$TMP/server.log"
start_server -v --tls=require --tls-certificates="$T/server" memory 4M
grep -q "; records sealed by OpenSSL$" "$TMP/server.log" || fail "start-up line does not name OpenSSL"
grep -q "self-test" "$TMP/server.log" && fail "a self-test ran without --tls-seal=blkd"
copy_back "$(XURI)" "default"
[ "$(sealed_by OpenSSL)" -ge 2 ] || fail "sessions not sealed by OpenSSL by default"
ok "OpenSSL sealed the sessions"
stop_server

for creds in "--tls-certificates=$T/server" "--tls-psk=$T/keys.psk"; do
  echo "# --tls-seal=blkd with $creds: the self-test passes"
  : >"$TMP/server.log"
  start_server -v --tls=require "$creds" --tls-seal=blkd memory 4M
  grep -q "sealed by blkd (--tls-seal=blkd, self-test passed)" "$TMP/server.log" \
    || { cat "$TMP/server.log"; fail "self-test did not pass ($creds)"; }
  ok "self-test passed ($creds)"
  case $creds in --tls-psk*) uri=$(PURI) ;; *) uri=$(XURI) ;; esac
  copy_back "$uri" "blkd seals, $creds"
  [ "$(sealed_by blkd)" -ge 2 ] || fail "blkd did not seal the sessions ($creds)"
  ok "blkd sealed the sessions ($creds)"
  stop_server
done

echo "# a failing self-test turns the sealer off"
: >"$TMP/server.log"
BLKD_TLS_REKEY_RECORDS=100000 BLKD_TLS_SELFTEST_CORRUPT=1 \
  start_server -v --tls=require --tls-certificates="$T/server" --tls-seal=blkd memory 4M
grep -q "only test builds" "$TMP/server.log" \
  && skip "$BLKD was built without test hooks (make check, or make TEST_HOOKS=1)"
grep -q "warning: TLS: the --tls-seal=blkd self-test failed with TLS_AES_128_GCM_SHA256: .*OpenSSL seals every record instead" \
  "$TMP/server.log" || { cat "$TMP/server.log"; fail "no self-test failure warning"; }
ok "$(grep 'self-test failed' "$TMP/server.log" | sed 's/^blkd: //')"
grep -q "; records sealed by OpenSSL$" "$TMP/server.log" || fail "start-up line still names blkd"
copy_back "$(XURI)" "after a failed self-test"
[ "$(sealed_by blkd)" = 0 ] || fail "blkd sealed a session after its self-test failed"
[ "$(sealed_by OpenSSL)" -ge 2 ] || fail "sessions not sealed by OpenSSL after the failed self-test"
ok "OpenSSL sealed every session"
check_alive
stop_server
echo "all self-test checks passed"
