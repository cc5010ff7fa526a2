#!/usr/bin/python3
# STARTTLS byte by byte, with Python's ssl module as the TLS client:
#  - --tls=require: every option but STARTTLS and ABORT gets ERR_TLS_REQD in
#    clear, EXPORT_NAME in clear closes, so no export is reachable in clear;
#  - STARTTLS with data or inside TLS: ERR_INVALID;
#  - downgrade: STRUCTURED_REPLY, SET_META_CONTEXT and INFO negotiated in
#    clear do not survive STARTTLS (SET_META_CONTEXT without a new
#    STRUCTURED_REPLY is refused, replies are simple, BLOCK_STATUS fails);
#  - options pipelined behind STARTTLS are discarded unread (CVE-2021-3716
#    in nbdkit); a client sending clear text after the ACK is dropped;
#  - TLS 1.2 and 1.3 both work, TLS 1.1 is refused;
#  - a forged record inside TLS 1.3 is answered with an alert the client
#    can read (sealed in sequence behind the replies OpenSSL collected);
#  - --tls-verify-peer: a certificate from another CA is rejected (GnuTLS
#    clients would not even send it), one from our CA accepted;
# and after every refusal the server is alive and serves a good client.
import os
import socket
import ssl
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

NBD_REP_ERR_TLS_REQD = 0x80000005
SIZE = 64 * 1024 * 1024

if IS_NBDKIT:
    skip("TLS tests run against blkd only (their log lines are blkd's)")
need_server()
T = tls_material()
ok("certificates made")


