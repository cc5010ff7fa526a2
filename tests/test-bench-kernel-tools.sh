#!/usr/bin/env bash
# bench/kernel.sh's host-side tools without a guest: tests/vm/control.py
# starts a blkd variant (another binary path with its own options),
# traces a server over a stretch of requests (strace -c, the summary
# written when "trace stop" ends it) and reads its CPU time both ways
# (ticks, and the exact CPU clock, which must cover what its threads'
# schedstat shows); bench/kernel-budget.py sorts made-up call chains
# into their parts.  Nothing here is timed.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
need strace
need nbdinfo

# --- kernel-budget.py's parts on made-up call chains --------------------------
"$PY" - "$TOP/bench" <<'EOF2' || fail "kernel-budget.py's parts"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kb", sys.argv[1] + "/kernel-budget.py")
kb = importlib.util.module_from_spec(spec); spec.loader.exec_module(kb)
K = " ([kernel.kallsyms])"
cases = [
    (["finish_task_switch" + K, "schedule" + K, "do_epoll_wait" + K, "epoll_wait (libc.so.6)"],
     "epoll_wait (sleep, wake-up)"),
    (["finish_task_switch" + K, "schedule" + K, "sk_wait_data" + K, "tcp_recvmsg" + K],
     "sleep, wake-up in a blocking socket call"),
    (["_copy_to_iter" + K, "tcp_recvmsg_locked" + K, "sock_read_iter" + K, "read (libc.so.6)"],
     "receive syscall (TCP receive, copy)"),
    (["tun_net_xmit" + K, "tcp_write_xmit" + K, "tcp_sendmsg" + K], "send syscall (TCP transmit, tap)"),
    (["futex_wake" + K, "do_futex" + K], "futex (thread hand-off, locks)"),
    (["__memmove_avx512_unaligned_erms (/usr/lib/x86_64-linux-gnu/libc.so.6)"],
     "user memcpy (payload, plugin copy)"),
    (["0x36ee (/usr/lib/x86_64-linux-gnu/nbdkit/plugins/nbdkit-memory-plugin.so)"], "plugin code"),
    (["conn_on_read (/work/blkd)"], "server code"),
]
for chain, want in cases:
    got = kb.parts_of(chain)
    if got != want:
        print("%s: got %r, want %r" % (chain[0], got, want)); sys.exit(1)
EOF2

# --- control.py: a variant, and a trace around some requests ------------------
T=$TMP                              # lib.sh removes it; control.py stops its servers on SIGTERM
mkdir -p "$T/trace"
"$PY" "$TOP/tests/vm/control.py" --tmp "$T" --top "$TOP" --blkd /nonexistent/blkd \
  --port-file "$T/ctl.port" --variant "alt=$TOP/blkd --poll-us 0 --shards 1" \
  --trace strace-c --trace-dir "$T/trace" 2>"$T/control.log" &
SERVER_PIDS+=("$!")
for _ in $(seq 1 100); do [ -s "$T/ctl.port" ] && break; sleep 0.1; done
[ -s "$T/ctl.port" ] || fail "control.py did not start: $(cat "$T/control.log")"
ctl() { "$PY" -c '
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
s.sendall((" ".join(sys.argv[2:]) + "\n").encode())
print(s.makefile().readline().strip())' "$(cat "$T/ctl.port")" "$@"; }

r=$(ctl start v1 blkd:nope memory size=1M)
case $r in "ERR unknown blkd variant nope") ;; *) fail "unknown variant: $r" ;; esac
r=$(ctl start v1 blkd:alt memory size=16M)
case $r in OK*) ;; *) fail "start variant: $r" ;; esac
port=$(echo "$r" | awk '{print $2}')
pid=$(ctl pid v1 | awk '{print $2}')
grep -q -- "^$TOP/blkd .*--poll-us 0 --shards 1 memory" <<<"$(tr '\0' ' ' <"/proc/$pid/cmdline")" ||
  fail "variant's command line: $(tr '\0' ' ' <"/proc/$pid/cmdline")"

r=$(ctl trace v1 start "1-1-probe")
[ "$r" = OK ] || fail "trace start: $r"
r=$(ctl trace v1 start "again")
case $r in ERR*traced*) ;; *) fail "second trace start: $r" ;; esac
for _ in 1 2 3; do
  timeout 30 nbdinfo --size "nbd://127.0.0.1:$port" >/dev/null || fail "nbdinfo"
done
r=$(ctl trace v1 stop)
[ "$r" = OK ] || fail "trace stop: $r"

# The CPU clock counts every thread's run time: at least the sum of the
# live threads' schedstat read just before it, and the same time as the
# ticks (utime+stime are scaled to it) up to their rounding.
ss=$(cat /proc/"$pid"/task/*/schedstat | awk '{ s += $1 } END { printf "%d", s }')
r=$(ctl cpu v1)
"$PY" - "$r" "$ss" "$(getconf CLK_TCK)" <<'EOF2' || fail "cpu: $r (schedstat sum $ss)"
import sys
f = sys.argv[1].split()
ss, tck = int(sys.argv[2]), int(sys.argv[3])
assert len(f) == 3 and f[0] == "OK", f
ticks, ns = int(f[1]), int(f[2])
assert ns > 0 and ns >= ss, (ns, ss)
tick_ns = 1e9 / tck
assert abs(ticks * tick_ns - ns) <= 3 * tick_ns + 0.02 * ns, (ticks, ns)
EOF2
out="$T/trace/1-1-probe.v1.strace-c"
[ -s "$out" ] || fail "no trace output ($(cat "$out.err" 2>/dev/null))"
grep -q "total" "$out" || fail "strace -c summary missing: $(cat "$out")"
r=$(ctl trace v1 stop)
case $r in ERR*"not being traced"*) ;; *) fail "stop without a trace: $r" ;; esac
r=$(ctl stop v1 10)
[ "$r" = "OK 0" ] || fail "stop: $r"
echo "ok: variant started with its options, strace -c around 3 connections"
