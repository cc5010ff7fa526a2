#!/usr/bin/env bash
# --max-connections N: connections beyond N are accepted and closed at once
# (no greeting), with a log line; the N admitted ones keep working; a slot
# freed by a client that leaves is reusable.  Skips while blkd lacks the
# option.
. "$(dirname "$0")/lib.sh"
[ -x "$BLKD" ] || skip "no blkd binary at $BLKD"
: "${PYTHON:=/usr/bin/python3}"
export TOP
"$PYTHON" - <<'PYEOF'
import os, sys, time, socket, re
sys.path.insert(0, os.path.join(os.environ["TOP"], "tests", "helpers"))
from blkdtest import *

N = 3
srv = Server(["ram", "size=16M"], opts=["--max-connections", str(N)])

def admitted_conn():
    c = RawClient(srv)
    c.handshake(structured=False)
    return c

def refused(what, timeout=3.0):
    """A connection beyond the limit: accepted (connect succeeds), then
    closed with no greeting."""
    s = srv.connect_socket()
    t = time.time()
    check(peer_closed(s, timeout), "%s: closed without a greeting" % what)
    ok("%s: closed after %.2f s" % (what, time.time() - t))
    s.close()

def works(c, what, cookie=1):
    c.send_request(NBD_CMD_READ, 0, 4096, cookie=cookie)
    check_eq(c.recv_reply(4096)[:2], (cookie, 0), "%s: READ" % what)

held = [admitted_conn() for _ in range(N)]
ok("%d connections admitted" % N)
refused("connection %d" % (N + 1))
# A connection still haggling counts too.
held[-1].disconnect()
time.sleep(0.3)
h = RawClient(srv)
h.greeting()
refused("connection %d while one admitted client is mid-handshake" % (N + 1))
h.close()
time.sleep(0.3)
held[-1] = admitted_conn()
ok("a slot freed by a leaving client is reused")

# A burst of refused connections does not hurt the admitted ones.
for i in range(100):
    try:
        s = srv.connect_socket(timeout=5)
        s.close()
    except OSError as e:
        fail("connect %d of the burst failed: %s" % (i, e))
for i, c in enumerate(held):
    works(c, "admitted connection %d after 100 refused ones" % i, cookie=i + 1)
srv.check_alive()

log = open(srv.log_path, "rb").read().decode(errors="replace")
check(re.search(r"max-connections", log) is not None, "the refusal is logged",
      "log: %s" % log[-500:])
for c in held:
    c.disconnect()
time.sleep(0.3)
for i in range(N):
    held[i] = admitted_conn()
ok("after everyone left, %d new connections are admitted" % N)
PYEOF
