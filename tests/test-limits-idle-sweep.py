#!/usr/bin/python3
# --idle-timeout after a slow handshake, with --handshake-timeout 0: the
# shard's once-a-second timeout sweep runs only while some connection may
# time out, and a connection still in its handshake may, once it reaches
# transmission (nothing arms the sweep again then: only a new connection
# does).  A client that stands in its handshake across two sweeps, then
# finishes it, sends one request and falls idle is still disconnected by
# --idle-timeout, and not before it.
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

if IS_NBDKIT:
    skip("the shard's timeout sweep is blkd's")

T = 2
srv = Server(["memory", "size=1M"],
             opts=["--shards", "1", "--idle-timeout", str(T), "--handshake-timeout", "0"])
c = RawClient(srv, timeout=30)
c.greeting()
time.sleep(2.5)                     # sweeps find this connection alone, in its handshake
c.client_flags()
rtype, _ = c.go()
check_eq(rtype, NBD_REP_ACK, "GO after a handshake that stood open for 2.5 s")
c.send_request(NBD_CMD_READ, 0, 4096, cookie=1)
check_eq(c.recv_reply(4096)[:2], (1, 0), "a READ after it is answered")
t0 = time.time()
closed = peer_closed(c.sock, timeout=T + 4)
dt = time.time() - t0
check(closed, "--idle-timeout %d closes the idle connection (waited %.1f s)" % (T, dt))
if closed:
    check(dt >= T - 0.05, "not before --idle-timeout (closed after %.1f s)" % dt)
c.close()
srv.check_alive()
srv.stop()
