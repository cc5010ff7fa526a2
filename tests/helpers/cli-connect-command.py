"""A libnbd client that starts its server with connect_command (the server
speaks NBD on its stdin/stdout, as `nbdkit -s` does), for the CLI tests.

Usage: cli-connect-command.py OP[,OP...] -- SERVER [ARGS...]
OPs, run in order, each printing one line:
  size        the export size
  write-read  write a pattern at three offsets, read it back, print 'ok'
  read        the first 8 bytes, in hex
  can-write   'True' or 'False'
The process that served the connection must exit once the client has
disconnected; its exit is waited for (a generous bound) and printed as
'server exited' (or the test fails with exit status 3).
"""

import os
import sys
import time

import nbd

ops, sep, server = sys.argv[1], sys.argv[2], sys.argv[3:]
if sep != "--" or not server:
    sys.exit(__doc__)


def children():
    """PIDs of our child processes (connect_command forks the server)."""
    me = str(os.getpid())
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            pids.append(int(d))
    return pids


h = nbd.NBD()
h.connect_command(server)
for op in ops.split(","):
    if op == "size":
        print(h.get_size())
    elif op == "write-read":
        size = h.get_size()
        offsets = [0, size // 2, size - 4096]
        for i, off in enumerate(offsets):
            h.pwrite(bytes([0x41 + i]) * 4096, off)
        h.flush()
        for i, off in enumerate(offsets):
            if h.pread(4096, off) != bytes([0x41 + i]) * 4096:
                print("mismatch at %d" % off)
                sys.exit(2)
        print("ok")
    elif op == "read":
        print(h.pread(8, 0).hex())
    elif op == "can-write":
        print(not h.is_read_only())
    else:
        sys.exit("unknown op %s" % op)

pids = children()
h.shutdown()
# The server must leave by itself once its one client has gone: it turns
# into a zombie (libnbd reaps it only at close), so it drops off children().
deadline = time.time() + 60
while any(p in children() for p in pids) and time.time() < deadline:
    time.sleep(0.05)
if any(p in children() for p in pids):
    print("server still running after the client left", file=sys.stderr)
    sys.exit(3)
del h                   # reaps the server
print("server exited")
