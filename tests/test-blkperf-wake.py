#!/usr/bin/python3
# blkperf's wake-up threshold (client/wire.c, bp_wire_wake): on uniform
# large reads the connection thread must wake about once per whole reply,
# not once per piece of it that arrives; --wake-replies sets or disables it.  The server here is a minimal NBD
# server in this file that sends each 256 KiB read reply in PIECES pieces a
# few milliseconds apart, so that a client woken per arrival sleeps and
# wakes PIECES times per reply whatever the load.  The measure is the
# client's voluntary context switches (wait4's rusage), a count, not a
# time.  Then the same server answers some reads with short error replies
# after the threshold is armed: the run must still finish with every
# request accounted for (the threshold disarms itself).
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

BLKPERF = os.environ.get("BLKPERF") or os.path.join(TOP, "blkperf")
if not os.access(BLKPERF, os.X_OK):
    skip("blkperf is not built (make blkperf)")

BS = 256 * 1024
SIZE = 64 << 20
# 16 pieces 1 ms apart: 16 ms a reply, well inside the 50 ms receive
# timeout blkperf uses while the threshold is armed, even when slowed down
# a few times by load; and many more wake-ups per reply than one when
# woken per piece, even when load merges some pieces.
PIECES = 16
GAP_S = 0.001
REQUESTS = 400


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        got = s.recv(n - len(b))
        if not got:
            raise EOFError
        b += got
    return b


def opt_reply(s, opt, rtype, data=b""):
    s.sendall(struct.pack(">QIII", NBD_REP_MAGIC, opt, rtype, len(data)) + data)


