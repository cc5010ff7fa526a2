#!/usr/bin/python3
# Small WRITEs whose payloads the read buffer holds whole, run on the shard
# thread, are written by the plugin from where they lie (no copy into a
# pool buffer first); others are copied: a payload split across reads, a
# request for a worker (--dispatch worker), which outlives the read
# buffer's contents.  The client sends batches of pipelined WRITEs of
# mixed sizes in one send (many whole requests per read), READs of what
# the batch wrote inside the same batch, and one WRITE whose payload
# comes in two sends a moment apart; every reply is right and every block
# reads back, through the inline, worker and --iobuf calloc set-ups.  On
# the shard thread requests run in the order they came, so there a READ
# in the batch sees the WRITE before it, whose payload was read in place
# (NBD promises no order between requests in flight: with workers the
# READ's data is not checked).
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

K = 1024
SIZES = [512, 4 * K, 4 * K, 8 * K, 4 * K, 16 * K, 4 * K, 1 * K]
SLOT = 32 * K


def batches(srv, tag, ordered):
    rnd = random.Random(7)
    disk = bytearray(8 * 1024 * K)
    c = RawClient(srv, timeout=30)
    c.handshake(structured=False)
    cookie = 1
    for b in range(20):
        msg, want = [], {}
        # Disjoint slots within a batch: requests in flight together may
        # run in any order (workers), so no two of them overlap.
        slots = rnd.sample(range(len(disk) // SLOT), 24)
        for i in range(24):
            n = SIZES[(b + i) % len(SIZES)]
            off = slots[i] * SLOT + rnd.randrange(0, (SLOT - n) // 512 + 1) * 512
            if i % 6 == 5:
                # A READ of a block this batch wrote: it must see that data.
                off, n = last
                msg.append(RawClient.request(NBD_CMD_READ, off, n, cookie=cookie))
                want[cookie] = bytes(disk[off:off + n])
            else:
                data = rnd.randbytes(n)
                msg.append(RawClient.request(NBD_CMD_WRITE, off, n, cookie=cookie) + data)
                disk[off:off + n] = data
                want[cookie] = None
                last = (off, n)
            cookie += 1
        c.sock.sendall(b"".join(msg))
        for _ in range(len(want)):
            k, err, _, _ = c.recv_reply()
            check_eq(err, 0, "%s: request %d answered without error" % (tag, k))
            if want[k] is not None:
                got = c.recv(len(want[k]))
                if ordered and got != want[k]:
                    check(False, "%s: a READ in the batch sees the batch's WRITE (cookie %d)"
                          % (tag, k))
            del want[k]
    # One WRITE whose payload arrives in two parts: the copy path.
    data = rnd.randbytes(8 * K)
    hdr = RawClient.request(NBD_CMD_WRITE, 4096, len(data), cookie=cookie)
    c.sock.sendall(hdr + data[:3000])
    time.sleep(0.2)
    c.sock.sendall(data[3000:])
    k, err, _, _ = c.recv_reply()
    check_eq((k, err), (cookie, 0), "%s: a WRITE split across reads is answered" % tag)
    disk[4096:4096 + len(data)] = data
    # Everything reads back.
    for off in range(0, len(disk), 256 * K):
        c.send_request(NBD_CMD_READ, off, 256 * K, cookie=1)
        _, err, _, got = c.recv_reply(256 * K)
        if err or got != disk[off:off + 256 * K]:
            check(False, "%s: the disk reads back at %d" % (tag, off))
            break
    else:
        ok("%s: %d batches of pipelined small requests, the disk reads back" % (tag, 20))
    c.close()


for tag, opts in (("inline", ["--shards", "1"]),
                  ("workers", ["--shards", "1", "--dispatch", "worker"]),
                  ("calloc", ["--iobuf", "calloc"])):
    if IS_NBDKIT and tag != "inline":
        continue
    srv = Server(["memory", "size=8M"], opts=[] if IS_NBDKIT else opts)
    batches(srv, tag, tag != "workers")
    srv.check_alive()
    srv.stop()
