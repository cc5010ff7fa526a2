#!/usr/bin/python3
"""Write the seed corpora for fuzz/fuzz_nbd.c: fuzz/corpus/handshake/ and
fuzz/corpus/request/.  Each seed is a small, valid-or-nearly-valid client
stream that reaches one part of the parsers, so the fuzzer starts from
every option, command and flag instead of rediscovering the magics.

    /usr/bin/python3 fuzz/make-corpus.py fuzz/corpus     (make fuzz-corpus)

Handshake seeds are what a client sends after the greeting; request seeds
are one mode byte (bit 0 structured, bit 1 base:allocation, bit 2
read-only, bit 3 EXPORT_NAME, bit 4 extended headers) then the
transmission stream.  The fuzz
server's disk is 1 MiB, --max-request 64 KiB.
"""
import os
import struct
import sys

OPTS = 0x49484156454f5054
REQ = 0x25609513
EXT_REQ = 0x21e41c71
PAYLOAD_LEN = 1 << 5


def flags(f=3):
    return struct.pack(">I", f)


def opt(o, data=b"", length=None):
    return struct.pack(">QII", OPTS, o, len(data) if length is None else length) + data


def go_data(name=b"", infos=()):
    return struct.pack(">I", len(name)) + name + struct.pack(">H", len(infos)) + \
        b"".join(struct.pack(">H", i) for i in infos)


def meta_data(name=b"", queries=(b"base:allocation",)):
    return struct.pack(">II", len(name), len(queries)) + name + \
        b"".join(struct.pack(">I", len(q)) + q for q in queries)


def req(cmd, off=0, count=0, flags=0, cookie=1, payload=b""):
    return struct.pack(">IHHQQI", REQ, flags, cmd, cookie, off, count) + payload


def ereq(cmd, off=0, length=0, flags=0, cookie=1, payload=b"", magic=EXT_REQ):
    """An extended request (NBD_OPT_EXTENDED_HEADERS): 64-bit length."""
    return struct.pack(">IHHQQQ", magic, flags, cmd, cookie, off, length) + payload


def ewrite(off, data, cookie=1, flags=0):
    return ereq(1, off, len(data), flags | PAYLOAD_LEN, cookie, data)


GO = opt(7, go_data())
DISC = req(2)
K = 1024

handshake = {
    "go": flags() + GO + req(0, 0, 4096) + DISC,
    "go-structured-meta": flags() + opt(8) + opt(10, meta_data()) + GO
    + req(7, 0, 65536, cookie=2) + req(0, 0, 65536, cookie=3) + DISC,
    "list-info-abort": flags() + opt(3) + opt(6, go_data(b"", (0, 1, 2, 3))) + opt(2),
    "export-name": flags() + opt(1) + req(1, 512, 512, payload=b"w" * 512) + DISC,
    "export-name-zeroes": flags(1) + opt(1, b"name") + req(0, 0, 512) + DISC,
    "flags-zero": flags(0) + opt(1) + DISC,
    "unknown-starttls": flags() + opt(0x1234, b"xyz") + opt(5) + opt(5, b"x") + GO + DISC,
    "too-big": flags() + opt(7, b"\0" * 20000) + GO + DISC,
    "too-big-export-name": flags() + opt(1, length=1 << 20) + b"\0" * 64,
    "list-meta": flags() + opt(8) + opt(9, meta_data(b"", ())) + opt(9, meta_data(b"", (b"base:",)))
    + opt(10, meta_data(b"x", (b"nope", b"base:allocation"))) + opt(2),
    "meta-before-structured": flags() + opt(10, meta_data()) + opt(2),
    "go-malformed": flags() + opt(7, b"\0\0\0\5ab") + opt(7, go_data(b"a\0b")) + opt(6, b"")
    + opt(7, struct.pack(">IH", 0, 3) + b"\0\1") + GO + DISC,
    "go-long-name": flags() + opt(6, go_data(b"n" * 4096, (1,))) + opt(7, go_data(b"n" * 4097)),
    "bad-option-magic": flags() + struct.pack(">QII", OPTS ^ 1, 7, 0),
    "bad-flags": flags(0x80000000),
    "structured-twice": flags() + opt(8) + opt(8) + opt(8, b"x") + GO + DISC,
    "extended": flags() + opt(11) + opt(10, meta_data()) + GO + ewrite(0, b"x" * 512)
    + ereq(7, 0, 1 << 40, cookie=2) + ereq(6, 0, 1 << 36, cookie=3) + ereq(2),
    "extended-misuse": flags() + opt(11, b"x") + opt(11) + opt(8) + opt(11) + opt(1),
    "extended-then-tls": flags() + opt(11) + opt(5) + opt(2),
    "info-then-go": flags() + opt(6, go_data(b"", (3,))) + opt(7, go_data(b"", (1, 2, 3)))
    + req(0, 0, 1, cookie=9) + DISC,
}

