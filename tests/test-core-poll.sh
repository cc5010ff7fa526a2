#!/usr/bin/env bash
# --poll-us: after a read the shard looks again without sleeping for a
# bounded window.  Data stays right at QD1, an idle server stops spinning
# (its CPU time stands still), SIGTERM still stops it, and a shard with
# two connections sending requests does not poll (one connection paced
# the same way keeps it spinning: the control that shows the check can
# fail), nor one whose client runs on the shard's own CPU, over TCP or a
# Unix socket (the same client on another CPU is the control).
# run.sh: serial
# (CPU ticks of a pinned server: another test on the other CPU blurs
# the on-its-CPU case against its control.)
. "$(dirname "$0")/lib.sh"
need qemu-io
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import nbd' 2>/dev/null || skip "python3 nbd module missing"

start_server_unix --poll-us 200 ram size=16M

echo "# pattern write and read back through qemu-io"
qemu-io -f raw -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M' -c 'read -P 0 1M 1M' "$URI" \
  >"$TMP/qemu-io.log" 2>&1 || { cat "$TMP/qemu-io.log"; fail "qemu-io pattern check"; }
grep -q "Pattern verification failed" "$TMP/qemu-io.log" && fail "pattern mismatch"

echo "# 2000 requests one at a time (QD1), each checked"
/usr/bin/python3 - "$SOCK" <<'PY' || fail "QD1 read/write loop"
import sys, nbd
h = nbd.NBD()
h.connect_unix(sys.argv[1])
for i in range(1000):
    off = (i * 7919 % 4096) * 4096
    data = bytes([i & 0xff]) * 4096
    h.pwrite(data, off)
    assert h.pread(4096, off) == data, "read back at %d" % off
h.shutdown()
PY

cpu() { awk '{print $14 + $15}' "/proc/$SERVER_PID/stat"; }
echo "# idle: the poll window ends, the shard sleeps"
sleep 1
c0=$(cpu); sleep 3; c1=$(cpu)
echo "  server CPU while idle for 3 s: $((c1 - c0)) ticks"
[ $((c1 - c0)) -lt 30 ] || fail "an idle server with --poll-us kept spinning ($((c1 - c0)) ticks in 3 s)"

echo "# SIGTERM stops a polling server"
kill -TERM "$SERVER_PID"
for ((i = 0; i < 200; i++)); do server_alive || break; sleep 0.05; done
server_alive && fail "blkd --poll-us did not stop on SIGTERM"
[ -e "$SOCK" ] && fail "Unix socket left behind"

echo "# two busy connections on one shard: no polling"
# Clients on another CPU than the shard's where there is one: a client on
# the shard's CPU stops the polling itself (below).
start_server_unix --shards 1 --poll-us 2000 ram size=16M
CLIENT_CPU=()
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
  taskset -a -p -c "$(($(nproc) - 1))" "$SERVER_PID" >/dev/null || fail "cannot pin blkd"
  CLIENT_CPU=(taskset -c 0)
fi
paced() {   # $1 connections, each a read every ~0.6 ms for 2 s; prints server ticks
  "${CLIENT_CPU[@]}" /usr/bin/python3 - "$SOCK" "$1" "$SERVER_PID" <<'PY'
import sys, threading, time, nbd
sock, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
handles = []
for _ in range(n):
    h = nbd.NBD()
    h.connect_unix(sock)
    handles.append(h)
def ticks():
    with open("/proc/%d/stat" % pid) as f:
        v = f.read().rsplit(")", 1)[1].split()
    return int(v[11]) + int(v[12])
def run(h):
    end = time.time() + 2
    while time.time() < end:
        h.pread(4096, 0)
        time.sleep(0.0006)
t0 = ticks()
ts = [threading.Thread(target=run, args=(h,)) for h in handles]
for t in ts: t.start()
for t in ts: t.join()
print(ticks() - t0)
for h in handles: h.shutdown()
PY
}
one=$(paced 1) || fail "one paced connection"
two=$(paced 2) || fail "two paced connections"
echo "  server CPU over 2 s: one connection $one ticks (polling), two connections $two ticks"
[ "$one" -ge 40 ] || skip "one paced connection did not keep the shard polling ($one ticks): machine too busy to tell"
[ $((two * 2)) -lt "$one" ] || fail "a shard with two busy connections kept polling ($two ticks against $one for one)"
stop_server

echo "# a client on the shard's own CPU: no polling (TCP, then a Unix socket)"
# The shard pinned to the last CPU; one paced client pinned to the same
# CPU, then to another (the control: there the shard polls).  Over TCP
# the shard learns where a local client runs from SO_INCOMING_CPU; over a
# Unix socket from being preempted by it.
[ "$(nproc)" -ge 2 ] || skip "one CPU: no other CPU for the control"
need taskset
last=$(($(nproc) - 1))
paced_at() {   # $1: the client's CPU; prints server ticks over 2 s
  taskset -c "$1" /usr/bin/python3 - "$URI" "$SERVER_PID" <<'PY'
import sys, time, nbd
uri, pid = sys.argv[1], int(sys.argv[2])
h = nbd.NBD()
h.connect_uri(uri)
def ticks():
    with open("/proc/%d/stat" % pid) as f:
        v = f.read().rsplit(")", 1)[1].split()
    return int(v[11]) + int(v[12])
t0 = ticks()
end = time.time() + 2
while time.time() < end:
    h.pread(4096, 0)
    time.sleep(0.0006)
print(ticks() - t0)
h.shutdown()
PY
}
for how in tcp unix; do
  if [ $how = tcp ]; then start_server --shards 1 --poll-us 2000 ram size=16M
  else start_server_unix --shards 1 --poll-us 2000 ram size=16M; fi
  taskset -a -p -c "$last" "$SERVER_PID" >/dev/null || fail "cannot pin blkd"
  same=$(paced_at "$last") || fail "$how: client on the shard's CPU"
  apart=$(paced_at 0) || fail "$how: client on another CPU"
  echo "  $how: server CPU over 2 s: client on its CPU $same ticks, on another CPU $apart ticks (polling)"
  [ "$apart" -ge 40 ] || skip "$how: the client on another CPU did not keep the shard polling ($apart ticks): machine too busy to tell"
  [ $((same * 2)) -lt "$apart" ] || fail "$how: the shard kept polling on its client's CPU ($same ticks against $apart apart)"
  stop_server
done
echo ok
