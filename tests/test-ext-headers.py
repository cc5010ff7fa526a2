#!/usr/bin/python3
# Extended headers (NBD_OPT_EXTENDED_HEADERS) by hand over a raw socket:
# the negotiation rules (no data, STRUCTURED_REPLY and EXPORT_NAME after
# it, --ext-headers=off and =require), 32-byte replies for every reply type
# with the request's offset echoed, a 64 GiB WRITE_ZEROES and TRIM as one
# request each (the server's request counter says one; nbdkit's log filter
# shows the plugin calls it was split into, none over 2 GiB), 64-bit block
# status that merges a 1 TiB hole into one descriptor, REQ_ONE, and READ
# over the payload limit answered NBD_EOVERFLOW.  Runs in a few seconds.
import os
import re
import struct
import time
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

need_server()
if IS_NBDKIT:
    skip("nbdkit (through 1.42) does not offer extended headers")

GiB = 1 << 30
TiB = 1 << 40
LOG_FILTER = os.path.join(nbdkit_dir("filterdir") or "", "nbdkit-log-filter.so")


def requests_total(srv, cmd):
    url = "http://127.0.0.1:%d/metrics" % srv.metrics_port
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    m = re.search(r'^blkd_requests_total\{cmd="%s"\} (\d+)' % cmd, text, re.M)
    return int(m.group(1)) if m else 0


def requests_after(srv, cmd, before, want, secs=5.0):
    """The counter's growth since `before`, once it reaches `want` or secs
    pass: the server counts a request when it frees it, just after the
    reply went out, so the client can ask a moment too early."""
    deadline = time.time() + secs
    while True:
        n = requests_total(srv, cmd) - before
        if n >= want or time.time() > deadline:
            return n
        time.sleep(0.05)


def reply(c):
    cookie, err, chunks, _ = c.recv_reply()
    return cookie, err, chunks


# ---- negotiation ---------------------------------------------------------
srv = Server(["ram", "size=1T"], opts=["--metrics", "127.0.0.1:0", "--max-request", "1M"])

c = RawClient(srv)
c.start()
check_eq(c.extended_headers(b"x"), NBD_REP_ERR_INVALID, "EXTENDED_HEADERS with data")
check_eq(c.extended_headers(), NBD_REP_ACK, "EXTENDED_HEADERS accepted")
check_eq(c.extended_headers(), NBD_REP_ACK, "EXTENDED_HEADERS again")
check_eq(c.structured_reply(), NBD_REP_ERR_EXT_HEADER_REQD,
         "STRUCTURED_REPLY after extended headers")
rtype, ctx = c.set_meta_context()
check_eq((rtype, len(ctx)), (NBD_REP_ACK, 1), "SET_META_CONTEXT without STRUCTURED_REPLY")
c.send_opt(NBD_OPT_EXPORT_NAME, b"")
check(peer_closed(c.sock), "EXPORT_NAME after extended headers closes the connection")
c.close()

off = Server(["ram", "size=1M"], opts=["--ext-headers=off"])
c = RawClient(off)
c.start()
check_eq(c.extended_headers(), NBD_REP_ERR_UNSUP, "--ext-headers=off refuses the option")
check_eq(c.structured_reply(), NBD_REP_ACK, "--ext-headers=off: structured replies still")
c.close()
off.stop()

nosr = Server(["ram", "size=1M"], opts=["--no-sr"])
c = RawClient(nosr)
c.start()
check_eq(c.extended_headers(), NBD_REP_ERR_UNSUP, "--no-sr refuses extended headers too")
c.close()
nosr.stop()
r = subprocess.run([BLKD, "--no-sr", "--ext-headers=require", "ram", "size=1M"],
                   capture_output=True, text=True, timeout=20)
check(r.returncode != 0 and "--no-sr" in r.stderr,
      "--no-sr with --ext-headers=require is refused at start-up")

req = Server(["ram", "size=1M"], opts=["--ext-headers=require"])
c = RawClient(req)
c.start()
check_eq(c.go()[0], NBD_REP_ERR_EXT_HEADER_REQD, "--ext-headers=require: GO without them")
check_eq(c.go(opt=NBD_OPT_INFO)[0], NBD_REP_ERR_EXT_HEADER_REQD,
         "--ext-headers=require: INFO without them")
check_eq(c.extended_headers(), NBD_REP_ACK, "--ext-headers=require: EXTENDED_HEADERS")
check_eq(c.go()[0], NBD_REP_ACK, "--ext-headers=require: GO once negotiated")
c.send_request(NBD_CMD_FLUSH, cookie=3)
check_eq(reply(c)[:2], (3, 0), "--ext-headers=require: a request goes through")
c.disconnect()
c = RawClient(req)
c.start()
c.send_opt(NBD_OPT_EXPORT_NAME, b"")
check(peer_closed(c.sock), "--ext-headers=require: EXPORT_NAME closes the connection")
c.close()
req.stop()

