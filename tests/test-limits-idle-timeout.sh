#!/usr/bin/env bash
# --idle-timeout S: a transmission-phase client with nothing in flight and
# no request for S seconds is disconnected; a client that keeps sending
# requests is not; a request running in the plugin longer than S does not
# count as idle; the handshake phase is not subject to it; 0 (the
# default) never disconnects.  Skips while blkd lacks the option.
. "$(dirname "$0")/lib.sh"
[ -x "$BLKD" ] || skip "no blkd binary at $BLKD"
: "${PYTHON:=/usr/bin/python3}"
export TOP
"$PYTHON" - <<'PYEOF'
import os, sys, time, socket, struct, threading
sys.path.insert(0, os.path.join(os.environ["TOP"], "tests", "helpers"))
from blkdtest import *

T = 2
srv = Server(["ram", "size=16M"], opts=["--idle-timeout", str(T), "--handshake-timeout", "0"])
dflt = Server(["ram", "size=16M"])
EVAL = os.path.join(NBDKIT_PLUGINDIR, "nbdkit-eval-plugin.so")
slow = None
if os.path.exists(EVAL):
    slow = Server(["eval", "get_size=echo 1048576", "open=echo h",
                   "pread=sleep %d; head -c $3 /dev/zero" % (T + 2), "thread_model=echo parallel"],
                  opts=["--idle-timeout", str(T)])


def wait_closed(sock, secs):
    """True if the server closes sock within secs (data is read and dropped)."""
    sock.settimeout(secs)
    t = time.time()
    try:
        while True:
            if not sock.recv(65536):
                return time.time() - t
    except (ConnectionResetError, BrokenPipeError):
        return time.time() - t
    except socket.timeout:
        return None


results = []


def scenario(fn):
    def run():
        try:
            fn()
            results.append((fn.__name__, None))
        except SystemExit:
            results.append((fn.__name__, "failed"))
        except Exception as e:
            results.append((fn.__name__, repr(e)))
    th = threading.Thread(target=run)
    th.start()
    return th


def idle_after_go():
    c = RawClient(srv)
    c.handshake()
    t0 = time.time()
    dt = wait_closed(c.sock, T + 3)
    check(dt is not None, "idle client dropped within %d s" % (T + 3))
    dt = time.time() - t0
    # A sweep once a second: up to 1 s late, never early.
    check(T - 0.05 <= dt <= T + 2.5, "idle client dropped after %.1f s (limit %d)" % (dt, T))


def idle_after_requests():
    c = RawClient(srv)
    c.handshake()
    for i in range(3):
        c.send_request(NBD_CMD_READ, 0, 4096, cookie=i)
        c.recv_reply(4096)
    t0 = time.time()
    dt = wait_closed(c.sock, T + 3)
    check(dt is not None and T - 0.05 <= time.time() - t0 <= T + 2.5,
          "client idle after 3 READs dropped after %.1f s" % (time.time() - t0))


def busy():
    c = RawClient(srv)
    c.handshake()
    t0 = time.time()
    n = 0
    while time.time() - t0 < T + 2.5:
        c.send_request(NBD_CMD_READ, 0, 4096, cookie=n)
        got = c.recv_reply(4096)[:2]
        if got != (n, 0):
            fail("busy client READ %d: got %r" % (n, got))
        n += 1
        time.sleep(0.4)
    ok("busy client (a READ every 0.4 s) kept for %.1f s" % (time.time() - t0))
    c.disconnect()


def handshake_not_idle():
    c = RawClient(srv)
    c.start()
    dt = wait_closed(c.sock, T + 2)
    check(dt is None, "a client in the handshake is not subject to --idle-timeout")
    rtype, _ = c.go()
    check_eq(rtype, NBD_REP_ACK, "GO after %d s in the handshake" % (T + 2))
    c.disconnect()


def long_request():
    if not slow:
        note("nbdkit eval plugin not installed: long in-flight request case skipped")
        return
    c = RawClient(slow)
    c.handshake()
    t0 = time.time()
    c.send_request(NBD_CMD_READ, 0, 4096, cookie=77)
    c.sock.settimeout(T + 10)
    cookie, err, _, _ = c.recv_reply(4096)
    check_eq((cookie, err), (77, 0), "a READ running %.1f s (> %d s idle limit) completes"
             % (time.time() - t0, T))
    dt = wait_closed(c.sock, T + 3)
    check(dt is not None, "then idle again: dropped")


def default_never():
    c = RawClient(dflt)
    c.handshake()
    check(wait_closed(c.sock, T + 2) is None, "default (no --idle-timeout): idle client kept")
    c.send_request(NBD_CMD_READ, 0, 4096, cookie=5)
    check_eq(c.recv_reply(4096)[:2], (5, 0), "default: READ after %d s idle" % (T + 2))
    c.disconnect()


threads = [scenario(f) for f in (idle_after_go, idle_after_requests, busy, handshake_not_idle,
                                 long_request, default_never)]
for t in threads:
    t.join()
for name, err in results:
    if err:
        fail("scenario %s: %s" % (name, err))
srv.check_alive()
c = RawClient(srv)
c.handshake()
c.send_request(NBD_CMD_READ, 0, 4096, cookie=9)
check_eq(c.recv_reply(4096)[:2], (9, 0), "a new client after the idle ones were dropped")
c.disconnect()
PYEOF
