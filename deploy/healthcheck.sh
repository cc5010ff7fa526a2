#!/bin/bash
# blkd container health check (the image's HEALTHCHECK). Needs only bash:
# the runtime image carries no curl.
#
# Asks GET /healthz on the metrics listener (BLKD_METRICS, as the entrypoint
# reads it) and is healthy on HTTP 200. Falls back to a plain TCP connect to
# the NBD port (BLKD_PORT) only when metrics are switched off
# (BLKD_METRICS=off) or the server answers 404 for /healthz (a blkd built
# before the endpoint existed) -- and says so on stdout, which podman keeps
# in the health log. A TCP connect proves the listener is up, not that the
# plugin answers, so the /healthz path is the one to rely on.
set -u
timeout=${BLKD_HEALTH_TIMEOUT:-3}

local_addr() {
  case "$1" in
    ''|0.0.0.0|'[::]'|'::'|'*') echo 127.0.0.1 ;;
    \[*\]) local a=${1#[}; echo "${a%]}" ;;
    *) echo "$1" ;;
  esac
}

tcp_check() {
  local port=${BLKD_PORT:-10809} addr
  addr=$(local_addr "${BLKD_ADDR:-0.0.0.0}")
  if timeout "$timeout" bash -c "exec 3<>/dev/tcp/$addr/$port" 2>/dev/null; then
    echo "healthy: NBD port $addr:$port accepts connections ($1)"
    exit 0
  fi
  echo "unhealthy: NBD port $addr:$port does not accept connections ($1)"
  exit 1
}

metrics=${BLKD_METRICS-0.0.0.0:9100}
case "${metrics,,}" in
  ''|off|no|none|0) tcp_check "metrics off, TCP check only" ;;
  *:*) host=$(local_addr "${metrics%:*}"); port=${metrics##*:} ;;
  *)   host=127.0.0.1; port=$metrics ;;
esac

status=$(timeout "$timeout" bash -c '
  exec 3<>"/dev/tcp/$0/$1" || exit 1
  printf "GET /healthz HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n" "$0" >&3
  IFS=" " read -r _ code _ <&3 && echo "$code"' "$host" "$port" 2>/dev/null)

case "$status" in
  200) echo "healthy: http://$host:$port/healthz answered 200"; exit 0 ;;
  404) tcp_check "no /healthz on $host:$port, TCP check only" ;;
  '')  echo "unhealthy: no HTTP answer from $host:$port/healthz"; exit 1 ;;
  *)   echo "unhealthy: http://$host:$port/healthz answered $status"; exit 1 ;;
esac
