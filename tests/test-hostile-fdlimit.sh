#!/usr/bin/env bash
# File-descriptor exhaustion: blkd runs with RLIMIT_NOFILE 64 and 200
# clients connect at once (half of them negotiate, the rest stay silent).
# accept() then fails with EMFILE; blkd must not spin on the listening
# socket (CPU stays low), must keep serving the clients it has, and must
# serve new clients once the crowd leaves.  The rawio plugin (an fd per
# open) is used so GO itself can hit the limit: that must be a clean
# option error, not a crash.
# run.sh: serial (checks blkd's CPU use)
. "$(dirname "$0")/lib.sh"
[ -x "$BLKD" ] || skip "no blkd binary at $BLKD"
RAWIO=$TOP/plugins/rawio/nbdkit-rawio-plugin.so
[ -f "$RAWIO" ] || skip "rawio plugin not built (make all)"
: "${PYTHON:=/usr/bin/python3}"
truncate -s 16M "$TMP/fd.img"
( ulimit -n 64; exec "$BLKD" -f -i 127.0.0.1 -p 0 "$RAWIO" file="$TMP/fd.img" ) \
  >>"$TMP/server.log" 2>&1 &
SERVER_PID=$!
SERVER_PIDS+=("$SERVER_PID")
PORT=$(wait_listen "$SERVER_PID")
wait_port "$PORT"
export TOP PORT SERVER_PID
"$PYTHON" - <<'PYEOF' || fail "fd-exhaustion checks failed"
import os, socket, struct, sys, time
sys.path.insert(0, os.path.join(os.environ["TOP"], "tests", "helpers"))
from blkdtest import *
port, pid = int(os.environ["PORT"]), int(os.environ["SERVER_PID"])


class Srv:
    unix = False
    def connect_socket(self, timeout=10):
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s


def cpu():
    with open("/proc/%d/stat" % pid) as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


first = RawClient(Srv())
first.handshake(structured=False)
ok("a client is in transmission before the crowd")
crowd, outcomes = [], {"go": 0, "refused": 0, "no greeting": 0}
for i in range(200):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    crowd.append(s)
# Some try to negotiate: they may get GO, an option error (the plugin
# could not open the file), or no greeting at all (still in the backlog).
for s in crowd[:60:3]:
    s.settimeout(0.2)
    try:
        c = RawClient.__new__(RawClient)
        c.sock, c.structured = s, False
        c.start()
        rtype, _ = c.go()
        outcomes["go" if rtype == NBD_REP_ACK else "refused"] += 1
    except (OSError, EOFError, ProtocolError):
        outcomes["no greeting"] += 1
print("crowd outcomes: %r" % outcomes)
c0, t0 = cpu(), time.time()
time.sleep(2)
used = cpu() - c0
check(used < 0.5, "blkd CPU while accept() fails with EMFILE: %.2f s in %.1f s (no spin)"
      % (used, time.time() - t0))
first.send_request(NBD_CMD_READ, 0, 4096, cookie=1)
check_eq(first.recv_reply(4096)[:2], (1, 0), "the established client is still served")
for s in crowd:
    s.close()
time.sleep(1.0)
c = RawClient(Srv())
c.handshake(structured=False)
c.send_request(NBD_CMD_READ, 0, 4096, cookie=2)
check_eq(c.recv_reply(4096)[:2], (2, 0), "a new client is served after the crowd left")
c.disconnect()
first.disconnect()
PYEOF
server_alive || fail "blkd died under fd exhaustion"
n=$(grep -c "accept: .*pausing" "$TMP/server.log" || true)
echo "ok: EMFILE logged $n times (rate-limited by the 100 ms pause)"
