#!/usr/bin/env bash
# TLS throughput and server CPU: blkd against nbdkit, both serving the
# memory plugin over TLS (X.509, the same certificates), read with nbdcopy
# into null: at two request sizes, in alternating runs A B A B ...
#
#   bench/tls.sh [ROUNDS]        (default 3; env: SIZE=1G BLKD=./blkd
#                                 REQ="262144 4096" MODE=x509|psk
#                                 CIPHER=default|aes128|aes256
#                                 BASE=PATH PROFILE=DIR PIN=1
#                                 LOAD=nbdcopy|blkperf SECS=8)
#
# BASE=PATH adds another blkd binary with default settings ("blkd_base"),
# e.g. one built from an earlier commit, for a before/after in one run.
#
# PROFILE=DIR: after the timed rounds, one more copy per server and request
# size under `perf stat` (system calls: all, and the writing ones) and one
# under `perf record -g` (blkd servers); DIR gets NAME-REQ.stat and
# NAME-REQ.report (perf report --no-children), and the system calls per
# MiB are printed.  Needs perf and the right to trace the servers (root,
# or kernel.perf_event_paranoid <= 1 and tracefs readable).
#
# PIN=1: every server's threads on the last CPU and nbdcopy on CPU 0
# (pinned apart), so that the client and the server cannot take each
# other's CPU and the rate says which server is cheaper; nbdcopy's CPU
# share is printed beside each run so that a client-bound run shows.
#
# LOAD=blkperf: the load is blkperf's STREAM_READ (one connection, 16
# requests in flight, through libnbd's TLS) for SECS seconds per run
# instead of nbdcopy copying the disk.  blkd then serves /metrics and each
# blkd run prints the READs blkperf counted beside the ones blkd's
# blkd_requests_total counted over the run, so a rate is only believed
# where the two agree; with PIN=1 this is the client-bound check: whether
# a client on a CPU of its own, as cheap as libnbd's TLS gets, still
# leaves the server's CPU idle.
#
# CIPHER: each server picks the TLS 1.3 suite by its own preference
# (default: blkd AES-128-GCM, nbdkit/GnuTLS AES-256-GCM); aes128/aes256
# make the client (GnuTLS, through its system priority file) offer only
# that AES-GCM, so both servers run the same cipher.  The suite each
# server chose is printed (read off the ServerHello by a small relay).
#
# Per run: MiB/s (disk size / nbdcopy's wall time) and the server's CPU
# (utime+stime from /proc/PID/stat, all threads) per MiB moved.  Prints
# each run, then per request size the median, min-max spread and the
# blkd/nbdkit ratios.  Both servers are started once and filled once with
# the same non-zero pattern, so neither can skip holes.  The machine is
# shared: only ratios from one invocation mean anything.
set -euo pipefail
TOP=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${1:-3}
SIZE=${SIZE:-1G}
BLKD=${BLKD:-$TOP/blkd}
REQ=${REQ:-"262144 4096"}
MODE=${MODE:-x509}
CIPHER=${CIPHER:-default}
LOAD=${LOAD:-nbdcopy}
SECS=${SECS:-8}
case $LOAD in nbdcopy|blkperf) ;; *) echo "bench/tls.sh: LOAD must be nbdcopy or blkperf" >&2; exit 1 ;; esac
TMP=$(mktemp -d /tmp/blkd-bench-tls.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "bench/tls.sh: $*" >&2; exit 1; }
[ "$LOAD" = nbdcopy ] || [ -x "$TOP/blkperf" ] || { echo "bench/tls.sh: no $TOP/blkperf (make blkperf)" >&2; exit 1; }
for t in nbdkit nbdcopy openssl; do command -v $t >/dev/null || fail "$t is not installed"; done
[ -x "$BLKD" ] || fail "no blkd at $BLKD (make blkd)"
. "$TOP/tests/helpers/tls.sh"
make_tls_material "$TMP/tls"
CERTS=$TMP/tls/server CLIENT=$TMP/tls/client-ca PSKF=$TMP/tls/keys.psk

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  local i
  for ((i = 0; i < 200; i++)); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  fail "nothing listening on $1"
}
start() {  # NAME BINARY ARGS... -> sets PORT_<NAME>, PID_<NAME>
  local name=$1 bin=$2 port; shift 2
  port=$(free_port)
  if [ "$MODE" = psk ]; then set -- --tls-psk="$PSKF" "$@"
  else set -- --tls-certificates="$CERTS" "$@"; fi
  "$bin" -f -i 127.0.0.1 -p "$port" --tls=require "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=($!)
  printf -v "PID_$name" %s $!
  printf -v "PORT_$name" %s "$port"
  wait_port "$port"
}
SERVERS="blkd"
METRICS_PORT=$(free_port)
start blkd "$BLKD" --metrics "127.0.0.1:$METRICS_PORT" memory "$SIZE"
if [ -n "${BASE:-}" ]; then
  [ -x "$BASE" ] || fail "BASE=$BASE is not an executable"
  start blkd_base "$BASE" memory "$SIZE"
  SERVERS="$SERVERS blkd_base"
