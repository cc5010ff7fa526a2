#!/usr/bin/env bash
# --fdstore where no service manager listens (no $NOTIFY_SOCKET: blkd run
# by hand, or under systemd-socket-activate): blkd says once that SIGTERM
# stops as usual, and it does: a connected client is closed, exit 0.  Then
# what blkd makes of LISTEN_FDNAMES it did not write: a name that only
# contains the store's prefix is an ordinary socket-activation fd, and a
# "blkdstore-N-state" that is no state (a socket) is logged and closed,
# and blkd binds its own port instead.  The store itself is tested under a
# real systemd by tests/test-restart-systemd.sh.
. "$(dirname "$0")/lib.sh"
need nbdsh
[ -x "$BLKD" ] || fail "$BLKD is not built"
PY=/usr/bin/python3
"$PY" -c 'import nbd' 2>/dev/null || skip "python3-libnbd (the nbd module) is not installed"

unset NOTIFY_SOCKET
start_server --fdstore ram size=16M
grep -q -- "--fdstore: no \$NOTIFY_SOCKET" "$TMP/server.log" ||
  { cat "$TMP/server.log"; fail "no warning that --fdstore has no NOTIFY_SOCKET"; }

# A client connected across the SIGTERM sees the connection end, and
# blkd exits 0 as on any stop.
"$PY" - "$URI" "$SERVER_PID" <<'EOF' || fail "SIGTERM with --fdstore and no NOTIFY_SOCKET"
import nbd, os, signal, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"x" * 4096, 0)
os.kill(int(sys.argv[2]), signal.SIGTERM)
deadline = time.time() + 20
while time.time() < deadline:
    try:
        h.pread(4096, 0)
    except nbd.Error:
        print("connection closed after SIGTERM")
        sys.exit(0)
    time.sleep(0.05)
sys.exit("still served 20 s after SIGTERM")
EOF
rc=0; wait "$SERVER_PID" || rc=$?
[ "$rc" = 0 ] || { cat "$TMP/server.log"; fail "blkd exited $rc"; }
! grep -q "file descriptor store" "$TMP/server.log" ||
  fail "blkd talked of the store without a NOTIFY_SOCKET: $(cat "$TMP/server.log")"
echo "no NOTIFY_SOCKET: warned once, SIGTERM stopped, exit 0"

# activate NAME ARGS...: blkd with a listening socket on 127.0.0.1 as fd 3,
# LISTEN_FDNAMES=NAME; prints the socket's port first.
activate() {
  exec "$PY" -c '
import os, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
os.dup2(s.fileno(), 3); os.set_inheritable(3, True)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1", LISTEN_FDNAMES=sys.argv[1])
os.execv(sys.argv[2], sys.argv[2:])' "$@"
}

# A name that merely contains the prefix: socket activation as always.
activate "xblkdstore-1-state" "$BLKD" -f --fdstore ram size=1M >"$TMP/act.out" 2>>"$TMP/act.log" &
pid=$!; SERVER_PIDS+=("$pid")
for ((i = 0; i < 100; i++)); do [ -s "$TMP/act.out" ] && break; sleep 0.05; done
port=$(head -n1 "$TMP/act.out")
[ "$(nbdinfo --size "nbd://127.0.0.1:$port" 2>>"$TMP/act.log")" = 1048576 ] ||
  { cat "$TMP/act.log"; fail "socket activation with a name containing blkdstore-"; }
kill "$pid"; wait "$pid" || fail "blkd exited $? (prefix in another name)"
echo "LISTEN_FDNAMES=xblkdstore-1-state: an ordinary activated socket"

# "blkdstore-7-state" naming a socket, not a memfd: logged, closed, and
# blkd binds -p itself.
: >"$TMP/act.log"
activate "blkdstore-7-state" "$BLKD" -f --fdstore -i 127.0.0.1 -p 0 ram size=1M \
  >"$TMP/act.out" 2>>"$TMP/act.log" &
pid=$!; SERVER_PIDS+=("$pid")
own=$(log_port "$TMP/act.log" 0 'serving .* on nbd://[^ ]*:([0-9]+)/')
stale=$(head -n1 "$TMP/act.out")
[ "$own" != "$stale" ] || fail "blkd served the fd named as a state"
grep -q "cannot use the state in systemd's file descriptor store" "$TMP/act.log" ||
  { cat "$TMP/act.log"; fail "no log line for a state that is not one"; }
[ "$(nbdinfo --size "nbd://127.0.0.1:$own")" = 1048576 ] || fail "blkd's own port does not serve"
! nbdinfo --size "nbd://127.0.0.1:$stale" >/dev/null 2>&1 || fail "the fd named as a state was kept open"
kill "$pid"; wait "$pid" || fail "blkd exited $? (bad state)"
echo "LISTEN_FDNAMES=blkdstore-7-state on a socket: logged, closed, own port $own served"
