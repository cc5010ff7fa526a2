#!/usr/bin/env bash
# What extended headers buy on a big sparse disk: blkd (ram plugin, 64 GiB
# export) zeroed and trimmed in one pass, and a 1 TiB sparse export
# mapped, by each client with extended headers on and off (blkd's
# --ext-headers=on|off), counting the requests blkd answered (/metrics)
# and the wall time.  Clients: nbdcopy and nbdsh (libnbd 1.22 and the
# system's 1.14), qemu-img convert and qemu-io (qemu 10 and the system's
# 7.2); the newer ones from `make interop-clients`, skipped when missing.
#
#   bench/ext-headers.sh [OUTDIR]     (make bench-ext; default build/bench)
#
# Writes OUTDIR/ext-headers.md (a table) and prints it.  Figures swing
# with machine load: quote them only from a quiet machine, with uptime.
set -euo pipefail
TOP=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$TOP/build/bench}
BLKD=${BLKD:-$TOP/blkd}
CACHE=${BLKD_INTEROP_CACHE:-/var/tmp/blkd-interop}
L122=$CACHE/libnbd122
Q10=$CACHE/qemu10/usr/bin
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
mkdir -p "$OUT"
TMP=$(mktemp -d /tmp/blkd-bench-ext.XXXXXX)
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
[ -x "$BLKD" ] || { echo "no $BLKD: make all first" >&2; exit 1; }

GiB=$((1 << 30))
TABLE=$OUT/ext-headers.md
{
  echo "# Extended headers: requests and time ($(date -u +%F), $(nproc) CPUs)"
  echo
  echo "uptime: $(uptime)"
  echo
  echo "| operation | client | blkd --ext-headers | extended negotiated | requests | seconds |"
  echo "|---|---|---|---|---|---|"
} >"$TABLE"

start_blkd() {   # start_blkd EXT SIZE
  "$BLKD" -f -v -i 127.0.0.1 -p 0 --metrics 127.0.0.1:0 --ext-headers="$1" ram size="$2" \
    >"$TMP/blkd.log" 2>&1 &
  SERVER_PID=$!
  local i
  for ((i = 0; i < 200; i++)); do
    PORT=$(sed -nE 's|.*serving .* on nbd://[^ ]*:([0-9]+)/.*|\1|p' "$TMP/blkd.log" | head -n1)
    MPORT=$(sed -nE 's|.*metrics on http://[^ ]*:([0-9]+)/metrics.*|\1|p' "$TMP/blkd.log" | head -n1)
    [ -n "$PORT" ] && [ -n "$MPORT" ] && return 0
    sleep 0.05
  done
  cat "$TMP/blkd.log" >&2
  echo "blkd did not start" >&2
  exit 1
}
stop_blkd() { kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=; }

