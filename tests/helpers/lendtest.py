"""Helpers for tests/test-lend-*.py: blkd's lending counters on /metrics,
and raw clients that leave replies unread."""

import time
import urllib.request

from blkdtest import RawClient, fail, read_via_chunks, NBD_CMD_READ

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


def read_requests(c, ranges, first_cookie=1):
    """Send READs for (offset, length) pairs without reading any reply."""
    c.sock.sendall(b"".join(RawClient.request(NBD_CMD_READ, off, n, cookie=first_cookie + i)
                            for i, (off, n) in enumerate(ranges)))


def read_data(c, offset, length):
    """One successful READ reply's (cookie, data), simple or structured."""
    cookie, err, chunks, data = c.recv_reply(read_len=length)
    if err:
        fail("READ cookie %d failed with NBD error %d" % (cookie, err))
    if chunks is not None:
        data = read_via_chunks(chunks, offset, length)[0]
    return cookie, data
