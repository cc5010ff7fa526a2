#!/usr/bin/python3
# Live restart when things go wrong:
# - the binary renamed away: SIGUSR2 is refused, the old process serves on;
# - the binary replaced by a file that is no executable image (execv
#   fails): the running binary is started again, connections survive;
# - a client that sent half a request header (or half a WRITE payload)
#   when SIGUSR2 came is closed after --restart-timeout and nothing
#   hangs; the binary gone by then calls the restart off and the paused
#   connections go on in the old process;
# - a second SIGUSR2 while a restart waits is logged and ignored, and a
#   SIGTERM then stops the server cleanly (exit 0), without an exec;
# - states passed in BLKD_RESTART_FD that do not parse (garbage, another
#   version, counts out of bounds, bad or misused fds, truncated, trailing
#   bytes): the server logs why, closes the sockets it was passed and
#   serves new clients; a well-formed one is served at once without a
#   handshake, unless the export no longer matches what it says.
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403
from restarttest import *  # noqa: E402,F401,F403

nbd = need_live_restart()

MiB = 1024 * 1024
BS = 4096
BOUND = 2                         # --restart-timeout



def round_trip(h, what, block=0):
    data = os.urandom(BS)
    h.pwrite(data, block * BS)
    check_eq(h.pread(BS, block * BS), data, what)


def half_header(srv):
    """A handshaken raw client that has sent 10 of a request's 28 bytes."""
    c = RawClient(srv)
    c.handshake(structured=True)
    c.sock.sendall(RawClient.request(NBD_CMD_READ, 0, BS, cookie=7)[:10])
    wait_server_read(c.sock)
    return c


def half_write(srv):
    """A raw client that has sent a 64 KiB WRITE's header and 1000 bytes."""
    c = RawClient(srv)
    c.handshake(structured=True)
    c.sock.sendall(RawClient.request(NBD_CMD_WRITE, MiB, 65536, cookie=8) + b"x" * 1000)
    wait_server_read(c.sock)
    return c


path = disk("hostile.img", 8 * MiB)
srv = restart_server(["file", "file=" + path], opts=["--restart-timeout=%d" % BOUND])
pid = srv.proc.pid
h = nbd.NBD()
h.connect_uri(srv.uri)
round_trip(h, "round trip before")

# ---- the binary renamed away ---------------------------------------------
print("# binary renamed away, then SIGUSR2")
os.rename(EXE, EXE + ".away")
os.kill(pid, signal.SIGUSR2)
wait_log(srv, r"live restart refused: cannot execute .*No such file", 1, 30,
         "the refusal is logged")
round_trip(h, "the connection serves on in the old process")
check_eq(srv.proc.pid, pid, "same PID")
check_eq(count(srv, r"live restart \d+: exec"), 0, "no exec was tried")
os.rename(EXE + ".away", EXE)

# ---- execv fails ---------------------------------------------------------
print("# binary replaced by a file execv refuses (ENOEXEC)")
os.rename(EXE, EXE + ".real")
with open(EXE, "w") as f:
    f.write("this is not an executable image\n")
os.chmod(EXE, 0o755)
restart(srv)
check(count(srv, r"live restart: exec \S+: Exec format error; starting the running binary "
                 r"again instead") == 1, "the failed exec is logged")
round_trip(h, "the connection survives on the running binary")
check_eq(srv.proc.pid, pid, "same PID")
os.rename(EXE + ".real", EXE)
restart(srv)
round_trip(h, "a restart with the binary back works")

# ---- half a request when SIGUSR2 comes, binary gone meanwhile ------------
print("# half a request header; the binary goes while the restart waits for it")
bad = half_header(srv)
t0 = time.time()
os.kill(pid, signal.SIGUSR2)
wait_log(srv, r"live restart: quiescing", 3, 10, "the restart began")
os.rename(EXE, EXE + ".away")
check(peer_closed(bad.sock, BOUND + 10), "the half-header client is closed after the bound")
waited = time.time() - t0
print("  closed after %.1f s (bound %d s)" % (waited, BOUND))
wait_log(srv, r"live restart called off: cannot execute", 1, 30, "the restart is called off")
check(count(srv, r"conn \d+ peer \S+: live restart: a request still incomplete after %d s"
                 % BOUND) == 1, "the close is logged naming the connection and peer")
round_trip(h, "the paused connection goes on in the old process")
check_eq(srv.proc.pid, pid, "same PID")
os.rename(EXE + ".away", EXE)
bad.close()

