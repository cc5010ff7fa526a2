"""One NBD connection through `systemctl restart` (tests/test-restart-systemd.sh).

fdstore-client.py URI PODMAN CONTAINER UNIT PORT RESTARTS

Opens one libnbd handle and keeps QD writes and reads in flight on it
(64 KiB blocks, each read compared with what was last written there) on a
thread, while the main thread restarts UNIT in the container RESTARTS
times with `systemctl restart`.  After each restart the unit must have a
new main PID, systemd's file descriptor store must be empty again (the new
process took and removed everything), the socket listening on PORT in the
container must be the same one (its inode: a listener blkd bound itself
went through the store too), and I/O must go on.  Then
every block written is read back and compared, the connection must still be
the same socket (same local address, same fd: libnbd never reconnects),
and `systemctl stop UNIT` must close it: a request sent afterwards
fails instead of hanging.  Prints one line per step; exits 1 on a failure.
"""
import os
import random
import socket
import subprocess
import sys
import threading
import time

import nbd

URI, PODMAN, NAME, UNIT, PORT = sys.argv[1:6]
RESTARTS = int(sys.argv[6])
BLOCK = 64 * 1024
QD = 8
STEP_TIMEOUT = 60


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def sd(*args):
    r = subprocess.run([PODMAN, "exec", NAME] + list(args), capture_output=True,
                       text=True, timeout=STEP_TIMEOUT)
    return r.returncode, r.stdout.strip(), r.stderr.strip()


def show(prop):
    return sd("systemctl", "show", "-p", prop, "--value", UNIT)[1]


def journal():
    return sd("journalctl", "-u", UNIT, "--no-pager", "-o", "cat")[1]


def listener():
    """The inode of the TCP socket listening on PORT in the container."""
    out = sd("cat", "/proc/net/tcp", "/proc/net/tcp6")[1]
    for line in out.splitlines():
        f = line.split()
        if len(f) > 9 and f[3] == "0A" and f[1].rsplit(":", 1)[-1] == "%04X" % int(PORT):
            return f[9]
    fail("nothing listens on port %s in the container" % PORT)


def sockname(h):
    fd = h.aio_get_fd()
    s = socket.socket(fileno=os.dup(fd))
    try:
        return fd, s.getsockname()
    finally:
        s.close()


h = nbd.NBD()
h.connect_uri(URI)
size = h.get_size()
nblocks = size // BLOCK
if nblocks < 64:
    fail("export of %d bytes is too small" % size)
fd0, addr0 = sockname(h)
print("connected: %s, %d bytes, local %s" % (URI, size, addr0), flush=True)

rng = random.Random(23)
shadow = {}                     # block -> bytes last written (acknowledged)
state = {"ops": 0, "error": None, "stop": False}
lock = threading.Lock()


def io_loop():
    busy = set()
    inflight = {}               # cookie -> (kind, block, data, buf)
    try:
        while not state["stop"] or inflight:
            while not state["stop"] and len(inflight) < QD:
                blk = rng.randrange(nblocks)
                if blk in busy:
                    continue
                busy.add(blk)
                if blk in shadow and rng.random() < 0.5:
                    buf = nbd.Buffer(BLOCK)
                    cookie = h.aio_pread(buf, blk * BLOCK)
                    inflight[cookie] = ("read", blk, shadow[blk], buf)
                else:
                    data = rng.randbytes(BLOCK)
                    buf = nbd.Buffer.from_bytearray(bytearray(data))
                    cookie = h.aio_pwrite(buf, blk * BLOCK)
                    inflight[cookie] = ("write", blk, data, buf)
            if inflight:
                h.poll(1000)
            for cookie in list(inflight):
                if not h.aio_command_completed(cookie):   # raises if it failed
                    continue
                kind, blk, data, buf = inflight.pop(cookie)
                busy.discard(blk)
                if kind == "write":
                    shadow[blk] = data
                elif bytes(buf.to_bytearray()) != data:
                    raise RuntimeError("block %d read back different data" % blk)
                with lock:
                    state["ops"] += 1
    except Exception as e:      # nbd.Error or a mismatch: reported by main
        state["error"] = "%s: %s" % (type(e).__name__, e)


