# TLS material for the tests/test-tls-* tests, made fresh with the openssl
# CLI (nothing is committed).  Source after lib.sh; make_tls_material DIR
# creates, in DIR:
#   server/          ca-cert.pem server-cert.pem server-key.pem   (blkd, nbdkit)
#   server-expired/  the same with a server certificate that expired in 2020
#   client-ca/       ca-cert.pem                      (a client: trusts our CA)
#   client/          + client-cert.pem client-key.pem (client cert from our CA)
#   client-other/    + a client certificate from another CA
#   client-wrongca/  ca-cert.pem of the other CA      (cannot trust our server)
#   keys.psk         "alice:<hex>" (psktool's format), wrong.psk (same name,
#                    another key), other.psk (unknown username)
# Certificates are EC P-256 (fast to make); the server's names are localhost
# and 127.0.0.1, in the SAN where GnuTLS looks.

make_tls_material() {
  local d=$1
  mkdir -p "$d"/{ca,other,server,server-expired,client-ca,client,client-other,client-wrongca,ca-db/newcerts}
  local newkey=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
  openssl req -x509 "${newkey[@]}" -keyout "$d/ca/key.pem" -out "$d/ca/cert.pem" \
    -days 30 -subj "/CN=blkd test CA" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  openssl req -x509 "${newkey[@]}" -keyout "$d/other/key.pem" -out "$d/other/cert.pem" \
    -days 30 -subj "/CN=some other CA" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

  printf '%s\n' 'subjectAltName=DNS:localhost,IP:127.0.0.1' \
    'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' \
    'basicConstraints=CA:FALSE' >"$d/server.ext"
  printf '%s\n' 'keyUsage=critical,digitalSignature,keyEncipherment' \
    'extendedKeyUsage=clientAuth' 'basicConstraints=CA:FALSE' >"$d/client.ext"

  # Server certificate (CN and SAN localhost, 127.0.0.1).
  openssl req -new "${newkey[@]}" -keyout "$d/server/server-key.pem" \
    -subj "/CN=localhost" -out "$d/server.csr" 2>/dev/null
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca/cert.pem" -CAkey "$d/ca/key.pem" \
    -CAcreateserial -days 30 -extfile "$d/server.ext" -out "$d/server/server-cert.pem" 2>/dev/null
  cp "$d/ca/cert.pem" "$d/server/ca-cert.pem"

  # The same key, certified for one day in January 2020 (x509 -days cannot
  # go back in time; "openssl ca" takes explicit dates).
  : >"$d/ca-db/index.txt"
  echo 1000 >"$d/ca-db/serial"
  cat >"$d/ca-db/ca.cnf" <<CNF
[ ca ]
default_ca = test_ca
[ test_ca ]
dir = $d/ca-db
database = \$dir/index.txt
new_certs_dir = \$dir/newcerts
serial = \$dir/serial
default_md = sha256
policy = any
unique_subject = no
[ any ]
commonName = supplied
CNF
  openssl ca -batch -notext -config "$d/ca-db/ca.cnf" -cert "$d/ca/cert.pem" \
    -keyfile "$d/ca/key.pem" -in "$d/server.csr" -out "$d/server-expired/server-cert.pem" \
    -startdate 20200101000000Z -enddate 20200102000000Z -extfile "$d/server.ext" 2>/dev/null
  cp "$d/server/server-key.pem" "$d/server/ca-cert.pem" "$d/server-expired/"

  # Clients.
  cp "$d/ca/cert.pem" "$d/client-ca/ca-cert.pem"
  cp "$d/ca/cert.pem" "$d/client/ca-cert.pem"
  cp "$d/ca/cert.pem" "$d/client-other/ca-cert.pem"
  cp "$d/other/cert.pem" "$d/client-wrongca/ca-cert.pem"
  openssl req -new "${newkey[@]}" -keyout "$d/client/client-key.pem" \
    -subj "/CN=good client" -out "$d/client.csr" 2>/dev/null
  openssl x509 -req -in "$d/client.csr" -CA "$d/ca/cert.pem" -CAkey "$d/ca/key.pem" \
    -CAcreateserial -days 30 -extfile "$d/client.ext" -out "$d/client/client-cert.pem" 2>/dev/null
  openssl req -new "${newkey[@]}" -keyout "$d/client-other/client-key.pem" \
    -subj "/CN=stranger" -out "$d/stranger.csr" 2>/dev/null
  openssl x509 -req -in "$d/stranger.csr" -CA "$d/other/cert.pem" -CAkey "$d/other/key.pem" \
    -CAcreateserial -days 30 -extfile "$d/client.ext" -out "$d/client-other/client-cert.pem" 2>/dev/null

  # Pre-shared keys, psktool's "username:hexkey" lines, written by hand so
  # psktool (gnutls-bin) is not needed.
  ( umask 077
    echo "alice:$(openssl rand -hex 32)" >"$d/keys.psk"
    echo "alice:$(openssl rand -hex 32)" >"$d/wrong.psk"
    echo "mallory:$(openssl rand -hex 32)" >"$d/other.psk" )
  for f in server/server-cert.pem server-expired/server-cert.pem client/client-cert.pem \
           client-other/client-cert.pem; do
    [ -s "$d/$f" ] || fail "could not make $d/$f"
  done
}

# KU: the OpenSSL test client (tests/helpers/tls-keyupdate.c), which
# `make check` builds; T: a fresh set of TLS material.
need_ku_client() {
  KU=$TOP/tests/helpers/tls-keyupdate
  [ -x "$KU" ] || fail "no $KU (make check builds it)"
  T=$TMP/tls
  make_tls_material "$T"
}

# The start of every TLS test: the server, openssl (for the material) and
# the clients named (need_tls_server nbdinfo nbdcopy).  Needs core.sh.
need_tls_server() {
  need_server
  local tool
  for tool in openssl "$@"; do need "$tool"; done
}
