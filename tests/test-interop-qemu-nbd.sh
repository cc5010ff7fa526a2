#!/usr/bin/env bash
# The interop matrix's reference: the same clients as test-interop-blkd.sh
# (libnbd 1.14 and 1.22, qemu 7.2 and 10) against qemu-nbd 10, a server
# that speaks extended headers, in clear and over TLS.  qemu-nbd cannot
# refuse extended headers, so their "off" column is libnbd 1.22's nbdsh
# told not to ask (set_request_extended_headers(False)); the tools that
# cannot be told skip that column, saying so.  What passes here and fails
# against blkd is blkd's bug; what fails here too is the client's.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
. "$(dirname "$0")/helpers/tls.sh"
. "$(dirname "$0")/interop/matrix.sh"
have_qemu 10 || skip "$(why_missing qemu-10): no qemu-nbd 10 to serve"
need openssl

T=$TMP/tls
make_tls_material "$T"
MX_TLSDIR=$T/client-ca
MX_SIZE=$((64 * MIB))
t0=$SECONDS
DISK=$TMP/disk.img
truncate -s "$MX_SIZE" "$DISK"

for MX_TLS in 0 1; do
  tls_opts=()
  [ "$MX_TLS" = 1 ] && tls_opts=(--object "tls-creds-x509,id=tls0,dir=$T/server,endpoint=server,verify-peer=off"
                                 --tls-creds tls0)
  # -t: stay up between clients; -e 8: nbdcopy opens several connections;
  # verify-peer=off: no client certificates, as blkd without --tls-verify-peer.
  "$QEMU_NEW/qemu-nbd" -f raw -t -e 8 -b 127.0.0.1 -p 0 "${tls_opts[@]}" "$DISK" \
    >>"$TMP/server.log" 2>&1 &
  SERVER_PID=$!
  SERVER_PIDS+=("$SERVER_PID")
  MX_PORT=$(wait_listen "$SERVER_PID")
  wait_port "$MX_PORT"
  label="[qemu-nbd 10 tls=$MX_TLS]"
  echo "# $label"
  libnbd_cells 1.14 no "$label"
  libnbd_cells 1.22 yes "$label ext=on"
  libnbd_cells 1.22 off-client "$label ext=off"
  qemu_cells 7.2 "$label"
  qemu_cells 10 "$label"
  check_alive
  stop_server
done

echo "matrix: $MATRIX_RAN cells ran, $MATRIX_SKIPPED skipped, $((SECONDS - t0)) s"
