#!/usr/bin/env bash
# The command line as a user meets it: --help/--version, the embedded
# default, --run, pidfiles, forking into the background, loud start-up
# errors, and an orderly SIGTERM that removes the Unix socket.
. "$(dirname "$0")/lib.sh"
need nbdinfo
[ "$(basename "$BLKD")" = nbdkit ] && skip "tests blkd's own command line"

echo "# --help and --version"
# Captured first: grep -q closing the pipe early would fail under pipefail.
help=$("$BLKD" --help)
grep -q -- '--max-request' <<<"$help" || fail "--help does not describe --max-request"
grep -q -- '--iobuf' <<<"$help" || fail "--help does not describe --iobuf"
grep -Eq '^blkd [0-9]+\.[0-9]+' <<<"$("$BLKD" --version)" || fail "--version"

echo "# start-up errors: one clear line, exit 1"
expect_startup_error() {
  local want=$1; shift
  set +e
  out=$("$BLKD" -f -i 127.0.0.1 -p 0 "$@" 2>&1)
  rc=$?
  set -e
  [ $rc -eq 1 ] || fail "'$*' exited $rc, want 1 (output: $out)"
  grep -qi -- "$want" <<<"$out" || fail "'$*': message does not say '$want': $out"
  [ "$(echo "$out" | wc -l)" -le 3 ] || fail "'$*': more than a few lines: $out"
  echo "ok: $* -> $out"
}
expect_startup_error "not found" no-such-plugin
expect_startup_error "bad parameter" memory size=banana
expect_startup_error "unknown value" --iobuf=sometimes memory 1M
expect_startup_error "size" --max-request=1 memory 1M
"$BLKD" -f -i 127.0.0.1 -p 0 memory 1M >"$TMP/first.log" 2>&1 &
FIRST=$!; SERVER_PIDS+=("$FIRST")
PORT=$(wait_listen "$FIRST")
set +e
out=$("$BLKD" -f -i 127.0.0.1 -p "$PORT" memory 1M 2>&1); rc=$?
set -e
[ $rc -eq 1 ] && grep -qi "in use" <<<"$out" || fail "address in use: rc=$rc out=$out"
echo "ok: address in use -> $out"
stop_server "$FIRST"

echo "# no plugin: the embedded default, ram 1 GiB"
start_server
size=$(nbdinfo --size "$URI")
[ "$size" = 1073741824 ] || fail "default export size $size, want 1073741824"
grep -q "serving ram" "$TMP/server.log" || fail "start-up line does not name the ram plugin"
stop_server
echo "ok: default serves ram of 1 GiB"

echo "# no -i: both IPv4 and IPv6"
if [ -e /proc/net/if_inet6 ]; then
  "$BLKD" -f -p 0 memory 1M >>"$TMP/server.log" 2>&1 &
  SERVER_PID=$!; SERVER_PIDS+=("$SERVER_PID")
  # Port 0 on two sockets gives two kernel-chosen ports; both must serve.
  mapfile -t ports < <(for _ in $(seq 200); do p=$(listen_ports "$SERVER_PID"); \
                         [ "$(wc -l <<<"$p")" -ge 2 ] && { echo "$p"; break; }; sleep 0.05; done)
  [ ${#ports[@]} -ge 2 ] || fail "no -i: fewer than two listeners: ${ports[*]}"
  PORT=${ports[0]}
  wait_port "$PORT"
  ok6=0 ok4=0
  for p in "${ports[@]}"; do
    [ "$(nbdinfo --size "nbd://[::1]:$p" 2>/dev/null)" = 1048576 ] && ok6=1
    [ "$(nbdinfo --size "nbd://127.0.0.1:$p" 2>/dev/null)" = 1048576 ] && ok4=1
  done
  [ $ok6 = 1 ] || fail "no IPv6 listener"
  [ $ok4 = 1 ] || fail "no IPv4 listener"
  stop_server
  echo "ok: listens on IPv4 and IPv6"
else
  echo "note: no IPv6 on this machine: dual-stack check not made"
fi

echo "# plugin by path"
start_server "$NBDKIT_PLUGINDIR/nbdkit-null-plugin.so" 5M
[ "$(nbdinfo --size "$URI")" = 5242880 ] || fail "null plugin by path"
stop_server
echo "ok: plugin loaded by path"

echo "# --run: \$uri, \$port, \$unixsocket; exit status passes through"
out=$("$BLKD" --run 'nbdinfo --size "$uri"; echo "unix=$unixsocket"' memory 3M 2>&1)
grep -qx 3145728 <<<"$out" || fail "--run did not reach the export: $out"
grep -q "unix=/" <<<"$out" || fail "--run without address should use a private Unix socket: $out"
set +e
"$BLKD" --run 'exit 7' memory 1M; rc=$?
set -e
[ $rc -eq 7 ] || fail "--run exit status $rc, want 7"
out=$("$BLKD" -i 127.0.0.1 -p 0 --run 'echo "port=$port uri=$uri"' memory 1M 2>&1)
grep -Eq "port=([1-9][0-9]*) uri=nbd://127.0.0.1:\1/" <<<"$out" || fail "--run over TCP: $out"
echo "ok: --run"

echo "# background mode with a pidfile"
"$BLKD" -i 127.0.0.1 -p 0 -P "$TMP/blkd.pid" memory 2M   # returns once bound
[ -s "$TMP/blkd.pid" ] || fail "no pidfile"
pid=$(cat "$TMP/blkd.pid")
SERVER_PIDS+=("$pid")
kill -0 "$pid" || fail "daemon not running"
PORT=$(listen_ports "$pid" | head -n1)
[ -n "$PORT" ] || fail "daemon returned before it listened"
[ "$(nbdinfo --size "nbd://127.0.0.1:$PORT")" = 2097152 ] || fail "daemon does not serve"
kill "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
kill -0 "$pid" 2>/dev/null && fail "daemon did not stop on SIGTERM"
[ -e "$TMP/blkd.pid" ] && fail "pidfile left behind"
echo "ok: forks into the background, pidfile written and removed"

echo "# SIGTERM drains, exits 0 and removes the Unix socket"
start_server_unix memory 8M
/usr/bin/python3 - "$SOCK" <<'EOF' &
import nbd, sys
h = nbd.NBD(); h.connect_unix(sys.argv[1])
for i in range(200):
    h.pwrite(bytes([i % 256]) * 65536, (i * 65536) % (8 << 20))
EOF
CLIENT=$!
sleep 0.2
kill -TERM "$SERVER_PID"
set +e
wait "$SERVER_PID"; rc=$?
wait "$CLIENT"
set -e
[ $rc -eq 0 ] || fail "blkd exited $rc on SIGTERM, want 0"
[ -e "$SOCK" ] && fail "Unix socket $SOCK left behind"
echo "ok: SIGTERM -> exit 0, socket removed"

echo "# -e names the export LIST shows"
start_server -e myexport memory 1M
grep -q 'export="myexport"' <<<"$(nbdinfo --list "$URI")" || fail "-e not in nbdinfo --list"
stop_server
echo "ok: -e"

echo "# --dump-plugin"
grep -q '^name=memory$' <<<"$("$BLKD" --dump-plugin memory)" || fail "--dump-plugin memory"
grep -q '^thread_model=parallel$' <<<"$("$BLKD" --dump-plugin ram)" || fail "--dump-plugin ram"
echo "ok: --dump-plugin"
