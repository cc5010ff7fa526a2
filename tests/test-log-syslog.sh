#!/usr/bin/env bash
# --log: a daemonized blkd logs through syslog by default -- its start-up
# line, a refused client, a plugin's error, even a start-up failure after
# the fork -- and nothing of that reaches the terminal it was started
# from.  --log=null logs nothing; --log=stderr keeps a daemon on stderr;
# --log=syslog works in the foreground too.  Each line names the
# connection and peer.
#
# Our own /dev/log: in a private mount namespace (unshare -m), a directory
# of ours is bind-mounted over /dev, holding the few devices blkd and the
# eval plugin use and a datagram socket this test listens on.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
. "$(dirname "$0")/helpers/tls.sh"
need_server
need unshare
need nbdinfo
need openssl
server_is_nbdkit && skip "the log lines checked are blkd's"
[ "$(id -u)" = 0 ] || skip "a private mount namespace needs root"
unshare -m true 2>/dev/null || skip "unshare -m is not permitted here"

T=$TMP/tls
make_tls_material "$T"
DEV=$TMP/dev
mkdir -p "$DEV"
for n in null zero full random urandom; do : >"$DEV/$n"; done

# The syslog daemon: one line per datagram in $TMP/syslog.txt.
cat >"$TMP/syslogd.py" <<'PY'
import os, socket, sys
path, out = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
os.chmod(path, 0o666)
with open(out, "a") as f:
    f.write("ready\n")
    f.flush()
    while True:
        f.write(s.recv(65536).decode(errors="replace").rstrip("\n") + "\n")
        f.flush()
PY
$PY "$TMP/syslogd.py" "$DEV/log" "$TMP/syslog.txt" &
SERVER_PIDS+=("$!")
for _ in $(seq 600); do grep -q '^ready$' "$TMP/syslog.txt" 2>/dev/null && break; sleep 0.1; done
grep -q '^ready$' "$TMP/syslog.txt" || fail "the test's syslog socket did not come up"

# in_ns CMD...: run CMD with our directory as /dev.  In a subshell (run in
# the background) it execs, so that $! is CMD's own pid.
in_ns() {
  local exec_=
  [ "$BASHPID" = "$$" ] || exec_=exec
  $exec_ unshare -m sh -c 'dev=$1; shift
    for n in null zero full random urandom; do mount --bind /dev/$n "$dev/$n" || exit 99; done
    mount --rbind "$dev" /dev || exit 99
    exec "$@"' in_ns "$DEV" "$@"
}

# sync_log: everything sent to our socket before now is in syslog.txt
# (datagrams queue in order, so our own marker comes after them).
MARK=0
sync_log() {
  MARK=$((MARK + 1))
  $PY -c 'import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(sys.argv[2].encode(), sys.argv[1])' "$DEV/log" "marker $MARK"
  for _ in $(seq 1200); do grep -q "^marker $MARK\$" "$TMP/syslog.txt" && return 0; sleep 0.1; done
  fail "our own marker never reached syslog.txt"
}

# wait_line FILE REGEX WHAT: wait (generously) for a line, then show it.
wait_line() {
  for _ in $(seq 1200); do grep -qE "$2" "$1" && break; sleep 0.1; done
  grep -qE "$2" "$1" || { echo "--- $1"; cat "$1"; fail "$3: no line matching /$2/"; }
  ok "$3: $(grep -E "$2" "$1" | tail -1)"
}

# stop_daemon PIDFILE: SIGTERM, and wait for it to go.
stop_daemon() {
  local pid
  pid=$(cat "$1")
  kill -TERM "$pid"
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  fail "daemon $pid still running a minute after SIGTERM"
}

PLUGIN=(eval "get_size=echo 1048576"
        "pread=echo disk on fire >&2; exit 1")
# bad_read URI: a read the plugin fails.
bad_read() {
  $PY -c 'import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pread(512, 0)' "$1"
}

# daemon NAME BLKD-OPTIONS...: a daemon in our namespace on a fresh PORT,
# its stderr (the "terminal") in $TMP/NAME.stderr; sets DPID.
daemon() {
  local name=$1; shift
  PORT=$(free_port)
  in_ns "$BLKD" "$@" -P "$TMP/$name.pid" -i 127.0.0.1 -p "$PORT" "${PLUGIN[@]}" \
    2>"$TMP/$name.stderr" || { cat "$TMP/$name.stderr"; fail "daemon $name did not start"; }
  DPID=$(cat "$TMP/$name.pid")
  SERVER_PIDS+=("$DPID")
}

