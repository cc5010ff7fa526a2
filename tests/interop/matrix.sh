# The interop matrix's clients: libnbd (nbdinfo, nbdcopy, nbdsh) and qemu
# (qemu-img convert/compare, qemu-io) in the system's versions (Debian 12:
# libnbd 1.14, qemu 7.2) and the newer ones tests/interop/fetch-clients.sh
# caches (libnbd 1.22, qemu 10), each run against one server with or
# without TLS.  Source after lib.sh and helpers/core.sh.
#
# A cell that cannot run says why on a "skip:" line and the test goes on;
# the counts come out in MATRIX_RAN and MATRIX_SKIPPED.

INTEROP_CACHE=${BLKD_INTEROP_CACHE:-/var/tmp/blkd-interop}
LIBNBD_NEW=$INTEROP_CACHE/libnbd122
QEMU_NEW=$INTEROP_CACHE/qemu10/usr/bin
MATRIX_RAN=0
MATRIX_SKIPPED=0
MIB=1048576

cell_skip() { echo "skip: $*"; MATRIX_SKIPPED=$((MATRIX_SKIPPED + 1)); }
cell_ok() { ok "$*"; MATRIX_RAN=$((MATRIX_RAN + 1)); }

# Which client builds are here.  The system's are packages (make deps);
# the new ones are a cache that `make interop-clients` fills.
have_libnbd() {
  case $1 in
    1.14) command -v nbdinfo >/dev/null && command -v nbdcopy >/dev/null ;;
    1.22) [ -f "$LIBNBD_NEW/.done" ] && [ -x "$LIBNBD_NEW/bin/nbdinfo" ] ;;
  esac
}
have_qemu() {
  case $1 in
    7.2) command -v qemu-img >/dev/null && command -v qemu-io >/dev/null ;;
    10) [ -f "$INTEROP_CACHE/qemu10/.done" ] && [ -x "$QEMU_NEW/qemu-img" ] ;;
  esac
}
why_missing() {
  case $1 in
    libnbd-1.14) echo "libnbd-bin is not installed" ;;
    libnbd-1.22) echo "libnbd 1.22 is not built in $LIBNBD_NEW (make interop-clients)" ;;
    qemu-7.2) echo "qemu-utils is not installed" ;;
    qemu-10) echo "qemu 10 is not unpacked in $INTEROP_CACHE/qemu10 (make interop-clients)" ;;
  esac
}

# libnbd tools of one version, run as themselves (the 1.22 binaries carry
# their library's path; nbdsh needs its Python module's), each under a
# timeout of MX_TIMEOUT seconds.
MX_TIMEOUT=${MX_TIMEOUT:-120}
lnbd() {
  local ver=$1 tool=$2; shift 2
  if [ "$tool" = nbdsh ]; then
    # nbdsh is its nbd module run by the system interpreter (whichever
    # python3 is first on PATH may not have the module).
    if [ "$ver" = 1.22 ]; then
      PYTHONPATH=$LIBNBD_NEW/python timeout "$MX_TIMEOUT" /usr/bin/python3 -m nbd "$@"
    else
      timeout "$MX_TIMEOUT" /usr/bin/python3 -m nbd "$@"
    fi
  elif [ "$ver" = 1.22 ]; then
    PYTHONPATH=$LIBNBD_NEW/python timeout "$MX_TIMEOUT" "$LIBNBD_NEW/bin/$tool" "$@"
  else
    timeout "$MX_TIMEOUT" "$tool" "$@"
  fi
}
qemu_tool() {
  local ver=$1 tool=$2; shift 2
  if [ "$ver" = 10 ]; then tool=$QEMU_NEW/$tool; fi
  timeout "$MX_TIMEOUT" "$tool" "$@"
}

# Each server the matrix runs against exports SIZE bytes on 127.0.0.1:PORT
# (MX_PORT), with TLS (X.509, MX_TLSDIR: the client's CA) when MX_TLS=1.
mx_uri() {
  if [ "$MX_TLS" = 1 ]; then
    echo "nbds://127.0.0.1:$MX_PORT/?tls-certificates=$MX_TLSDIR"
  else
    echo "nbd://127.0.0.1:$MX_PORT/"
  fi
}
mx_qemu_args() {
  if [ "$MX_TLS" = 1 ]; then
    echo "--object tls-creds-x509,id=tls0,dir=$MX_TLSDIR,endpoint=client"
  fi
}
mx_qemu_opts() {
  local o="driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$MX_PORT"
  [ "$MX_TLS" = 1 ] && o="$o,tls-creds=tls0"
  echo "$o"
}

