#!/usr/bin/python3
# How blkd's TLS send path groups records, counted with strace:
#  - small replies are gathered: a reply smaller than a record shares its
#    record with the replies behind it, and records that are not full
#    are collected and sent several at a time: 64 pipelined 512-byte
#    READs, sent by the client in one write, come back in a few sends,
#    and 4 KiB READs in about one send per 16 KiB record (one send per
#    reply would be 64 a burst);
#  - a full 16 KiB record with nothing queued ahead goes to the socket
#    straight from OpenSSL's buffer, one send each, never split into
#    more (256 KiB READs: 16 records each);
# and every byte read back is the byte written, through both paths and
# a mix of them.  Skips the counts where strace cannot attach.
import os
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

if IS_NBDKIT:
    skip("blkd's TLS send path")
need_server()
T = tls_material()
import ssl  # noqa: E402

SMALL, BIG, BURST, BURSTS = 4096, 256 * 1024, 64, 8
srv = Server(["memory", "64M"],
             opts=["--tls=require", "--tls-certificates=" + os.path.join(T, "server")])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.load_verify_locations(os.path.join(T, "client-ca", "ca-cert.pem"))
c = RawClient(srv)
c.start()
_, rtype, _ = c.opt_replies(NBD_OPT_STARTTLS)
check_eq(rtype, NBD_REP_ACK, "STARTTLS answer")
c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost")
rtype, _ = c.go()
check_eq(rtype, NBD_REP_ACK, "GO over TLS")

# Known data: 4 MiB of a pattern that differs in every 4 KiB block.
DATA = b"".join(struct.pack(">Q", i) * (SMALL // 8) for i in range(1024))
for off in range(0, len(DATA), BIG):
    c.send_request(NBD_CMD_WRITE, off, BIG, cookie=off, payload=DATA[off:off + BIG])
    cookie, err = c.recv_reply()[:2]
    if (cookie, err) != (off, 0):
        fail("WRITE at %d: cookie %d, error %d" % (off, cookie, err))
ok("4 MiB written")


def burst(size, count, base):
    """count READs of size pipelined in one write; the replies checked."""
    reqs = b"".join(c.request(NBD_CMD_READ, (base + i * size) % len(DATA), size, cookie=i)
                    for i in range(count))
    c.sock.sendall(reqs)
    for i in range(count):
        cookie, err, _, data = c.recv_reply(size)
        off = (base + cookie * size) % len(DATA)
        if err or data != DATA[off:off + size]:
            fail("READ %d of %d bytes at %d: error %d, %s" %
                 (cookie, size, off, err, "data wrong" if not err else ""))


class SendCounter:
    """strace on the server's threads, counting successful sends to sockets
    (descriptors above 2: stderr is the log)."""

    def __init__(self, pid):
        self.path = os.path.join(TMP, "strace.%d" % time.monotonic_ns())
        self.p = subprocess.Popen(["strace", "-f", "-qq", "-e",
                                   "trace=write,writev,sendto,sendmsg",
                                   "-o", self.path, "-p", str(pid)],
                                  stderr=subprocess.DEVNULL)
        for _ in range(100):
            if os.path.exists(self.path) or self.p.poll() is not None:
                break
            time.sleep(0.1)
        time.sleep(0.5)
        self.ok = self.p.poll() is None

    def stop(self):
        self.p.send_signal(signal.SIGINT)
        self.p.wait(10)
        calls = nbytes = 0
        for line in open(self.path):
            f = line.split(None, 1)
            if len(f) < 2 or "(" not in f[1] or "=" not in f[1]:
                continue
            name, rest = f[1].split("(", 1)
            if name not in ("write", "writev", "sendto", "sendmsg"):
                continue
            try:
                fd = int(rest.split(",", 1)[0])
                n = int(f[1].rsplit("=", 1)[1].split()[0])
            except ValueError:
                continue
            if fd > 2 and n > 0:
                calls += 1
                nbytes += n
        return calls, nbytes


def counted(size, count, bursts, what):
    have = subprocess.run(["sh", "-c", "command -v strace"], capture_output=True).returncode == 0
    sc = SendCounter(srv.proc.pid) if have else None
    if sc and not sc.ok:
        sc = None
    # One burst more than the byte check asks for: strace attaches to the
    # server's threads one by one, and may miss the first sends.  The
    # bounds on sends count all bursts + 1.
    for b in range(bursts + 1):
        burst(size, count, b * count * size)
    ok("%s: %d replies read back exact" % (what, count * (bursts + 1)))
    if not sc:
        note("strace missing or refused: %s not counted" % what)
        return None
    calls, nbytes = sc.stop()
    want = count * bursts * size
    check(nbytes >= want, "%s: strace saw %d bytes sent (at least %d)" % (what, nbytes, want))
    return calls


calls = counted(512, BURST, BURSTS, "512-byte READs in bursts of %d" % BURST)
if calls is not None:
    replies = BURST * (BURSTS + 1)
    # 64 replies of 528 bytes are 34 KiB: three records, and the shard
    # sends every --reply-batch (8) replies: at most 8 sends a burst.
    check(calls <= replies // 8,
          "small records batched: %d sends for %d replies (one per reply would be %d)"
          % (calls, replies, replies))

calls = counted(SMALL, BURST, BURSTS, "4 KiB READs in bursts of %d" % BURST)
if calls is not None:
    replies = BURST * (BURSTS + 1)
    # Four replies of 4112 bytes fill a 16 KiB record nearly: a send per
    # record is a send per four replies; allow one per three.
    check(calls <= replies // 3,
          "4 KiB replies share records: %d sends for %d replies (one per reply would be %d)"
          % (calls, replies, replies))

calls = counted(BIG, 4, BURSTS, "256 KiB READs in bursts of 4")
if calls is not None:
    records = 4 * (BURSTS + 1) * (BIG // 16384)
    check(calls <= records + 4 * BURSTS,
          "full records sent whole: %d sends for %d records" % (calls, records))

# A mix: small replies queued ahead of a big one keep their order.
reqs = b""
for i in range(16):
    size = BIG if i % 5 == 4 else SMALL
    reqs += c.request(NBD_CMD_READ, i * BIG, size, cookie=i)
c.sock.sendall(reqs)
for i in range(16):
    size = BIG if i % 5 == 4 else SMALL
    cookie, err, _, data = c.recv_reply(size)
    if cookie != i or err or data != DATA[i * BIG:i * BIG + size]:
        fail("mixed READ %d (%d bytes): cookie %d, error %d, %s" %
             (i, size, cookie, err, "data exact" if data == DATA[i * BIG:i * BIG + size]
              else "data wrong"))
ok("16 mixed 4 KiB and 256 KiB READs in order and exact")
c.send_request(NBD_CMD_DISC)
c.close()
srv.check_alive()
