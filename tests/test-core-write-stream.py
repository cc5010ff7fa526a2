#!/usr/bin/python3
# The WRITE payload path: big payloads are read straight into their buffer
# together with the next request's header, a run of big writes reads each
# header alone so its payload skips rbuf, and while part of a big payload
# is still on its way the kernel is asked (SO_RCVLOWAT) to wake the shard
# only once the rest is there.  Checks, on a copying plugin (memory) and
# on one that places payloads (ram): big and small writes pipelined in one
# send read back in order; a big write's payload and the next header split
# at every awkward place; a payload sent slowly, piece by piece, completes
# and costs far fewer wake-ups than pieces; a lone request after a slow
# payload is answered (the low-water mark went back to one byte); a READ
# sent before a half-sent payload is answered while the payload waits.
# The same cases run over a Unix socket, where the mark has no effect.
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

K = 1024
MiB = 1024 * K


def shard_thread(pid):
    """The task id of the one shard thread (--shards 1: "blkd.s0")."""
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                if f.read().strip() == "blkd.s0":
                    return int(tid)
        except OSError:
            pass
    return None


def wakeups(pid, tid):
    """Times the thread went to sleep and was woken (voluntary switches)."""
    with open("/proc/%d/task/%d/status" % (pid, tid)) as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    return 0


def write_req(off, n, cookie):
    return RawClient.request(NBD_CMD_WRITE, off, n, cookie=cookie)


def expect_ok(c, cookies, what, read_len=0):
    """Replies for every cookie (any order), all successful."""
    want = set(cookies)
    while want:
        cookie, err, _, _ = c.recv_reply(read_len)
        if cookie not in want:
            fail("%s: unexpected reply cookie %d" % (what, cookie))
        if err:
            fail("%s: request %d failed with %d" % (what, cookie, err))
        want.discard(cookie)


