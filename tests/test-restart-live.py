#!/usr/bin/python3
# Live restart (SIGUSR2) with real clients: libnbd connections with
# structured replies and base:allocation (and one with simple replies, as
# the kernel's client uses) keep writing and reading through several
# restarts without an error, over TCP and a Unix socket; the data
# is on disk afterwards; the PID is the same; block status and a new
# connection work after; a TLS session open across a restart is closed
# cleanly; requests in flight in a slow filter when the signal comes
# finish with the right data before the hand-over; the restart metrics
# count.
import os
import random
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from restarttest import *  # noqa: E402,F401,F403

nbd = need_live_restart()
if not FILTERDIR or not os.path.exists(os.path.join(FILTERDIR, "nbdkit-delay-filter.so")):
    skip("nbdkit's delay filter is not installed (nbdkit-plugin-dev / nbdkit)")

KiB = 1024
MiB = 1024 * KiB
BS = 64 * KiB
NBLK = 64
T = tls_material()
PSK = os.path.join(T, "keys.psk")
rng = random.Random(23)



def connect(srv):
    h = nbd.NBD()
    h.add_meta_context("base:allocation")
    h.connect_uri(srv.uri)
    return h


def wait_all(h, cookies, what, secs=60):
    deadline = time.time() + secs
    while h.aio_in_flight() > 0:
        if time.time() > deadline:
            fail("%s: %d commands still in flight after %d s" % (what, h.aio_in_flight(), secs))
        h.poll(1000)
    for c in cookies:
        h.aio_command_completed(c)      # raises nbd.Error on a failed command


def issue(h, writes, rblocks):
    """aio writes of {block: data} and reads of rblocks; the cookies and
    (block, buffer) for each read."""
    cookies, reads = [], []
    for b, data in writes.items():
        cookies.append(h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(data)), b * BS))
    for b in rblocks:
        buf = nbd.Buffer(BS)
        cookies.append(h.aio_pread(buf, b * BS))
        reads.append((b, buf))
    return cookies, reads


class Workload:
    """Writes of fresh random blocks and reads of blocks already written,
    several in flight at once; every read is checked against what the last
    completed write put there."""

    def __init__(self, h):
        self.h = h
        self.expect = {}
        self.batches = 0

    def batch(self):
        h = self.h
        wblocks = rng.sample(range(NBLK), 6)
        known = [b for b in self.expect if b not in wblocks]
        rblocks = rng.sample(known, min(6, len(known)))
        writes = {b: os.urandom(BS) for b in wblocks}
        cookies, reads = issue(h, writes, rblocks)
        wait_all(h, cookies, "batch %d" % self.batches)
        for b, buf in reads:
            if bytes(buf.to_bytearray()) != self.expect[b]:
                fail("batch %d: block %d read back wrong" % (self.batches, b))
        self.expect.update(writes)
        self.batches += 1

    def verify_file(self, path, what):
        self.h.flush()
        with open(path, "rb") as f:
            for b, data in sorted(self.expect.items()):
                f.seek(b * BS)
                if f.read(BS) != data:
                    check_failed("%s: block %d on disk differs" % (what, b))
                    return
        ok("%s: all %d blocks on disk as written" % (what, len(self.expect)))


def run_through_restarts(srv, h, rounds, what):
    """Batches run without a pause while another thread sends SIGUSR2
    `rounds` times, each once the previous restart is done."""
    w = Workload(h)
    w.batch()
    errors = []

    def signaller():
        try:
            for _ in range(rounds):
                time.sleep(0.3)
                restart(srv)
        except SystemExit:
            errors.append("a restart did not finish (see the log)")

    t = threading.Thread(target=signaller)
    t.start()
    deadline = time.time() + 120
    while t.is_alive() and time.time() < deadline:
        try:
            w.batch()
        except nbd.Error as e:
            t.join(60)
            fail("%s: client error during the restarts: %s" % (what, e.string))
    t.join(60)
    if errors:
        srv.dump_log()
        fail("%s: %s" % (what, errors[0]))
    for _ in range(5):
        w.batch()
    ok("%s: %d batches of writes and verified reads across %d restarts, no error"
       % (what, w.batches, rounds))
    return w


def block_status_works(h, what):
    seen = []

    def cb(ctx, offset, entries, err):
        seen.append((ctx, list(entries)))
        return 0
    h.block_status(NBLK * BS, 0, cb)
    check(seen and seen[0][0] == "base:allocation" and len(seen[0][1]) >= 2,
          "%s: block status after the restart answers base:allocation" % what, repr(seen[:1]))


def tls_connect(srv):
    h = nbd.NBD()
    h.set_tls(nbd.TLS_REQUIRE)
    h.set_tls_username("alice")
    h.set_tls_psk_file(PSK)
    h.connect_uri(srv.uri)
    return h


def metric(port, name):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return int(float(line.split()[1]))
    return None


# ---- TCP: plaintext clients carry on, a TLS session is closed ------------
print("# TCP, the file plugin, three restarts under load, a TLS session open")
path = disk("tcp.img")
srv = restart_server(["file", "file=" + path],
                     opts=["-v", "--restart-timeout=5", "--tls=on", "--tls-psk", PSK,
                           "--metrics", "127.0.0.1:0"])