class DribbleServer:
    """Fixed newstyle, simple replies only (structured replies are refused,
    so the reply layout is fixed).  Reads get zeros, sent in PIECES pieces
    GAP_S apart; with errors_after=N, every 3rd read after the Nth request
    on a connection gets an EIO simple reply (16 bytes, no data)."""

    def __init__(self, errors_after=None):
        self.errors_after = errors_after
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.zero = bytes(BS // PIECES)
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            c, _ = self.sock.accept()
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        try:
            if self.handshake(c):
                self.transmit(c)
        except (EOFError, OSError):
            pass
        finally:
            c.close()

    def handshake(self, c):
        c.sendall(struct.pack(">QQH", NBD_MAGIC, NBD_OPTS_MAGIC,
                              NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES))
        recv_exact(c, 4)
        while True:
            magic, opt, n = struct.unpack(">QII", recv_exact(c, 16))
            recv_exact(c, n)
            if opt in (NBD_OPT_GO, NBD_OPT_INFO):
                info = struct.pack(">HQH", NBD_INFO_EXPORT, SIZE, NBD_FLAG_HAS_FLAGS | NBD_FLAG_READ_ONLY)
                opt_reply(c, opt, NBD_REP_INFO, info)
                opt_reply(c, opt, NBD_REP_ACK)
                if opt == NBD_OPT_GO:
                    return True
            elif opt == NBD_OPT_ABORT:
                opt_reply(c, opt, NBD_REP_ACK)
                return False
            else:
                opt_reply(c, opt, NBD_REP_ERR_UNSUP)

    def transmit(self, c):
        n = 0
        while True:
            magic, _, cmd, handle, off, length = struct.unpack(">IHHQQI", recv_exact(c, 28))
            if magic != NBD_REQUEST_MAGIC or cmd == NBD_CMD_DISC:
                return
            n += 1
            if cmd != NBD_CMD_READ or length != BS:
                c.sendall(struct.pack(">IIQ", NBD_SIMPLE_REPLY_MAGIC, 22, handle))   # EINVAL
                continue
            if self.errors_after is not None and n > self.errors_after and n % 3 == 0:
                c.sendall(struct.pack(">IIQ", NBD_SIMPLE_REPLY_MAGIC, 5, handle))    # EIO
                continue
            c.sendall(struct.pack(">IIQ", NBD_SIMPLE_REPLY_MAGIC, 0, handle) + self.zero)
            for _ in range(PIECES - 1):
                time.sleep(GAP_S)
                c.sendall(self.zero)


def blkperf(port, *args):
    """Runs blkperf; returns (exit status, JSON or None, stderr, voluntary
    context switches of the whole process)."""
    out = os.path.join(TMP, "bp.json")
    err = os.path.join(TMP, "bp.err")
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen([BLKPERF, "--json", "--quiet", "-t", "STREAM_READ", "-b", "256k"]
                             + list(args) + ["nbd://127.0.0.1:%d" % port], stdout=fo, stderr=fe)
        _, status, ru = os.wait4(p.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    try:
        d = json.load(open(out))
    except ValueError:
        d = None
    return rc, d, open(err).read(), ru.ru_nvcsw


# TEST: one wake-up per whole reply, not one per piece.
srv = DribbleServer()
rc, d, err, nvcsw = blkperf(srv.port, "-q", "4", "-n", str(REQUESTS))
check(rc == 0 and d is not None, "blkperf ran against the dribbling server", err)
check_eq(d["requests"], REQUESTS, "requests done")
check_eq(d["io"], "wire", "request loop")
per = nvcsw / REQUESTS
print("voluntary context switches: %d, %.2f per request (a reply comes in %d pieces)"
      % (nvcsw, per, PIECES))
# Woken per piece: about PIECES per request.  Woken per reply: about one,
# plus the first replies before the threshold is armed (up to 16 here: the
# slow server leaves the receive buffer small, so blkperf arms on its
# fourth look) and the other threads' few wake-ups.
check(per < PIECES / 4, "blkperf woke %.2f times per request; a reply comes in %d pieces, "
      "expected about one wake-up per reply" % (per, PIECES))

# TEST: --wake-replies 0 turns the threshold off: woken per piece again.
rc, d, err, nvcsw = blkperf(srv.port, "-q", "4", "-n", "100", "--wake-replies", "0")
check(rc == 0 and d is not None and d["requests"] == 100 and d["wake_replies"] == 0,
      "--wake-replies 0 runs and says so", err)
# About PIECES when idle; load can merge a few pieces into one wake-up.
check(nvcsw / 100 > PIECES / 4, "--wake-replies 0: woken %.2f times per request, "
      "expected about one per piece (%d)" % (nvcsw / 100, PIECES))

# TEST: several replies per wake-up: every request still ends, including
# the last few, fewer than the threshold (it is dropped once no more
# requests will be issued).
rc, d, err, _ = blkperf(srv.port, "-q", "8", "-n", "100", "--wake-replies", "4")
check(rc == 0 and d is not None and d["requests"] == 100 and d["errors"] == 0
      and d["wake_replies"] == 4, "--wake-replies 4: 100 requests done", err)

# TEST: a threshold above the queue depth is a one-line usage error.
p = subprocess.run([BLKPERF, "-t", "RAND_READ", "-q", "8", "--wake-replies", "9",
                    "nbd://127.0.0.1:%d" % srv.port], capture_output=True, text=True)
check(p.returncode == 2 and p.stderr.startswith("blkperf: --wake-replies 9: more than the 8 "),
      "--wake-replies above -q refused", p.stderr)

# TEST: --io=libnbd is untouched by it and still works here.
rc, d, err, nvcsw = blkperf(srv.port, "--io=libnbd", "-q", "4", "-n", "40")
check(rc == 0 and d is not None and d["requests"] == 40 and d["io"] == "libnbd",
      "--io=libnbd against the dribbling server", err)

# TEST: short replies after the threshold is armed: every request still
# ends (error or data), the stream stays in step, no protocol error.
srv2 = DribbleServer(errors_after=40)
rc, d, err, _ = blkperf(srv2.port, "-q", "4", "-n", "120")
check(rc == 1 and d is not None, "error replies make blkperf exit 1", err)
check(d["requests"] + d["errors"] == 120 and d["errors"] > 0,
      "requests %d + errors %d == 120" % (d["requests"], d["errors"]))
check("protocol error" not in err and "requests failed, first with: Input/output error" in err,
      "error replies counted, framing intact", err)
