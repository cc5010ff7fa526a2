#!/usr/bin/python3
# A sendfile READ reply whose header went out but whose file data did not
# (the client hung up mid-reply) was dropped unanswered: /metrics must count
# it in blkd_errors_total{cmd="read"}, as it counts a copied reply cut off
# in the middle of its data.  The client asks for one 32 MiB READ (more
# than loopback's socket buffers hold), reads 100 bytes of the reply and
# resets the connection.
import os
import socket
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from lendtest import MiB, read_requests, wait_metric, need_cachestat  # noqa: E402
import lendtest  # noqa: E402

nbd = need_nbd()
if IS_NBDKIT:
    skip("sendfile replies are blkd's extension")

SIZE = 64 * MiB
path = os.path.join(TMP, "disk.img")
with open(path, "wb") as f:
    f.write(os.urandom(SIZE))
with open(path, "rb") as f:
    f.read()
need_cachestat(path)
srv = Server(["rawio", "file=" + path], opts=["--metrics", "127.0.0.1:0"])
mport = srv.metrics_port


def read_metric(name, cmd="read"):
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith('%s{cmd="%s"}' % (name, cmd)):
                return float(line.rpartition(" ")[2])
    fail("no %s{cmd=\"%s\"} on /metrics" % (name, cmd))


for structured in (False, True):
    shape = "structured" if structured else "simple"
    before = read_metric("blkd_errors_total")
    sf = lendtest.metrics(mport)["blkd_sendfile_replies_total"]
    c = RawClient(srv, timeout=60)
    c.handshake(structured=structured)
    read_requests(c, [(0, 32 * MiB)])
    wait_metric(mport, lambda m: m["blkd_sendfile_replies_total"] > sf, "READ sent with sendfile")
    c.recv(100)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    wait_metric(mport, lambda m: m["blkd_requests_in_flight"] == 0 and m["blkd_connections"] == 0,
                "%s: connection gone" % shape)
    check_eq(read_metric("blkd_errors_total") - before, 1,
             "%s: the sendfile reply cut off mid-file counts as dropped" % shape)

srv.check_alive()
srv.stop()
print("sendfile drop accounting checks passed")
