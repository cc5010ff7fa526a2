#!/usr/bin/env bash
# SIGHUP reloads TLS credentials under load.  Clients keep writing and
# reading back (PSK and certificate sessions) while the server certificate,
# its CA and the pre-shared key are rotated, a CRL is added and removed and
# the client CA is changed: no session may drop and no request may fail.
# After each reload a new client must meet the NEW credentials (the new
# server certificate, the new PSK; the old CA and the old key refused); a
# bad file (garbage, a key that does not match, a bad PSK line) must be
# logged naming the file, and the old credentials kept.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
. "$(dirname "$0")/helpers/tls.sh"
need_tls_server nbdinfo
server_is_nbdkit && skip "credential reload on SIGHUP is blkd's (nbdkit stops on SIGHUP)"
$PY -c 'import nbd' 2>/dev/null || skip "the nbd Python module (python3-libnbd) is missing"

T=$TMP/tls
make_tls_material "$T"

# new_ca NAME: a CA in $T/NAME/{key,cert}.pem.
new_ca() {
  mkdir -p "$T/$1"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -keyout "$T/$1/key.pem" -out "$T/$1/cert.pem" -subj "/CN=blkd test $1" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
# new_cert CA EXT OUTDIR CERTNAME KEYNAME CN: a key and a certificate from CA.
new_cert() {
  local ca=$1 ext=$2 dir=$3 cert=$4 key=$5 cn=$6
  mkdir -p "$dir"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/$key" \
    -subj "/CN=$cn" -out "$dir/$cert.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$cert.csr" -CA "$T/$ca/cert.pem" -CAkey "$T/$ca/key.pem" \
    -CAcreateserial -days 30 -extfile "$ext" -out "$dir/$cert" 2>/dev/null
  rm -f "$dir/$cert.csr"
  [ -s "$dir/$cert" ] || fail "could not make $dir/$cert"
}

# The load: one process per session, writing random blocks into its own
# quarter of the disk and reading each back, until $TMP/stop appears.  It
# counts requests in its progress file; any error ends it non-zero.
cat >"$TMP/load.py" <<'PY'
import nbd, os, random, sys
uri, slot, progress, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri(uri)
quarter = h.get_size() // 4
rnd = random.Random(slot)
n = rounds = 0
while not os.path.exists(stop):
    off = slot * quarter + rnd.randrange(quarter // 4096) * 4096
    data = rnd.randbytes(4096)
    h.pwrite(data, off)
    if h.pread(4096, off) != data:
        sys.exit("%s: read back differs at %d after %d requests" % (uri, off, n))
    n += 2
    rounds += 1
    if rounds % 10 == 0:
        h.flush()
        n += 1
        with open(progress + ".new", "w") as f:
            f.write("%d\n" % n)
        os.rename(progress + ".new", progress)
h.shutdown()
print("%s: %d requests, none failed" % (uri, n))
PY

LOADS=()
# start_load NAME URI SLOT
start_load() {
  echo 0 >"$TMP/progress.$1"
  $PY "$TMP/load.py" "$2" "$3" "$TMP/progress.$1" "$TMP/stop" >"$TMP/load.$1.log" 2>&1 &
  LOADS+=("$1:$!")
}
# load_moves: every load process has done more requests than at the last
# call (each is still alive and its session still works).
declare -A SEEN
load_moves() {
  local l name pid
  for l in "${LOADS[@]}"; do
    name=${l%%:*} pid=${l#*:}
    for _ in $(seq 1200); do
      [ "$(cat "$TMP/progress.$name")" -gt "${SEEN[$name]:-0}" ] && break
      kill -0 "$pid" 2>/dev/null || { cat "$TMP/load.$name.log"; fail "load $name died"; }
      sleep 0.1
    done
    [ "$(cat "$TMP/progress.$name")" -gt "${SEEN[$name]:-0}" ] \
      || fail "load $name made no progress in two minutes"
    SEEN[$name]=$(cat "$TMP/progress.$name")
  done
  ok "every session still doing I/O ($*)"
}
stop_loads() {
  local l
  touch "$TMP/stop"
  for l in "${LOADS[@]}"; do
    wait "${l#*:}" || { cat "$TMP/load.${l%%:*}.log"; fail "load ${l%%:*} failed"; }
    ok "$(cat "$TMP/load.${l%%:*}.log")"
  done
  LOADS=()
  rm -f "$TMP/stop"
}

# reload WHAT good|bad [REGEX]: SIGHUP, then wait for the outcome's log line.
reload() {
  local what=$1 want=$2 re=${3:-} line before
  if [ "$want" = good ]; then line='info: TLS reloaded: new handshakes use'
  else line='error: TLS reload failed: new handshakes keep the credentials loaded before'; fi
  before=$(grep -c "$line" "$TMP/server.log" || true)
  kill -HUP "$SERVER_PID"
  for _ in $(seq 600); do
    [ "$(grep -c "$line" "$TMP/server.log" || true)" -gt "$before" ] && break
    server_alive || { tail -5 "$TMP/server.log"; fail "$what: the server died of SIGHUP"; }
    sleep 0.1
  done
  [ "$(grep -c "$line" "$TMP/server.log" || true)" -gt "$before" ] \
    || { tail -20 "$TMP/server.log"; fail "$what: no log line '$line'"; }
  if [ -n "$re" ]; then
    grep -qE "$re" "$TMP/server.log" || { tail -20 "$TMP/server.log"; fail "$what: no log line /$re/"; }
    ok "$what: $(grep -E "$re" "$TMP/server.log" | tail -1)"
  fi
  ok "$what: reload $( [ "$want" = good ] && echo done || echo refused, old credentials kept)"
  check_alive
}

# size URI: the export's size through a new TLS session.
size() { nbdinfo --size "$1"; }

echo "# server certificate, its CA and the PSK rotated under load"
: >"$TMP/server.log"
D=$TMP/certs P=$TMP/keys2.psk
rm -rf "$D" && cp -r "$T/server" "$D"
cp "$T/keys.psk" "$P"
start_server --tls=require --tls-certificates="$D" --tls-psk="$P" memory 64M
PSK_OLD="nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$T/keys.psk"
CERT_OLD="nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca"
start_load psk "$PSK_OLD" 0
start_load cert "$CERT_OLD" 1
load_moves "before any reload"

new_ca ca2
new_cert ca2 "$T/server.ext" "$T/server2" server-cert.pem server-key.pem localhost
cp "$T/ca2/cert.pem" "$T/server2/ca-cert.pem"
mkdir -p "$T/client-ca2" && cp "$T/ca2/cert.pem" "$T/client-ca2/ca-cert.pem"
( umask 077; echo "alice:$(openssl rand -hex 32)" >"$T/new.psk" )
PSK_NEW="nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$T/new.psk"
CERT_NEW="nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca2"

cp "$T/server2/"* "$D/"
cp "$T/new.psk" "$P"
reload "new certificate, CA and PSK" good
load_moves "after the rotation"
expect_eq "$(size "$CERT_NEW")" 67108864 "a new client checking the NEW CA"
expect_fail "a new client checking the OLD CA" size "$CERT_OLD"
expect_eq "$(size "$PSK_NEW")" 67108864 "a new client with the NEW pre-shared key"
expect_fail "a new client with the OLD pre-shared key" size "$PSK_OLD"
grep -q 'TLS handshake failed: wrong pre-shared key for PSK identity "alice"' "$TMP/server.log" \
  || fail "the old key's refusal was not logged"
load_moves "after the new clients"

echo "# bad files: logged, old credentials kept"
cp "$D/server-cert.pem" "$TMP/good-cert.pem"
echo junk >"$D/server-cert.pem"
reload "garbage certificate" bad "error: --tls-certificates: $D/server-cert.pem: .*(PEM|no start line)"
expect_eq "$(size "$CERT_NEW")" 67108864 "certificate kept after the garbage one"
expect_eq "$(size "$PSK_NEW")" 67108864 "PSK kept after the garbage certificate"

cp "$T/server/server-cert.pem" "$D/server-cert.pem"     # the old certificate, the new key
reload "certificate rotated before its key" bad "$D/server-key.pem does not match server-cert.pem"
expect_eq "$(size "$CERT_NEW")" 67108864 "certificate kept after the mismatch"
cp "$TMP/good-cert.pem" "$D/server-cert.pem"

printf 'alice:not-hex!\n' >"$P"
reload "PSK file with a bad line" bad "error: --tls-psk: $P:1: key for \"alice\" (is not hex|must be)"
expect_eq "$(size "$PSK_NEW")" 67108864 "PSK kept after the bad PSK file"
expect_fail "the old pre-shared key is still refused" size "$PSK_OLD"
rm "$P"
reload "PSK file removed" bad "error: --tls-psk: cannot open $P"
expect_eq "$(size "$PSK_NEW")" 67108864 "PSK kept after the PSK file went away"
cp "$T/new.psk" "$P"
reload "good files again" good
expect_eq "$(size "$PSK_NEW")" 67108864 "new PSK after the good reload"
load_moves "after the bad files"

# Handshakes starting on shard threads while the main thread swaps the
# context: every one must find a whole context (a sanitizer build catches
# a context freed under a starting session).
storm=()
for i in $(seq 20); do size "$PSK_NEW" >"$TMP/storm.$i" 2>&1 & storm+=($!); done
for _ in $(seq 20); do kill -HUP "$SERVER_PID"; done
for i in $(seq 20); do
  wait "${storm[i-1]}" && [ "$(cat "$TMP/storm.$i")" = 67108864 ] \
    || { cat "$TMP/storm.$i"; fail "client $i during the SIGHUPs"; }
done
ok "20 new clients during 20 SIGHUPs all served"
check_alive
load_moves "after the SIGHUPs"
stop_loads
stop_server

echo "# --tls-verify-peer: a CRL and a new client CA, under load"
: >"$TMP/server.log"
D=$TMP/certs-vp
cp -r "$T/server" "$D"
start_server --tls=require --tls-certificates="$D" --tls-verify-peer memory 64M
CLIENT1="nbds://127.0.0.1:$PORT/?tls-certificates=$T/client"
start_load client1 "$CLIENT1" 2
load_moves "client certificate session"

openssl ca -batch -config "$T/ca-db/ca.cnf" -cert "$T/ca/cert.pem" -keyfile "$T/ca/key.pem" \
  -revoke "$T/client/client-cert.pem" 2>/dev/null
openssl ca -batch -config "$T/ca-db/ca.cnf" -cert "$T/ca/cert.pem" -keyfile "$T/ca/key.pem" \
  -gencrl -crldays 30 -out "$D/ca-crl.pem" 2>/dev/null
[ -s "$D/ca-crl.pem" ] || fail "could not make a CRL"
reload "CRL revoking the client's certificate" good
expect_fail "a new session with the revoked certificate" size "$CLIENT1"
# The client may see the refusal before the server has logged it.
for ((i = 0; i < 100; i++)); do
  grep -q "client certificate rejected: certificate revoked" "$TMP/server.log" && break
  sleep 0.1
done
grep -q "client certificate rejected: certificate revoked" "$TMP/server.log" \
  || { tail "$TMP/server.log"; fail "the revocation was not logged"; }
ok "revocation logged: $(grep 'certificate revoked' "$TMP/server.log" | tail -1)"
load_moves "the revoked client's established session goes on"
rm "$D/ca-crl.pem"
reload "CRL removed" good
expect_eq "$(size "$CLIENT1")" 67108864 "the client again, once the CRL is gone"

# A client certificate from CA2, trusting the server's (unchanged) CA.
new_cert ca2 "$T/client.ext" "$T/client2" client-cert.pem client-key.pem "ca2 client"
cp "$T/ca/cert.pem" "$T/client2/ca-cert.pem"
CLIENT2="nbds://127.0.0.1:$PORT/?tls-certificates=$T/client2"
expect_fail "a client from CA2 before the CA changes" size "$CLIENT2"
cp "$T/ca2/cert.pem" "$D/ca-cert.pem"
reload "client CA changed to CA2" good
expect_eq "$(size "$CLIENT2")" 67108864 "a client from CA2 after the CA changed"
expect_fail "a client from the old CA after the CA changed" size "$CLIENT1"
load_moves "the old CA's established session goes on"
stop_loads
check_alive
stop_server
echo "all TLS reload checks passed"
