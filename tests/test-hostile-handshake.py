#!/usr/bin/python3
# Hostile clients during option haggling, by hand over raw sockets: every
# option with wrong lengths, lengths up to 2^31 (discarded, then
# ERR_TOO_BIG; EXPORT_NAME closes), export names of 4096 bytes and far
# beyond, unknown options, bad magics, garbage before and during the
# handshake, STARTTLS without TLS (ERR_POLICY, connection still usable)
# and a TLS ClientHello pushed after it, ABORT, pipelined options, and
# options whose replies are never read (memory must stay flat).
#
# After every case: the server is alive, a second connection does a
# write/read round trip, and (per batch) the server's RSS and open file
# descriptors are flat.  The spec's answer for each case is checked
# exactly (proto.md, "Option types" and "Option reply types").
# Server: in-tree ram plugin, 64 MiB.  Runs in ~10 s.
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

need_server()
if IS_NBDKIT:
    skip("blkd-specific hostile suite (limits and sizes are blkd's)")

MiB = 1 << 20
NBD_REP_ERR_TOO_BIG = 0x80000009
NBD_OPT_EXTENDED_HEADERS = 11
MAX_OPTION_LEN = 4096 * 4 + 64          # server/handshake.c: larger is skipped

from hostile import *  # noqa: E402,F401,F403

# ---- cases ----------------------------------------------------------------


def fresh(srv):
    c = RawClient(srv)
    c.start()
    return c


def opt_hdr(opt, length, magic=NBD_OPTS_MAGIC):
    return struct.pack(">QII", magic, opt, length)


def expect_reply(c, opt, data, want, what):
    try:
        _, rtype, rdata = c.opt_replies(opt, data)
    except (OSError, EOFError, ProtocolError) as e:
        fail("%s: no reply (%s)" % (what, e))
    check_eq(rtype, want, what)
    return rdata


def still_in_sync(c, what):
    """The connection answers a further option correctly, then goes to
    transmission with GO and does one read."""
    _, rtype, _ = c.opt_replies(0x4242)
    check_eq(rtype, NBD_REP_ERR_UNSUP, "in sync after %s: unknown option answer" % what)
    rtype, _ = c.go()
    check_eq(rtype, NBD_REP_ACK, "in sync after %s: GO" % what)
    c.send_request(NBD_CMD_READ, 0, 512, cookie=77)
    cookie, err, _, _ = c.recv_reply(512)
    check_eq((cookie, err), (77, 0), "in sync after %s: READ" % what)
    c.disconnect()


srv = Server(["ram", "size=64M"], opts=EXTRA_OPTS)


@case("unknown options 0, 4 (withdrawn), 12, 0x1234, 0xffffffff")
def _():
    c = fresh(srv)
    for opt in (0, 4, 12, 0x1234, 0xffffffff):
        expect_reply(c, opt, b"", NBD_REP_ERR_UNSUP, "option %#x answer" % opt)
    expect_reply(c, 0x1234, os.urandom(1000), NBD_REP_ERR_UNSUP,
                 "unknown option with 1000 bytes of data")
    still_in_sync(c, "unknown options")


@case("unknown option with data exactly at the cap and one past it")
def _():
    c = fresh(srv)
    expect_reply(c, 0x77, bytes(MAX_OPTION_LEN), NBD_REP_ERR_UNSUP,
                 "unknown option of %d bytes" % MAX_OPTION_LEN)
    expect_reply(c, 0x77, bytes(MAX_OPTION_LEN + 1), NBD_REP_ERR_TOO_BIG,
                 "unknown option of %d bytes" % (MAX_OPTION_LEN + 1))
    still_in_sync(c, "option at the cap")