def client_ctx(cadir="client-ca", cert_dir=None, tls_max=None, tls_min=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(os.path.join(T, cadir, "ca-cert.pem"))
    if cert_dir:
        ctx.load_cert_chain(os.path.join(T, cert_dir, "client-cert.pem"),
                            os.path.join(T, cert_dir, "client-key.pem"))
    if tls_max:
        ctx.maximum_version = tls_max
    if tls_min:
        ctx.minimum_version = tls_min
    return ctx


def starttls(c, ctx=None):
    """STARTTLS, expect the ACK in clear, then the TLS handshake."""
    _, rtype, _ = c.opt_replies(NBD_OPT_STARTTLS)
    check_eq(rtype, NBD_REP_ACK, "STARTTLS answer")
    c.sock = (ctx or client_ctx()).wrap_socket(c.sock, server_hostname="localhost")
    ok("TLS up: %s %s" % (c.sock.version(), c.sock.cipher()[0]))


def closed_soon(sock, timeout=5.0):
    """True when the peer closes within timeout (an alert may come first)."""
    sock.settimeout(timeout)
    end = time.time() + timeout
    try:
        while time.time() < end:
            if not sock.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except (socket.timeout, ssl.SSLError):
        return False
    return False


def log_has(srv, text, timeout=5.0):
    end = time.time() + timeout
    while time.time() < end:
        with open(srv.log_path, errors="replace") as f:
            for line in f:
                if text in line:
                    return line.strip()
        time.sleep(0.05)
    fail("server log has no line with %r" % text)


def opt_payload_info(name=b""):
    return RawClient.info_go_payload(name)


srv = Server(["memory", "size=64M"],
             opts=["-v", "--tls=require", "--tls-certificates", os.path.join(T, "server")])

# --- require: nothing in clear -------------------------------------------------
print("# --tls=require: every option but STARTTLS and ABORT -> ERR_TLS_REQD")
c = RawClient(srv)
c.start()
meta = struct.pack(">I", 0) + struct.pack(">I", 1) + struct.pack(">I", 15) + b"base:allocation"
for opt, data, name in ((NBD_OPT_LIST, b"", "LIST"),
                        (NBD_OPT_INFO, opt_payload_info(), "INFO"),
                        (NBD_OPT_GO, opt_payload_info(), "GO"),
                        (NBD_OPT_STRUCTURED_REPLY, b"", "STRUCTURED_REPLY"),
                        (NBD_OPT_LIST_META_CONTEXT, meta, "LIST_META_CONTEXT"),
                        (NBD_OPT_SET_META_CONTEXT, meta, "SET_META_CONTEXT"),
                        (11, b"", "EXTENDED_HEADERS"),
                        (0x4242, b"junk", "unknown option")):
    infos, rtype, _ = c.opt_replies(opt, data)
    check_eq(rtype, NBD_REP_ERR_TLS_REQD, "%s in clear" % name)
    check_eq(infos, [], "%s in clear: no information replies" % name)
print("# STARTTLS with a payload -> ERR_INVALID")
_, rtype, _ = c.opt_replies(NBD_OPT_STARTTLS, b"x")
check_eq(rtype, NBD_REP_ERR_INVALID, "STARTTLS with data")
print("# ABORT in clear is still answered")
_, rtype, _ = c.opt_replies(NBD_OPT_ABORT)
check_eq(rtype, NBD_REP_ACK, "ABORT in clear")
c.close()

print("# EXPORT_NAME in clear cannot be refused politely: the server closes")
c = RawClient(srv)
c.start()
c.send_opt(NBD_OPT_EXPORT_NAME, b"")
check(closed_soon(c.sock), "connection closed after EXPORT_NAME in clear")
c.close()
srv.check_alive()

# --- a full TLS session ---------------------------------------------------------
print("# STARTTLS, then GO, I/O, and STARTTLS again inside TLS")
c = RawClient(srv)
c.start()
starttls(c)
_, rtype, _ = c.opt_replies(NBD_OPT_STARTTLS)
check_eq(rtype, NBD_REP_ERR_INVALID, "STARTTLS inside TLS")
c.structured_reply()
rtype, _ = c.go()
check_eq(rtype, NBD_REP_ACK, "GO over TLS")
check_eq(c.size, SIZE, "export size over TLS")
data = os.urandom(256 * 1024)
c.send_request(NBD_CMD_WRITE, 4096, len(data), cookie=7, payload=data)
cookie, err, _, _ = c.recv_reply()
check_eq((cookie, err), (7, 0), "256 KiB write over TLS")
# Several reads pipelined: replies are gathered into shared records.
for i in range(8):
    c.send_request(NBD_CMD_READ, 4096 + i * 32768, 32768, cookie=100 + i)
for i in range(8):
    cookie, err, chunks, _ = c.recv_reply()
    check(err == 0, "pipelined read %d" % i)
    got, _ = read_via_chunks(chunks, 4096 + (cookie - 100) * 32768, 32768)
    want = data[(cookie - 100) * 32768:(cookie - 99) * 32768]
    check(got == want, "pipelined read %d returns what was written" % (cookie - 100))
c.disconnect()
print(log_has(srv, "TLS up: TLSv1.3"))

print("# TLS 1.2 works, TLS 1.1 is refused")
c = RawClient(srv)
c.start()
starttls(c, client_ctx(tls_max=ssl.TLSVersion.TLSv1_2))
check_eq(c.sock.version(), "TLSv1.2", "negotiated version")
rtype, _ = c.go()
check_eq(rtype, NBD_REP_ACK, "GO over TLS 1.2")
c.disconnect()
try:
    import warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    old = client_ctx(tls_max=ssl.TLSVersion.TLSv1_1, tls_min=ssl.TLSVersion.TLSv1_1)
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    c = RawClient(srv)
    c.start()
    _, rtype, _ = c.opt_replies(NBD_OPT_STARTTLS)
    check_eq(rtype, NBD_REP_ACK, "STARTTLS answer")
    try:
        old.wrap_socket(c.sock, server_hostname="localhost")
        fail("a TLS 1.1 handshake succeeded")
    except (ssl.SSLError, OSError) as e:
        ok("TLS 1.1 refused (%s)" % e.__class__.__name__)
    print(log_has(srv, "TLS handshake failed: the client's TLS version is too old"))
    c.close()
except ssl.SSLError as e:
    note("this Python/OpenSSL cannot even offer TLS 1.1 (%s): not checked" % e)
srv.check_alive()

# --- injection and clear text after the ACK --------------------------------------
print("# options pipelined behind STARTTLS are discarded, not answered in clear")
c = RawClient(srv)
c.start()
c.sock.sendall(struct.pack(">QII", NBD_OPTS_MAGIC, NBD_OPT_STARTTLS, 0)
               + struct.pack(">QII", NBD_OPTS_MAGIC, NBD_OPT_STRUCTURED_REPLY, 0)
               + struct.pack(">QII", NBD_OPTS_MAGIC, NBD_OPT_GO, 6) + opt_payload_info())
opt, rtype, _ = c.recv_opt_reply()
check_eq((opt, rtype), (NBD_OPT_STARTTLS, NBD_REP_ACK), "STARTTLS ACK (first reply)")
# Were the injected options answered in clear, the TLS handshake would
# choke on those bytes.
c.sock = client_ctx().wrap_socket(c.sock, server_hostname="localhost")
ok("TLS handshake right after the ACK: nothing else was sent in clear")
print(log_has(srv, "discarding"))
_, rtype, _ = c.opt_replies(NBD_OPT_SET_META_CONTEXT, meta)
check_eq(rtype, NBD_REP_ERR_INVALID, "SET_META_CONTEXT: the injected STRUCTURED_REPLY had no effect")
rtype, _ = c.go()
check_eq(rtype, NBD_REP_ACK, "GO over TLS after the injection")
c.disconnect()

print("# clear text after the ACK, where TLS records belong: dropped")
c = RawClient(srv)
c.start()
_, rtype, _ = c.opt_replies(NBD_OPT_STARTTLS)
check_eq(rtype, NBD_REP_ACK, "STARTTLS answer")
c.send_opt(NBD_OPT_GO, opt_payload_info())
check(closed_soon(c.sock), "connection closed after clear text in place of TLS")
c.close()
print(log_has(srv, "client did not send TLS after STARTTLS"))
srv.check_alive()


def forged_record(srv):
    print("# a forged record inside TLS: the alert comes back sealed, then the close")
    c = RawClient(srv)
    c.start()
    starttls(c)
    rtype, _ = c.go()
    check_eq(rtype, NBD_REP_ACK, "GO over TLS")
    # Under the socket's TLS layer: a record no key sealed.
    os.write(c.sock.fileno(), b"\x17\x03\x03\x00\x20" + os.urandom(32))
    c.sock.settimeout(5)
    try:
        d = c.sock.recv(4096)
        fail("expected the server's alert, got %r" % d)
    except ssl.SSLError as e:
        # The client could decrypt it: the alert is sealed in sequence.
        check("BAD_RECORD_MAC" in str(e).upper(), "bad_record_mac alert read by the client (%s)" % e)
    c.close()
    print(log_has(srv, "TLS receive failed"))
    srv.check_alive()


forged_record(srv)
srv.stop()

# --- downgrade: clear-text state does not survive STARTTLS ------------------------
print("# --tls=on: state negotiated in clear is reset by STARTTLS")
srv = Server(["memory", "size=64M"],
             opts=["--tls=on", "--tls-certificates", os.path.join(T, "server")])
c = RawClient(srv)
c.start()
check_eq(c.structured_reply(), NBD_REP_ACK, "STRUCTURED_REPLY in clear")
rtype, ctxs = c.set_meta_context()
check_eq((rtype, len(ctxs)), (NBD_REP_ACK, 1), "SET_META_CONTEXT base:allocation in clear")
rtype, _ = c.go(opt=NBD_OPT_INFO)
check_eq(rtype, NBD_REP_ACK, "INFO in clear (--tls=on)")
starttls(c)
c.structured = False
rtype, _ = c.set_meta_context()
check_eq(rtype, NBD_REP_ERR_INVALID, "SET_META_CONTEXT after STARTTLS without STRUCTURED_REPLY")
rtype, _ = c.go()
check_eq(rtype, NBD_REP_ACK, "GO over TLS")
check(not (c.eflags & NBD_FLAG_SEND_DF), "no DF flag: structured replies were not carried over")
c.send_request(NBD_CMD_READ, 0, 512, cookie=1)
cookie, err, chunks, payload = c.recv_reply(512)
check(chunks is None, "READ answered with a simple reply")
check_eq((cookie, err, len(payload)), (1, 0, 512), "simple READ reply")
c.send_request(NBD_CMD_BLOCK_STATUS, 0, 4096, cookie=2)
cookie, err, _, _ = c.recv_reply()
check_eq((cookie, err), (2, NBD_EINVAL), "BLOCK_STATUS without a meta context negotiated in TLS")
c.disconnect()

print("# --tls=on: clear text still works")
c = RawClient(srv)
size, _ = c.handshake()
check_eq(size, SIZE, "GO in clear with --tls=on")
c.disconnect()
srv.stop()

# --- client certificates -------------------------------------------------------------
print("# --tls-verify-peer: a certificate from another CA is rejected")
srv = Server(["memory", "size=64M"],
             opts=["--tls=require", "--tls-verify-peer",
                   "--tls-certificates", os.path.join(T, "server")])
c = RawClient(srv)
c.start()
_, rtype, _ = c.opt_replies(NBD_OPT_STARTTLS)
check_eq(rtype, NBD_REP_ACK, "STARTTLS answer")
got = None
try:
    s = client_ctx(cert_dir="client-other").wrap_socket(c.sock, server_hostname="localhost")
    # TLS 1.3: the client finishes before the server has judged its
    # certificate; the verdict arrives as an alert on the first read.
    s.sendall(struct.pack(">QII", NBD_OPTS_MAGIC, NBD_OPT_GO, 6) + opt_payload_info())
    s.settimeout(5)
    got = s.recv(20)
except (ssl.SSLError, OSError) as e:
    ok("refused: %s" % e)
check(not got, "no option reply for a client with a foreign certificate")
c.close()
print(log_has(srv, "client certificate rejected: unable to get local issuer certificate"))
srv.check_alive()
c = RawClient(srv)
c.start()
starttls(c, client_ctx(cert_dir="client"))
rtype, _ = c.go()
check_eq(rtype, NBD_REP_ACK, "GO with a certificate from our CA")
c.disconnect()
srv.check_alive()
srv.stop()

# --- a client that stalls in the TLS handshake ------------------------------------
print("# STARTTLS then silence: --handshake-timeout covers the TLS handshake too")
srv = Server(["memory", "size=1M"],
             opts=["--tls=require", "--handshake-timeout", "1",
                   "--tls-certificates", os.path.join(T, "server")])
c = RawClient(srv)
c.start()
_, rtype, _ = c.opt_replies(NBD_OPT_STARTTLS)
check_eq(rtype, NBD_REP_ACK, "STARTTLS answer")
t0 = time.time()
check(closed_soon(c.sock, 10), "stalled TLS handshake closed by the server")
check(time.time() - t0 < 8, "closed within the handshake timeout (%.1f s)" % (time.time() - t0))
c.close()
srv.check_alive()
print("all TLS protocol checks passed")
