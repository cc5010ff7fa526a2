#!/usr/bin/python3
# Clients that hang up (close or TCP reset) in every transmission-phase
# state, and clients that pile up replies they never read.
#
#   after GO; mid request header; mid WRITE payload (through the input
#   buffer and straight into the request buffer); with 1, 64 and 500
#   requests in flight (reads, writes, mixed); after reading part of the
#   replies; while stalled waiting for pool buffers; with a slow plugin
#   call still running on a worker.
#
# Pile-up: a client sends 1000 x 1 MiB READs (simple replies, so every
# reply carries its data) and never reads a byte.  With --iobuf-mem 256M
# the server's RSS must stay bounded (pool bound + overhead, measured
# ~265 MiB; the check allows iobuf-mem + 160 MiB, doubled under ASan), and
# must not grow when this is repeated (buffers are reused, not leaked).
# Meanwhile a second client on another shard is served, and with one
# shard a second client on the hoarder's own shard is served too.
# After every case: server alive, second client round trip, fds and RSS flat.
import os
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from hostile import *  # noqa: E402,F401,F403

need_server()
if IS_NBDKIT:
    skip("blkd-specific hostile suite (uses --iobuf-mem and --shards)")

MiB = 1 << 20
IOBUF_MEM = 256
ASAN = b"libasan" in subprocess.run(["ldd", BLKD], capture_output=True).stdout \
    or b"__asan_init" in subprocess.run(["nm", "-D", BLKD], capture_output=True).stdout
RSS_BOUND = (IOBUF_MEM + 160) * (2 if ASAN else 1)

srv = Server(["ram", "size=256M"], opts=["--shards", "2", "--iobuf-mem", "%dM" % IOBUF_MEM] + EXTRA_OPTS)
# Data the hang-ups must not disturb.
golden = os.urandom(MiB)
c = RawClient(srv)
c.handshake()
c.send_request(NBD_CMD_WRITE, 200 * MiB, MiB, cookie=1, payload=golden, flags=NBD_CMD_FLAG_FUA)
assert c.recv_reply()[1] == 0
c.disconnect()


def golden_intact(what):
    c = RawClient(srv)
    c.handshake(structured=False)
    c.send_request(NBD_CMD_READ, 200 * MiB, MiB, cookie=2)
    _, err, _, data = c.recv_reply(MiB)
    c.disconnect()
    check(err == 0 and data == golden, "untouched data intact after: %s" % what)


def hang(c, how):
    if how == "reset":
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()


def conn(structured=True):
    c = RawClient(srv)
    c.handshake(structured=structured)
    return c


def reads(n, size=MiB, base=0, span=190):
    return b"".join(RawClient.request(NBD_CMD_READ, base + (i % span) * MiB, size, cookie=i + 1)
                    for i in range(n))


def writes(n, size=65536, base=0):
    p = os.urandom(size)
    return b"".join(RawClient.request(NBD_CMD_WRITE, base + i * size, size, cookie=i + 1) + p
                    for i in range(n))


def send_bg(c, data):
    """Send without blocking the test: the server may stop reading."""
    def run():
        try:
            c.sock.sendall(data)
        except OSError:
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def both(fn):
    """Run a scenario once with close and once with reset."""
    def run():
        for how in ("close", "reset"):
            for structured in (False, True):
                fn(how, structured)
        time.sleep(0.1)
    return run


for name, fn in [
    ("after GO, nothing sent", lambda how, st: hang(conn(st), how)),
    ("mid request header (13 bytes)",
     lambda how, st: (lambda c: (c.sock.sendall(RawClient.request(NBD_CMD_READ, 0, 512)[:13]),
                                 hang(c, how)))(conn(st))),
    ("mid small WRITE payload (through the input buffer)",
     lambda how, st: (lambda c: (c.sock.sendall(RawClient.request(NBD_CMD_WRITE, 0, 8192)
                                                + b"\1" * 3000), hang(c, how)))(conn(st))),
    ("mid 1 MiB WRITE payload (read straight into the request buffer)",
     lambda how, st: (lambda c: (c.sock.sendall(RawClient.request(NBD_CMD_WRITE, 0, MiB)
                                                + b"\1" * (600 * 1024)), hang(c, how)))(conn(st))),
    ("with 1 READ in flight", lambda how, st: (lambda c: (c.sock.sendall(reads(1)), hang(c, how)))(conn(st))),
    ("with 64 READs in flight", lambda how, st: (lambda c: (c.sock.sendall(reads(64)), hang(c, how)))(conn(st))),
    ("with 500 READs in flight",
     lambda how, st: (lambda c: (send_bg(c, reads(500, 65536)).join(2), hang(c, how)))(conn(st))),
    ("with 500 WRITEs in flight",
     lambda how, st: (lambda c: (send_bg(c, writes(500, 4096)).join(2), hang(c, how)))(conn(st))),
    ("with 500 mixed requests in flight",
     lambda how, st: (lambda c: (send_bg(c, b"".join(
         RawClient.request(NBD_CMD_READ, i * 65536, 65536, cookie=i) if i % 3 else
         RawClient.request(NBD_CMD_WRITE, i * 65536, 4096, cookie=i) + b"\2" * 4096
         for i in range(500))).join(2), hang(c, how)))(conn(st))),
    ("after reading 64 KiB of 64 x 1 MiB replies",
     lambda how, st: (lambda c: (c.sock.sendall(reads(64)), c.recv(65536), hang(c, how)))(conn(st))),
]:
    CASES.append((name, both(fn)))