@case("GO/INFO/LIST/STARTTLS/STRUCTURED_REPLY/META/EXTENDED_HEADERS of 1 MiB: ERR_TOO_BIG")
def _():
    c = fresh(srv)
    for opt in (NBD_OPT_GO, NBD_OPT_INFO, NBD_OPT_LIST, NBD_OPT_STARTTLS,
                NBD_OPT_STRUCTURED_REPLY, NBD_OPT_LIST_META_CONTEXT,
                NBD_OPT_SET_META_CONTEXT, NBD_OPT_EXTENDED_HEADERS, NBD_OPT_ABORT):
        expect_reply(c, opt, os.urandom(MiB), NBD_REP_ERR_TOO_BIG,
                     "option %d with 1 MiB of data" % opt)
    still_in_sync(c, "1 MiB options")


@case("option length 2^31 - 1 and 2^31: read, discarded, ERR_TOO_BIG, in sync")
def _():
    c = fresh(srv)
    zeros = bytes(4 * MiB)
    for length in ((1 << 31) - 1, 1 << 31):
        t = time.time()
        c.sock.sendall(opt_hdr(NBD_OPT_GO, length))
        left = length
        while left:
            k = min(left, len(zeros))
            c.sock.sendall(memoryview(zeros)[:k])
            left -= k
        opt, rtype, _ = c.recv_opt_reply()
        check_eq((opt, rtype), (NBD_OPT_GO, NBD_REP_ERR_TOO_BIG),
                 "GO with a %d-byte payload (%.1f s)" % (length, time.time() - t))
    still_in_sync(c, "2 GiB options")


@case("option length 2^31, client hangs up after 10 MiB of it")
def _():
    c = fresh(srv)
    c.sock.sendall(opt_hdr(NBD_OPT_INFO, 1 << 31) + bytes(10 * MiB))
    c.close()


@case("option length 0xffffffff, client hangs up after the header")
def _():
    c = fresh(srv)
    c.sock.sendall(opt_hdr(0x99, 0xffffffff))
    c.close()


@case("EXPORT_NAME of 2^31 bytes: server closes without reading it")
def _():
    c = fresh(srv)
    c.sock.sendall(opt_hdr(NBD_OPT_EXPORT_NAME, 1 << 31) + b"x" * 100)
    expect_closed(c.sock, "EXPORT_NAME length 2^31")
    c.close()


@case("EXPORT_NAME of 4096 bytes is served; 4097 and 64 KiB close")
def _():
    c = fresh(srv)
    size, eflags = c.export_name(b"n" * 4096)
    check_eq(size, 64 * MiB, "EXPORT_NAME (4096-byte name) export size")
    c.send_request(NBD_CMD_READ, 0, 4096, cookie=3)
    check_eq(c.recv_reply(4096)[:2], (3, 0), "READ after a 4096-byte EXPORT_NAME")
    c.disconnect()
    for n in (4097, 65536):
        c = fresh(srv)
        send_quiet(c.sock, opt_hdr(NBD_OPT_EXPORT_NAME, n) + b"n" * n)
        expect_closed(c.sock, "EXPORT_NAME of %d bytes" % n)
        c.close()


@case("EXPORT_NAME with a NUL in the name closes")
def _():
    c = fresh(srv)
    send_quiet(c.sock, opt_hdr(NBD_OPT_EXPORT_NAME, 5) + b"ab\0cd")
    expect_closed(c.sock, "EXPORT_NAME with NUL")
    c.close()


@case("EXPORT_NAME without NO_ZEROES pads with 124 zero bytes")
def _():
    c = RawClient(srv)
    c.greeting()
    c.client_flags(NBD_FLAG_FIXED_NEWSTYLE)
    size, _ = c.export_name(b"")
    check_eq(size, 64 * MiB, "EXPORT_NAME export size (padded)")
    c.disconnect()