# Nothing negotiated in clear survives STARTTLS: extended headers taken
# before it are off inside TLS until asked for again (proto.md: the client
# "MUST renegotiate extended headers").
import ssl  # noqa: E402
T = tls_material()
tsrv = Server(["ram", "size=1M"], opts=["--tls=on", "--tls-certificates", os.path.join(T, "server")])
c = RawClient(tsrv)
c.start()
check_eq(c.extended_headers(), NBD_REP_ACK, "EXTENDED_HEADERS in clear")
check_eq(c.opt_replies(NBD_OPT_STARTTLS)[1], NBD_REP_ACK, "STARTTLS")
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.load_verify_locations(os.path.join(T, "client-ca", "ca-cert.pem"))
c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost")
c.extended = c.structured = False
check_eq(c.go()[0], NBD_REP_ACK, "GO inside TLS without asking again")
c.send_request(NBD_CMD_FLUSH, cookie=5)
cookie, err, chunks, _ = c.recv_reply()
check_eq((cookie, err, chunks), (5, 0, None), "compact headers and a simple reply inside TLS")
c.disconnect()
c = RawClient(tsrv)
c.start()
check_eq(c.opt_replies(NBD_OPT_STARTTLS)[1], NBD_REP_ACK, "STARTTLS first")
c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost")
check_eq(c.extended_headers(), NBD_REP_ACK, "EXTENDED_HEADERS inside TLS")
check_eq(c.go()[0], NBD_REP_ACK, "GO inside TLS")
c.send_request(NBD_CMD_FLUSH, cookie=6)
check_eq(reply(c)[:2], (6, 0), "extended reply inside TLS")
c.disconnect()
tsrv.stop()

# ---- transmission --------------------------------------------------------
c = RawClient(srv)
size, eflags = c.handshake(extended=True, meta=True)
check_eq(size, TiB, "export size")
check(eflags & NBD_FLAG_SEND_DF, "DF offered (extended headers imply structured replies)")

pat = os.urandom(8192)
base = TiB - 64 * 1024
c.send_request(NBD_CMD_WRITE, base, len(pat), cookie=10, payload=pat)
cookie, err, chunks = reply(c)
check_eq((cookie, err, [t for t, _, _ in chunks]), (10, 0, [NBD_REPLY_TYPE_NONE]),
         "WRITE: one NONE chunk")
check_eq(chunks[0][1], NBD_REPLY_FLAG_DONE, "NONE chunk carries DONE")
check_eq(c.reply_offsets, [base], "reply header echoes the request offset")

c.send_request(NBD_CMD_READ, base, len(pat), cookie=11)
cookie, err, chunks = reply(c)
data, _ = read_via_chunks(chunks, base, len(pat))
check_eq((cookie, err, data == pat), (11, 0, True), "READ returns the data")
check(all(o == base for o in c.reply_offsets), "every read chunk echoes the request offset")

# A stream of big WRITEs: each payload is read straight into its buffer
# with the next 32-byte header read behind it (conn.c's write stream).
K256 = 256 * 1024
pats = [os.urandom(K256) for _ in range(16)]
c.sock.sendall(b"".join(c.ext_request(NBD_CMD_WRITE, i * K256, K256, 100 + i,
                                      NBD_CMD_FLAG_PAYLOAD_LEN) + p for i, p in enumerate(pats)))
got = sorted(reply(c)[:2] for _ in pats)
check_eq(got, [(100 + i, 0) for i in range(16)], "16 pipelined 256 KiB WRITEs")
for i, p in enumerate(pats):
    c.send_request(NBD_CMD_READ, i * K256, K256, cookie=200 + i)
    cookie, err, chunks = reply(c)
    if (cookie, err, read_via_chunks(chunks, i * K256, K256)[0]) != (200 + i, 0, p):
        fail("pipelined WRITE %d read back wrong" % i)
ok("16 pipelined 256 KiB WRITEs read back exactly")

# Errors come as ERROR chunks, whatever the command.
c.send_request(NBD_CMD_FLUSH, 0, 512, cookie=12)
cookie, err, chunks = reply(c)
check_eq((cookie, err, chunks[0][0]), (12, NBD_EINVAL, NBD_REPLY_TYPE_ERROR),
         "FLUSH with a length: EINVAL in an ERROR chunk")
c.send_request(NBD_CMD_READ, 0, 2 << 20, cookie=13)
check_eq(reply(c)[:2], (13, NBD_EOVERFLOW), "READ over the payload limit: EOVERFLOW")
c.send_request(NBD_CMD_READ, 0, 64 * GiB, cookie=14)
check_eq(reply(c)[:2], (14, NBD_EOVERFLOW), "READ of 64 GiB: EOVERFLOW")
c.send_request(NBD_CMD_TRIM, 4096, TiB, cookie=15)
check_eq(reply(c)[:2], (15, NBD_EINVAL), "TRIM past the end in 64 bits: EINVAL")