# ---- half a WRITE payload; the restart goes through -------------------------
print("# half a WRITE payload when SIGUSR2 comes; another client mid-handshake")
bad = half_write(srv)
bad2 = half_header(srv)
shaking = RawClient(srv)
shaking.start()                   # greeting and flags: still negotiating
n = count(srv, DONE) + 1
os.kill(pid, signal.SIGUSR2)
check(peer_closed(bad.sock, BOUND + 10), "the half-WRITE client is closed after the bound")
check(peer_closed(bad2.sock, BOUND + 10), "the half-header client is closed after the bound")
check(peer_closed(shaking.sock, 10), "the client still in the handshake is closed")
check(count(srv, r"conn \d+ peer \S+: live restart: a connection still in the handshake "
                 r"cannot be handed over; closing it as on shutdown") == 1,
      "its close is logged, naming it")
shaking.close()
wait_log(srv, DONE, n, 30, "the restart after the bound")
round_trip(h, "the libnbd client goes on after the restart")
h2 = nbd.NBD()
h2.connect_uri(srv.uri)
round_trip(h2, "a new connection", block=5)
h2.shutdown()
bad.close()
bad2.close()
with open(path, "rb") as f:
    f.seek(MiB)
    check(f.read(65536) == bytes(65536), "the unacknowledged WRITE did not reach the file")
h.shutdown()
srv.stop()
check_eq(srv.proc.returncode, 0, "server exit status after the restarts")

# ---- a second SIGUSR2, then SIGTERM, while the restart waits ---------------
print("# SIGUSR2 twice, then SIGTERM, while a half request holds the restart")
srv = restart_server(["file", "file=" + path], opts=["--restart-timeout=30"])
h = nbd.NBD()
h.connect_uri(srv.uri)
round_trip(h, "round trip before")
bad = half_header(srv)
os.kill(srv.proc.pid, signal.SIGUSR2)
wait_log(srv, r"live restart: quiescing", 1, 10, "the restart began")
os.kill(srv.proc.pid, signal.SIGUSR2)
wait_log(srv, r"live restart: already under way", 1, 10, "the second SIGUSR2 is logged")
os.kill(srv.proc.pid, signal.SIGTERM)
try:
    rc = srv.proc.wait(20)
except subprocess.TimeoutExpired:
    fail("SIGTERM during the restart's wait: the server did not exit")
check_eq(rc, 0, "SIGTERM during the restart's wait: exit status")
check(peer_closed(bad.sock, 5), "the half-request client is closed")
bad.close()
check_eq(count(srv, r"live restart \d+: exec"), 0, "no exec after SIGTERM")

# ---- a state that does not parse -------------------------------------------
print("# states passed in BLKD_RESTART_FD that do not parse")


