# Shared helpers for shell tests: free ports, starting and stopping servers,
# and the skip/fail conventions the runner understands. Source it.
set -euo pipefail
: "${TOP:=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
: "${BLKD:=$TOP/blkd}"
: "${BLKPERF:=$TOP/blkperf}"
TMP=$(mktemp -d /tmp/blkd-test.XXXXXX)
SERVER_PIDS=()

cleanup() {
  local pid
  for pid in "${SERVER_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${SERVER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || skip "$1 is not installed"; }

# A TCP port nobody listens on right now (bind-and-release; racy but fine
# for tests because servers are started immediately after).
free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_port PORT [SECONDS]: wait until something accepts on 127.0.0.1:PORT.
wait_port() {
  local port=$1 secs=${2:-20} i
  for ((i = 0; i < secs * 20; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  fail "nothing listening on port $port after ${secs}s"
}

wait_socket() {
  local path=$1 secs=${2:-20} i
  for ((i = 0; i < secs * 20; i++)); do [ -S "$path" ] && return 0; sleep 0.05; done
  fail "no socket at $path after ${secs}s"
}

# start_server [SERVER] ARGS...: start blkd (or nbdkit when SERVER=nbdkit is
# given as first word; "blkd" names the default explicitly) in the foreground on a fresh TCP port; sets PORT, URI
# and SERVER_PID. Server output goes to $TMP/server.log.
start_server() {
  local bin=$BLKD
  if [ "${1:-}" = nbdkit ]; then bin=nbdkit; shift
  elif [ "${1:-}" = blkd ]; then shift; fi
  PORT=$(free_port)
  "$bin" -f -i 127.0.0.1 -p "$PORT" "$@" >>"$TMP/server.log" 2>&1 &
  SERVER_PID=$!
  SERVER_PIDS+=("$SERVER_PID")
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
}

server_alive() { kill -0 "${1:-$SERVER_PID}" 2>/dev/null; }
