#!/usr/bin/env bash
# The interop matrix against blkd: libnbd 1.14 and 1.22 (nbdinfo, nbdcopy,
# nbdsh) and qemu 7.2 and 10 (qemu-img convert/compare, qemu-io), each
# in clear and over TLS, with blkd's extended headers on and off.  libnbd
# 1.22 and qemu 10 must negotiate them when they are on (nbdinfo says
# "extended packets"; blkd -v logs the transmission phase) and fall back to
# structured replies when they are off; the old clients see no change.
# Then the point of it: a 64 GiB WRITE_ZEROES from nbdsh 1.22 is one
# request (blkd's /metrics), and so is qemu-io 10's write -z of 64 GiB.  The newer clients come from `make interop-clients`
# (tests/interop/fetch-clients.sh); without them their cells skip, saying so.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
. "$(dirname "$0")/helpers/tls.sh"
. "$(dirname "$0")/interop/matrix.sh"
need_server
server_is_nbdkit && skip "the matrix is for blkd (nbdkit has no extended headers)"
need openssl
need curl

T=$TMP/tls
make_tls_material "$T"
MX_TLSDIR=$T/client-ca
MX_SIZE=$((64 * MIB))
t0=$SECONDS

ext_sessions() { grep -c "transmission phase: .*extended headers" "$TMP/server.log" || true; }

for MX_TLS in 0 1; do
  for ext in on off; do
    tls_opts=()
    [ "$MX_TLS" = 1 ] && tls_opts=(--tls=require --tls-certificates="$T/server")
    start_server -v --ext-headers="$ext" "${tls_opts[@]}" ram size=64M
    MX_PORT=$PORT
    label="[blkd tls=$MX_TLS ext=$ext]"
    want=no; [ "$ext" = on ] && want=yes
    echo "# $label"
    libnbd_cells 1.14 no "$label"
    libnbd_cells 1.22 "$want" "$label"
    qemu_cells 7.2 "$label"
    before=$(ext_sessions)
    qemu_cells 10 "$label"
    if have_qemu 10; then
      after=$(ext_sessions)
      if [ "$ext" = on ]; then
        [ "$after" -gt "$before" ] || fail "$label qemu 10 did not negotiate extended headers"
        ok "$label qemu 10 negotiated extended headers ($((after - before)) connections)"
      else
        [ "$after" = "$before" ] || fail "$label extended headers with --ext-headers=off"
        ok "$label qemu 10 used structured replies"
      fi
    fi
    check_alive
    stop_server
  done
done

echo "# 64 GiB in one request"
start_server -v --metrics 127.0.0.1:0 ram size=1T
MX_PORT=$PORT MX_TLS=0
wz() {
  curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" |
    sed -n 's/^blkd_requests_total{cmd="write_zeroes"} \([0-9]*\)$/\1/p'
}
# wz_after BEFORE WANT: the growth since BEFORE once it reaches WANT or 5 s
# pass (a request is counted when freed, just after its reply went out).
wz_after() {
  local i n
  for ((i = 0; i < 100; i++)); do
    n=$(( $(wz) - $1 ))
    [ "$n" -ge "$2" ] && break
    sleep 0.05
  done
  echo "$n"
}
if have_libnbd 1.22; then
  n0=$(wz)
  lnbd 1.22 nbdsh -u "$(mx_uri)" -c '
assert h.get_extended_headers_negotiated()
h.zero(64 << 30, 0)
h.zero(64 << 30, 100 << 30)' || fail "nbdsh 1.22: zero 64 GiB"
  expect_eq "$(wz_after "$n0" 2)" 2 "nbdsh 1.22: two 64 GiB zeroes are two WRITE_ZEROES requests"
  MATRIX_RAN=$((MATRIX_RAN + 1))
else
  cell_skip "64 GiB zero from nbdsh: $(why_missing libnbd-1.22)"
fi
if have_qemu 10; then
  n0=$(wz)
  # shellcheck disable=SC2046
  qemu_tool 10 qemu-io --image-opts "$(mx_qemu_opts)" -c "write -z -u -n 0 64G" \
    >"$TMP/qz" 2>&1 || { cat "$TMP/qz"; fail "qemu-io 10 write -z 64G"; }
  expect_eq "$(wz_after "$n0" 1)" 1 "qemu-io 10: write -z -u -n (fast zero) of 64 GiB is one WRITE_ZEROES"
  MATRIX_RAN=$((MATRIX_RAN + 1))
else
  cell_skip "64 GiB zero from qemu-io: $(why_missing qemu-10)"
fi
check_alive
stop_server

echo "matrix: $MATRIX_RAN cells ran, $MATRIX_SKIPPED skipped, $((SECONDS - t0)) s"
