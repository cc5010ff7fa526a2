#!/usr/bin/python3
# Clients that stream big WRITEs and then misbehave.  While the shard works
# through such a stream it raises the socket's receive low-water mark far
# above anything queued and must put it back before it sleeps; a shard
# asleep with a mark the client never reaches hangs the client.  Every
# step here waits on the server with a socket timeout, so a hang fails.
#
#   a stream that stops in the middle of a payload (the replies before it
#   come, the rest of it is answered, a lone READ after it too); big
#   WRITEs mixed with small READs; a client that does not read its
#   replies for a while; a payload and a small request sent a byte at a
#   time; a payload shorter than its header said, completed later; EOF
#   in the middle of a payload after a stream; meanwhile a second client
#   on the same shard is served.  Under one shard with and without
#   polling, the default shards, and a pool so small that reading stops
#   for buffers.  Then live restarts (SIGUSR2): one while the stream
#   stands still in the middle of a payload, one while it flows; the
#   mark travels with the socket to the next image, which must still
#   wake for a lone READ.
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from restarttest import *  # noqa: E402,F401,F403

need_server()
if IS_NBDKIT:
    skip("blkd's receive path (--shards, --poll-us, live restart)")

K = 1024
MiB = K * K
BS = 256 * K
SIZE = 64 * MiB
TIMEOUT = 20                      # a hang shows as a timeout on the socket


class Client:
    """A raw client with simple replies and a model of what it wrote."""

    def __init__(self, srv, model):
        self.c = RawClient(srv, timeout=TIMEOUT)
        self.c.handshake(structured=False)
        self.sock = self.c.sock
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.model = model
        self.lens = {}            # cookie -> READ length, for the replies
        self.cookie = 0

    def write(self, offset, data):
        self.cookie += 1
        self.model[offset:offset + len(data)] = data
        return RawClient.request(NBD_CMD_WRITE, offset, len(data), cookie=self.cookie) + data

    def read(self, offset, length):
        self.cookie += 1
        self.lens[self.cookie] = (offset, length)
        return RawClient.request(NBD_CMD_READ, offset, length, cookie=self.cookie)

    def send_bg(self, data):
        t = threading.Thread(target=self.sock.sendall, args=(data,), daemon=True)
        t.start()
        return t

    def replies(self, n, what):
        """n replies, each without error; READs compared with the model."""
        for i in range(n):
            try:
                magic, err, cookie = struct.unpack(">IIQ", recv_exact(self.sock, 16))
                if magic != NBD_SIMPLE_REPLY_MAGIC:
                    fail("%s: bad reply magic %#x" % (what, magic))
                if err:
                    fail("%s: request %d failed with %d" % (what, cookie, err))
                if cookie in self.lens:
                    off, length = self.lens.pop(cookie)
                    if recv_exact(self.sock, length) != bytes(self.model[off:off + length]):
                        fail("%s: READ %d does not match what was written" % (what, cookie))
            except socket.timeout:
                fail("%s: no reply %d of %d within %d s (the server sleeps)"
                     % (what, i + 1, n, TIMEOUT))

    def lone_read(self, what):
        self.sock.sendall(self.read(0, 4096))
        self.replies(1, what + ", then a lone READ")

    def finish(self, sender, n, what):
        """n replies, the sender thread (if any) done, then a lone READ
        answered."""
        self.replies(n, what)
        if sender:
            sender.join(TIMEOUT)
        self.lone_read(what)
        self.c.close()

    def close(self):
        self.c.close()


def blocks(n):
    return [os.urandom(BS) for _ in range(n)]


def neighbour(srv, model, what):
    """A second client (on the same shard with --shards 1) is served."""
    o = Client(srv, model)
    o.lone_read(what + ": another client")
    o.close()


def stop_mid_payload(srv, model, base):
    c = Client(srv, model)
    data = b"".join(c.write(base + i * BS, b) for i, b in enumerate(blocks(16)))
    last = os.urandom(BS)
    tail = c.write(base + 16 * BS, last)
    half = len(tail) // 2
    t = c.send_bg(data + tail[:half])
    c.replies(16, "stream stopped mid-payload")
    t.join(TIMEOUT)
    time.sleep(0.3)               # the shard goes to sleep now
    neighbour(srv, model, "stream stopped mid-payload")
    c.sock.sendall(tail[half:])
    c.finish(None, 1, "the stopped payload completed")
    ok("a stream stopped in the middle of a payload: answered before and after")


def mixed(srv, model, base):
    c = Client(srv, model)
    out = []
    for i in range(24):
        out.append(c.write(base + i * BS, os.urandom(BS)))
        out.append(c.read(4096 * i, 4096 if i % 3 else BS))   # earlier data only
    c.finish(c.send_bg(b"".join(out)), 48, "big WRITEs mixed with READs")
    ok("big WRITEs mixed with small and big READs, pipelined")


def no_reader(srv, model, base):
    c = Client(srv, model)
    out = [c.write(base + i * BS, b) for i, b in enumerate(blocks(32))]
    out += [c.read((i % 16) * BS, BS) for i in range(32)]   # earlier data only
    t = c.send_bg(b"".join(out))
    time.sleep(1)                 # replies pile up, unread
    neighbour(srv, model, "a client that does not read")
    c.finish(t, 64, "replies read late")
    ok("a client that leaves its replies unread for a while")


