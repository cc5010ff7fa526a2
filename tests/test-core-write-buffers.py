#!/usr/bin/python3
# A stream of big WRITEs on a copying plugin (memory, called on the shard
# thread) receives every payload into the same pool buffer: a WRITE gives
# its buffer back as soon as the plugin has its payload, not once its
# reply has gone out, so the next WRITE of the batch takes the buffer the
# plugin has just read (still in cache) instead of a new one.  The server
# is stopped while the client queues 32 pipelined 256 KiB WRITEs, so on
# resuming it finds many whole requests waiting and reads them in one
# batch: the pool must then hold one or two 256 KiB buffers, not one per
# WRITE of the batch.  Every WRITE is answered, and the data reads back.
# The same stream through worker threads (--dispatch worker) is answered
# and reads back too (its buffers go back when the worker's result
# reaches the shard).
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from lendtest import metrics  # noqa: E402

K = 1024
BS = 256 * K
N = 32

if IS_NBDKIT:
    skip("the request buffer pool is blkd's")


def stream(srv, tag, check_pool):
    data = [os.urandom(BS) for _ in range(N)]
    c = RawClient(srv, timeout=60)
    c.handshake(structured=True)
    before = metrics(srv.metrics_port)["blkd_iobuf_pool_bytes"]
    msg = b"".join(RawClient.request(NBD_CMD_WRITE, i * BS, BS, cookie=100 + i) + data[i]
                   for i in range(N))
    os.kill(srv.proc.pid, signal.SIGSTOP)
    # The socket buffers take only part of 8 MiB while the server is
    # stopped: send from a thread, resume the server, then collect.
    err = []

    def send():
        try:
            c.sock.sendall(msg)
        except OSError as e:
            err.append(e)
    t = threading.Thread(target=send)
    t.start()
    t.join(0.5)                     # queue what fits; the rest follows
    os.kill(srv.proc.pid, signal.SIGCONT)
    cookies, errors = [], []
    for _ in range(N):
        cookie, error, _, _ = c.recv_reply()
        cookies.append(cookie)
        if error:
            errors.append((cookie, error))
    check_eq(errors, [], "%s: WRITEs answered with an error" % tag)
    t.join(60)
    check(not t.is_alive() and not err, "%s: whole stream sent" % tag, str(err))
    check_eq(sorted(cookies), list(range(100, 100 + N)), "%s: every WRITE answered once" % tag)
    if check_pool:
        pool = metrics(srv.metrics_port)["blkd_iobuf_pool_bytes"]
        grown = pool - before
        check(grown <= 2 * BS, "%s: pool grew by %d KiB for %d pipelined %d KiB WRITEs "
              "(at most 2 buffers)" % (tag, grown // K, N, BS // K))
    for i in range(N):
        c.send_request(NBD_CMD_READ, i * BS, BS, cookie=1000 + i)
        cookie, error, chunks, got = c.recv_reply(read_len=BS)
        if chunks is not None:
            got = bytes(read_via_chunks(chunks, i * BS, BS)[0])
        if got != data[i]:
            check(False, "%s: data of WRITE %d reads back" % (tag, i))
            break
    else:
        ok("%s: all %d payloads read back" % (tag, N))
    c.close()


srv = Server(["memory", "size=64M"], opts=["--shards", "1", "--metrics", "127.0.0.1:0"])
stream(srv, "inline", True)
stream(srv, "inline again", True)
srv.check_alive()
srv.stop()

wsrv = Server(["memory", "size=64M"], opts=["--shards", "1", "--dispatch", "worker",
                                            "--metrics", "127.0.0.1:0"])
stream(wsrv, "workers", False)
wsrv.check_alive()