request = {
    "basic-simple": b"\0" + req(1, 0, 4096, payload=b"a" * 4096) + req(0, 0, 4096, cookie=2)
    + req(3, cookie=3) + req(4, 4096, 4096, cookie=4) + req(6, 8192, 4096, cookie=5)
    + req(5, 0, 4096, cookie=6) + DISC,
    "basic-structured-meta": b"\3" + req(1, 0, 8192, 1, payload=b"b" * 8192)
    + req(7, 0, 1 << 20, cookie=2) + req(7, 0, 65536, 8, cookie=3)
    + req(0, 0, 65536, cookie=4) + req(0, 0, 4096, 4, cookie=5) + DISC,
    "sparse-read": b"\3" + req(1, 65536, 4096, payload=b"c" * 4096)
    + req(0, 0, 65536 * 1, cookie=2) + req(4, 65536, 4096, cookie=3) + req(0, 32768, 65536, cookie=4),
    "readonly-writes": b"\4" + req(1, 0, 512, payload=b"d" * 512) + req(4, 0, 512)
    + req(6, 0, 512, 2) + req(0, 0, 512) + DISC,
    "export-name": b"\x08" + req(0, 0, 512) + req(1, 1 << 20, 512, payload=b"e" * 512) + DISC,
    "invalid": b"\1" + req(0, 1 << 20, 512) + req(0, (1 << 64) - 512, 1024)
    + req(1, 0, 70000, payload=b"f" * 70000) + req(9, 0, 0) + req(0, 0, 0) + req(3, 1, 1)
    + req(0, 0, 512, 0x8000) + req(1, 0, 512, 2, payload=b"g" * 512) + req(7, 0, 512) + DISC,
    "zeroes-flags": b"\3" + req(6, 0, 65536, 2) + req(6, 0, 65536, 16) + req(6, 0, 65536, 1)
    + req(4, 0, 65536, 1) + DISC,
    "write-header-4g": b"\0" + req(1, 0, 0xffffffff) + b"\0" * 1000,
    "pipelined": b"\1" + b"".join(req(0, i * 4096, 4096, cookie=i) for i in range(40))
    + b"".join(req(1, i * 512, 512, cookie=100 + i, payload=bytes([i]) * 512) for i in range(20))
    + DISC,
    "truncated-write": b"\0" + req(1, 0, 65536) + b"h" * 30000,
    "bad-magic-after-good": b"\1" + req(0, 0, 512) + struct.pack(">I", 0x12345678) + b"\0" * 24,
    "ext-basic": b"\x13" + ewrite(0, b"i" * 8192, flags=1) + ereq(0, 0, 8192, cookie=2)
    + ereq(7, 0, 1 << 40, cookie=3) + ereq(7, 0, 1 << 20, 8, cookie=4) + ereq(3, cookie=5)
    + ereq(4, 4096, 4096, cookie=6) + ereq(6, 0, 1 << 36, cookie=7) + ereq(5, 0, 4096, cookie=8)
    + ereq(2),
    "ext-lengths": b"\x12" + ereq(0, 0, (1 << 64) - 1) + ereq(0, 0, 1 << 32) + ereq(4, 0, (1 << 64) - 1)
    + ereq(6, (1 << 64) - 1, 1) + ereq(7, 1 << 63, 1 << 63) + ereq(3, 0, 1 << 40) + ereq(2),
    "ext-payload-len": b"\x12" + ereq(4, 0, 100, PAYLOAD_LEN, payload=b"j" * 100)
    + ereq(7, 0, 8, PAYLOAD_LEN, payload=b"k" * 8) + ewrite(0, b"l" * 70000)
    + ereq(1, 0, 512, payload=b"m" * 512),
    "ext-huge-payload": b"\x12" + ereq(1, 0, 1 << 40, PAYLOAD_LEN) + b"\0" * 64,
    "ext-compact-mix": b"\x12" + ereq(0, 0, 512) + req(0, 0, 512) + ereq(2),
    "compact-ext-mix": b"\x01" + req(0, 0, 512) + ereq(0, 0, 512) + DISC,
    "ext-readonly": b"\x16" + ewrite(0, b"n" * 512) + ereq(4, 0, 1 << 33) + ereq(6, 0, 512)
    + ereq(0, 0, 512) + ereq(2),
    "disc-in-flight": b"\0" + req(0, 0, 65536) + req(0, 65536, 65536, cookie=2) + DISC + req(0, 0, 1),
}


def main(top):
    for name, seeds in (("handshake", handshake), ("request", request)):
        d = os.path.join(top, name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f.startswith("seed-"):
                os.unlink(os.path.join(d, f))
        for k, v in seeds.items():
            with open(os.path.join(d, "seed-" + k), "wb") as f:
                f.write(v)
        print("%s: %d seeds in %s" % (name, len(seeds), d))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus"))
