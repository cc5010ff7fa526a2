#!/usr/bin/python3
# Hostile clients in the transmission phase, by hand over raw sockets:
# unknown commands and flags, requests past the end and overflowing the
# offset, zero-length and misaligned requests (rawio direct=true, which
# advertises a minimum block size), requests over --max-request (EINVAL,
# connection usable), a WRITE header with count 0xffffffff (EINVAL, its
# payload discarded: both a client that sends all 4 GiB and stays in sync
# and one that hangs up half way), truncated writes, bad request magic,
# garbage, DISC with requests in flight, pipelining past --max-inflight,
# and pipelining through a pool smaller than the pipeline.
#
# Each case checks the spec's error code (proto.md "Error values": EINVAL
# for bad requests, ENOSPC for writes past the end, EPERM for writes to a
# read-only export), that the connection is still in sync when it should
# be, and afterwards that the server is alive, serves a second client and
# keeps RSS and fds flat.  Runs in ~15 s.
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from hostile import *  # noqa: E402,F401,F403

need_server()
if IS_NBDKIT:
    skip("blkd-specific hostile suite (uses --max-request and the in-tree plugins)")

MiB = 1 << 20
SIZE = 64 * MiB
MAXREQ = MiB
NBD_CMD_FLAG_NO_HOLE = 1 << 1
NBD_CMD_FLAG_FAST_ZERO = 1 << 4
NBD_CMD_FLAG_PAYLOAD_LEN = 1 << 5

srv = Server(["ram", "size=64M"], opts=["--max-request", "1M"] + EXTRA_OPTS)


def conn(structured=True, meta=False, server=None):
    c = RawClient(server or srv)
    c.handshake(structured=structured, meta=meta)
    return c


def reply(c, read_len=0):
    """(cookie, error, chunk types) of the next reply; the data is read too."""
    cookie, err, chunks, _ = c.recv_reply(read_len)
    return cookie, err, [t for t, _, _ in chunks] if chunks is not None else None


def expect_err(c, cmd, off, count, want, flags=0, payload=b"", what=None, read_len=0):
    what = what or "cmd %d flags %#x offset %#x count %#x" % (cmd, flags, off, count)
    c.send_request(cmd, off, count, cookie=0xc0ffee, flags=flags, payload=payload)
    try:
        cookie, err, types = reply(c, read_len)
    except (OSError, EOFError, ProtocolError) as e:
        fail("%s: no reply (%s)" % (what, e))
    wants = want if isinstance(want, (tuple, list, set)) else (want,)
    if cookie != 0xc0ffee or err not in wants:
        fail("%s: got cookie %#x error %d, want error %s" % (what, cookie, err, wants))
    ok("%s -> %d" % (what, err))
    return err, types


def in_sync(c, what, off=4 * MiB):
    """Write then read 4 KiB on the same connection."""
    pat = os.urandom(4096)
    c.send_request(NBD_CMD_WRITE, off, 4096, cookie=0x5151, payload=pat)
    cookie, err, _ = reply(c)
    if (cookie, err) != (0x5151, 0):
        fail("in sync after %s: WRITE got cookie %#x error %d" % (what, cookie, err))
    c.send_request(NBD_CMD_READ, off, 4096, cookie=0x5252)
    cookie, err, chunks, data = c.recv_reply(4096)
    if chunks is not None:
        data, _ = read_via_chunks(chunks, off, 4096)
    if (cookie, err, data) != (0x5252, 0, pat):
        fail("in sync after %s: READ back wrong (cookie %#x error %d)" % (what, cookie, err))
    ok("connection still in sync after %s" % what)


@case("unknown commands 8, 9, 100, 0xffff with counts 0, 4096, 0xffffffff: EINVAL")
def _():
    for structured in (False, True):
        c = conn(structured)
        for cmd in (8, 9, 100, 0xffff):
            for count in (0, 4096, 0xffffffff):
                expect_err(c, cmd, 0, count, NBD_EINVAL)
        in_sync(c, "unknown commands")
        c.disconnect()


