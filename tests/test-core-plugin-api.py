#!/usr/bin/python3
"""The plugin host keeps nbdkit's contracts: every thread model is enforced
with the lock it asks for and no more, and API version 1 plugins work
(v1 callbacks, FUA emulated through flush, errors via nbdkit_set_error).
"""
import os
import sys
import threading
import time
import struct

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import (TOP, Server, check, check_eq, fail, hammer_reads, need_nbd, nbd_connect,
                      nbd_errno, ok, skip, IS_NBDKIT)

nbd = need_nbd()
PLUGDIR = os.path.join(TOP, "tests", "plugins")
MODELS = os.path.join(PLUGDIR, "nbdkit-models-plugin.so")
APIV1 = os.path.join(PLUGDIR, "nbdkit-apiv1-plugin.so")
for p in (MODELS, APIV1):
    if not os.path.exists(p):
        skip("test plugin %s not built (make check builds it)" % p)


def stats(h):
    return struct.unpack(">III", h.pread(12, 0))   # max active, max per handle, max open


for model, name in ((1, "SERIALIZE_ALL_REQUESTS"), (2, "SERIALIZE_REQUESTS"),
                    (3, "PARALLEL")):
    print("# thread model %d (%s), plugin calls on workers" % (model, name))
    srv = Server([MODELS, "model=%d" % model], opts=["--dispatch=worker", "--shards=2"])
    a, b = nbd_connect(srv), nbd_connect(srv)
    hammer_reads([a, b])
    max_active, max_handle, max_open = stats(a)
    print("max in flight: %d in the plugin, %d on one handle; %d handles open"
          % (max_active, max_handle, max_open))
    if model == 1:
        check_eq(max_active, 1, "SERIALIZE_ALL_REQUESTS: one call at a time in the plugin")
    elif model == 2:
        check_eq(max_handle, 1, "SERIALIZE_REQUESTS: one call at a time per handle")
        if not IS_NBDKIT:
            check(max_active >= 2, "SERIALIZE_REQUESTS: connections still run in parallel "
                  "(a global lock would be too wide)")
    else:
        check(max_handle >= 2, "PARALLEL: calls overlap on one handle")
    flags_a = a.can_multi_conn()
    a.shutdown()
    b.shutdown()
    srv.check_alive()
    srv.stop()

print("# a plugin's maximum request smaller than blkd's is advertised and enforced")
srv = Server([MODELS, "model=3"])
h = nbd.NBD()
h.set_strict_mode(0)                 # let libnbd send what the server must refuse
h.connect_uri(srv.uri)
check_eq(h.get_block_size(nbd.SIZE_MAXIMUM), 1 << 20, "advertised maximum is the plugin's")
check_eq(len(h.pread(1 << 20, 0)), 1 << 20, "a 1 MiB read (the maximum) works")
try:
    h.pread(2 << 20, 0)
    if not IS_NBDKIT:
        fail("a 2 MiB read over the plugin's 1 MiB maximum was served")
    print("note: nbdkit 1.32 serves requests over a plugin's maximum")
except nbd.Error as e:
    check_eq(nbd_errno(e), 22, "a read over the plugin's maximum fails with EINVAL")
check_eq(len(h.pread(4096, 0)), 4096, "connection still usable")
h.shutdown()
srv.stop()

print("# thread model 0 (SERIALIZE_CONNECTIONS): one client at a time")
srv = Server([MODELS, "model=0"])
a = nbd_connect(srv)
check(not a.can_multi_conn(), "SERIALIZE_CONNECTIONS never advertises multi-conn")
result = {}


def second():
    h = nbd.NBD()
    h.connect_uri(srv.uri)
    result["connected_at"] = time.time()
    result["stats"] = stats(h)
    h.shutdown()


t = threading.Thread(target=second)
t.start()
time.sleep(1.0)
check("connected_at" not in result, "a second client waits while the first is connected")
released = time.time()
a.shutdown()
t.join(20)
check("connected_at" in result, "the second client gets in once the first leaves")
check_eq(result["stats"][2], 1, "never more than one handle open")
srv.stop()

print("# API version 1 plugin")
srv = Server([APIV1])
h = nbd_connect(srv)
check(h.can_fua(), "v1 plugin with flush: FUA advertised (emulated by flush)")
check(h.can_trim() and h.can_zero() and h.can_flush(), "trim, zero and flush advertised")
data = bytes(range(256)) * 256
h.pwrite(data, 65536, nbd.CMD_FLAG_FUA)
check_eq(h.pread(len(data), 65536), data, "v1 pwrite with FUA then pread")
h.trim(4096, 65536)
check_eq(h.pread(4096, 65536), bytes(4096), "v1 trim")
h.zero(8192, 65536 + 4096)
check_eq(h.pread(8192, 65536 + 4096), bytes(8192), "v1 zero")
h.flush()
try:
    h.pwrite(b"x" * 4096, 16 * 1024 * 1024 - 4096)
    fail("write the plugin refuses succeeded")
except nbd.Error as e:
    check_eq(nbd_errno(e), 28, "error from nbdkit_set_error (ENOSPC), not the stray errno")
check_eq(h.pread(4096, 65536 + 16384), data[16384:16384 + 4096], "connection usable after error")
h.shutdown()
srv.check_alive()
