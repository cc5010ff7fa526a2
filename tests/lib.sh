# Shared helpers for shell tests: servers' ports, starting and stopping servers,
# and the skip/fail conventions the runner understands. Source it.
set -euo pipefail
: "${TOP:=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
: "${BLKD:=$TOP/blkd}"
: "${BLKPERF:=$TOP/blkperf}"
# nbdkit's plugin directory (multiarch: it differs per architecture); run.sh
# exports it, a test run by hand asks pkg-config or nbdkit itself.
if [ -z "${NBDKIT_PLUGINDIR:-}" ]; then
  NBDKIT_PLUGINDIR=$(pkg-config --variable=plugindir nbdkit 2>/dev/null ||
                     nbdkit --dump-config 2>/dev/null | sed -n 's/^plugindir=//p' || true)
fi
TMP=$(mktemp -d /tmp/blkd-test.XXXXXX)
SERVER_PIDS=()
# How long the wait_* helpers wait for a server to come up; a server under
# valgrind (tests/helpers/valgrind.sh) gets longer.
: "${START_TIMEOUT:=20}"

# Files (glob patterns) a failing test prints before $TMP goes: helpers add
# the logs that explain a failure the test itself did not get to read.
SHOW_ON_FAILURE=()

# cleanup [STATUS]: the EXIT trap; STATUS is the test's exit status when a
# trap of the test's own calls it after commands of its own.
cleanup() {
  local rc=${1:-$?} pattern f
  stop_servers
  # After the servers have ended: their last words are in the logs too.
  if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
    for pattern in "${SHOW_ON_FAILURE[@]}"; do
      for f in $pattern; do [ -s "$f" ] && { echo "--- $f"; cat "$f"; } >&2; done
    done
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT

# stop_servers: SIGTERM to every server the test started, then wait for all.
stop_servers() {
  local pid
  for pid in "${SERVER_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${SERVER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  SERVER_PIDS=()
}

# built_with_asan FILE: FILE links AddressSanitizer (a SANITIZE=1 build).
# Matched on ldd's captured output: piped into grep -q, ldd (a line a
# write) could die of SIGPIPE and, under pipefail, read as "no".
built_with_asan() { grep -q libasan <<<"$(ldd "$1" 2>/dev/null)"; }

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || skip "$1 is not installed"; }

# No test picks a port and hopes it is still free when the server binds it
# (two tests running at once could pick the same one): servers listen on
# port 0 and the test asks the kernel which port they got.

# listen_ports PID: the TCP ports process PID listens on, one a line, in
# file-descriptor order (its first listener first).  Reads /proc, so it
# works for any server, including ones that do not print their port.
listen_ports() {
  local pid=$1 fd link
  local -A fd_of=()
  for fd in $(ls /proc/"$pid"/fd 2>/dev/null); do
    link=$(readlink /proc/"$pid"/fd/"$fd" 2>/dev/null) || continue
    if [[ $link =~ ^socket:\[([0-9]+)\]$ ]]; then fd_of[${BASH_REMATCH[1]}]=$fd; fi
  done
  [ ${#fd_of[@]} -gt 0 ] || return 0
  # /proc/net/tcp{,6}: field 2 is ADDR:PORT in hex, 4 the state (0A is
  # LISTEN), 10 the socket's inode.
  awk '$4 == "0A" { split($2, a, ":"); print $10, a[2] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null |
    while read -r ino hex; do
      if [ -n "${fd_of[$ino]:-}" ]; then echo "${fd_of[$ino]} $((16#$hex))"; fi
    done | sort -n -u | awk '{ print $2 }'
  return 0
}

# wait_listen PID [SECONDS]: wait until PID listens on a TCP port; prints
# its first port.  Fails at once if PID is gone.
wait_listen() {
  local pid=$1 secs=${2:-$START_TIMEOUT} i port
  for ((i = 0; i < secs * 20; i++)); do
    port=$(listen_ports "$pid" | head -n1)
    if [ -n "$port" ]; then echo "$port"; return 0; fi
    kill -0 "$pid" 2>/dev/null || fail "process $pid exited before it listened"
    sleep 0.05
  done
  fail "process $pid is not listening on any TCP port after ${secs}s"
}

# log_port FILE FROM REGEX [SECONDS]: wait for a line matching REGEX (whose
# first group is a port) in FILE after byte FROM; prints the port.  blkd
# prints "serving PLUGIN on nbd://HOST:PORT/" and "metrics on
# http://HOST:PORT/metrics" when it runs in the foreground.
log_port() {
  local file=$1 from=$2 re=$3 secs=${4:-$START_TIMEOUT} i port
  for ((i = 0; i < secs * 20; i++)); do
    port=$(tail -c +"$((from + 1))" "$file" 2>/dev/null | sed -nE "s|.*$re.*|\1|p" | head -n1)
    if [ -n "$port" ]; then echo "$port"; return 0; fi
    sleep 0.05
  done
  tail -n 20 "$file" >&2 || true
  fail "no line matching '$re' in $file after ${secs}s"
}

# dead_port: sets DEAD_PORT to a TCP port that refuses connections for as
# long as the test runs -- bound by a helper that never listens, so nobody
# else can take it.  Not for $(...): the helper must be our child so that
# cleanup() stops it.
dead_port() {
  local f i; f=$(mktemp "$TMP/deadport.XXXXXX")
  /usr/bin/python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0))
open(sys.argv[1], "w").write("%d\n" % s.getsockname()[1])
while True: time.sleep(3600)' "$f" </dev/null >/dev/null 2>&1 &
  SERVER_PIDS+=("$!")
  for ((i = 0; i < 400; i++)); do [ -s "$f" ] && break; sleep 0.05; done
  [ -s "$f" ] || fail "dead_port helper did not start"
  DEAD_PORT=$(cat "$f")
}