@case("GO/INFO with export names of 4096 (ACK), 4097, 16 KiB, 1 MiB (errors)")
def _():
    c = fresh(srv)
    for opt in (NBD_OPT_INFO, NBD_OPT_GO):
        for n, want in ((4097, (NBD_REP_ERR_INVALID, NBD_REP_ERR_TOO_BIG)),
                        (16384, (NBD_REP_ERR_INVALID, NBD_REP_ERR_TOO_BIG)),
                        (MiB, (NBD_REP_ERR_TOO_BIG,))):
            _, rtype, _ = c.opt_replies(opt, RawClient.info_go_payload(b"e" * n))
            check(rtype in want, "option %d with a %d-byte name refused" % (opt, n),
                  "got %#x" % rtype)
    rtype, info = c.go(b"e" * 4096, infos=(NBD_INFO_NAME,), opt=NBD_OPT_INFO)
    check_eq(rtype, NBD_REP_ACK, "INFO with a 4096-byte name")
    check_eq(info.get(NBD_INFO_NAME), b"e" * 4096, "INFO_NAME echoes the 4096-byte name")
    rtype, _ = c.go(b"e" * 4096)
    check_eq(rtype, NBD_REP_ACK, "GO with a 4096-byte name")
    c.send_request(NBD_CMD_READ, 0, 512, cookie=9)
    check_eq(c.recv_reply(512)[:2], (9, 0), "READ after GO with a 4096-byte name")
    c.disconnect()


@case("GO/INFO with every wrong length: ERR_INVALID, in sync")
def _():
    c = fresh(srv)
    bad = [
        b"",                                          # no name length
        b"\0\0\0",                                    # short name length
        b"\0\0\0\0\0",                                # no request count
        struct.pack(">I", 10) + b"abc" + b"\0\0",     # name longer than option
        struct.pack(">I", 0xffffffff) + b"\0\0",      # name length 2^32-1
        struct.pack(">I", 0x7ffffffa) + b"\0\0",      # name length near 2^31
        struct.pack(">IH", 0, 1),                     # says 1 request, has 0
        struct.pack(">IHH", 0, 1, 0) + b"\0",         # one trailing byte
        struct.pack(">IHHH", 0, 1, 0, 0),             # says 1, has 2
        struct.pack(">IH", 0, 0xffff) + b"\0\0" * 10,  # says 65535, has 10
        struct.pack(">I", 3) + b"a\0b" + b"\0\0",     # NUL inside the name
    ]
    for opt in (NBD_OPT_INFO, NBD_OPT_GO):
        for i, data in enumerate(bad):
            expect_reply(c, opt, data, NBD_REP_ERR_INVALID,
                         "option %d, malformed payload #%d (%d bytes)" % (opt, i, len(data)))
    # Unknown info requests are ignored, not an error (proto.md).
    rtype, info = c.go(b"", infos=(0x7777, 0xffff, NBD_INFO_EXPORT), opt=NBD_OPT_INFO)
    check_eq(rtype, NBD_REP_ACK, "INFO with unknown information requests")
    check(NBD_INFO_EXPORT in info, "INFO still sends INFO_EXPORT")
    still_in_sync(c, "malformed GO/INFO")


@case("LIST, STRUCTURED_REPLY, STARTTLS, EXTENDED_HEADERS with data: ERR_INVALID")
def _():
    c = fresh(srv)
    for opt in (NBD_OPT_LIST, NBD_OPT_STRUCTURED_REPLY, NBD_OPT_STARTTLS,
                NBD_OPT_EXTENDED_HEADERS):
        for n in (1, 4, 4096):
            expect_reply(c, opt, b"\1" * n, NBD_REP_ERR_INVALID,
                         "option %d with %d bytes of data" % (opt, n))
    still_in_sync(c, "options with unexpected data")


@case("STARTTLS without TLS configured: ERR_POLICY, plaintext GO still works")
def _():
    c = fresh(srv)
    for _ in range(3):
        expect_reply(c, NBD_OPT_STARTTLS, b"", NBD_REP_ERR_POLICY, "STARTTLS answer")
    rtype = c.structured_reply()
    check_eq(rtype, NBD_REP_ACK, "STRUCTURED_REPLY after refused STARTTLS")
    still_in_sync(c, "refused STARTTLS")