def ops():
    with lock:
        return state["ops"]


def wait_ops(n, what):
    deadline = time.time() + STEP_TIMEOUT
    start = ops()
    while ops() < start + n:
        if state["error"]:
            fail("I/O error %s: %s" % (what, state["error"]))
        if time.time() > deadline:
            fail("no I/O progress %s (%d ops in %d s)" % (what, ops() - start, STEP_TIMEOUT))
        time.sleep(0.05)


t = threading.Thread(target=io_loop, daemon=True)
t.start()
wait_ops(200, "before any restart")

for i in range(1, RESTARTS + 1):
    pid0 = show("MainPID")
    ino0 = listener()
    before = ops()
    rc, out, err = sd("systemctl", "restart", UNIT)
    if rc != 0:
        fail("systemctl restart %d: rc %d: %s\n%s" % (i, rc, err, journal()[-3000:]))
    pid1 = show("MainPID")
    if pid1 in ("", "0") or pid1 == pid0:
        fail("restart %d: MainPID %s -> %s: not a new process" % (i, pid0, pid1))
    if listener() != ino0:
        fail("restart %d: the listening socket changed (inode %s -> %s)" % (i, ino0, listener()))
    wait_ops(200, "after restart %d" % i)
    # Everything the new process took from the store has left it: a copy
    # there would keep a connection open after blkd closed it.
    stored = show("NFileDescriptorStore")
    if stored != "0":
        fail("restart %d: %s fd(s) still in the store after the new blkd started" % (i, stored))
    print("%s restart %d: pid %s -> %s, %d ops during and after, same listener, store "
          "empty again" % (UNIT, i, pid0, pid1, ops() - before), flush=True)

state["stop"] = True
t.join(STEP_TIMEOUT)
if t.is_alive() or state["error"]:
    fail("I/O: %s" % (state["error"] or "did not finish"))
for blk, data in sorted(shadow.items()):
    if h.pread(BLOCK, blk * BLOCK) != data:
        fail("final check: block %d differs" % blk)
fd1, addr1 = sockname(h)
if (fd1, addr1) != (fd0, addr0):
    fail("the connection changed: fd %d %s -> fd %d %s" % (fd0, addr0, fd1, addr1))
print("verified %d blocks after %d ops; the same connection throughout (local %s)"
      % (len(shadow), ops(), addr1), flush=True)

log = journal()
for want in ("in systemd's file descriptor store (restart %d)" % RESTARTS,
             "state of restart %d from systemd's file descriptor store, 1 connection(s)"
             % RESTARTS):
    if want not in log:
        fail("journal lacks %r:\n%s" % (want, log[-3000:]))

# A real stop: blkd quiesces and stores as always, then systemd closes the
# store, and with it the connection.
rc, out, err = sd("systemctl", "stop", UNIT)
res = "%s %s" % (show("Result"), show("ExecMainStatus"))
if rc != 0 or res != "success 0":
    fail("systemctl stop: rc %d, Result/ExecMainStatus %s: %s" % (rc, res, err))
buf = nbd.Buffer(4096)
deadline = time.time() + 20
closed = None
try:
    cookie = h.aio_pread(buf, 0)
    while time.time() < deadline:
        h.poll(500)
        if h.aio_is_dead() or h.aio_is_closed():
            closed = "the handle is dead"
            break
        if h.aio_command_completed(cookie):
            fail("a read was served after systemctl stop")
except nbd.Error as e:
    closed = str(e)
if not closed:
    fail("the connection is still open 20 s after systemctl stop (still in the store?)")
print("systemctl stop: Result=success, exit 0; the connection closed (%s)" % closed, flush=True)
