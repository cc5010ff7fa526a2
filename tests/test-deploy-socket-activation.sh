#!/usr/bin/env bash
# systemd socket activation with the real binary, as blkd.socket +
# blkd.service run it: systemd-socket-activate binds the port and execs blkd
# with LISTEN_PID/LISTEN_FDS; blkd must serve that socket (and bind none of
# its own), answer nbdinfo, and exit 0 on SIGTERM. Then the same over a Unix
# socket, and once with the command line deploy/systemd/blkd.env produces.
. "$(dirname "$0")/lib.sh"
need systemd-socket-activate
need nbdinfo
[ -x "$BLKD" ] || fail "$BLKD is not built (make blkd)"

# activate LISTEN_ARG ARGS...: blkd under systemd-socket-activate; sets PID.
# LISTEN_ARG "tcp" binds 127.0.0.1 port 0 instead and sets PORT:
# systemd-socket-activate cannot take port 0, so a few lines of Python do
# the same hand-over (listen, LISTEN_PID/LISTEN_FDS, fd 3, exec) on a port
# no other test can be holding.
activate() {
  local listen=$1; shift
  if [ "$listen" = tcp ]; then
    /usr/bin/python3 -c '
import os, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
os.dup2(s.fileno(), 3); os.set_inheritable(3, True)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1", LISTEN_FDNAMES="blkd")
os.execv(sys.argv[1], sys.argv[1:])' "$BLKD" -f "$@" >>"$TMP/server.log" 2>&1 &
    PID=$!
    PORT=$(wait_listen "$PID")
  else
    systemd-socket-activate -l "$listen" "$BLKD" -f "$@" >>"$TMP/server.log" 2>&1 &
    PID=$!
  fi
  SERVER_PIDS+=("$PID")
}

# stop_ok: SIGTERM, then the exit status must be 0, within 10 s.
stop_ok() {
  local i rc
  kill -TERM "$PID"
  for ((i = 0; i < 200; i++)); do server_alive "$PID" || break; sleep 0.05; done
  server_alive "$PID" && fail "blkd still running 10 s after SIGTERM"
  rc=0; wait "$PID" || rc=$?
  [ "$rc" = 0 ] || { cat "$TMP/server.log"; fail "blkd exited $rc on SIGTERM, want 0"; }
}

# --- TCP ---
activate tcp ram size=64M
wait_port "$PORT"
size=$(nbdinfo --size "nbd://127.0.0.1:$PORT") || { cat "$TMP/server.log"; fail "nbdinfo over the activated socket"; }
[ "$size" = 67108864 ] || fail "size $size, want 64 MiB"
# A second connection: the listener survives the first.
nbdinfo --size "nbd://127.0.0.1:$PORT" >/dev/null || fail "second connection"
# blkd must not have opened a listener of its own (e.g. the default 10809).
if command -v ss >/dev/null; then
  listeners=$(ss -Hltnp 2>/dev/null | grep "pid=$PID," || true)
  n=$(printf '%s\n' "$listeners" | grep -c . || true)
  [ "$n" = 1 ] || fail "blkd listens on $n TCP sockets, want only the activated one: $listeners"
  grep -q ":$PORT " <<<"$listeners" || fail "blkd's listener is not the activated port: $listeners"
fi
grep -qi 'socket activation\|LISTEN_FDS' "$TMP/server.log" &&
  echo "log: $(grep -i 'socket activation\|LISTEN_FDS' "$TMP/server.log" | head -n1)"
stop_ok
echo "tcp: activated socket served, exit 0 on SIGTERM"

# --- Unix socket ---
SOCK=$TMP/blkd.sock
activate "$SOCK" ram size=1M
wait_socket "$SOCK"
size=$(nbdinfo --size "nbd+unix:///?socket=$SOCK") || { cat "$TMP/server.log"; fail "nbdinfo over the activated Unix socket"; }
[ "$size" = 1048576 ] || fail "size $size, want 1 MiB"
stop_ok
echo "unix: activated socket served, exit 0 on SIGTERM"

# --- the command line blkd.service builds from blkd.env ---
eval "$(env -i bash -c 'set -a; . "$1"; declare -p BLKD_PLUGIN BLKD_PLUGIN_ARGS BLKD_OPTIONS' _ "$TOP/deploy/systemd/blkd.env")"
opts=${BLKD_OPTIONS//127.0.0.1:9100/127.0.0.1:0}
from=$(stat -c %s "$TMP/server.log")
# Unquoted on purpose: systemd splits unbraced $VARS on whitespace too.
# shellcheck disable=SC2086
activate tcp $opts "$BLKD_PLUGIN" $BLKD_PLUGIN_ARGS
wait_port "$PORT"
size=$(nbdinfo --size "nbd://127.0.0.1:$PORT") || { cat "$TMP/server.log"; fail "nbdinfo with blkd.env's options"; }
[ "$size" = 1073741824 ] || fail "blkd.env default export is $size bytes, want 1 GiB"
case "$opts" in
  *--metrics*)
    need curl
    MPORT=$(log_port "$TMP/server.log" "$from" 'metrics on http://[^ ]*:([0-9]+)/metrics')
    wait_port "$MPORT"
    curl -fsS "http://127.0.0.1:$MPORT/healthz" >/dev/null || fail "/healthz with blkd.env's --metrics"
    echo "blkd.env: /healthz answers on the metrics port" ;;
esac
stop_ok
echo "blkd.env: blkd -f $opts $BLKD_PLUGIN $BLKD_PLUGIN_ARGS served, exit 0 on SIGTERM"
