#!/usr/bin/env python3
"""A plugin's .open and .list_exports run off the shard's event loop: while
one client's open waits, another client on the same shard (--shards 1)
completes its handshake and reads.

The gateopen test plugin (tests/plugins) holds an open of an export named
slow* (and .list_exports, while list.hold exists) until the test creates a
release file, so every check is an ordering, never a time:

- client B handshakes and reads while client A's GO is held, and A has no
  reply until the release;
- LIST held the same way;
- options sent behind a held INFO (LIST, then GO) are answered in order
  once it returns, and the connection then reads;
- a client that hangs up during its open: the connection is freed once the
  open returns (blkd_connections back to 0), and --handshake-timeout closes
  a held one the same way;
- SIGTERM while an open is held: the server waits for it, then exits 0
  (under ASan, with no leak);
- a live restart (SIGUSR2) while an open is held closes that client as
  one still in the handshake, waits for the open, and hands over a client
  already in the transmission phase.
With --dispatch inline the open runs on the shard thread as before; the
pipelined options are checked there too."""

import os
import select
import signal
import struct
import sys
import subprocess

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from restarttest import DONE, count, restart_server, wait_log  # noqa: E402

if IS_NBDKIT:
    skip("checks blkd's shards (--shards, --metrics)")
from gatetest import (GATE, PLUGIN, connections, gate_file, release,  # noqa: E402
                      wait_connections, wait_entered)


def no_reply_yet(c, what):
    r, _, _ = select.select([c.sock], [], [], 0)
    check(not r, what)


def read_4k(c, what):
    c.send_request(NBD_CMD_READ, 0, 4096, cookie=7)
    cookie, err, _, data = c.recv_reply(4096)
    check(cookie == 7 and err == 0 and data == b"\x5a" * 4096, what)


def served_meanwhile(srv, who, held):
    """Another client handshakes and reads while `held` is held; a
    server whose shard waits on the held call times this out."""
    try:
        c = RawClient(srv)
        c.handshake(structured=False, name=b"fast")
        read_4k(c, "%s reads while %s is held" % (who, held))
        c.disconnect()
    except (OSError, ProtocolError) as e:
        fail("client %s could not finish while %s was held "
             "(does the call block the shard?): %s" % (who, held, e))


def server(*extra):
    return Server([PLUGIN, "gate=" + GATE],
                  opts=["--shards", "1", "--metrics", "127.0.0.1:0"] + list(extra))


def list_replies(c):
    names = []
    while True:
        opt, rtype, data = c.recv_opt_reply()
        if opt != NBD_OPT_LIST:
            raise ProtocolError("reply for option %d, expected LIST" % opt)
        if rtype != NBD_REP_SERVER:
            return rtype, names
        n = struct.unpack(">I", data[:4])[0]
        names.append(data[4:4 + n])


def recv_final(c, opt):
    """The replies to an option already sent, up to its final one."""
    while True:
        ropt, rtype, _ = c.recv_opt_reply()
        if ropt != opt:
            raise ProtocolError("reply for option %d, expected %d" % (ropt, opt))
        if rtype == NBD_REP_ACK or rtype & 0x80000000:
            return rtype


def check_pipelined(srv, name, mode):
    c = RawClient(srv)
    c.start()
    c.send_opt(NBD_OPT_INFO, RawClient.info_go_payload(name))
    c.send_opt(NBD_OPT_LIST)
    c.send_opt(NBD_OPT_GO, RawClient.info_go_payload(b"fast"))
    if name.startswith(b"slow"):
        wait_entered(name.decode())
        no_reply_yet(c, "%s: nothing answered while INFO's open is held" % mode)
        release(name.decode())
    check_eq(recv_final(c, NBD_OPT_INFO), NBD_REP_ACK, "%s: pipelined INFO answered first" % mode)
    rtype, names = list_replies(c)
    check(rtype == NBD_REP_ACK and set(names) == {b"fast", b"slow"},
          "%s: then LIST" % mode, "got %#x %r" % (rtype, names))
    check_eq(recv_final(c, NBD_OPT_GO), NBD_REP_ACK, "%s: then GO" % mode)
    read_4k(c, "%s: a read after the pipelined options" % mode)
    c.disconnect()