echo "# daemonized, default --log: syslog"
daemon d1 --tls=on --tls-psk="$T/keys.psk"
D1=$DPID
# Only what came before the fork may be on the terminal.
cp "$TMP/d1.stderr" "$TMP/d1.stderr.at-start"
wait_line "$TMP/syslog.txt" "^<30>.* blkd\\[$D1\\]: info: serving eval on nbd://127.0.0.1:$PORT" \
  "start-up line in syslog (daemon.info)"
expect_fail "a client with an unknown PSK identity" \
  nbdinfo --size "nbds://mallory@127.0.0.1:$PORT/?tls-psk-file=$T/other.psk"
wait_line "$TMP/syslog.txt" \
  "^<27>.* blkd\\[$D1\\]: error: conn [0-9]+ peer 127\\.0\\.0\\.1:[0-9]+: TLS handshake failed: unknown PSK identity \"mallory\"" \
  "refusal in syslog (daemon.err), naming connection and peer"
expect_fail "a read the plugin fails" bad_read "nbd://127.0.0.1:$PORT"
wait_line "$TMP/syslog.txt" \
  "^<27>.* blkd\\[$D1\\]: error: conn [0-9]+ peer 127\\.0\\.0\\.1:[0-9]+: .*disk on fire" \
  "plugin error in syslog, naming connection and peer"

echo "# a start-up failure after the fork reaches syslog too"
rc=0
in_ns "$BLKD" -i 127.0.0.1 -p "$(free_port)" --metrics "127.0.0.1:$PORT" "${PLUGIN[@]}" \
  2>"$TMP/d2.stderr" || rc=$?
expect_eq "$rc" 1 "exit status of a daemon that cannot start its metrics server"
wait_line "$TMP/syslog.txt" "^<27>.* blkd\\[[0-9]+\\]: --metrics: cannot listen on 127\\.0\\.0\\.1 port $PORT" \
  "post-fork start-up error in syslog"
[ ! -s "$TMP/d2.stderr" ] || { cat "$TMP/d2.stderr"; fail "the failing daemon wrote to the terminal"; }
ok "the failing daemon wrote nothing to the terminal"

stop_daemon "$TMP/d1.pid"
cmp -s "$TMP/d1.stderr" "$TMP/d1.stderr.at-start" \
  || { cat "$TMP/d1.stderr"; fail "the daemon wrote to the terminal after forking"; }
! grep -q "serving\|mallory\|disk on fire" "$TMP/d1.stderr" || fail "daemon log lines on the terminal"
ok "the daemon wrote nothing to the terminal after forking"

echo "# --log=null: nothing anywhere"
daemon d3 --log=null
D3=$DPID
expect_fail "a read the plugin fails (--log=null)" bad_read "nbd://127.0.0.1:$PORT"
stop_daemon "$TMP/d3.pid"
sync_log
! grep -q "blkd\\[$D3\\]" "$TMP/syslog.txt" || fail "--log=null: lines in syslog"
[ ! -s "$TMP/d3.stderr" ] || { cat "$TMP/d3.stderr"; fail "--log=null: lines on stderr"; }
ok "--log=null: no line in syslog or on stderr"

echo "# --log=stderr: a daemon keeps the terminal"
daemon d4 --log=stderr
D4=$DPID
wait_line "$TMP/d4.stderr" "^blkd: info: serving eval" "--log=stderr: start-up line on stderr"
expect_fail "a read the plugin fails (--log=stderr)" bad_read "nbd://127.0.0.1:$PORT"
wait_line "$TMP/d4.stderr" "^blkd: error: conn [0-9]+ peer 127\\.0\\.0\\.1:[0-9]+: .*disk on fire" \
  "--log=stderr: plugin error on stderr"
stop_daemon "$TMP/d4.pid"
sync_log
! grep -q "blkd\\[$D4\\]" "$TMP/syslog.txt" || fail "--log=stderr: lines in syslog"
ok "--log=stderr: no line in syslog"

echo "# --log=syslog in the foreground"
PORT=$(free_port)
in_ns "$BLKD" -f --log=syslog -i 127.0.0.1 -p "$PORT" "${PLUGIN[@]}" 2>"$TMP/d5.stderr" &
D5=$!
SERVER_PIDS+=("$D5")
wait_line "$TMP/syslog.txt" "blkd\\[[0-9]+\\]: info: serving eval on nbd://127.0.0.1:$PORT" \
  "--log=syslog -f: start-up line in syslog"
kill -TERM "$D5"
wait "$D5" || fail "the foreground server did not stop cleanly"
! grep -q "serving" "$TMP/d5.stderr" || fail "--log=syslog -f: start-up line on stderr"
ok "--log=syslog -f: nothing on stderr"
echo "all --log checks passed"