# Requests of each kind answered so far, as "zero trim bs write" (a request
# is counted as it is freed, just after its reply: wait for the count to
# stop moving before reading it).
counts() {
  local last= now i
  for ((i = 0; i < 40; i++)); do
    now=$(curl -sf "http://127.0.0.1:$MPORT/metrics" | awk -F'[ "]' '
      /^blkd_requests_total\{cmd="write_zeroes"\}/ { z = $NF }
      /^blkd_requests_total\{cmd="trim"\}/ { t = $NF }
      /^blkd_requests_total\{cmd="block_status"\}/ { b = $NF }
      /^blkd_requests_total\{cmd="write"\}/ { w = $NF }
      END { print z + 0, t + 0, b + 0, w + 0 }')
    [ "$now" = "$last" ] && break
    last=$now
    sleep 0.05
  done
  echo "$now"
}
ext_sessions() { grep -c "transmission phase: .*extended headers" "$TMP/blkd.log" || true; }

# run_case OPERATION CLIENT EXT FIELD CMD...: run CMD against the blkd now
# up, and add a row: FIELD picks the counter (1 zero, 2 trim, 3 block
# status, 4 write).
run_case() {
  local op=$1 client=$2 ext=$3 field=$4; shift 4
  local before after e0 t0 t1 n
  before=$(counts); e0=$(ext_sessions)
  t0=$(date +%s.%N)
  if ! timeout "$STEP_TIMEOUT" "$@" >"$TMP/out" 2>&1; then
    echo "| $op | $client | $ext | | failed: $(tail -n1 "$TMP/out") | |" >>"$TABLE"
    return 0
  fi
  t1=$(date +%s.%N)
  after=$(counts)
  n=$(( $(echo "$after" | cut -d' ' -f"$field") - $(echo "$before" | cut -d' ' -f"$field") ))
  local neg=no; [ "$(ext_sessions)" -gt "$e0" ] && neg=yes
  printf '| %s | %s | %s | %s | %d | %.2f |\n' "$op" "$client" "$ext" "$neg" "$n" \
    "$(echo "$t1 - $t0" | bc)" >>"$TABLE"
}

SPARSE=$TMP/sparse64g.img
truncate -s $((64 * GiB)) "$SPARSE"
# nbdsh is its Python module run by the system interpreter.
nbdsh_cmd() {
  if [ "$1" = 1.22 ]; then echo env "PYTHONPATH=$L122/python" /usr/bin/python3 -m nbd
  else echo /usr/bin/python3 -m nbd; fi
}
# nbdsh's pass over the 64 GiB: one request with extended headers, else
# the biggest a 32-bit length carries (4 GiB - 4 KiB, still aligned).
one_pass() {
  cat <<PY
ext = hasattr(h, "get_extended_headers_negotiated") and h.get_extended_headers_negotiated()
step = $((64 * GiB)) if ext else (1 << 32) - 4096
off = 0
while off < $((64 * GiB)):
    n = min(step, $((64 * GiB)) - off)
    h.$1(n, off)
    off += n
PY
}
have122() { [ -f "$L122/.done" ]; }
have10() { [ -f "$CACHE/qemu10/.done" ]; }

for ext in on off; do
  start_blkd "$ext" 64G
  URI="nbd://127.0.0.1:$PORT/"
  QOPTS="driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$PORT"
  for v in 1.14 1.22; do
    if [ "$v" = 1.22 ] && ! have122; then continue; fi
    # shellcheck disable=SC2046
    run_case "zero 64 GiB (h.zero)" "nbdsh $v" "$ext" 1 $(nbdsh_cmd "$v") -u "$URI" -c "$(one_pass zero)"
    # shellcheck disable=SC2046
    run_case "trim 64 GiB (h.trim)" "nbdsh $v" "$ext" 2 $(nbdsh_cmd "$v") -u "$URI" -c "$(one_pass trim)"
    nc=nbdcopy; [ "$v" = 1.22 ] && nc=$L122/bin/nbdcopy
    run_case "copy a 64 GiB hole onto it" "nbdcopy $v" "$ext" 1 "$nc" "$SPARSE" "$URI"
  done
  for v in 7.2 10; do
    if [ "$v" = 10 ] && ! have10; then continue; fi
    qi=qemu-io qimg=qemu-img
    [ "$v" = 10 ] && qi=$Q10/qemu-io qimg=$Q10/qemu-img
    # qemu-io takes more than 2 GiB in one command only for a fast zero
    # (-n); its discard stops at 2 GiB, so qemu has no one-pass trim here.
    run_case "zero 64 GiB (write -z -u -n)" "qemu-io $v" "$ext" 1 "$qi" --image-opts "$QOPTS" -c "write -z -u -n 0 64G"
    run_case "convert a 64 GiB hole onto it" "qemu-img $v" "$ext" 1 "$qimg" convert -n -f raw "$SPARSE" --target-image-opts "$QOPTS"
  done
  stop_blkd

  start_blkd "$ext" 1T
  URI="nbd://127.0.0.1:$PORT/"
  run_case "map 1 TiB sparse" "nbdinfo 1.14" "$ext" 3 nbdinfo --map "$URI"
  have122 && run_case "map 1 TiB sparse" "nbdinfo 1.22" "$ext" 3 "$L122/bin/nbdinfo" --map "$URI"
  QOPTS="driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$PORT"
  run_case "map 1 TiB sparse" "qemu-img 7.2 map" "$ext" 3 qemu-img map --image-opts "$QOPTS"
  have10 && run_case "map 1 TiB sparse" "qemu-img 10 map" "$ext" 3 "$Q10/qemu-img" map --image-opts "$QOPTS"
  stop_blkd
done
have122 || echo "(libnbd 1.22 not built: make interop-clients)" >>"$TABLE"
have10 || echo "(qemu 10 not unpacked: make interop-clients)" >>"$TABLE"
cat "$TABLE"