@case("unknown or misplaced command flags: EINVAL, write payloads skipped")
def _():
    c = conn(structured=False)
    expect_err(c, NBD_CMD_READ, 0, 4096, NBD_EINVAL, flags=1 << 15, what="READ flag bit 15")
    expect_err(c, NBD_CMD_READ, 0, 4096, NBD_EINVAL, flags=NBD_CMD_FLAG_DF,
               what="READ with DF under simple replies")
    expect_err(c, NBD_CMD_READ, 0, 4096, NBD_EINVAL, flags=NBD_CMD_FLAG_REQ_ONE,
               what="READ with REQ_ONE")
    for fl in (NBD_CMD_FLAG_NO_HOLE, NBD_CMD_FLAG_DF, NBD_CMD_FLAG_REQ_ONE,
               NBD_CMD_FLAG_FAST_ZERO, NBD_CMD_FLAG_PAYLOAD_LEN, 0xffff):
        expect_err(c, NBD_CMD_WRITE, 0, 8192, NBD_EINVAL, flags=fl, payload=b"\xee" * 8192,
                   what="WRITE with flags %#x (payload sent)" % fl)
    expect_err(c, NBD_CMD_FLUSH, 0, 0, NBD_EINVAL, flags=NBD_CMD_FLAG_PAYLOAD_LEN,
               what="FLUSH with PAYLOAD_LEN")
    expect_err(c, NBD_CMD_TRIM, 0, 4096, NBD_EINVAL, flags=NBD_CMD_FLAG_NO_HOLE,
               what="TRIM with NO_HOLE")
    expect_err(c, NBD_CMD_BLOCK_STATUS, 0, 4096, NBD_EINVAL, flags=NBD_CMD_FLAG_DF,
               what="BLOCK_STATUS with DF")
    # The rejected writes must not have written anything.
    c.send_request(NBD_CMD_READ, 0, 8192, cookie=3)
    cookie, err, _, data = c.recv_reply(8192)
    check(err == 0 and b"\xee" * 64 not in data, "rejected writes left the disk untouched")
    in_sync(c, "bad flags")
    c.disconnect()


@case("requests past the end and overflowing the offset: EINVAL / ENOSPC")
def _():
    c = conn(structured=True, meta=True)
    end = SIZE
    for off, count in ((end, 1), (end - 512, 1024), (end + 4096, 4096),
                       ((1 << 64) - 512, 1024), ((1 << 64) - 1, 1), (1 << 63, 4096)):
        expect_err(c, NBD_CMD_READ, off, count, NBD_EINVAL,
                   what="READ offset %#x count %d" % (off, count))
        expect_err(c, NBD_CMD_WRITE, off, count, NBD_ENOSPC, payload=b"\xdd" * count,
                   what="WRITE offset %#x count %d" % (off, count))
        expect_err(c, NBD_CMD_WRITE_ZEROES, off, count, NBD_ENOSPC,
                   what="WRITE_ZEROES offset %#x count %d" % (off, count))
        expect_err(c, NBD_CMD_TRIM, off, count, (NBD_EINVAL, NBD_ENOSPC),
                   what="TRIM offset %#x count %d" % (off, count))
        expect_err(c, NBD_CMD_CACHE, off, count, NBD_EINVAL,
                   what="CACHE offset %#x count %d" % (off, count))
        expect_err(c, NBD_CMD_BLOCK_STATUS, off, count, NBD_EINVAL,
                   what="BLOCK_STATUS offset %#x count %d" % (off, count))
    expect_err(c, NBD_CMD_WRITE_ZEROES, 0, 0xffffffff, NBD_ENOSPC,
               what="WRITE_ZEROES of 4 GiB on a 64 MiB disk")
    expect_err(c, NBD_CMD_TRIM, 0, 0xffffffff, (NBD_EINVAL, NBD_ENOSPC),
               what="TRIM of 4 GiB on a 64 MiB disk")
    # The last byte is fine.
    expect_err(c, NBD_CMD_READ, end - 1, 1, 0, read_len=1, what="READ of the last byte")
    in_sync(c, "past-the-end requests")
    c.disconnect()


@case("zero-length requests: EINVAL (or success) and no payload expected")
def _():
    c = conn(structured=True, meta=True)
    for cmd in (NBD_CMD_READ, NBD_CMD_WRITE, NBD_CMD_TRIM, NBD_CMD_WRITE_ZEROES,
                NBD_CMD_CACHE, NBD_CMD_BLOCK_STATUS):
        expect_err(c, cmd, 4096, 0, (NBD_EINVAL, 0), what="cmd %d with count 0" % cmd)
    in_sync(c, "zero-length requests")
    c.disconnect()


@case("FLUSH with an offset or a length: EINVAL")
def _():
    c = conn()
    expect_err(c, NBD_CMD_FLUSH, 4096, 0, NBD_EINVAL, what="FLUSH offset 4096")
    expect_err(c, NBD_CMD_FLUSH, 0, 4096, NBD_EINVAL, what="FLUSH count 4096 (no payload)")
    expect_err(c, NBD_CMD_FLUSH, 0, 0, 0, what="plain FLUSH")
    in_sync(c, "bad FLUSH")
    c.disconnect()


@case("requests over --max-request (1 MiB): EINVAL, payload skipped, usable")
def _():
    for structured in (False, True):
        c = conn(structured)
        for count in (MAXREQ + 1, MAXREQ + 4096, 2 * MAXREQ, 32 * MiB):
            expect_err(c, NBD_CMD_READ, 0, count, NBD_EINVAL, what="READ of %d bytes" % count)
            expect_err(c, NBD_CMD_WRITE, 0, count, NBD_EINVAL, payload=b"\xab" * count,
                       what="WRITE of %d bytes (payload sent)" % count)
        expect_err(c, NBD_CMD_READ, 0, MAXREQ, 0, read_len=MAXREQ,
                   what="READ of exactly --max-request")
        c.send_request(NBD_CMD_READ, 0, 8192, cookie=3)
        cookie, err, chunks, data = c.recv_reply(8192)
        if chunks is not None:
            data, _ = read_via_chunks(chunks, 0, 8192)
        check(err == 0 and b"\xab" * 64 not in data, "oversized writes wrote nothing")
        in_sync(c, "oversized requests")
        c.disconnect()


@case("WRITE header with count 0xffffffff: 4 GiB discarded, then EINVAL, in sync")
def _():
    c = conn(structured=True)
    c.send_request(NBD_CMD_WRITE, 0, 0xffffffff, cookie=0xbad)
    # No reply before the payload: a client matches a reply only to a
    # request it has finished sending (libnbd drops the connection for an
    # early one).
    c.sock.settimeout(0.5)
    try:
        early = c.sock.recv(1)
    except (TimeoutError, socket.timeout):
        early = None
    check(early is None, "no reply while the refused WRITE's payload is still coming")
    # A second client is served while this one's payload is being skipped.
    zeros = bytes(16 * MiB)
    left = 0xffffffff
    t = time.time()
    first = True
    while left:
        k = min(left, len(zeros))
        c.sock.sendall(memoryview(zeros)[:k])
        left -= k
        if first and left < 0xffffffff // 2:
            round_trip(srv, "half of a 4 GiB discarded payload")
            ok("another client served while a 4 GiB payload is discarded")
            first = False
    ok("4 GiB payload sent in %.1f s" % (time.time() - t))
    c.sock.settimeout(30)
    cookie, err, _ = reply(c)
    check_eq((cookie, err), (0xbad, NBD_EINVAL), "EINVAL for a 4 GiB WRITE once its payload is skipped")
    in_sync(c, "a discarded 4 GiB payload")
    c.disconnect()


@case("WRITE header with count 0xffffffff, client hangs up after 64 MiB (close, reset)")
def _():
    for how in ("close", "reset"):
        c = conn(structured=True)
        c.send_request(NBD_CMD_WRITE, 0, 0xffffffff, cookie=0xbad)
        c.sock.sendall(bytes(64 * MiB))
        if how == "reset":
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()


@case("truncated writes: header only, half a header, half the payload")
def _():
    cuts = [
        RawClient.request(NBD_CMD_WRITE, 0, 65536)[:13],
        RawClient.request(NBD_CMD_WRITE, 0, 65536),
        RawClient.request(NBD_CMD_WRITE, 0, 65536) + b"\x77" * 32768,
        RawClient.request(NBD_CMD_WRITE, 0, 4096) + b"\x77" * 100,
        RawClient.request(NBD_CMD_WRITE, 0, MAXREQ) + b"\x77" * (MAXREQ - 1),
    ]
    for data in cuts:
        c = conn()
        c.sock.sendall(data)
        c.close()
    time.sleep(0.2)
    c = conn(structured=False)
    c.send_request(NBD_CMD_READ, 0, MAXREQ, cookie=1)
    cookie, err, _, data = c.recv_reply(MAXREQ)
    check(err == 0 and b"\x77" * 64 not in data, "no truncated write reached the disk")
    c.disconnect()


@case("bad request magic (first request, and after good ones): closed")
def _():
    for prefix in (b"", RawClient.request(NBD_CMD_READ, 0, 512, cookie=1) * 3):
        for magic in (0, 0x25609514, NBD_SIMPLE_REPLY_MAGIC, 0x21e41c71):
            c = conn(structured=False)
            send_quiet(c.sock, prefix + RawClient.request(NBD_CMD_READ, 0, 512, magic=magic))
            c.sock.settimeout(5)
            got = 0
            try:
                while True:
                    cookie, err, _, _ = c.recv_reply(512)
                    check_eq((cookie, err), (1, 0), "reply before the bad magic")
                    got += 1
            except (EOFError, ConnectionResetError):
                pass
            except socket.timeout:
                fail("server did not close after request magic %#x" % magic)
            # Requests before the bad one are answered, then it closes.
            check_eq(got, len(prefix) // 28, "replies before request magic %#x, then closed"
                     % magic)
            c.close()


@case("garbage in the transmission phase: closed")
def _():
    for junk in (os.urandom(28), os.urandom(65536), b"\0" * 4096):
        c = conn()
        send_quiet(c.sock, junk)
        check(peer_closed(c.sock, 5), "server closes on %d bytes of garbage" % len(junk))
        c.close()


@case("requests and payloads sent one byte at a time")
def _():
    c = conn(structured=False)
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pat = os.urandom(600)
    data = RawClient.request(NBD_CMD_WRITE, 12345, 600, cookie=42) + pat \
        + RawClient.request(NBD_CMD_READ, 12345, 600, cookie=43)
    for i in range(len(data)):
        c.sock.send(data[i:i + 1])
    check_eq(reply(c)[:2], (42, 0), "trickled WRITE")
    cookie, err, _, got = c.recv_reply(600)
    check_eq((cookie, err, got == pat), (43, 0, True), "trickled READ returns the data")
    c.disconnect()


@case("cookies 0 and 2^64-1 are echoed exactly")
def _():
    c = conn(structured=True)
    for cookie in (0, (1 << 64) - 1, 0x0102030405060708):
        c.send_request(NBD_CMD_READ, 0, 512, cookie=cookie)
        check_eq(reply(c, 512)[0], cookie, "cookie echoed")
        c.send_request(NBD_CMD_READ, SIZE, 512, cookie=cookie)
        check_eq(reply(c)[:2], (cookie, NBD_EINVAL), "cookie echoed in an error")
    c.disconnect()


@case("error replies to READ/BLOCK_STATUS are structured ERROR chunks with DONE")
def _():
    c = conn(structured=True, meta=True)
    for cmd in (NBD_CMD_READ, NBD_CMD_BLOCK_STATUS):
        c.send_request(cmd, SIZE, 4096, cookie=8)
        cookie, err, chunks, _ = c.recv_reply()
        check(chunks is not None and len(chunks) == 1, "one chunk for a failed cmd %d" % cmd)
        ctype, flags, payload = chunks[0]
        check_eq((ctype, flags & NBD_REPLY_FLAG_DONE, err),
                 (NBD_REPLY_TYPE_ERROR, NBD_REPLY_FLAG_DONE, NBD_EINVAL),
                 "cmd %d error chunk (type, done, error)" % cmd)
        msglen = struct.unpack(">H", payload[4:6])[0]
        check_eq(len(payload), 6 + msglen, "error chunk length matches its message")
    c.disconnect()


@case("BLOCK_STATUS without a meta context: EINVAL; with one, whole disk works")
def _():
    c = conn(structured=True, meta=False)
    expect_err(c, NBD_CMD_BLOCK_STATUS, 0, 4096, NBD_EINVAL, what="BLOCK_STATUS w/o context")
    c.disconnect()
    c = conn(structured=True, meta=True)
    expect_err(c, NBD_CMD_BLOCK_STATUS, 0, SIZE, 0, what="BLOCK_STATUS of the whole disk")
    expect_err(c, NBD_CMD_BLOCK_STATUS, 0, 0xffffffff, NBD_EINVAL,
               what="BLOCK_STATUS of 4 GiB on a 64 MiB disk")
    c.disconnect()


@case("WRITE_ZEROES with FAST_ZERO: as advertised")
def _():
    c = conn()
    if c.eflags & NBD_FLAG_SEND_FAST_ZERO:
        expect_err(c, NBD_CMD_WRITE_ZEROES, 0, 65536, (0, NBD_ENOTSUP),
                   flags=NBD_CMD_FLAG_FAST_ZERO, what="FAST_ZERO (advertised)")
    else:
        expect_err(c, NBD_CMD_WRITE_ZEROES, 0, 65536, NBD_EINVAL,
                   flags=NBD_CMD_FLAG_FAST_ZERO, what="FAST_ZERO (not advertised)")
    in_sync(c, "FAST_ZERO")
    c.disconnect()


@case("DISC with 64 reads in flight: every reply arrives, then close")
def _():
    c = conn(structured=False)
    c.sock.sendall(b"".join(RawClient.request(NBD_CMD_READ, i * 65536, 65536, cookie=i + 1)
                            for i in range(64))
                   + RawClient.request(NBD_CMD_DISC, cookie=999)
                   + RawClient.request(NBD_CMD_READ, 0, 512, cookie=1000))
    seen = set()
    for _ in range(64):
        cookie, err, _, _ = c.recv_reply(65536)
        if err:
            fail("READ %d before DISC failed with %d" % (cookie, err))
        seen.add(cookie)
    check_eq(seen, set(range(1, 65)), "all 64 replies before DISC")
    check(peer_closed(c.sock, 5), "closed after DISC; the READ after it is not answered")
    c.close()


@case("a client that writes everything before reading: READ 16 MiB, WRITE 16 MiB, then read")
def _():
    # The READ reply fills both socket buffers.  blkd stops parsing while
    # its socket is full, but only for a moment (SEND_STALL_MS), or this
    # client, blocked sending the WRITE payload, would wait for ever (it
    # did, between 24a94b2 and the stall timer).
    big = Server(["ram", "size=64M"], opts=EXTRA_OPTS)
    c = conn(server=big)
    fill = os.urandom(MiB)                 # data, not a hole, comes back
    for i in range(16):
        c.send_request(NBD_CMD_WRITE, i * MiB, MiB, cookie=50 + i, payload=fill)
        check_eq(c.recv_reply()[:2], (50 + i, 0), "fill %d" % i)
    pat = os.urandom(16 * MiB)
    c.sock.settimeout(10)
    try:
        c.sock.sendall(RawClient.request(NBD_CMD_READ, 0, 16 * MiB, cookie=1)
                       + RawClient.request(NBD_CMD_WRITE, 32 * MiB, 16 * MiB, cookie=2) + pat)
    except socket.timeout:
        fail("the server stopped reading: the WRITE payload was not taken in 10 s")
    ok("READ, WRITE and its 16 MiB payload sent before reading anything")
    got = {}
    for _ in range(2):
        cookie, err, _, _ = c.recv_reply()
        got[cookie] = err
    check_eq(got, {1: 0, 2: 0}, "both replies, no error")
    c.send_request(NBD_CMD_READ, 40 * MiB, MiB, cookie=7)
    cookie, err, chunks, _ = c.recv_reply()
    data, _ = read_via_chunks(chunks, 40 * MiB, MiB)
    check((cookie, err, data) == (7, 0, pat[8 * MiB:9 * MiB]), "the WRITE is on disk")
    c.disconnect()
    big.check_alive()
    big.stop()


@case("DISC with flags, offset, count set still disconnects")
def _():
    c = conn()
    c.sock.sendall(struct.pack(">IHHQQI", NBD_REQUEST_MAGIC, 0xffff, NBD_CMD_DISC, 7,
                               (1 << 64) - 1, 0xffffffff))
    check(peer_closed(c.sock, 5), "closed after a DISC full of junk")
    c.close()


@case("2000 pipelined bad requests then a good one: all answered in order")
def _():
    c = conn(structured=False)
    bad = b"".join(RawClient.request(NBD_CMD_READ, SIZE + i, 4096, cookie=i) for i in range(2000))
    c.sock.sendall(bad + RawClient.request(NBD_CMD_READ, 0, 4096, cookie=5000))
    for i in range(2000):
        cookie, err, _, _ = c.recv_reply()
        if (cookie, err) != (i, NBD_EINVAL):
            fail("bad request %d: got (%d, %d)" % (i, cookie, err))
    check_eq(reply(c, 4096)[:2], (5000, 0), "the good request after 2000 bad ones")
    c.disconnect()


@case("1500 pipelined writes and reads (past --max-inflight 512), data verified")
def _():
    c = conn(structured=True)
    pats = {}
    out = []
    for i in range(750):
        off = 16 * MiB + i * 4096
        p = os.urandom(4096)
        pats[off] = p
        out.append(RawClient.request(NBD_CMD_WRITE, off, 4096, cookie=i, flags=NBD_CMD_FLAG_FUA) + p)
    for i in range(750):
        out.append(RawClient.request(NBD_CMD_READ, 16 * MiB + i * 4096, 4096, cookie=10000 + i))
    import threading
    t = threading.Thread(target=c.sock.sendall, args=(b"".join(out),))
    t.start()
    writes = 0
    reads = 0
    for _ in range(1500):
        cookie, err, chunks, _ = c.recv_reply()
        if err:
            fail("pipelined request %d failed: %d" % (cookie, err))
        if cookie >= 10000:
            off = 16 * MiB + (cookie - 10000) * 4096
            data, _ = read_via_chunks(chunks, off, 4096)
            if data != pats[off]:
                fail("pipelined READ at %d returned wrong data" % off)
            reads += 1
        else:
            writes += 1
    t.join()
    check_eq((writes, reads), (750, 750), "replies to 1500 pipelined requests")
    c.disconnect()


@case("pipelining through a 1 MiB pool: stalled connections are woken (fast and slow readers)")
def _():
    # A READ that finds the pool at its bound parks the connection until
    # replies ahead of it free their buffers.  Nothing else may be needed
    # to wake it: not a full socket (fast reader), not more input (slow
    # reader, the wake-up comes from the write event).
    K = 1024
    for bs, n, slow in ((512 * K, 64, False), (64 * K, 64, False), (512 * K, 3, True),
                        (512 * K, 3, True), (512 * K, 3, True)):
        s2 = Server(["ram", "size=64M"], opts=["--shards", "1", "--iobuf-mem", "1M",
                                               "--max-request", "512K"] + EXTRA_OPTS)
        c = RawClient(s2, timeout=5)
        c.handshake(structured=False)
        if slow:
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
        c.sock.sendall(b"".join(RawClient.request(NBD_CMD_READ, i * bs, bs, cookie=i)
                                for i in range(n)))
        got = 0
        try:
            for i in range(n):
                if slow:
                    time.sleep(0.05)
                c.recv_reply(bs)
                got += 1
        except (OSError, EOFError):
            pass
        c.close()
        s2.stop()
        check_eq(got, n, "replies to %d pipelined %d KiB READs through a 1 MiB pool%s"
                 % (n, bs // K, " (slow reader)" if slow else ""))


@case("misaligned requests on rawio direct=true (minimum block size): EINVAL")
def _():
    path = os.path.join(TMP, "direct.img")
    with open(path, "wb") as f:
        f.truncate(16 * MiB)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        os.close(fd)
    except OSError as e:
        note("no O_DIRECT on %s (%s): misaligned-request case skipped" % (TMP, e))
        return
    rsrv = Server([os.path.join(TOP, "plugins/rawio/nbdkit-rawio-plugin.so"),
                   "file=" + path, "direct=true"], opts=["--max-request", "1M"] + EXTRA_OPTS)
    c = RawClient(rsrv)
    c.start()
    rtype, info = c.go(infos=(NBD_INFO_BLOCK_SIZE,))
    check_eq(rtype, NBD_REP_ACK, "GO on rawio direct=true")
    bmin, bpref, bmax = struct.unpack(">III", info[NBD_INFO_BLOCK_SIZE])
    check(bmin >= 512, "rawio direct=true advertises a minimum block size (%d)" % bmin)
    half = bmin // 2
    for cmd, pl in ((NBD_CMD_READ, False), (NBD_CMD_WRITE, True), (NBD_CMD_TRIM, False),
                    (NBD_CMD_WRITE_ZEROES, False), (NBD_CMD_CACHE, False)):
        for off, count in ((half, bmin), (0, half), (bmin, bmin + 1), (1, 1)):
            expect_err(c, cmd, off, count, NBD_EINVAL, payload=b"\x99" * count if pl else b"",
                       what="misaligned cmd %d offset %d count %d (min %d)" % (cmd, off, count, bmin))
    pat = os.urandom(2 * bmin)
    expect_err(c, NBD_CMD_WRITE, bmin, 2 * bmin, 0, payload=pat, flags=NBD_CMD_FLAG_FUA,
               what="aligned WRITE")
    c.send_request(NBD_CMD_READ, bmin, 2 * bmin, cookie=4)
    cookie, err, _, data = c.recv_reply(2 * bmin)
    check_eq((cookie, err, data == pat), (4, 0, True), "aligned READ returns the data")
    c.disconnect()
    with open(path, "rb") as f:
        disk = f.read()
    check(b"\x99" * 64 not in disk, "no misaligned write reached the file")
    check(disk[bmin:3 * bmin] == pat, "the aligned write is in the file")
    rsrv.check_alive("rawio server alive after misaligned requests")
    round_trip(rsrv, "misaligned requests")
    rsrv.stop()



run_cases(srv, CASES)