def start_with_state(make_blob, name):
    """blkd started with BLKD_RESTART_FD naming a memfd that holds
    make_blob(L, C): L a listening socket's fd and C a connected socket's,
    both passed along; returns (proc, log, our end of C, the listener)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    a, b = socket.socketpair()
    fd = os.memfd_create("state", 0)
    os.write(fd, make_blob(lsock.fileno(), b.fileno()))
    log_path = os.path.join(TMP, name + ".log")
    log = open(log_path, "wb")
    env = dict(os.environ, BLKD_RESTART_FD=str(fd))
    proc = subprocess.Popen([EXE, "-f", "-i", "127.0.0.1", "-p", "0", "file", "file=" + path],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, pass_fds=(fd, b.fileno(), lsock.fileno()))
    os.close(fd)
    b.close()
    return proc, log_path, a, lsock


def serves(proc, log_path, what):
    deadline = time.time() + 20
    port = None
    while time.time() < deadline and port is None and proc.poll() is None:
        with open(log_path, "rb") as f:
            m = re.search(rb"serving .* on nbd://\S*:(\d+)/", f.read())
        if m:
            port = int(m.group(1))
        else:
            time.sleep(0.05)
    if port is None:
        fail("%s: server not serving (status %s)" % (what, proc.poll()))
    h = nbd.NBD()
    h.connect_uri("nbd://127.0.0.1:%d" % port)
    round_trip(h, "%s: a new client is served" % what)
    h.shutdown()
    return port


def preamble(*fds):
    return b"BLKDRST\n" + struct.pack("=II", len(fds), 0) + b"".join(struct.pack("=i", f)
                                                                   for f in fds)


def header(nconns, version=1, exe=b"/usr/sbin/blkd"):
    return struct.pack("=IIQQI", version, nconns, 0, 0, len(exe)) + exe


def record(fd, peer=b"p", name=b"", size=8 * MiB, eflags=1, cflags=0, bs=(1, 4096, 1 << 25)):
    return (struct.pack("=iIQQIIIIII", fd, cflags, size, 1, eflags, bs[0], bs[1], bs[2],
                        len(peer), len(name)) + peer + name)


# (name, blob from the listener L and the connection C, what the log says,
#  whether the listener is kept)
cases = [
    ("garbage", lambda L, C: b"\x00" * 7 + os.urandom(200), r"no valid magic", False),
    ("badfd", lambda L, C: preamble(0) + header(0),
     r"listener 0 \(fd 0\) is not a listening socket", False),
    ("conn-as-listener", lambda L, C: preamble(C) + header(0),
     r"listener 0 \(fd \d+\) is not a listening socket", False),
    ("listeners", lambda L, C: b"BLKDRST\n" + struct.pack("=II", 1000, 0),
     r"state out of bounds \(1000 listeners", False),
    ("version", lambda L, C: preamble(L) + header(1, version=99) + record(C),
     r"state version 99, this binary reads 1", True),
    ("counts", lambda L, C: preamble(L) + header(1 << 30),
     r"state out of bounds \(1073741824 connections", True),
    ("path", lambda L, C: preamble(L) + header(1, exe=b"blkd") + record(C),
     r"the binary's path in the state is not an absolute path", True),
    ("truncated", lambda L, C: preamble(L) + header(1) + record(C)[:20],
     r"connection record 0 is malformed", True),
    ("listener-as-conn", lambda L, C: preamble(L) + header(1) + record(L),
     r"connection record 0 \(fd \d+\) is malformed", True),
    ("twice", lambda L, C: preamble(L) + header(2) + record(C) + record(C),
     r"fd \d+ is named twice", True),
    ("trailing", lambda L, C: preamble(L) + header(1) + record(C) + b"x",
     r"1 bytes after the last record", True),
    ("name-nul", lambda L, C: preamble(L) + header(1) + record(C, name=b"a\0b"),
     r"connection record 0 \(fd \d+\) is malformed", True),
]
for name, make_blob, said, kept in cases:
    proc, log_path, ours, lsock = start_with_state(make_blob, name)
    port = serves(proc, log_path, name)
    check_eq(port == lsock.getsockname()[1], kept,
             "%s: the passed listener is served (or closed and bound afresh)" % name)
    check(peer_closed(ours, 5), "%s: the inherited connection was closed" % name)
    with open(log_path, "rb") as f:
        text = f.read().decode(errors="replace")
    check(re.search(said, text) is not None, "%s: the reason is logged" % name, said)
    if kept:
        check("keeping the listening sockets only" in text,
              "%s: the server says it keeps the listeners only" % name)
    else:
        check("starting afresh" in text, "%s: the server says it starts afresh" % name)
    proc.terminate()
    check_eq(proc.wait(10), 0, "%s: clean exit" % name)
    ours.close()
    lsock.close()

# State that parses, built from what a real handshake on this export says:
# the connection is served at once, without a handshake; and with a size
# that differs from the export's, it is closed instead.
print("# well-formed states: adopted, or closed when the export differs")
probe_srv = restart_server(["file", "file=" + path])
probe = RawClient(probe_srv)
probe.start()
rtype, infos = probe.go(infos=(NBD_INFO_BLOCK_SIZE,))
check_eq(rtype, NBD_REP_ACK, "probe handshake")
bmin, bpref, bmax = struct.unpack(">III", infos[NBD_INFO_BLOCK_SIZE])
probe.disconnect()
probe_srv.stop()


def good(size):
    def make(L, C):
        return preamble(L) + header(1) + record(C, peer=b"peer", size=size,
                                                eflags=probe.eflags, bs=(bmin, bpref, bmax))
    return make


for name, size, served in (("adopted", probe.size, True), ("changed", probe.size + 4096, False)):
    proc, log_path, ours, lsock = start_with_state(good(size), name)
    serves(proc, log_path, name)
    raw = RawClient.__new__(RawClient)
    raw.sock = ours
    raw.extended = False            # the state handed over a compact-header connection
    raw.sock.settimeout(10)
    with open(log_path, "rb") as f:
        text = f.read().decode(errors="replace")
    if served:
        data = os.urandom(BS)
        raw.send_request(NBD_CMD_WRITE, 2 * BS, BS, cookie=11, payload=data)
        check_eq(raw.recv_reply()[:2], (11, 0), "adopted: a WRITE on the passed socket")
        raw.send_request(NBD_CMD_READ, 2 * BS, BS, cookie=12)
        check_eq(raw.recv_reply(BS)[3], data, "adopted: the READ after it")
        check("live restart 0 done: serving again, 1 connection(s) handed over" in text,
              "adopted: logged")
        check_eq(serves(proc, log_path, name), lsock.getsockname()[1],
                 "adopted: the passed listener serves")
    else:
        check(peer_closed(ours, 10), "changed: the connection is closed")
        wait_for_text = time.time() + 10
        while "changed (size" not in text and time.time() < wait_for_text:
            time.sleep(0.05)
            with open(log_path, "rb") as f:
                text = f.read().decode(errors="replace")
        check(re.search(r"conn \d+ peer peer: live restart: export \"\" changed \(size", text)
              is not None, "changed: logged, naming the connection")
    proc.terminate()
    check_eq(proc.wait(10), 0, "%s: clean exit" % name)
    ours.close()
    lsock.close()
print("live restart failure checks done")
