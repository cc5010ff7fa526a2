#!/usr/bin/env python3
"""A client that hangs up while a worker runs one of its requests: the
plugin, still inside that request, must see the gone client, never the
next client that connects.

The gateopen test plugin (tests/plugins) holds a read of the export "peer"
until the test creates pread.release, then asks nbdkit_peer_name for its
client's port and sleeps with nbdkit_nanosleep, and writes both answers to
pread.peer.  Client A's read is held on a worker (--dispatch worker); A
hangs up; client B connects while the read is still held.  Checked, all
orderings, no timing:

- A's socket number stays open in the server until the read returns, so
  B gets another (with the socket closed at the hang-up, B, the next
  socket the server accepts, would get A's lowest free number and the
  plugin's address lookups and polls would be about B);
- the plugin reports A's port or an error, never B's;
- nbdkit_nanosleep sees the hang-up (returns -1 at once) rather than
  sleeping its 30 s out on no socket at all;
- the connection counts in blkd_connections until the read returned, and
  B is served throughout."""

import os
import re
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

if IS_NBDKIT:
    skip("checks blkd's connection teardown (--dispatch, --metrics)")
from gatetest import (GATE, PLUGIN, connections, gate_file, release,  # noqa: E402
                      wait_connections, wait_entered)


def server_socket_fds(pid):
    """fd number -> socket inode, of the server's sockets."""
    out = {}
    d = "/proc/%d/fd" % pid
    for n in os.listdir(d):
        try:
            t = os.readlink(os.path.join(d, n))
        except OSError:
            continue
        m = re.match(r"socket:\[(\d+)\]", t)
        if m:
            out[int(n)] = m.group(1)
    return out




srv = Server([PLUGIN, "gate=" + GATE],
             opts=["--shards", "1", "--dispatch", "worker", "--metrics", "127.0.0.1:0"])
pid = srv.proc.pid

before = server_socket_fds(pid)
a = RawClient(srv, timeout=30)
a.handshake(structured=False, name=b"peer")
a_port = a.sock.getsockname()[1]
# New by socket, not by number: a number closed meanwhile (the harness's
# probe of the port) may come back as A's.
new = sorted(set(server_socket_fds(pid).items()) - set(before.items()))
new = [fd for fd, _ in new]
check(len(new) == 1, "one new server socket for client A", "new fds %r" % new)
a_fd = new[0]
a_inode = server_socket_fds(pid)[a_fd]

a.send_request(NBD_CMD_READ, 0, 4096, cookie=1)
wait_entered("pread")

# A hangs up; the server's side answers with its end of the stream once it
# has seen that (shutdown or close: either way A reads EOF).
a.sock.shutdown(socket.SHUT_WR)
a.sock.settimeout(20)
try:
    rest = a.sock.recv(4096)
except socket.timeout:
    fail("the server never ended A's connection after A hung up")
check_eq(rest, b"", "A's connection ended with no reply")
a.close()
check_eq(connections(srv), 1, "A's connection counts while its read is held")
check(server_socket_fds(pid).get(a_fd) == a_inode,
      "A's socket number stays open while a worker holds its read",
      "fd %d was closed: a new client can get its number" % a_fd)

b = RawClient(srv, timeout=30)
b.handshake(structured=False, name=b"fast")
b_port = b.sock.getsockname()[1]
b.send_request(NBD_CMD_READ, 0, 4096, cookie=2)
cookie, err, _, data = b.recv_reply(4096)
check(cookie == 2 and err == 0 and data == b"\x5a" * 4096, "B is served while A's read is held")

release("pread")
deadline = time.time() + 60
while not os.path.exists(gate_file("pread.peer")) and time.time() < deadline:
    time.sleep(0.01)
check(os.path.exists(gate_file("pread.peer")), "the plugin finished A's read")
with open(gate_file("pread.peer")) as f:
    said = dict(line.split(" ", 1) for line in f.read().split("\n") if line)
print("A port %d, B port %d, plugin said %r" % (a_port, b_port, said))
check(said.get("port") != str(b_port), "the plugin never sees B as A's client",
      "reported B's port %d" % b_port)
check(said.get("port") in (str(a_port), "error"), "the plugin sees A's port or an error",
      "got %r" % said.get("port"))
check_eq(said.get("sleep"), "-1", "nbdkit_nanosleep sees A's hang-up")

wait_connections(srv, 1, "A's connection freed once its read returned (B stays)")
b.disconnect()
wait_connections(srv, 0, "B gone too")
srv.check_alive()
srv.stop()
ok("a hung-up client's held request sees that client, not the next")