# wait_port PORT [SECONDS]: wait until something accepts on 127.0.0.1:PORT.
wait_port() {
  local port=$1 secs=${2:-$START_TIMEOUT} i
  for ((i = 0; i < secs * 20; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  fail "nothing listening on port $port after ${secs}s"
}

wait_socket() {
  local path=$1 secs=${2:-$START_TIMEOUT} i
  for ((i = 0; i < secs * 20; i++)); do [ -S "$path" ] && return 0; sleep 0.05; done
  fail "no socket at $path after ${secs}s"
}

# start_server [SERVER] ARGS...: start blkd (or nbdkit when SERVER=nbdkit is
# given as first word; "blkd" names the default explicitly) in the
# foreground on a port the kernel picks; sets PORT, URI and SERVER_PID, and
# METRICS_PORT when ARGS hold --metrics ADDR:0.  Server output goes to
# $TMP/server.log.
start_server() {
  local bin=$BLKD
  if [ "${1:-}" = nbdkit ]; then bin=nbdkit; shift
  elif [ "${1:-}" = blkd ]; then shift; fi
  local from; from=$(stat -c %s "$TMP/server.log" 2>/dev/null || echo 0)
  "$bin" -f -i 127.0.0.1 -p 0 "$@" >>"$TMP/server.log" 2>&1 &
  SERVER_PID=$!
  SERVER_PIDS+=("$SERVER_PID")
  if [ "$(basename "$bin")" = nbdkit ]; then
    PORT=$(wait_listen "$SERVER_PID")
  else
    # blkd may listen twice (--metrics): its start-up line says which is NBD.
    PORT=$(log_port "$TMP/server.log" "$from" 'serving .* on nbds?://[^ ]*:([0-9]+)/')
    case " $* " in
      *" --metrics "*) METRICS_PORT=$(log_port "$TMP/server.log" "$from" 'metrics on http://[^ ]*:([0-9]+)/metrics') ;;
    esac
  fi
  wait_port "$PORT"
  URI="nbd://127.0.0.1:$PORT"
}

# start_server_unix [SERVER] ARGS...: same on a Unix socket; sets SOCK, URI.
start_server_unix() {
  local bin=$BLKD
  if [ "${1:-}" = nbdkit ]; then bin=nbdkit; shift
  elif [ "${1:-}" = blkd ]; then shift; fi
  SOCK="$TMP/nbd.sock"
  "$bin" -f -U "$SOCK" "$@" >>"$TMP/server.log" 2>&1 &
  SERVER_PID=$!
  SERVER_PIDS+=("$SERVER_PID")
  wait_socket "$SOCK"
  URI="nbd+unix:///?socket=$SOCK"
}

stop_server() {
  kill "${1:-$SERVER_PID}" 2>/dev/null || true
  wait "${1:-$SERVER_PID}" 2>/dev/null || true
  forget_server "${1:-$SERVER_PID}"
}

# forget_server PID: PID has been waited for; cleanup must not signal it
# again (by then the number may belong to another process).
forget_server() {
  local i
  for i in "${!SERVER_PIDS[@]}"; do
    [ "${SERVER_PIDS[$i]}" = "$1" ] && unset 'SERVER_PIDS[i]'
  done
  return 0
}

server_alive() { kill -0 "${1:-$SERVER_PID}" 2>/dev/null; }
