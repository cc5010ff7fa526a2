#!/usr/bin/python3
# A TLS 1.3 client that splits a post-handshake message across records and
# stops half way, with replies queued: the client sends READ requests and,
# behind them, a record holding the start of a KeyUpdate, then waits.
# Once the message header is whole, OpenSSL writes no application data
# until the body comes (its SSL_write asks for input), so blkd must wait
# for the client's next bytes, not spin on a writable socket: the
# server's CPU time while the client waits stays near zero.  Then the rest of the KeyUpdate comes;
# the queued replies must arrive, and a request sealed under the client's
# next key (which only a completed KeyUpdate makes the server expect) is
# answered too.  Records after the handshake are sealed by
# tests/helpers/tls13.py, in sequence behind what Python's ssl wrote.
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

need_tls13()
import ssl  # noqa: E402
from tls13 import BioClient, CT_HANDSHAKE, CT_APPLICATION_DATA, HS_KEY_UPDATE  # noqa: E402

if IS_NBDKIT:
    skip("TLS tests run against blkd only")
need_server()
T = tls_material()

NREQ, BS = 8, 4096
WAIT = 1.5                         # seconds the client sits on half a message


def cpu_ticks(pid):
    """utime + stime of the whole process, in clock ticks."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def split_key_update(split, extra=()):
    print("# KeyUpdate split after byte %d of 5, replies queued %s" % (split, " ".join(extra)))
    opts = ["--tls=require", "--tls-certificates", os.path.join(T, "server")] + list(extra)
    srv = Server(["memory", "size=16M"], opts=opts)
    c = RawClient(srv)
    c.start()
    _, rtype, _ = c.opt_replies(NBD_OPT_STARTTLS)
    check_eq(rtype, NBD_REP_ACK, "STARTTLS answer")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(os.path.join(T, "client-ca", "ca-cert.pem"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    c.sock = BioClient(c.sock, ctx, os.path.join(TMP, "keylog-%d" % split))
    rtype, _ = c.go()
    check_eq(rtype, NBD_REP_ACK, "GO over TLS")
    # Known data to read back.
    pattern = bytes(range(256)) * (NREQ * BS // 256)
    c.send_request(NBD_CMD_WRITE, 0, len(pattern), cookie=0x77, payload=pattern)
    check_eq(c.recv_reply()[:2], (0x77, 0), "WRITE of the pattern")

    d = c.sock.client_direction()
    reqs = b"".join(c.request(NBD_CMD_READ, i * BS, BS, cookie=100 + i) for i in range(NREQ))
    key_update = bytes([HS_KEY_UPDATE, 0, 0, 1, 0])      # update_not_requested
    raw = c.sock.raw
    raw.sendall(d.seal(CT_APPLICATION_DATA, reqs) + d.seal(CT_HANDSHAKE, key_update[:split]))
    time.sleep(0.3)                # the server reads both records and answers
    t0 = cpu_ticks(srv.proc.pid)
    time.sleep(WAIT)
    spent = (cpu_ticks(srv.proc.pid) - t0) / os.sysconf("SC_CLK_TCK")
    check(spent < 0.25 * WAIT, "no spinning while the client's KeyUpdate is half sent",
          "server CPU %.2f s in %.1f s" % (spent, WAIT))
    srv.check_alive()
    raw.setblocking(False)
    try:
        early = raw.recv(1 << 20)
    except BlockingIOError:
        early = b""
    raw.setblocking(True)
    note("bytes the server sent while the KeyUpdate was half sent: %d" % len(early))
    c.sock.inc.write(early)         # ssl reads them with the rest

    raw.sendall(d.seal(CT_HANDSHAKE, key_update[split:]))
    d.next()                       # our next records under the updated key
    raw.sendall(d.seal(CT_APPLICATION_DATA, c.request(NBD_CMD_READ, 0, BS, cookie=999)))
    c.sock.settimeout(10)
    got = {}
    for _ in range(NREQ + 1):
        cookie, err, _, data = c.recv_reply(read_len=BS)
        check(err == 0, "reply %d without error" % cookie, "error %d" % err)
        got[cookie] = data
    for i in range(NREQ):
        check(got.get(100 + i) == pattern[i * BS:(i + 1) * BS],
              "queued READ %d answered with its data" % i)
    check(got.get(999) == pattern[:BS], "READ sealed under the client's updated key answered")
    ok("split at %d: all %d replies" % (split, NREQ + 1))
    c.close()
    srv.check_alive()
    srv.stop()


# Inside the message header, and after the whole header with the body
# missing: OpenSSL 3.0 writes on in the first case and asks for input in
# the second.
for split in (2, 4):
    split_key_update(split)
# Reading paused with the message half read (the requests in flight at
# the limit): the rest must still be read, and the replies sent.
split_key_update(4, ["--max-inflight", "4"])
