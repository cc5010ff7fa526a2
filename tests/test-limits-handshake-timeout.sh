#!/usr/bin/env bash
# --handshake-timeout S: a client that has not finished option haggling S
# seconds after connecting is disconnected -- whether it is silent, stuck
# mid-option, or busy sending options forever (slow loris) -- while a
# client that reached transmission is not affected.  0 disables it; the
# default (10 s) is checked too, in parallel with the rest.  Skips while
# blkd lacks the option.
. "$(dirname "$0")/lib.sh"
[ -x "$BLKD" ] || skip "no blkd binary at $BLKD"
: "${PYTHON:=/usr/bin/python3}"
export TOP
"$PYTHON" - <<'PYEOF'
import os, sys, time, socket, struct, threading
sys.path.insert(0, os.path.join(os.environ["TOP"], "tests", "helpers"))
from blkdtest import *

T = 2
srv = Server(["ram", "size=16M"], opts=["--handshake-timeout", str(T)])
dflt = Server(["ram", "size=16M"])
off = Server(["ram", "size=16M"], opts=["--handshake-timeout", "0"])
t_start = time.time()

# Default (10 s): opened now, checked at the end.
d_idle = dflt.connect_socket()
o_idle = off.connect_socket()


def closed_between(sock, lo, hi, t0, what):
    """The server closes sock no earlier than lo and no later than hi
    seconds after t0 (a sweep once a second: up to 1 s late, never early)."""
    sock.settimeout(max(0.1, hi - (time.time() - t0)))
    try:
        while True:
            d = sock.recv(65536)
            if not d:
                break
    except (ConnectionResetError, BrokenPipeError):
        pass
    except socket.timeout:
        fail("%s: still open %.1f s after connecting (limit %d s)" % (what, hi, T))
    dt = time.time() - t0
    check(lo <= dt <= hi, "%s: closed after %.1f s (window %.1f..%.1f)" % (what, dt, lo, hi))


def peer_closed_eventually(sock, timeout):
    """Reads (and drops) whatever comes; True on EOF within timeout."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


results = []


def scenario(name, fn):
    def run():
        try:
            fn()
            results.append((name, None))
        except SystemExit as e:
            results.append((name, "failed"))
        except Exception as e:
            results.append((name, repr(e)))
    th = threading.Thread(target=run)
    th.start()
    return th


def silent():
    t0 = time.time()
    s = srv.connect_socket()
    closed_between(s, T - 0.05, T + 2.5, t0, "silent client (greeting unread)")


def mid_option():
    t0 = time.time()
    c = RawClient(srv)
    c.start()
    c.sock.sendall(struct.pack(">QII", NBD_OPTS_MAGIC, NBD_OPT_GO, 100) + b"\0" * 10)
    closed_between(c.sock, T - 0.05, T + 2.5, t0, "client stuck mid-option")


def slow_loris():
    # An option every 0.3 s: busy, but never finishing the handshake.
    t0 = time.time()
    c = RawClient(srv)
    c.start()
    try:
        while time.time() - t0 < T + 3:
            _, rtype, _ = c.opt_replies(NBD_OPT_LIST)
            time.sleep(0.3)
    except (EOFError, OSError, ProtocolError):
        dt = time.time() - t0
        check(T - 0.05 <= dt <= T + 2.5, "slow-loris client closed after %.1f s" % dt)
        return
    fail("slow-loris client still negotiating after %d s" % (T + 3))


def finished():
    # Reaches transmission within the limit: then it is not a handshake.
    c = RawClient(srv)
    c.handshake()
    time.sleep(T + 2)
    c.send_request(NBD_CMD_READ, 0, 4096, cookie=7)
    check_eq(c.recv_reply(4096)[:2], (7, 0), "client in transmission after %d s: READ" % (T + 2))
    c.disconnect()


def late_finisher():
    # Negotiates slowly but finishes inside the limit.
    c = RawClient(srv)
    c.start()
    time.sleep(T / 2.0)
    rtype, _ = c.go()
    check_eq(rtype, NBD_REP_ACK, "GO at %.1f s of %d" % (T / 2.0, T))
    time.sleep(T + 1)
    c.send_request(NBD_CMD_READ, 0, 4096, cookie=8)
    check_eq(c.recv_reply(4096)[:2], (8, 0), "late finisher still served")
    c.disconnect()


def default_limit():
    # Read from the start, beside the rest: the default's window must not
    # depend on how long the other checks took on a loaded machine.
    closed_between(d_idle, 9.95, 13.0, t_start, "default --handshake-timeout (10 s)")


default_thread = scenario("default 10 s", default_limit)
threads = [scenario(n, f) for n, f in (("silent", silent), ("mid-option", mid_option),
                                       ("slow loris", slow_loris), ("finished", finished),
                                       ("late finisher", late_finisher))]
# 20 silent clients at once are all dropped, and a good client is served meanwhile.
t_crowd = time.time()
crowd = [srv.connect_socket() for _ in range(20)]
for i, s in enumerate(crowd):
    closed_between(s, T - 0.05, T + 2.5, t_crowd, "silent client %d of a crowd of 20" % i)
for t in threads:
    t.join()
for name, err in results:
    if err:
        fail("scenario %s: %s" % (name, err))
c = RawClient(srv)
c.handshake()
c.send_request(NBD_CMD_READ, 0, 4096, cookie=9)
check_eq(c.recv_reply(4096)[:2], (9, 0), "a new client after the crowd was dropped")
c.disconnect()
srv.check_alive()

# Never early: with --handshake-timeout 1, clients that connect just before
# a wall-clock second boundary (where whole-second stamps would round
# them up to "one second old") stay at least 1 s.
early = Server(["ram", "size=16M"], opts=["--handshake-timeout", "1"])
worst = 10.0
for i in range(3):
    time.sleep((0.985 - time.time() % 1.0) % 1.0)
    t0 = time.time()
    s = early.connect_socket()
    closed = peer_closed_eventually(s, 3.5)
    dt = time.time() - t0
    s.close()
    if not check(closed, "--handshake-timeout 1: client %d closed by the server (%.3f s)" % (i, dt)):
        break
    worst = min(worst, dt)
check(worst >= 0.95, "--handshake-timeout 1 never drops a client early (earliest: %.3f s)" % worst)

# --handshake-timeout 0: never.
check(not peer_closed_eventually(o_idle, 0.2),
      "--handshake-timeout 0: idle client still open after %.0f s" % (time.time() - t_start))
# Default: 10 s (the connection was opened at t_start and never read).
default_thread.join()
for name, err in results:
    if err and name == "default 10 s":
        fail("scenario %s: %s" % (name, err))
PYEOF