def bytewise(srv, model, base):
    c = Client(srv, model)
    msg = c.write(base, os.urandom(64 * K)) + c.read(4096, 4096) \
        + c.write(base + 64 * K, os.urandom(BS)) + c.read(0, 512)
    for i in range(0, 1200):      # headers and the start of a payload, a byte each
        c.sock.send(msg[i:i + 1])
    for i in range(1200, len(msg), 997):
        c.sock.sendall(msg[i:i + 997])
    c.finish(None, 4, "sent a byte at a time")
    ok("big and small requests sent a byte, then a few hundred bytes, at a time")


def short_payload(srv, model, base):
    c = Client(srv, model)
    data = b"".join(c.write(base + i * BS, b) for i, b in enumerate(blocks(4)))
    msg = c.write(base + 4 * BS, os.urandom(MiB))
    # The client means a READ next, but it is part of the payload the
    # header announced: the server must wait for the rest, then answer.
    c.sock.sendall(data + msg[:300 * K] + RawClient.request(NBD_CMD_READ, 0, 4096, cookie=77))
    c.replies(4, "a short payload")
    c.sock.settimeout(0.5)
    try:
        got = c.sock.recv(1)
        fail("a reply (%r) to a WRITE whose payload has not all come" % got)
    except socket.timeout:
        pass
    c.sock.settimeout(TIMEOUT)
    c.sock.sendall(msg[300 * K + 28:])
    at = base + 4 * BS + 300 * K - 28
    c.model[at:at + 28] = RawClient.request(NBD_CMD_READ, 0, 4096, cookie=77)
    c.finish(None, 1, "a short payload completed")
    ok("a payload shorter than its header said is answered once it is whole")


def eof_mid_payload(srv, model, base):
    c = Client(srv, model)
    data = b"".join(c.write(base + i * BS, b) for i, b in enumerate(blocks(8)))
    tail = RawClient.request(NBD_CMD_WRITE, base + 8 * BS, BS, cookie=99) + bytes(BS // 3)
    c.sock.sendall(data + tail)
    c.sock.shutdown(socket.SHUT_WR)
    c.replies(8, "EOF mid-payload")
    try:
        check_eq(c.sock.recv(1), b"", "EOF mid-payload: the server closes")
    except socket.timeout:
        fail("EOF mid-payload: the server did not close within %d s" % TIMEOUT)
    c.close()
    neighbour(srv, model, "EOF mid-payload")
    ok("EOF in the middle of a payload after a stream: closed")


CONFIGS = [
    ("one shard, no polling", ["--shards", "1", "--poll-us", "0"]),
    ("one shard, polling", ["--shards", "1", "--poll-us", "500"]),
    ("default shards", []),
    ("one shard, a small pool", ["--shards", "1", "--max-inflight", "4",
                                  "--max-request", "1M", "--iobuf-mem", "2M"]),
]
for name, opts in CONFIGS:
    print("# " + name)
    srv = Server(["ram", "size=%d" % SIZE], opts=opts)
    model = bytearray(SIZE)
    stop_mid_payload(srv, model, 0)
    mixed(srv, model, 8 * MiB)
    no_reader(srv, model, 16 * MiB)
    bytewise(srv, model, 28 * MiB)
    short_payload(srv, model, 32 * MiB)
    eof_mid_payload(srv, model, 40 * MiB)
    srv.check_alive(name + ": server alive")
    srv.stop()

# ---- live restarts in the middle of a stream -----------------------------
print("# live restarts in the middle of a big-WRITE stream")
need_live_restart()
path = disk("stream.img", SIZE)
srv = restart_server(["file", "file=" + path], opts=["--shards", "1", "--restart-timeout=10"])
model = bytearray(SIZE)
c = Client(srv, model)
for rnd in range(2):
    what = "live restart %d" % (rnd + 1)
    data = b"".join(c.write(rnd * 32 * MiB + i * BS, b) for i, b in enumerate(blocks(96)))
    if rnd == 0:
        # The signal comes while the stream stands still in the middle
        # of a payload: the hand-over waits for the rest of it.
        cut = 8 * (BS + 28) + BS // 2
        c.sock.sendall(data[:cut])
        c.replies(8, what + ": before the signal")
        r = threading.Thread(target=restart, args=(srv,))
        r.start()
        time.sleep(0.3)
        t = c.send_bg(data[cut:])
        r.join(60)
        check(not r.is_alive(), what + ": done")
        c.replies(88, what + ": the stream's rest")
    else:
        t = c.send_bg(data)     # the signal while the stream flows
        restart(srv)
        c.replies(96, "stream across " + what)
    t.join(TIMEOUT)
    c.lone_read(what)
    # The next image adopted the socket: it must still wake for a lone
    # request, and stream again.
    t = c.send_bg(c.write(rnd * 32 * MiB + 96 * BS, os.urandom(BS)) + c.read(rnd * 32 * MiB, BS))
    c.replies(2, "after " + what)
    t.join(TIMEOUT)
c.close()
with open(path, "rb") as f:
    check(f.read() == bytes(model), "the file holds every write streamed across the restarts")
srv.check_alive("server alive after the restarts")
srv.stop()
ok("big-WRITE streams across two live restarts: answered, then a lone READ too")