fi
SERVERS="$SERVERS nbdkit"
start nbdkit nbdkit memory "$SIZE"

uri() {  # NAME
  local port; port=PORT_$1
  if [ "$MODE" = psk ]; then echo "nbds://alice@127.0.0.1:${!port}/?tls-psk-file=$PSKF"
  else echo "nbds://127.0.0.1:${!port}/?tls-certificates=$CLIENT"; fi
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# READs blkd has answered, from its own /metrics.
served_reads() {
  /usr/bin/python3 -c 'import re, sys, urllib.request
t = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
m = re.search(r"^blkd_requests_total\{cmd=\"read\"\} (\d+)", t, re.M)
print(m.group(1) if m else sys.exit("no read count in /metrics"))' "http://127.0.0.1:$METRICS_PORT/metrics"
}

case $CIPHER in
  default) ;;
  aes128) printf '[overrides]\n%s\n' "tls-disabled-cipher = AES-256-GCM" \
            "tls-disabled-cipher = CHACHA20-POLY1305" "tls-disabled-cipher = AES-256-CCM" \
            "tls-disabled-cipher = AES-128-CCM" >"$TMP/gnutls.cfg" ;;
  aes256) printf '[overrides]\n%s\n' "tls-disabled-cipher = AES-128-GCM" \
            "tls-disabled-cipher = CHACHA20-POLY1305" "tls-disabled-cipher = AES-256-CCM" \
            "tls-disabled-cipher = AES-128-CCM" >"$TMP/gnutls.cfg" ;;
  *) fail "CIPHER must be default, aes128 or aes256" ;;
esac
[ "$CIPHER" = default ] || export GNUTLS_SYSTEM_PRIORITY_FILE=$TMP/gnutls.cfg

# The suite a server picks, from the ServerHello seen by a one-shot relay.
suite() {  # NAME
  local port; port=PORT_$1
  local rport; rport=$(free_port)
  rm -f "$TMP/relay-ready"
  /usr/bin/python3 - "$rport" "${!port}" "$TMP/relay-ready" >"$TMP/suite" 2>/dev/null <<'PY' &
import socket, struct, sys, threading
ls = socket.socket(); ls.bind(("127.0.0.1", int(sys.argv[1]))); ls.listen(1)
open(sys.argv[3], "w").close()
c, _ = ls.accept(); s = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
def up():
    while (d := c.recv(65536)): s.sendall(d)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
buf, done = bytearray(), False
names = {0x1301: "TLS_AES_128_GCM_SHA256", 0x1302: "TLS_AES_256_GCM_SHA384",
         0x1303: "TLS_CHACHA20_POLY1305_SHA256"}
while (d := s.recv(65536)):
    if not done:
        buf += d
        i = buf.find(b"\x16\x03\x03")
        if i >= 0 and len(buf) > i + 80:
            p = i + 5 + 4 + 2 + 32
            p += 1 + buf[p]
            cs = struct.unpack(">H", buf[p:p + 2])[0]
            print(names.get(cs, "0x%04x" % cs), flush=True)
            done = True
    c.sendall(d)
PY
  local rp=$! i
  for ((i = 0; i < 100; i++)); do [ -e "$TMP/relay-ready" ] && break; sleep 0.05; done
  if [ "$MODE" = psk ]; then nbdinfo --size "nbds://alice@127.0.0.1:$rport/?tls-psk-file=$PSKF" >/dev/null
  else nbdinfo --size "nbds://127.0.0.1:$rport/?tls-certificates=$CLIENT" >/dev/null; fi
  wait $rp 2>/dev/null || true
  cat "$TMP/suite"
}