pid = srv.proc.pid
h = connect(srv)
check(h.get_structured_replies_negotiated(), "structured replies negotiated")
check(h.can_meta_context("base:allocation"), "base:allocation negotiated")
ht = tls_connect(srv)
tls_block = os.urandom(4096)
ht.pwrite(tls_block, 15 * MiB)
check_eq(ht.pread(4096, 15 * MiB), tls_block, "TLS client reads before the restart")

# More connections, spread over the shards; each idle across the restarts.
others = [connect(srv) for _ in range(4)]
w = run_through_restarts(srv, h, 3, "TCP")
for i, o in enumerate(others):
    b = sorted(w.expect)[i]
    check_eq(o.pread(BS, b * BS), w.expect[b], "idle connection %d reads after the restarts" % i)
    o.shutdown()
check_eq(srv.proc.pid, pid, "same PID")
srv.check_alive("server alive after three restarts")
check_eq(count(srv, r"live restart \d+: exec "), 3, "three execs logged")
check_eq(count(srv, r"live restart: adopted \(connection \d+ before\), export \"\", "
                    r"structured replies"), 15,
         "-v: every image adopted the five libnbd connections")
w.verify_file(path, "TCP")
block_status_works(h, "TCP")

h2 = connect(srv)
b = sorted(w.expect)[0]
check_eq(h2.pread(BS, b * BS), w.expect[b], "a new connection after the restarts reads the data")
h2.shutdown()

try:
    ht.pread(4096, 15 * MiB)
    check_failed("TLS session: a read after the restart must fail (the session was closed)")
except nbd.Error as e:
    msg = e.string or ""
    check("magic" not in msg and "invalid" not in msg.lower(),
          "TLS session: the client saw a disconnect, not garbage", msg)
    ok("TLS session closed across the restart: %s" % msg)
check(count(srv, r"live restart: a TLS session cannot be handed over; closing it") == 1,
      "the TLS session's close is logged, naming it")
del ht
ht = tls_connect(srv)
check_eq(ht.pread(4096, 15 * MiB), tls_block, "a new TLS session after the restarts")
ht.shutdown()

mp = metrics_port(srv)
check_eq(metric(mp, "blkd_restarts_total"), 3, "blkd_restarts_total")
check(metric(mp, "blkd_restart_connections_total") >= 3,
      "blkd_restart_connections_total counts the handed-over connections")
h.shutdown()
srv.stop()
check(srv.proc.returncode == 0, "server stops cleanly after the restarts",
      "status %s" % srv.proc.returncode)

# ---- a Unix socket ---------------------------------------------------------
print("# Unix socket, two restarts under load; simple replies (as the kernel's client)")
path = disk("unix.img")
srv = restart_server(["file", "file=" + path], unix=True, opts=["--restart-timeout=5"])
pid = srv.proc.pid
h = connect(srv)
hs = nbd.NBD()
hs.set_request_structured_replies(False)
hs.connect_uri(srv.uri)
check(not hs.get_structured_replies_negotiated(), "a client with simple replies")
w = run_through_restarts(srv, hs, 2, "Unix, simple replies")
check(not hs.get_structured_replies_negotiated(), "still simple replies")
check_eq(srv.proc.pid, pid, "same PID")
check(os.path.exists(srv.sock), "the socket file is still there")
w.verify_file(path, "Unix")
block_status_works(h, "Unix (the idle structured connection)")
hs.shutdown()
h2 = connect(srv)
b = sorted(w.expect)[-1]
check_eq(h2.pread(BS, b * BS), w.expect[b], "a new Unix connection reads the data")
h2.shutdown()
h.shutdown()
srv.stop()
check(not os.path.exists(srv.sock), "the socket file is removed at the final exit")

# ---- requests in flight in a slow filter -----------------------------------
print("# requests in flight (delay filter, 1 s each) when SIGUSR2 comes")
path = disk("slow.img")
srv = restart_server(["file", "file=" + path, "rdelay=1", "wdelay=1"],
                     opts=["--filter=delay", "--restart-timeout=10", "--threads=16"])
h = connect(srv)
old = {b: os.urandom(BS) for b in range(8)}
with open(path, "r+b") as f:
    for b, data in old.items():
        f.seek(b * BS)
        f.write(data)
new = {b: os.urandom(BS) for b in range(8, 16)}
cookies, reads = issue(h, new, list(old))
# Let the requests reach the server (the filter holds each for 1 s).
h.poll(100)
time.sleep(0.3)
n = count(srv, DONE) + 1
os.kill(srv.proc.pid, signal.SIGUSR2)
try:
    wait_all(h, cookies, "requests in flight at SIGUSR2")
except nbd.Error as e:
    fail("a request in flight at SIGUSR2 failed: %s" % e.string)
for b, buf in reads:
    check_eq(bytes(buf.to_bytearray()), old[b], "read of block %d in flight at SIGUSR2" % b)
wait_log(srv, DONE, n, 30, "the restart after the slow requests")
text = log_text(srv)
check(text.find("quiescing 1 connection") < text.find("live restart 1: exec"),
      "the exec came after the quiesce")
for b, data in new.items():
    check_eq(h.pread(BS, b * BS), data, "block %d written while SIGUSR2 came, after" % b)
with open(path, "rb") as f:
    f.seek(8 * BS)
    check(f.read(8 * BS) == b"".join(new[b] for b in range(8, 16)),
          "the in-flight writes are in the file")
h.shutdown()
srv.stop()
print("live restart checks done")
