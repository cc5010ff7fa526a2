#!/usr/bin/python3
# Clients that hang up with lent replies unsent (ram lends its chunks):
# 64 READs of 1 MiB and a close without reading (FIN and RST), a client
# that reads a little first, and one cut in the middle of a placed WRITE
# payload.  Afterwards nothing stays lent (blkd_lend_bytes and
# blkd_write_placed_bytes are 0), no request is in flight, the buffer pool
# does not grow from one round to the next, and the data is intact.
import os
import socket
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from lendtest import MiB, metrics, read_requests, wait_metric  # noqa: E402

nbd = need_nbd()
if IS_NBDKIT:
    skip("lending is blkd's extension")

mport = free_port()
srv = Server(["ram", "size=128M"], opts=["--metrics", "127.0.0.1:%d" % mport])
golden = os.urandom(64 * MiB)
w = nbd_connect(srv)
for i in range(64):
    w.pwrite(golden[i * MiB:(i + 1) * MiB], i * MiB)
w.flush()


def reads(structured):
    c = RawClient(srv)
    c.handshake(structured=structured)
    read_requests(c, [((i * 7) % 64 * MiB, MiB) for i in range(64)])
    return c


def close_fin(structured):
    c = reads(structured)
    wait_metric(mport, lambda m: m["blkd_lend_bytes"] > 0, "replies lent")
    c.close()


def close_rst(structured):
    c = reads(structured)
    wait_metric(mport, lambda m: m["blkd_lend_bytes"] > 0, "replies lent")
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()


def read_some_close(structured):
    c = reads(structured)
    c.recv(3 * MiB + 100)
    c.close()


def cut_placed_write(structured):
    c = RawClient(srv)
    c.handshake(structured=structured)
    c.sock.sendall(RawClient.request(NBD_CMD_WRITE, 4 * MiB, MiB, cookie=9)
                   + b"\xee" * (MiB // 2 + 1000))
    wait_metric(mport, lambda m: m["blkd_write_placed_bytes"] > 0, "payload placed")
    c.close()


def settle(what):
    m = wait_metric(mport, lambda m: m["blkd_lend_bytes"] == 0 and m["blkd_write_placed_bytes"] == 0
                    and m["blkd_requests_in_flight"] == 0 and m["blkd_connections"] == 1,
                    what + ": lent memory released")
    ok(what + ": nothing lent, nothing in flight")
    return m


scenarios = [close_fin, close_rst, read_some_close, cut_placed_write]
pool = []
for rnd in range(3):
    for fn in scenarios:
        for structured in (True, False):
            fn(structured)
            settle("round %d %s %s" % (rnd, fn.__name__, "structured" if structured else "simple"))
    pool.append(metrics(mport)["blkd_iobuf_pool_bytes"])
    check(b"".join(w.pread(MiB, i * MiB) for i in range(64)) == golden, "round %d: data intact" % rnd)
check(pool[2] <= pool[1], "buffer pool does not grow from round to round (%s)" % pool)
srv.check_alive()
w.shutdown()
print("lend hang-up checks passed")