echo "# filling both disks with a non-zero pattern ($SIZE)"
for s in $SERVERS; do
  nbdcopy -- [ nbdkit pattern "$SIZE" ] "$(uri $s)"
done
CLIENT_WRAP=()
if [ "${PIN:-0}" = 1 ]; then
  last=$(($(nproc) - 1))
  [ "$last" -ge 1 ] || fail "PIN=1 needs two CPUs"
  for s in $SERVERS; do
    pidv=PID_$s
    taskset -a -p -c "$last" "${!pidv}" >/dev/null || fail "cannot pin $s"
  done
  CLIENT_WRAP=(taskset -c 0)
fi
bytes=$(nbdinfo --size "$(uri blkd)")
mib=$((bytes / 1048576))
hz=$(getconf CLK_TCK)

echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "# $(grep -m1 'blkd: TLS' "$TMP/blkd.log")"
echo "# TLS 1.3 suites (CIPHER=$CIPHER): blkd $(suite blkd), nbdkit $(suite nbdkit)"
if [ "$LOAD" = blkperf ]; then
  echo "# $ROUNDS rounds, blkperf STREAM_READ for ${SECS}s per run (1 connection, 16 in flight)"
else
  echo "# $ROUNDS rounds, $mib MiB per run, nbdcopy defaults otherwise (multi-conn)"
