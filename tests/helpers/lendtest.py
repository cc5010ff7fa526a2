"""Helpers for tests/test-lend-*.py: blkd's lending counters on /metrics,
and raw clients that leave replies unread."""

import ctypes
import errno
import os
import struct
import time
import urllib.request

from blkdtest import (RawClient, fail, read_via_chunks, recv_exact, skip, NBD_CMD_READ,
                      NBD_SIMPLE_REPLY_MAGIC)

MiB = 1024 * 1024


def metrics(port):
    """/metrics as {sample name (labels dropped, summed): value}."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{")[0]
        out[name] = out.get(name, 0) + float(value)
    return out


def wait_metric(port, cond, what, secs=60):
    """Poll until cond(metrics) holds; generous, never a timed assertion
    of speed: the server only has to get there."""
    deadline = time.time() + secs
    while True:
        m = metrics(port)
        if cond(m):
            return m
        if time.time() > deadline:
            fail("%s: not reached in %ds (metrics: %s)" % (
                what, secs, {k: v for k, v in m.items()
                             if "lend" in k or "placed" in k or "flight" in k}))
        time.sleep(0.05)


def need_cachestat(path):
    """rawio sends with sendfile only ranges cachestat(2) says are in the
    page cache; before Linux 6.5 there is no cachestat, rawio copies, and a
    test of its sendfile replies has nothing to check: skip it."""
    class Range(ctypes.Structure):
        _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]

    libc = ctypes.CDLL(None, use_errno=True)
    cs = (ctypes.c_uint64 * 5)()
    fd = os.open(path, os.O_RDONLY)
    try:
        r = libc.syscall(ctypes.c_long(451), fd, ctypes.byref(Range(0, 4096)), cs, 0)
    finally:
        os.close(fd)
    if r == -1 and ctypes.get_errno() == errno.ENOSYS:
        skip("no cachestat(2) (Linux < 6.5): rawio copies instead of using sendfile")


def read_requests(c, ranges, first_cookie=1):
    """Send READs for (offset, length) pairs without reading any reply."""
    c.sock.sendall(b"".join(RawClient.request(NBD_CMD_READ, off, n, cookie=first_cookie + i)
                            for i, (off, n) in enumerate(ranges)))


def read_data(c, ranges, first_cookie=1):
    """The next READ reply, which may answer any of the requests sent by
    read_requests(c, ranges, first_cookie) (replies come in completion
    order): returns (index into ranges, data)."""
    magic = c.recv(4)
    cookie, err, chunks, data = _recv_reply_sized(c, magic, ranges, first_cookie)
    i = cookie - first_cookie
    if err:
        fail("READ cookie %d failed with NBD error %d" % (cookie, err))
    if chunks is not None:
        off, n = ranges[i]
        data = read_via_chunks(chunks, off, n)[0]
    return i, data


def _recv_reply_sized(c, magic, ranges, first_cookie):
    """recv_reply, but a simple reply's length comes from its cookie."""
    if struct.unpack(">I", magic)[0] == NBD_SIMPLE_REPLY_MAGIC:
        error, cookie = struct.unpack(">IQ", c.recv(12))
        n = ranges[cookie - first_cookie][1]
        return cookie, error, None, c.recv(n) if error == 0 else b""
    # Structured: push the magic back by handing recv_reply a socket view.
    return _Prefixed(c, magic).recv_reply()


class _Prefixed(RawClient):
    """A RawClient whose first recv returns bytes already read."""

    def __init__(self, c, prefix):
        self.sock = c.sock
        self._prefix = prefix

    def recv(self, n):
        if self._prefix:
            head, self._prefix = self._prefix[:n], self._prefix[n:]
            return head + (recv_exact(self.sock, n - len(head)) if n > len(head) else b"")
        return recv_exact(self.sock, n)