srv = server()

# ---- B is served while A's open is held --------------------------------
a = RawClient(srv, timeout=30)
a.start()
a.send_opt(NBD_OPT_GO, RawClient.info_go_payload(b"slowa"))
wait_entered("slowa")
served_meanwhile(srv, "B", "A's open")
no_reply_yet(a, "A has no GO reply before its open returns")
release("slowa")
check_eq(recv_final(a, NBD_OPT_GO), NBD_REP_ACK, "A's GO succeeds once its open returns")
read_4k(a, "A reads after its held open")
a.disconnect()
ok("a held .open stalls only its own client")

# ---- LIST held the same way --------------------------------------------
open(gate_file("list.hold"), "w").close()
f = RawClient(srv, timeout=30)
f.start()
f.send_opt(NBD_OPT_LIST)
wait_entered("list")
os.unlink(gate_file("list.hold"))
served_meanwhile(srv, "G", "F's LIST")
no_reply_yet(f, "F has no LIST reply before .list_exports returns")
release("list")
rtype, names = list_replies(f)
check(rtype == NBD_REP_ACK and set(names) == {b"fast", b"slow"}, "F's LIST answered",
      "got %#x %r" % (rtype, names))
f.close()

# ---- pipelined options behind a held INFO ------------------------------
check_pipelined(srv, b"slowp", "workers")

# ---- hang-up during the open -------------------------------------------
wait_connections(srv, 0, "no connection left before the hang-up case")
d = RawClient(srv, timeout=30)
d.start()
d.send_opt(NBD_OPT_GO, RawClient.info_go_payload(b"slowh"))
wait_entered("slowh")
d.close()
check_eq(connections(srv), 1, "the hung-up connection is kept while its open runs")
release("slowh")
wait_connections(srv, 0, "freed once the open returned")
srv.check_alive()
srv.stop()

# ---- --handshake-timeout during a held open ----------------------------
srv = server("--handshake-timeout", "1")
e = RawClient(srv, timeout=30)
e.start()
e.send_opt(NBD_OPT_GO, RawClient.info_go_payload(b"slowt"))
wait_entered("slowt")
check(peer_closed(e.sock, timeout=20), "--handshake-timeout closes a client whose open is held")
release("slowt")
wait_connections(srv, 0, "the timed-out connection freed once its open returned")
e.close()

# ---- SIGTERM during a held open ----------------------------------------
h = RawClient(srv, timeout=30)
h.start()
h.send_opt(NBD_OPT_GO, RawClient.info_go_payload(b"slowd"))
wait_entered("slowd")
srv.proc.send_signal(signal.SIGTERM)
check(peer_closed(h.sock, timeout=20), "SIGTERM closes a client whose open is held")
release("slowd")
try:
    rc = srv.proc.wait(timeout=20)
except subprocess.TimeoutExpired:
    fail("the server did not exit after SIGTERM once the open returned")
check_eq(rc, 0, "clean exit after SIGTERM with an open held")
h.close()

# ---- live restart during a held open -----------------------------------
srv = restart_server([PLUGIN, "gate=" + GATE], opts=["--shards", "1"])
t = RawClient(srv)
t.handshake(structured=False, name=b"fast")
read_4k(t, "restart: the transmission client reads before")
r = RawClient(srv, timeout=30)
r.start()
r.send_opt(NBD_OPT_GO, RawClient.info_go_payload(b"slowr"))
wait_entered("slowr")
os.kill(srv.proc.pid, signal.SIGUSR2)
check(peer_closed(r.sock, timeout=20), "restart: the client whose open is held is closed")
check_eq(count(srv, DONE), 0, "restart: not done while the open is held")
release("slowr")
wait_log(srv, DONE, 1, 30, "live restart after the held open returned")
read_4k(t, "restart: the transmission client reads after the hand-over")
t.disconnect()
r.close()
srv.stop()

# ---- --dispatch inline: the open on the shard thread, as before ---------
srv = server("--dispatch", "inline")
check_pipelined(srv, b"fast", "inline")
srv.stop()

print("all asynchronous handshake checks passed")