def run(plugin, poll_us, unix=False):
    # One shard: its voluntary context switches are its sleeps in epoll
    # (with polling too: the pauses below are far longer than its window).
    # On a Unix socket the kernel ignores SO_RCVLOWAT in poll: the same
    # cases must pass, only the wake-ups are not counted.
    srv = Server([plugin, "size=64M"], unix=unix,
                 opts=[] if IS_NBDKIT else ["--shards", "1", "--poll-us", poll_us])
    if unix:
        plugin += " (unix)"
    h = nbd_connect(srv)

    # Big and small writes, a READ and a FLUSH between them, one send.
    c = RawClient(srv)
    c.handshake(structured=False)
    expect = {}
    stream = b""
    cookies = []
    for i in range(40):
        off = i * 320 * K
        n = (256 * K, 4 * K, 64 * K, 512, 33 * K)[i % 5]
        payload = os.urandom(n)
        expect[off] = payload
        stream += write_req(off, n, 1000 + i) + payload
        cookies.append(1000 + i)
    c.sock.sendall(stream)
    expect_ok(c, cookies, "%s: 40 pipelined writes" % plugin)
    bad = 0
    for off, payload in expect.items():
        if h.pread(len(payload), off) != payload:
            bad += 1
    check(bad == 0, "%s: 40 pipelined writes of mixed sizes read back" % plugin,
          "%d do not" % bad)

    # The same range written twice back to back: the second wins (the
    # payloads land in order even when each is read straight into place).
    first, second = os.urandom(256 * K), os.urandom(256 * K)
    c.sock.sendall(write_req(16 * MiB, 256 * K, 1) + first
                   + write_req(16 * MiB, 256 * K, 2) + second
                   + RawClient.request(NBD_CMD_READ, 16 * MiB, 256 * K, cookie=3))
    expect_ok(c, [1, 2], "%s: overwrite" % plugin)
    cookie, err, _, data = c.recv_reply(256 * K)
    check(cookie == 3 and err == 0 and data == second,
          "%s: a READ right behind two writes of its range sees the second" % plugin)

    # Split points around the payload's end and the next header: the
    # stream is sent in two pieces with a pause, so each split is seen.
    base = 20 * MiB
    a, b = os.urandom(256 * K), os.urandom(64 * K)
    whole = write_req(base, 256 * K, 11) + a + write_req(base + 256 * K, 64 * K, 12) + b
    end_a = 28 + 256 * K
    for cut in (28, 29, 28 + 32 * K, end_a - 1, end_a, end_a + 1, end_a + 27, end_a + 28,
                end_a + 29):
        c.sock.sendall(whole[:cut])
        time.sleep(0.05)
        c.sock.sendall(whole[cut:])
        expect_ok(c, [11, 12], "%s: split at %d" % (plugin, cut))
    check(h.pread(256 * K, base) == a and h.pread(64 * K, base + 256 * K) == b,
          "%s: a big write and the next split at 9 awkward places read back" % plugin)

    # A big payload sent slowly: 32 pieces with pauses.  Without a
    # low-water mark the shard wakes for every piece; with it, about once.
    pid = srv.proc.pid
    tid = None if IS_NBDKIT or unix else shard_thread(pid)
    if tid is None and not IS_NBDKIT and not unix:
        fail("no shard thread named blkd.s0 in the server")
    slow = os.urandom(MiB)
    piece = len(slow) // 32
    w0 = wakeups(pid, tid) if tid else 0
    c.sock.sendall(write_req(24 * MiB, MiB, 21))
    for i in range(32):
        time.sleep(0.03)
        c.sock.sendall(slow[i * piece:(i + 1) * piece])
    expect_ok(c, [21], "%s: slow payload" % plugin)
    woke = wakeups(pid, tid) - w0 if tid else 0
    if tid and blkd_only("%s: slow payload wake-ups" % plugin, "SO_RCVLOWAT is blkd's"):
        check(woke < 16, "%s: a slowly sent payload wakes the shard fewer times than it "
              "has pieces" % plugin, "%d wake-ups" % woke)
        note("%s: %d wake-ups of the shard for a payload sent in 32 pieces" % (plugin, woke))
    check(h.pread(MiB, 24 * MiB) == slow, "%s: the slowly sent payload reads back" % plugin)

    # Right after it, a lone small request must be answered: the mark is
    # back to one byte (else this READ would wait for ever).
    c.send_request(NBD_CMD_READ, 24 * MiB, 4 * K, cookie=22)
    cookie, err, _, data = c.recv_reply(4 * K)
    check(cookie == 22 and err == 0 and data == slow[:4 * K],
          "%s: a lone READ after a slow payload is answered" % plugin)

    # A READ sent before a half-sent big payload is answered while the
    # rest of the payload has not come.
    h.pwrite(b"\x5a" * 4 * K, 30 * MiB)
    c.sock.sendall(RawClient.request(NBD_CMD_READ, 30 * MiB, 4 * K, cookie=31)
                   + write_req(31 * MiB, 512 * K, 32) + b"\x01" * (100 * K))
    cookie, err, _, data = c.recv_reply(4 * K)
    check(cookie == 31 and err == 0 and data == b"\x5a" * 4 * K,
          "%s: a READ ahead of a half-sent payload is answered" % plugin)
    c.sock.sendall(b"\x01" * (412 * K))
    expect_ok(c, [32], "%s: the half-sent payload, finished" % plugin)
    check(h.pread(512 * K, 31 * MiB) == b"\x01" * (512 * K),
          "%s: the payload finished after a pause reads back" % plugin)

    # Many small writes back to back, then a hang-up mid-payload of a big
    # one: the server stays up and serves the next client.
    stream = b"".join(write_req(40 * MiB + i * 4 * K, 4 * K, 100 + i)
                      + struct.pack(">I", i) * K for i in range(256))
    c.sock.sendall(stream)
    expect_ok(c, range(100, 356), "%s: 256 small writes" % plugin)
    check(all(h.pread(4 * K, 40 * MiB + i * 4 * K) == struct.pack(">I", i) * K
              for i in (0, 1, 127, 255)), "%s: 256 small writes back to back read back" % plugin)
    c.sock.sendall(write_req(48 * MiB, 256 * K, 400) + b"\x02" * (100 * K))
    c.close()
    h2 = nbd_connect(srv)
    h2.pwrite(b"\x03" * 4096, 0)
    check(h2.pread(4096, 0) == b"\x03" * 4096, "%s: served after a hang-up mid-payload" % plugin)
    srv.check_alive("%s: server up after the write-stream cases" % plugin)


run("memory", "0")
if not IS_NBDKIT:
    run("ram", "50")
    run("memory", "50", unix=True)