@case("DISC right after 500 READs: replies sent, then closed")
def _():
    c = conn(structured=False)
    t = send_bg(c, reads(500, 4096) + RawClient.request(NBD_CMD_DISC))
    for i in range(500):
        cookie, err, _, _ = c.recv_reply(4096)
        if err:
            fail("READ %d before DISC failed: %d" % (cookie, err))
    t.join()
    check(peer_closed(c.sock), "closed after DISC with 500 READs answered")
    c.close()


def pile_up(n=1000, hold=1.5, sample=True):
    """A client sends n x 1 MiB READs and reads nothing; returns peak RSS."""
    c = conn(structured=False)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    t = send_bg(c, reads(n))
    peak = 0.0
    deadline = time.time() + hold
    while time.time() < deadline:
        peak = max(peak, vmrss_mib(srv.proc.pid))
        time.sleep(0.05)
    return c, t, peak


@case("1000 x 1 MiB READs never read: RSS bounded, other shard served, close")
def _():
    c, t, peak = pile_up()
    check(peak <= RSS_BOUND, "RSS while 1000 x 1 MiB replies pile up: %.0f MiB <= %d MiB"
          % (peak, RSS_BOUND))
    # With two shards and one hoarder, a new client lands on the other one.
    round_trip(srv, "a pile-up in progress on the other shard")
    ok("another client served while replies pile up")
    hang(c, "close")
    t.join(5)


@case("a non-reading client does not starve its own shard (--shards 1)")
def _():
    # One connection may hold only its share of the shard's pool, so a
    # client that never reads cannot park every other client.
    s2 = Server(["ram", "size=64M"], opts=["--shards", "1", "--iobuf-mem", "64M"] + EXTRA_OPTS)
    c = RawClient(s2)
    c.handshake(structured=False)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    t = send_bg(c, reads(1000, span=60))
    time.sleep(1.0)
    d = RawClient(s2, timeout=5)
    try:
        d.handshake(structured=False)
        for i in range(20):
            d.send_request(NBD_CMD_READ, i * MiB, MiB, cookie=i)
            got = d.recv_reply(MiB)[:2]
            if got != (i, 0):
                fail("second client's READ %d on the hoarder's shard: %r" % (i, got))
    except (OSError, EOFError) as e:
        fail("second client on the hoarder's shard starved: %s" % e)
    ok("20 x 1 MiB READs by a second client on the hoarder's shard")
    d.disconnect()
    hang(c, "close")
    t.join(5)
    s2.stop()


@case("pile-up repeated 4 times (close, reset, DISC unread): RSS does not grow")
def _():
    peaks = []
    for how in ("close", "reset", "disc", "close"):
        c, t, peak = pile_up(hold=1.0)
        peaks.append(peak)
        if how == "disc":
            # DISC queued behind the stalled reads; the client then leaves.
            send_quiet(c.sock, RawClient.request(NBD_CMD_DISC))
            how = "close"
        hang(c, how)
        t.join(5)
        time.sleep(0.2)
    check(max(peaks) <= RSS_BOUND, "peak RSS over 4 pile-ups %s MiB <= %d"
          % ([int(p) for p in peaks], RSS_BOUND))
    check(peaks[-1] <= peaks[0] + 32, "RSS of the 4th pile-up not above the 1st + 32 MiB")


@case("hang up while stalled waiting for pool buffers (both shards full)")
def _():
    a, ta, _ = pile_up(hold=0.5, sample=False)
    b, tb, _ = pile_up(hold=0.5, sample=False)
    # Both shards' pools are now held by unread replies; a third client
    # stalls on a buffer, then gives up.
    c = conn(structured=False)
    c.sock.sendall(reads(4))
    time.sleep(0.3)
    hang(c, "reset")
    for x, t in ((a, ta), (b, tb)):
        hang(x, "close")
        t.join(5)


def slow_plugin_case():
    """A request still running below the protocol (on a worker) when the
    client hangs up: the reply has nowhere to go and must just be freed.
    The delay filter holds each read and write 300 ms (its sleep ends early
    when the client goes, which is the race this case is after)."""
    if not os.path.exists(os.path.join(FILTERDIR, "nbdkit-delay-filter.so")):
        note("nbdkit delay filter not installed: slow-plugin hang-up case skipped")
        return
    s2 = Server(["memory", "1M", "delay-read=300ms", "delay-write=300ms"],
                opts=["--threads", "4", "--filter=delay"])
    for how in ("close", "reset"):
        c = RawClient(s2)
        c.handshake()
        c.sock.sendall(reads(3, 4096, span=1) + writes(3, 4096))
        time.sleep(0.1)
        hang(c, how)
    time.sleep(1.0)
    s2.check_alive("server alive after hang-ups with plugin calls running")
    c = RawClient(s2)
    c.handshake(structured=False)
    c.send_request(NBD_CMD_READ, 0, 4096, cookie=1)
    check_eq(c.recv_reply(4096)[:2], (1, 0), "slow plugin still serves a new client")
    c.disconnect()
    s2.stop()


CASES.append(("hang-ups while plugin calls run on workers (delay filter)", slow_plugin_case))

run_cases(srv, CASES, rss_slack_mib=RSS_BOUND, batch=4)
golden_intact("all hang-ups")
print("RSS bound used: %d MiB (iobuf-mem %d MiB%s)" % (RSS_BOUND, IOBUF_MEM,
                                                        ", ASan build" if ASAN else ""))