fi
printf '%-6s %-5s %-8s %5s %10s %12s %7s %7s\n' server mode req round MiB/s cpu_us/MiB server client
: >"$TMP/results"
mode=$MODE
TIMEFORMAT='%U %S'
  for req in $REQ; do
    for ((r = 1; r <= ROUNDS; r++)); do
      for s in $SERVERS; do
        pidv=PID_$s
        c0=$(cpu_ticks "${!pidv}")
        t0=$(date +%s.%N)
        moved=$mib check=
        if [ "$LOAD" = blkperf ]; then
          [ "$s" = blkd ] && n0=$(served_reads)
          # bash's time reports the client's own CPU (user, system) on fd 2.
          { time "${CLIENT_WRAP[@]}" "$TOP/blkperf" -t STREAM_READ -b "$req" -l "$SECS" --quiet \
              --json "$(uri $s)" >"$TMP/blkperf.json" 2>&3; } 3>&2 2>"$TMP/client-time"
          t1=$(date +%s.%N)
          c1=$(cpu_ticks "${!pidv}")
          read -r moved rate nreq < <(/usr/bin/python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
if j["errors"]: sys.exit("blkperf counted %d errors" % j["errors"])
print(j["bytes"] / 1048576, j["throughput_mib_s"], j["reads"])' "$TMP/blkperf.json") \
            || fail "blkperf's output is unreadable"
          [ "$s" = blkd ] && check="client $nreq reads, blkd $(( $(served_reads) - n0 ))"
        else
          # bash's time reports the client's own CPU (user, system) on fd 2.
          { time "${CLIENT_WRAP[@]}" nbdcopy "$(uri $s)" null: --request-size="$req" 2>&3; } 3>&2 2>"$TMP/client-time"
          t1=$(date +%s.%N)
          c1=$(cpu_ticks "${!pidv}")
          rate=$(echo "$mib / ($t1 - $t0)" | bc -l)
        fi
        cpu=$(echo "($c1 - $c0) * 1000000 / $hz / $moved" | bc -l)
        # CPU shares: CPU seconds per wall second (one thread full = 1.00).
        sshare=$(echo "($c1 - $c0) / $hz / ($t1 - $t0)" | bc -l)
        cshare=$(awk -v w="$(echo "$t1 - $t0" | bc -l)" '{print ($1 + $2) / w}' "$TMP/client-time")
        printf '%-6s %-5s %-8s %5d %10.0f %12.0f %7.2f %7.2f  %s\n' "$s" "$mode" "$req" "$r" "$rate" "$cpu" "$sshare" "$cshare" "$check"
        echo "$s $mode $req $rate $cpu" >>"$TMP/results"
      done
    done
  done

if [ -n "${PROFILE:-}" ]; then
  command -v perf >/dev/null || fail "PROFILE needs perf"
  mkdir -p "$PROFILE"
  echo
  echo "# profile (one extra copy each; perf files in $PROFILE)"
  printf '%-10s %-8s %14s %14s %16s\n' server req syscalls/MiB writes/MiB bytes/write
  for req in $REQ; do
    for s in $SERVERS; do
      pidv=PID_$s
      base=$PROFILE/$s-$req
      perf stat -x, -o "$base.stat" -p "${!pidv}" -e raw_syscalls:sys_enter \
        -e syscalls:sys_enter_write -e syscalls:sys_enter_sendto \
        -e syscalls:sys_enter_sendmsg -e syscalls:sys_enter_writev &
      pp=$!
      sleep 1                       # perf attaches
      nbdcopy "$(uri $s)" null: --request-size="$req"
      kill -INT $pp; wait $pp || true
      /usr/bin/python3 - "$base.stat" "$s" "$req" "$mib" <<'PY'
import sys
c = {}
for line in open(sys.argv[1]):
    f = line.strip().split(",")
    if len(f) > 2 and f[0].replace(".", "").isdigit():
        c[f[2]] = float(f[0])
mib = float(sys.argv[4])
w = sum(v for k, v in c.items() if k != "raw_syscalls:sys_enter")
print("%-10s %-8s %14.1f %14.1f %16.0f" % (sys.argv[2], sys.argv[3],
      c.get("raw_syscalls:sys_enter", 0) / mib, w / mib, mib * 1048576 / w if w else 0))
PY
      case $s in nbdkit) continue ;; esac
      perf record -q -g -o "$base.data" -p "${!pidv}" &
      pp=$!
      sleep 1
      nbdcopy "$(uri $s)" null: --request-size="$req"
      kill -INT $pp; wait $pp || true
      perf report -q --stdio --no-children --percent-limit 1.5 -g none -i "$base.data" \
        >"$base.report" 2>/dev/null || true
      rm -f "$base.data"
    done
  done
  echo "# (writes: write+writev+sendto+sendmsg, all descriptors; bytes/write counts"
  echo "#  the copy's MiB only, so small writes of other kinds lower it; syscalls"
  echo "#  include blkd's epoll_wait polls (--poll-us), more when it waits more)"
fi

echo
echo "# medians (min-max) and ratios to nbdkit"
/usr/bin/python3 - "$TMP/results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
keys = sorted({(m, int(q)) for _, m, q, _, _ in rows}, key=lambda k: (k[0], -k[1]))
servers = []
for r in rows:
    if r[0] not in servers:
        servers.append(r[0])
fmt = lambda v: "%.0f (%.0f-%.0f)" % (statistics.median(v), min(v), max(v))
print("%-5s %-8s %-10s %-22s %-22s %-8s %-8s" % ("mode", "req", "server", "MiB/s", "cpu µs/MiB",
                                                "thru ×", "cpu ×"))
for m, q in keys:
    def col(srv, i):
        return [float(r[i]) for r in rows if r[0] == srv and r[1] == m and int(r[2]) == q]
    nt, nc = col("nbdkit", 3), col("nbdkit", 4)
    for srv in servers:
        t, c = col(srv, 3), col(srv, 4)
        print("%-5s %-8d %-10s %-22s %-22s %-8.2f %-8.2f" % (
            m, q, srv, fmt(t), fmt(c), statistics.median(t) / statistics.median(nt),
            statistics.median(c) / statistics.median(nc)))
print("(× is against nbdkit in the same run)")
PY