@case("STARTTLS then a TLS ClientHello without waiting: closed, no crash")
def _():
    c = fresh(srv)
    hello = bytes.fromhex("16030100a5010000a10303") + os.urandom(32) + bytes(128)
    send_quiet(c.sock, opt_hdr(NBD_OPT_STARTTLS, 0) + hello)
    # TLS never starts: ERR_POLICY, then the record is a bad option magic.
    replies = drain_replies(c)
    check_eq(replies, [(NBD_OPT_STARTTLS, NBD_REP_ERR_POLICY)],
             "ERR_POLICY, then closed, for a pipelined ClientHello")
    c.close()


@case("LIST/SET_META_CONTEXT malformed: ERR_INVALID, in sync")
def _():
    c = fresh(srv)
    q = b"base:allocation"
    good_q = struct.pack(">I", len(q)) + q
    # Before STRUCTURED_REPLY: refused even when well formed.
    for opt in (NBD_OPT_LIST_META_CONTEXT, NBD_OPT_SET_META_CONTEXT):
        expect_reply(c, opt, struct.pack(">II", 0, 1) + good_q, NBD_REP_ERR_INVALID,
                     "META_CONTEXT %d before STRUCTURED_REPLY" % opt)
    check_eq(c.structured_reply(), NBD_REP_ACK, "STRUCTURED_REPLY")
    bad = [
        b"",
        b"\0\0\0\0",                                       # no query count
        b"\0\0\0\0\0\0\0",                                 # 7 bytes
        struct.pack(">I", 100) + b"\0\0\0\0",              # name past the end
        struct.pack(">I", 0xffffffff) + b"\0" * 8,         # name length 2^32-1
        struct.pack(">II", 0, 1),                          # 1 query, none there
        struct.pack(">II", 0, 0xffffffff) + good_q,        # 2^32-1 queries
        struct.pack(">III", 0, 1, 100) + q,                # query past the end
        struct.pack(">III", 0, 1, 0xffffffff) + q,         # query length 2^32-1
        struct.pack(">II", 0, 1) + good_q + b"x",          # trailing byte
        struct.pack(">II", 0, 0) + good_q,                 # 0 queries + data
    ]
    for opt in (NBD_OPT_LIST_META_CONTEXT, NBD_OPT_SET_META_CONTEXT):
        for i, data in enumerate(bad):
            expect_reply(c, opt, data, NBD_REP_ERR_INVALID,
                         "META_CONTEXT %d, malformed payload #%d" % (opt, i))
    # Unknown contexts are simply not returned.
    rtype, ctx = c.set_meta_context(contexts=(b"nope:x", b"base:nonsense", b"\xff" * 300))
    check_eq((rtype, ctx), (NBD_REP_ACK, []), "SET_META_CONTEXT of unknown contexts")
    still_in_sync(c, "malformed META_CONTEXT")


@case("ABORT (with and without data): ACK, then closed")
def _():
    for data in (b"", b"junk"):
        c = fresh(srv)
        c.send_opt(NBD_OPT_ABORT, data)
        try:
            opt, rtype, _ = c.recv_opt_reply()
            check(opt == NBD_OPT_ABORT and rtype in (NBD_REP_ACK, NBD_REP_ERR_INVALID),
                  "ABORT with %d bytes answered" % len(data), "type %#x" % rtype)
        except EOFError:
            ok("ABORT with %d bytes: closed without a reply (allowed)" % len(data))
        expect_closed(c.sock, "after ABORT")
        c.close()


@case("ABORT followed by more options in the same packet: closed after the ACK")
def _():
    c = fresh(srv)
    send_quiet(c.sock, opt_hdr(NBD_OPT_ABORT, 0) + opt_hdr(NBD_OPT_LIST, 0) * 100)
    opt, rtype, _ = c.recv_opt_reply()
    check_eq((opt, rtype), (NBD_OPT_ABORT, NBD_REP_ACK), "ABORT answer")
    expect_closed(c.sock, "nothing answered after ABORT")
    c.close()


