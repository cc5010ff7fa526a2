# Helpers shared by the tests/test-hostile-*.py suites: RSS and fd
# sampling of the server, a second well-behaved client's round trip, and the
# case runner that checks the server after every case.  tests/test-hostile-
# lib.py checks them against a server.
import os
import socket
import struct
import sys
import time

from blkdtest import *  # noqa: F401,F403



# Extra server options for every server the hostile suites start, to run
# them over other engine modes: HOSTILE_SERVER_OPTS="--dispatch worker".
EXTRA_OPTS = os.environ.get("HOSTILE_SERVER_OPTS", "").split()


def vmrss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def nfds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def settle(srv, base_fds, secs=5.0):
    """Wait until the server's fd count is back to base (connections the
    cases left behind are closed); returns the count seen last."""
    deadline = time.time() + secs
    n = nfds(srv.proc.pid)
    while n > base_fds and time.time() < deadline:
        time.sleep(0.05)
        n = nfds(srv.proc.pid)
    return n


_rt = [0]


def round_trip(srv, what):
    """A second, well-behaved client writes a fresh pattern and reads it back."""
    _rt[0] += 1
    off = (_rt[0] % 1000) * 4096
    pat = struct.pack(">I", _rt[0]) * 1024
    c = RawClient(srv, timeout=10)
    try:
        c.handshake(structured=bool(_rt[0] % 2))
        c.send_request(NBD_CMD_WRITE, off, 4096, cookie=1, payload=pat)
        cookie, err, _, _ = c.recv_reply()
        if (cookie, err) != (1, 0):
            fail("round trip after %s: write got cookie %d error %d" % (what, cookie, err))
        c.send_request(NBD_CMD_READ, off, 4096, cookie=2)
        cookie, err, chunks, data = c.recv_reply(4096)
        if chunks is not None:
            data, _ = read_via_chunks(chunks, off, 4096)
        if (cookie, err, data) != (2, 0, pat):
            fail("round trip after %s: read back wrong data (cookie %d error %d)"
                 % (what, cookie, err))
        c.disconnect()
    except (OSError, EOFError, ProtocolError) as e:
        fail("second client could not do a round trip after %s: %s" % (what, e))


CASES = []


def case(name):
    def deco(fn):
        CASES.append((name, fn))
        return fn
    return deco


def run_cases(srv, cases, rss_slack_mib=64, batch=10):
    # One client first: whatever the server opens once, on first use (a
    # shard's worker queue, a sanitizer's report files), is not a leak.
    round_trip(srv, "warm-up")
    base_fds = settle(srv, nfds(srv.proc.pid))
    rss0 = vmrss_mib(srv.proc.pid)
    print("# server pid %d: RSS %.1f MiB, %d fds at start" % (srv.proc.pid, rss0, base_fds))
    for i, (name, fn) in enumerate(cases):
        print("## case %d: %s" % (i + 1, name))
        fn()
        srv.check_alive("server alive after: %s" % name)
        round_trip(srv, name)
        ok("second client round trip after: %s" % name)
        if (i + 1) % batch == 0 or i + 1 == len(cases):
            n = settle(srv, base_fds)
            check(n <= base_fds, "open fds back to %d after %d cases" % (base_fds, i + 1),
                  "now %d" % n)
            rss = vmrss_mib(srv.proc.pid)
            check(rss <= rss0 + rss_slack_mib,
                  "RSS flat after %d cases (%.1f -> %.1f MiB, slack %d)"
                  % (i + 1, rss0, rss, rss_slack_mib))
    print("all %d cases passed" % len(cases))


def expect_closed(sock, what, timeout=5.0):
    check(peer_closed(sock, timeout), "server closes the connection: %s" % what)


def drain_replies(c, timeout=5.0):
    """Option replies until the server closes; fails if it stays open."""
    got = []
    c.sock.settimeout(timeout)
    try:
        while True:
            opt, rtype, _ = c.recv_opt_reply()
            got.append((opt, rtype))
    except (EOFError, ConnectionResetError):
        return got
    except socket.timeout:
        fail("server did not close the connection (replies so far: %r)" % got)


def send_quiet(sock, data):
    """sendall that tolerates the server closing first."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass
