#!/usr/bin/python3
# Hostile clients with extended headers (NBD_OPT_EXTENDED_HEADERS), by
# hand over raw sockets: the wrong header form for what was negotiated
# (a compact request after extended headers and an extended one without
# them), bad magic and garbage, absurd 64-bit lengths, and
# NBD_CMD_FLAG_PAYLOAD_LEN mismatches (a WRITE without it, which qemu 10's
# client sends and blkd takes as a payload like qemu-nbd does; a payload
# on a command that takes none; payloads over the limit), headers dribbled
# a byte at a time, and a WRITE cut off half way.
#
# Where the stream can still be followed the server answers with an
# error chunk and the connection stays in sync; where it cannot (wrong
# magic, a payload over max(--max-request, 32 MiB)) it closes.  After every case the server is
# alive, serves a second client and keeps RSS and fds flat.
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
    skip("nbdkit (through 1.42) does not offer extended headers")

MiB = 1 << 20
SIZE = 64 * MiB
U64 = (1 << 64) - 1

srv = Server(["ram", "size=64M"], opts=["--max-request", "1M"] + EXTRA_OPTS)


def conn(extended=True, meta=True):
    c = RawClient(srv)
    c.handshake(extended=extended, structured=True, meta=meta)
    return c


def expect_err(c, cmd, off, length, want, flags=0, payload=b"", what=None):
    what = what or "cmd %d flags %#x offset %#x length %#x" % (cmd, flags, off, length)
    # Raw header: no flag added for us, so the case says exactly what is sent.
    c.sock.sendall(c.ext_request(cmd, off, length, 0xc0ffee, flags) + payload)
    try:
        cookie, err, chunks, _ = c.recv_reply()
    except (OSError, EOFError, ProtocolError) as e:
        fail("%s: no reply (%s)" % (what, e))
    wants = want if isinstance(want, (tuple, list, set)) else (want,)
    if cookie != 0xc0ffee or err not in wants:
        fail("%s: got cookie %#x error %d, want %s" % (what, cookie, err, wants))
    if err and chunks[-1][0] != NBD_REPLY_TYPE_ERROR:
        fail("%s: error not in an ERROR chunk (%r)" % (what, chunks))
    ok("%s -> %d" % (what, err))


def in_sync(c, what, off=4 * MiB):
    pat = os.urandom(4096)
    c.send_request(NBD_CMD_WRITE, off, 4096, cookie=0x5151, payload=pat)
    cookie, err, _, _ = c.recv_reply()
    if (cookie, err) != (0x5151, 0):
        fail("in sync after %s: WRITE got cookie %#x error %d" % (what, cookie, err))
    c.send_request(NBD_CMD_READ, off, 4096, cookie=0x5252)
    cookie, err, chunks, _ = c.recv_reply()
    data, _ = read_via_chunks(chunks, off, 4096)
    if (cookie, err, data) != (0x5252, 0, pat):
        fail("in sync after %s: READ back wrong (cookie %#x error %d)" % (what, cookie, err))
    ok("connection still in sync after %s" % what)


def expect_close(c, data, what):
    send_quiet(c.sock, data)
    expect_closed(c.sock, what)
    c.close()


@case("a compact request after extended headers: closed")
def _():
    c = conn()
    # 28 bytes of compact header plus the start of another: 32 to parse.
    expect_close(c, RawClient.request(NBD_CMD_READ, 0, 4096, 1) * 2,
                 "compact READ on an extended connection")
    c = conn()
    expect_close(c, RawClient.request(NBD_CMD_WRITE, 0, 4, 1) + b"abcd",
                 "compact WRITE on an extended connection")


@case("an extended request without extended headers: closed")
def _():
    for structured in (False, True):
        c = RawClient(srv)
        c.handshake(structured=structured)
        expect_close(c, RawClient.ext_request(NBD_CMD_READ, 0, 4096, 1),
                     "extended READ on a compact connection (structured %s)" % structured)
    # Negotiated but the option was refused: compact it stays.
    osrv = Server(["ram", "size=1M"], opts=["--ext-headers=off"])
    c = RawClient(osrv)
    c.start()
    check_eq(c.extended_headers(), NBD_REP_ERR_UNSUP, "--ext-headers=off")
    check_eq(c.go()[0], NBD_REP_ACK, "GO after the refusal")
    expect_close(c, RawClient.ext_request(NBD_CMD_FLUSH), "extended FLUSH after a refusal")
    osrv.stop()


@case("bad magic and garbage after extended negotiation: closed")
def _():
    for junk in (struct.pack(">I", 0x21e41c70) + bytes(28), b"\xff" * 32,
                 RawClient.ext_request(NBD_CMD_READ, 0, 512, 1, magic=NBD_EXTENDED_REPLY_MAGIC),
                 os.urandom(64)):
        c = conn()
        expect_close(c, junk, "junk %r..." % junk[:6])


@case("absurd 64-bit effect lengths: an error, in sync")
def _():
    c = conn()
    expect_err(c, NBD_CMD_READ, 0, U64, NBD_EOVERFLOW, what="READ of 2^64-1")
    expect_err(c, NBD_CMD_READ, 0, 1 << 32, NBD_EOVERFLOW, what="READ of 4 GiB")
    expect_err(c, NBD_CMD_READ, 0, 2 * MiB, NBD_EOVERFLOW, what="READ over --max-request")
    for cmd in (NBD_CMD_TRIM, NBD_CMD_WRITE_ZEROES, NBD_CMD_CACHE, NBD_CMD_BLOCK_STATUS):
        for off, length in ((0, U64), (4096, U64), (U64, 1), (1 << 63, 1 << 63),
                            (SIZE, 1 << 40)):
            expect_err(c, cmd, off, length, (NBD_EINVAL, NBD_ENOSPC),
                       what="cmd %d offset %#x length %#x" % (cmd, off, length))
    expect_err(c, NBD_CMD_FLUSH, 0, 1 << 40, NBD_EINVAL, what="FLUSH with a length")
    # Up to the end is fine, however it is expressed.
    expect_err(c, NBD_CMD_WRITE_ZEROES, 0, SIZE, 0, what="WRITE_ZEROES of the whole disk")
    expect_err(c, NBD_CMD_BLOCK_STATUS, 0, SIZE, 0, what="BLOCK_STATUS of the whole disk")
    in_sync(c, "absurd lengths")
    c.disconnect()


@case("PAYLOAD_LEN on commands that take none: payload read past, EINVAL")
def _():
    c = conn()
    for cmd, n in ((NBD_CMD_TRIM, 100), (NBD_CMD_BLOCK_STATUS, 8), (NBD_CMD_FLUSH, 16),
                   (NBD_CMD_READ, 4096), (NBD_CMD_WRITE_ZEROES, 4096), (NBD_CMD_CACHE, 1),
                   (9, 512)):
        expect_err(c, cmd, 0, n, NBD_EINVAL, flags=NBD_CMD_FLAG_PAYLOAD_LEN,
                   payload=b"\x5a" * n, what="cmd %d with a %d-byte payload" % (cmd, n))
    in_sync(c, "unexpected payloads")
    c.disconnect()


@case("WRITE payloads over --max-request: EINVAL and skipped up to 32 MiB, closed beyond")
def _():
    c = conn()
    for n in (MiB + 1, 2 * MiB, 32 * MiB):
        expect_err(c, NBD_CMD_WRITE, 0, n, NBD_EINVAL, flags=NBD_CMD_FLAG_PAYLOAD_LEN,
                   payload=b"\xab" * n, what="WRITE of %d bytes (payload sent)" % n)
    in_sync(c, "oversized writes")
    c.send_request(NBD_CMD_READ, 0, 8192, cookie=3)
    _, err, chunks, _ = c.recv_reply()
    data, _ = read_via_chunks(chunks, 0, 8192)
    check(err == 0 and b"\xab" * 64 not in data, "oversized writes wrote nothing")
    c.disconnect()
    for n in (32 * MiB + 1, 1 << 32, 1 << 40, U64):
        c = conn()
        expect_close(c, c.ext_request(NBD_CMD_WRITE, 0, n, 1, NBD_CMD_FLAG_PAYLOAD_LEN),
                     "WRITE announcing a %d-byte payload" % n)
    for cmd in (NBD_CMD_READ, NBD_CMD_BLOCK_STATUS):
        c = conn()
        expect_close(c, c.ext_request(cmd, 0, U64, 1, NBD_CMD_FLAG_PAYLOAD_LEN),
                     "cmd %d announcing a 2^64-1 byte payload" % cmd)


@case("WRITE without PAYLOAD_LEN: its length is still the payload (qemu 10 sends it so)")
def _():
    c = conn()
    pat = os.urandom(4096)
    expect_err(c, NBD_CMD_WRITE, 8 * MiB, 4096, 0, payload=pat, what="WRITE without PAYLOAD_LEN")
    c.send_request(NBD_CMD_READ, 8 * MiB, 4096, cookie=2)
    _, err, chunks, _ = c.recv_reply()
    data, _ = read_via_chunks(chunks, 8 * MiB, 4096)
    check_eq((err, data == pat), (0, True), "the flagless WRITE wrote its payload")
    expect_err(c, NBD_CMD_WRITE, 0, 2 * MiB, NBD_EINVAL, payload=b"\xcd" * (2 * MiB),
               what="flagless WRITE over --max-request: skipped")
    in_sync(c, "flagless writes")
    c.disconnect()
    c = conn()
    expect_close(c, c.ext_request(NBD_CMD_WRITE, 0, 1 << 40, 1),
                 "flagless WRITE announcing 1 TiB")


@case("headers and payload dribbled one byte at a time")
def _():
    c = conn()
    pat = os.urandom(512)
    msg = (c.ext_request(NBD_CMD_WRITE, 12 * MiB, 512, 7, NBD_CMD_FLAG_PAYLOAD_LEN) + pat
           + c.ext_request(NBD_CMD_READ, 12 * MiB, 512, 8))
    for i in range(len(msg)):
        c.sock.sendall(msg[i:i + 1])
    cookie, err, _, _ = c.recv_reply()
    check_eq((cookie, err), (7, 0), "dribbled WRITE")
    cookie, err, chunks, _ = c.recv_reply()
    data, _ = read_via_chunks(chunks, 12 * MiB, 512)
    check_eq((cookie, err, data == pat), (8, 0, True), "dribbled READ returns the data")
    c.disconnect()


@case("a pipeline of mixed extended requests, then DISC")
def _():
    c = conn()
    msg = b""
    for i in range(64):
        if i % 4 == 0:
            msg += c.ext_request(NBD_CMD_WRITE, i * 4096, 4096, i, NBD_CMD_FLAG_PAYLOAD_LEN)
            msg += bytes([i]) * 4096
        elif i % 4 == 1:
            msg += c.ext_request(NBD_CMD_READ, i * 4096, 4096, i)
        elif i % 4 == 2:
            msg += c.ext_request(NBD_CMD_BLOCK_STATUS, 0, SIZE, i)
        else:
            msg += c.ext_request(NBD_CMD_WRITE_ZEROES, i * 4096, 1 << 20, i)
    c.sock.sendall(msg + c.ext_request(NBD_CMD_DISC))
    seen = set()
    for _ in range(64):
        cookie, err, _, _ = c.recv_reply()
        check(err == 0, "pipelined request %d succeeded" % cookie)
        seen.add(cookie)
    check_eq(len(seen), 64, "every pipelined request answered once")
    check(peer_closed(c.sock), "DISC closes after the pipeline")
    c.close()


@case("a WRITE cut off half way: the server drops the connection")
def _():
    c = conn()
    c.sock.sendall(c.ext_request(NBD_CMD_WRITE, 0, MiB, 1, NBD_CMD_FLAG_PAYLOAD_LEN)
                   + b"\x11" * (MiB // 2))
    c.sock.shutdown(socket.SHUT_WR)
    expect_closed(c.sock, "half a payload then EOF")
    c.close()


run_cases(srv, CASES)