@case("bad option magic (first option, and after a good one): closed")
def _():
    for prefix in (b"", opt_hdr(NBD_OPT_LIST, 0)):
        c = fresh(srv)
        send_quiet(c.sock, prefix + opt_hdr(NBD_OPT_GO, 6, magic=0x49484156454f5055) + bytes(6))
        replies = drain_replies(c)
        want = [(NBD_OPT_LIST, NBD_REP_SERVER), (NBD_OPT_LIST, NBD_REP_ACK)] if prefix else []
        check_eq(replies, want, "bad option magic: earlier replies sent, then closed")
        c.close()


@case("request magic where an option belongs (client skipped GO): closed")
def _():
    c = fresh(srv)
    send_quiet(c.sock, RawClient.request(NBD_CMD_READ, 0, 512))
    expect_closed(c.sock, "transmission request during haggling")
    c.close()


@case("garbage instead of client flags (1 KiB random): closed")
def _():
    c = RawClient(srv)
    c.greeting()
    send_quiet(c.sock, b"\xff\xff\xff\xff" + os.urandom(1020))
    expect_closed(c.sock, "unknown client flags")
    c.close()


@case("garbage before the greeting is read, and an HTTP request: closed")
def _():
    for junk in (os.urandom(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"):
        c = RawClient(srv)
        send_quiet(c.sock, junk)
        c.greeting()
        expect_closed(c.sock, "junk as client flags and options")
        c.close()


@case("garbage during haggling (after a good option): closed")
def _():
    c = fresh(srv)
    check_eq(c.structured_reply(), NBD_REP_ACK, "STRUCTURED_REPLY")
    send_quiet(c.sock, os.urandom(4096))
    expect_closed(c.sock, "random bytes as an option")
    c.close()


@case("client flags: unknown bit closes; 0 (not fixed newstyle) still negotiates")
def _():
    for flags in (1 << 2, 1 << 31, 0xffffffff):
        c = RawClient(srv)
        c.greeting()
        send_quiet(c.sock, struct.pack(">I", flags))
        expect_closed(c.sock, "client flags %#x" % flags)
        c.close()
    c = RawClient(srv)
    c.greeting()
    c.client_flags(0)
    size, _ = c.export_name(b"")
    check_eq(size, 64 * MiB, "EXPORT_NAME with client flags 0 (non-fixed newstyle)")
    c.disconnect()


@case("1000 pipelined options in one send: all answered in order")
def _():
    c = fresh(srv)
    opts = [NBD_OPT_LIST, 0x1234, NBD_OPT_STRUCTURED_REPLY, NBD_OPT_STARTTLS] * 250
    c.sock.sendall(b"".join(opt_hdr(o, 0) for o in opts))
    want = {NBD_OPT_LIST: NBD_REP_ACK, 0x1234: NBD_REP_ERR_UNSUP,
            NBD_OPT_STRUCTURED_REPLY: NBD_REP_ACK, NBD_OPT_STARTTLS: NBD_REP_ERR_POLICY}
    for i, o in enumerate(opts):
        opt, rtype, _ = c.recv_opt_reply()
        while opt == NBD_OPT_LIST and rtype == NBD_REP_SERVER:
            opt, rtype, _ = c.recv_opt_reply()
        if (opt, rtype) != (o, want[o]):
            fail("pipelined option #%d: got (%d, %#x), want (%d, %#x)"
                 % (i, opt, rtype, o, want[o]))
    ok("1000 pipelined options answered in order")
    still_in_sync(c, "1000 pipelined options")


@case("options sent one byte at a time")
def _():
    c = fresh(srv)
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = opt_hdr(NBD_OPT_GO, 6) + struct.pack(">IH", 0, 0)
    for b in data:
        c.sock.send(bytes([b]))
        time.sleep(0.001)
    while True:
        opt, rtype, _ = c.recv_opt_reply()
        if rtype != NBD_REP_INFO:
            break
    check_eq((opt, rtype), (NBD_OPT_GO, NBD_REP_ACK), "GO trickled a byte at a time")
    c.send_request(NBD_CMD_READ, 0, 512, cookie=5)
    check_eq(c.recv_reply(512)[:2], (5, 0), "READ after a trickled GO")
    c.disconnect()


@case("200 MiB of options whose replies are never read: server memory stays flat")
def _():
    # Parsing must pause while handshake output is unsent, or obuf grows
    # with every option (40 bytes of ERR_UNSUP per 16-byte option).
    s2 = Server(["ram", "size=16M"], opts=["--shards", "1"] + EXTRA_OPTS)
    rss0 = vmrss_mib(s2.proc.pid)
    c = RawClient(s2)
    c.start()
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    blob = opt_hdr(0x1234, 0) * 65536                      # 1 MiB of options
    sent = [0]

    def run():
        try:
            for _ in range(200):
                c.sock.sendall(blob)
                sent[0] += 1
        except OSError:
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(2)           # unfixed, RSS passed 700 MiB in under a second
    rss = vmrss_mib(s2.proc.pid)
    check(rss - rss0 < 64, "RSS growth with %d MiB of unanswered options: %.1f MiB (< 64)"
          % (sent[0], rss - rss0))
    # Reading the replies lets it go on: answers arrive in order.
    for _ in range(100):
        opt, rtype, _ = c.recv_opt_reply()
        if (opt, rtype) != (0x1234, NBD_REP_ERR_UNSUP):
            fail("reply to a piled-up option: (%d, %#x)" % (opt, rtype))
    ok("piled-up options are answered once the client reads")
    c.close()
    s2.stop()


@case("200 INFO requests on one connection (open/close churn)")
def _():
    c = fresh(srv)
    c.sock.sendall(b"".join(opt_hdr(NBD_OPT_INFO, 6) + struct.pack(">IH", 0, 0)
                            for _ in range(200)))
    acks = 0
    while acks < 200:
        opt, rtype, _ = c.recv_opt_reply()
        if opt != NBD_OPT_INFO or rtype not in (NBD_REP_INFO, NBD_REP_ACK):
            fail("INFO #%d: reply opt %d type %#x" % (acks, opt, rtype))
        acks += rtype == NBD_REP_ACK
    ok("200 INFO requests acknowledged")
    still_in_sync(c, "200 INFOs")


@case("hang-ups in every handshake state")
def _():
    cuts = [
        ("right after connect", b"", False),
        ("after the greeting", b"", True),
        ("mid client flags", b"\0\0", True),
        ("after client flags", b"\0\0\0\3", True),
        ("mid option header", b"\0\0\0\3" + opt_hdr(NBD_OPT_GO, 6)[:9], True),
        ("after an option header", b"\0\0\0\3" + opt_hdr(NBD_OPT_GO, 6), True),
        ("mid option data", b"\0\0\0\3" + opt_hdr(NBD_OPT_GO, 100) + b"\0" * 40, True),
        ("mid a skipped oversized option", b"\0\0\0\3" + opt_hdr(1234, 1 << 24) + bytes(MiB), True),
        ("mid EXPORT_NAME", b"\0\0\0\3" + opt_hdr(NBD_OPT_EXPORT_NAME, 10) + b"abc", True),
        ("after GO, before reading its reply",
         b"\0\0\0\3" + opt_hdr(NBD_OPT_GO, 6) + b"\0" * 6, True),
    ]
    for what, data, read_greeting in cuts:
        for how in ("close", "reset"):
            c = RawClient(srv)
            if read_greeting:
                c.greeting()
            if data:
                send_quiet(c.sock, data)
            if how == "reset":
                c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()
        ok("hang-up (close and reset) %s" % what)


@case("100 connections that connect and vanish at once")
def _():
    for i in range(100):
        s = srv.connect_socket()
        if i % 2:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


run_cases(srv, CASES)