# libnbd_cells VER WANT_EXT LABEL: nbdinfo (and, from 1.18 on, whether
# extended headers were negotiated: WANT_EXT yes/no), nbdcopy up and down
# with a sparse image, nbdsh's own reads, writes, zeroes and block status.
libnbd_cells() {
  local ver=$1 want_ext=$2 label=$3 uri out
  if ! have_libnbd "$ver"; then cell_skip "$label libnbd $ver: $(why_missing "libnbd-$ver")"; return 0; fi
  uri=$(mx_uri)
  if [ "$want_ext" = off-client ]; then
    # A server that cannot refuse extended headers (qemu-nbd): only a
    # client that can be told not to ask turns them off.
    cell_skip "$label nbdinfo/nbdcopy $ver: they have no switch to not ask for extended headers"
    libnbd_nbdsh_cell "$ver" "$want_ext" "$label" "$uri"
    return 0
  fi
  out=$TMP/nbdinfo.$ver
  lnbd "$ver" nbdinfo "$uri" >"$out" 2>&1 || { cat "$out"; fail "$label nbdinfo $ver"; }
  grep -q "export-size: $MX_SIZE " "$out" || { cat "$out"; fail "$label nbdinfo $ver: size"; }
  if [ "$MX_TLS" = 1 ]; then
    grep -q "with TLS" "$out" || { cat "$out"; fail "$label nbdinfo $ver: TLS not used"; }
  fi
  if [ "$ver" = 1.22 ]; then
    local proto; proto=$(grep '^protocol:' "$out")
    case $want_ext in
      yes) [[ $proto == *"extended packets"* ]] || fail "$label nbdinfo $ver: extended headers not negotiated ($proto)" ;;
      no) [[ $proto != *"extended"* ]] || fail "$label nbdinfo $ver: extended headers negotiated ($proto)" ;;
    esac
  fi
  cell_ok "$label nbdinfo $ver ($(grep '^protocol:' "$out" | sed 's/^protocol: //'))"

  # A sparse image: data at both ends and in the middle, holes between.
  local img=$TMP/sparse.img back=$TMP/back.img
  if [ ! -f "$img" ]; then
    truncate -s "$MX_SIZE" "$img"
    head -c $MIB /dev/urandom | dd of="$img" conv=notrunc status=none
    head -c $MIB /dev/urandom | dd of="$img" bs=$MIB seek=7 conv=notrunc status=none
    head -c $MIB /dev/urandom | dd of="$img" bs=$MIB seek=$((MX_SIZE / MIB - 1)) conv=notrunc status=none
  fi
  rm -f "$back"
  lnbd "$ver" nbdcopy "$img" "$uri" || fail "$label nbdcopy $ver upload"
  lnbd "$ver" nbdcopy "$uri" "$back" || fail "$label nbdcopy $ver download"
  cmp -s "$img" "$back" || fail "$label nbdcopy $ver: data differs after the round trip"
  cell_ok "$label nbdcopy $ver up and down ($((MX_SIZE / MIB)) MiB, sparse)"

  libnbd_nbdsh_cell "$ver" "$want_ext" "$label" "$uri"
}

libnbd_nbdsh_cell() {
  local ver=$1 want_ext=$2 label=$3 uri=$4 ext_off=""
  [ "$want_ext" = off-client ] && ext_off="h.set_request_extended_headers(False)"
  lnbd "$ver" nbdsh -c "
import os, sys
$ext_off
h.add_meta_context('base:allocation')
h.set_uri_allow_local_file(True)
h.connect_uri('$uri')
want = '$want_ext'
if hasattr(h, 'get_extended_headers_negotiated'):
    got = h.get_extended_headers_negotiated()
    if (want == 'yes') != got:
        sys.exit('extended headers negotiated: %s, wanted %s' % (got, want))
size = h.get_size()
pat = os.urandom(65536)
h.pwrite(pat, size - 65536)
assert h.pread(65536, size - 65536) == pat, 'read back'
h.zero(size // 2, 0)
assert h.pread(4096, size // 2 - 4096) == bytes(4096), 'zeroed'
if h.can_trim():
    h.trim(1 << 20, 0)
seen = []
def cb(ctx, off, ents, err):
    seen.extend(ents[0::2])
h.block_status(size, 0, cb)
assert seen and sum(seen) <= size + (1 << 30), 'block status lengths'
h.flush()
h.shutdown()
" || fail "$label nbdsh $ver"
  cell_ok "$label nbdsh $ver (pwrite, pread, zero, trim, block status)"
}

# qemu_cells VER LABEL: qemu-img convert onto the export and compare, and
# qemu-io pattern writes, reads and write -z.
qemu_cells() {
  local ver=$1 label=$2 out=$TMP/qemu.out img=$TMP/qsrc.img
  if ! have_qemu "$ver"; then cell_skip "$label qemu $ver: $(why_missing "qemu-$ver")"; return 0; fi
  if [ ! -f "$img" ]; then
    truncate -s "$MX_SIZE" "$img"
    head -c $((2 * MIB)) /dev/urandom | dd of="$img" bs=$MIB seek=3 conv=notrunc status=none
  fi
  local opts; opts=$(mx_qemu_opts)
  # shellcheck disable=SC2046
  qemu_tool "$ver" qemu-img convert -n -f raw $(mx_qemu_args) "$img" \
    --target-image-opts "$opts" >"$out" 2>&1 || { cat "$out"; fail "$label qemu-img $ver convert"; }
  # shellcheck disable=SC2046
  qemu_tool "$ver" qemu-img compare $(mx_qemu_args) --image-opts \
    "driver=file,filename=$img" "$opts" >"$out" 2>&1 || { cat "$out"; fail "$label qemu-img $ver compare"; }
  cell_ok "$label qemu-img $ver convert + compare"
  # shellcheck disable=SC2046
  qemu_tool "$ver" qemu-io $(mx_qemu_args) --image-opts "$opts" \
    -c "write -P 0x5c 1M 1M" -c "read -P 0x5c 1M 1M" -c "write -z 8M 16M" \
    -c "read -P 0 8M 16M" -c "discard 8M 8M" -c "flush" >"$out" 2>&1 \
    || { cat "$out"; fail "$label qemu-io $ver"; }
  grep -q "read 1048576/1048576" "$out" && grep -q "read 16777216/16777216" "$out" \
    && ! grep -qi "pattern verification failed\|error" "$out" \
    || { cat "$out"; fail "$label qemu-io $ver: pattern check"; }
  cell_ok "$label qemu-io $ver (write -P, read -P, write -z, discard)"
}
