#!/usr/bin/env bash
# Signals: SIGTERM, SIGINT and SIGQUIT stop blkd cleanly (exit status 0,
# Unix socket removed, plugin unloaded, pidfile removed), as nbdkit does;
# SIGHUP is a reload request and never stops the server, with or without
# TLS, in the foreground or daemonized.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
need_server
need nbdinfo
server_is_nbdkit && skip "SIGHUP reloads in blkd; nbdkit stops on it"

# wait_gone PID: wait (up to a minute, a load allowance) for a process
# that is not our child to exit.
wait_gone() {
  for _ in $(seq 600); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  fail "process $1 still running a minute after the signal"
}

# serve NAME BLKD-OPTIONS...: blkd on the Unix socket $TMP/NAME.sock
# with the eval plugin, whose unload script leaves
# $TMP/unloaded.NAME so we can see that it ran.  In a subshell (run in the
# background) it execs, so that $! is blkd's own pid.
serve() {
  local name=$1 exec_=; shift
  [ "$BASHPID" = "$$" ] || exec_=exec
  $exec_ "$BLKD" "$@" -U "$TMP/$name.sock" eval "get_size=echo 1048576" \
    "pread=dd if=/dev/zero count=\$3 iflag=count_bytes status=none" \
    "unload=touch $TMP/unloaded.$name" >>"$TMP/server.log" 2>&1
}

for sig in TERM INT QUIT; do
  SOCK=$TMP/$sig.sock
  serve "$sig" -f &
  pid=$!
  SERVER_PIDS+=("$pid")
  wait_socket "$SOCK"
  expect_eq "$(nbdinfo --size "nbd+unix:///?socket=$SOCK")" 1048576 "served before SIG$sig"
  # A background job of a script starts with SIGINT and SIGQUIT ignored,
  # so a blkd without its own handler would never go: bound the wait.
  ( sleep 120; kill -KILL "$pid" 2>/dev/null ) &
  watchdog=$!
  kill -s "$sig" "$pid"
  rc=0; wait "$pid" || rc=$?
  kill "$watchdog" 2>/dev/null || true
  [ "$rc" != 137 ] || fail "SIG$sig did not stop blkd (killed after 120 s)"
  expect_eq "$rc" 0 "exit status after SIG$sig"
  [ ! -e "$SOCK" ] || fail "SIG$sig left the Unix socket $SOCK behind"
  ok "SIG$sig removed the Unix socket"
  [ -e "$TMP/unloaded.$sig" ] || fail "SIG$sig: the plugin's unload did not run"
  ok "SIG$sig unloaded the plugin"
done

echo "# SIGHUP without TLS: logged, nothing else changes"
SOCK=$TMP/hup.sock
serve hup -f &
pid=$!
SERVER_PIDS+=("$pid")
# The start-up line comes once SIGHUP is handled (the socket exists before).
for _ in $(seq 600); do grep -q "serving eval on .*hup.sock" "$TMP/server.log" && break; sleep 0.1; done
grep -q "serving eval on .*hup.sock" "$TMP/server.log" || fail "no start-up line"
kill -HUP "$pid"
for _ in $(seq 600); do
  grep -q "SIGHUP: TLS is off" "$TMP/server.log" && break
  server_alive "$pid" || break
  sleep 0.1
done
check_alive "$pid"
grep -q "SIGHUP: TLS is off, no credentials to reload" "$TMP/server.log" \
  || { cat "$TMP/server.log"; fail "no log line for SIGHUP"; }
ok "SIGHUP logged: $(grep 'SIGHUP' "$TMP/server.log" | tail -1)"
kill -HUP "$pid"; kill -HUP "$pid"
expect_eq "$(nbdinfo --size "nbd+unix:///?socket=$SOCK")" 1048576 "served after three SIGHUPs"
check_alive "$pid"
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
expect_eq "$rc" 0 "exit status after SIGHUP then SIGTERM"
[ -e "$TMP/unloaded.hup" ] && [ ! -e "$SOCK" ] || fail "unclean stop after SIGHUP"

echo "# daemonized: SIGHUP keeps it, SIGTERM stops it cleanly"
SOCK=$TMP/daemon.sock
serve daemon --log=null -P "$TMP/daemon.pid"
pid=$(cat "$TMP/daemon.pid")
SERVER_PIDS+=("$pid")
kill -HUP "$pid"
expect_eq "$(nbdinfo --size "nbd+unix:///?socket=$SOCK")" 1048576 "daemon serves after SIGHUP"
kill -0 "$pid" || fail "the daemon died of SIGHUP"
ok "daemon still running after SIGHUP"
kill -TERM "$pid"
wait_gone "$pid"
[ ! -e "$SOCK" ] || fail "daemon left its Unix socket behind"
[ ! -e "$TMP/daemon.pid" ] || fail "daemon left its pidfile behind"
[ -e "$TMP/unloaded.daemon" ] || fail "daemon did not unload the plugin"
ok "daemon stopped cleanly: socket and pidfile removed, plugin unloaded"
echo "all signal checks passed"