# 64 GiB WRITE_ZEROES and TRIM: one request each on the wire.
z0 = requests_total(srv, "write_zeroes")
c.send_request(NBD_CMD_WRITE_ZEROES, 0, 64 * GiB, cookie=20)
check_eq(reply(c)[:2], (20, 0), "WRITE_ZEROES of 64 GiB")
check_eq(requests_after(srv, "write_zeroes", z0, 1), 1,
         "64 GiB WRITE_ZEROES counted as one request")
t0 = requests_total(srv, "trim")
c.send_request(NBD_CMD_TRIM, 64 * GiB, 64 * GiB + 4096, cookie=21)
check_eq(reply(c)[:2], (21, 0), "TRIM of 64 GiB + 4 KiB")
check_eq(requests_after(srv, "trim", t0, 1), 1, "64 GiB TRIM counted as one request")

# Block status: one 64-bit descriptor for a hole far over 4 GiB.
def block_status(c, offset, length, flags=0, cookie=30):
    c.send_request(NBD_CMD_BLOCK_STATUS, offset, length, cookie=cookie, flags=flags)
    rc, err, chunks = reply(c)
    check_eq((rc, err), (cookie, 0), "BLOCK_STATUS offset %d length %d" % (offset, length))
    ctype, _, payload = chunks[0]
    check_eq(ctype, NBD_REPLY_TYPE_BLOCK_STATUS_EXT, "64-bit block status chunk")
    ctx, n = struct.unpack(">II", payload[:8])
    check_eq(len(payload), 8 + 16 * n, "descriptor count matches the chunk length")
    check_eq(ctx, c.meta_id, "context id")
    return [struct.unpack(">QQ", payload[8 + 16 * i:24 + 16 * i]) for i in range(n)]

ext = block_status(c, 0, TiB)
check(len(ext) >= 2, "1 TiB map has the data at the end (%d descriptors)" % len(ext))
check_eq(ext[0][1] & 3, 3, "first descriptor is a hole")
check(ext[0][0] >= TiB - 128 * 1024, "the whole hole is one descriptor (%d bytes)" % ext[0][0])
check_eq(sum(e[0] for e in ext), TiB, "descriptors cover the 1 TiB request")
check(all(e[1] >> 32 == 0 for e in ext), "base:allocation status fits 32 bits")
one = block_status(c, 0, 100 * GiB, flags=NBD_CMD_FLAG_REQ_ONE, cookie=31)
check_eq(one, [(100 * GiB, 3)], "REQ_ONE: one descriptor of 100 GiB")
c.disconnect()

# A compact client on the same server sees no change.
c = RawClient(srv)
c.handshake(structured=True, meta=True)
c.send_request(NBD_CMD_WRITE_ZEROES, 0, 1 << 20, cookie=40)
cookie, err, chunks, _ = c.recv_reply()
check_eq((cookie, err, chunks), (40, 0, None), "compact client: simple reply to WRITE_ZEROES")
c.disconnect()
srv.stop()

# The plugin's calls: nbdkit's log filter sees the 64 GiB split into
# pieces the 32-bit API can carry.
if os.path.exists(LOG_FILTER):
    logf = os.path.join(os.environ.get("TMPDIR", "/tmp"), "blkd-ext-%d.log" % os.getpid())
    lsrv = Server(["--filter=log", "ram", "size=1T", "logfile=" + logf])
    c = RawClient(lsrv)
    c.handshake(extended=True)
    c.send_request(NBD_CMD_WRITE_ZEROES, 4096, 64 * GiB, cookie=50)
    check_eq(reply(c)[:2], (50, 0), "WRITE_ZEROES of 64 GiB through the log filter")
    c.disconnect()
    lsrv.stop()
    with open(logf) as f:
        log = f.read()
    os.unlink(logf)
    calls = [(int(o, 16), int(n, 16)) for o, n in
             re.findall(r"Zero id=\d+ offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+)", log)]
    check_eq(sum(n for _, n in calls), 64 * GiB, "plugin zero calls add up to 64 GiB")
    check(calls and max(n for _, n in calls) <= 2 * GiB,
          "no plugin call over 2 GiB (%d calls)" % len(calls))
    pos = 4096
    for o, n in calls:
        if o != pos:
            break
        pos += n
    check_eq(pos, 4096 + 64 * GiB, "plugin zero calls are contiguous, in order")
else:
    note("nbdkit's log filter not installed: plugin call split not checked")

print("ok: extended headers")
