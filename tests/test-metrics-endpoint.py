#!/usr/bin/env python3
"""The metrics endpoint (--metrics ADDR:PORT), driven with known traffic:

- /metrics parses with the Prometheus client's own parser, and after
  exactly N reads of B bytes and K writes of W bytes the request, byte and
  error counters say exactly that; connections, requests in flight, iobuf
  pool use, CPU (blkd's split and the standard process_cpu_seconds_total)
  and, with --cache, hits, misses and dirty bytes are there and right;
- /stats is JSON and lists the open connection with its peer, export,
  requests in flight and bytes;
- /healthz is 200 "ok" while serving and 503 while draining (a request
  held in flight by a slow plugin keeps the drain going);
- any other path is 404."""

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import (Server, check, check_eq, fail, metric_value,  # noqa: E402
                      need_nbd, nbd_connect, ok, skip, IS_NBDKIT)

if IS_NBDKIT:
    skip("--metrics is a blkd option")
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    skip("python3-prometheus-client is not installed")
nbd = need_nbd()


def get(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(port):
    status, text = get(port, "/metrics")
    if status != 200:
        fail("GET /metrics: status %d" % status)
    fams = {}
    for fam in text_string_to_metric_families(text):
        fams[fam.name] = fam
    return fams


def wait_counts(port, want, what):
    """The reply reaches the client a moment before the server counts the
    request as done: poll briefly until the counters settle."""
    deadline = time.time() + 5
    while True:
        fams = scrape(port)
        got = {k: metric_value(fams, "blkd_requests", "blkd_requests_total", cmd=k) for k in want}
        if got == want or time.time() > deadline:
            check_eq(got, want, what)
            return fams
        time.sleep(0.05)


# ---- counters against known traffic ------------------------------------------
N, B, K, W = 37, 12288, 11, 4096
srv = Server(["ram", "size=64M"], opts=["--metrics", "127.0.0.1:0"])
mport = srv.metrics_port
h = nbd_connect(srv, strict=False)     # so a request past the end reaches the server
for i in range(K):
    h.pwrite(bytes([i + 1]) * W, i * W)
for i in range(N):
    got = h.pread(B, (i * B) % (32 << 20))
fams = wait_counts(mport, {"read": N, "write": K}, "requests by command")
check_eq(metric_value(fams, "blkd_bytes", "blkd_bytes_total", cmd="read"), N * B, "read bytes")
check_eq(metric_value(fams, "blkd_bytes", "blkd_bytes_total", cmd="write"), K * W, "written bytes")
check_eq(metric_value(fams, "blkd_errors", "blkd_errors_total", cmd="read"), 0, "read errors")
check_eq(metric_value(fams, "blkd_connections", "blkd_connections"), 1, "connections open")
check_eq(metric_value(fams, "blkd_requests_in_flight", "blkd_requests_in_flight"), 0, "in flight")
for fam in ("blkd_requests", "blkd_bytes", "blkd_errors", "blkd_process_cpu_user_seconds",
            "blkd_process_cpu_system_seconds", "process_cpu_seconds", "blkd_delay_plugin_seconds"):
    check_eq(fams[fam].type, "counter", "%s is a counter" % fam)
check_eq(fams["blkd_delay_plugin_duration_seconds"].type, "histogram", "delay histogram type")
user = metric_value(fams, "blkd_process_cpu_user_seconds", "blkd_process_cpu_user_seconds_total")
sys_ = metric_value(fams, "blkd_process_cpu_system_seconds", "blkd_process_cpu_system_seconds_total")
tot = metric_value(fams, "process_cpu_seconds", "process_cpu_seconds_total")
check(user is not None and sys_ is not None and tot is not None and user + sys_ > 0,
      "CPU user %.3f + system %.3f s" % (user or 0, sys_ or 0))
check(abs(tot - (user + sys_)) < 0.01, "process_cpu_seconds_total = user + system")
pool = [s for s in fams["blkd_iobuf_pool_bytes"].samples]
check(len(pool) >= 1 and sum(s.value for s in pool) >= B,
      "iobuf pool bytes by shard: %s" % [(s.labels["shard"], s.value) for s in pool])

# An error is counted as one.
try:
    h.pread(4096, 64 << 20)
    fail("read past the end succeeded")
except nbd.Error:
    pass
fams = wait_counts(mport, {"read": N + 1, "write": K}, "requests after one failed read")
check_eq(metric_value(fams, "blkd_errors", "blkd_errors_total", cmd="read"), 1, "read errors")
check_eq(metric_value(fams, "blkd_bytes", "blkd_bytes_total", cmd="read"), N * B, "failed read adds no bytes")

# ---- /stats ---------------------------------------------------------------
status, text = get(mport, "/stats")
check_eq(status, 200, "GET /stats status")
st = json.loads(text)
check_eq(st["connections"], 1, "/stats connections")
check_eq(len(st["conns"]), 1, "/stats lists one connection")
c = st["conns"][0]
check(c["peer"].startswith("127.0.0.1"), "/stats peer %s" % c["peer"])
check_eq(c["export"], "", "/stats export")
check_eq(c["inflight"], 0, "/stats inflight")
check_eq(c["bytes_read"], N * B, "/stats bytes read")
check_eq(c["bytes_written"], K * W, "/stats bytes written")
check_eq(st["commands"]["read"]["requests"], N + 1, "/stats read requests")
check_eq(st["delayacct"]["mode"], "compact", "/stats delay accounting mode")
check(st["delayacct"]["phase_counter_bytes"] < st["delayacct"]["phase_counter_bytes_locked"],
      "compact phase counters %d bytes < locked %d" % (st["delayacct"]["phase_counter_bytes"],
                                                       st["delayacct"]["phase_counter_bytes_locked"]))

# ---- /healthz, 404 -----------------------------------------------------------
check_eq(get(mport, "/healthz"), (200, "ok\n"), "/healthz while serving")
check_eq(get(mport, "/nope")[0], 404, "unknown path")
h.shutdown()
deadline = time.time() + 5
while json.loads(get(mport, "/stats")[1])["conns"] and time.time() < deadline:
    time.sleep(0.05)
check_eq(json.loads(get(mport, "/stats")[1])["conns"], [], "/stats after the client left")
srv.stop()
check_eq(srv.proc.returncode, 0, "clean exit")

# ---- cache counters --------------------------------------------------------
srv = Server(["ram", "size=16M"], opts=["--metrics", "127.0.0.1:0", "--cache", "1M",
                                        "--cache-block", "64K", "--cache-mode", "writeback",
                                        "--sparse-reads", "no"])
mport = srv.metrics_port
h = nbd_connect(srv)
h.pread(65536, 0)          # miss
h.pread(65536, 0)          # hit
h.pread(4096, 4096)        # hit
h.pwrite(b"x" * 4096, 1 << 20)   # read-modify-write: one more block, dirty
fams = scrape(mport)
check_eq(metric_value(fams, "blkd_cache_hits", "blkd_cache_hits_total"), 2, "cache hits")
check_eq(metric_value(fams, "blkd_cache_misses", "blkd_cache_misses_total"), 1, "cache misses")
check_eq(metric_value(fams, "blkd_cache_dirty_bytes", "blkd_cache_dirty_bytes"), 65536, "dirty bytes")
check_eq(metric_value(fams, "blkd_cache_entries", "blkd_cache_entries"), 2, "cache entries")
check_eq(metric_value(fams, "blkd_cache_capacity_bytes", "blkd_cache_capacity_bytes"), 1 << 20,
         "cache capacity")
h.flush()
fams = scrape(mport)
check_eq(metric_value(fams, "blkd_cache_dirty_bytes", "blkd_cache_dirty_bytes"), 0, "dirty after flush")
check_eq(metric_value(fams, "blkd_cache_writebacks", "blkd_cache_writebacks_total"), 1, "writebacks")
h.shutdown()
srv.stop()

# ---- 503 while draining --------------------------------------------------------
srv = Server(["eval", "get_size=echo 1048576",
              "pread=sleep 3; dd if=/dev/zero count=$3 iflag=count_bytes status=none"],
             opts=["--metrics", "127.0.0.1:0"])
mport = srv.metrics_port
h = nbd_connect(srv)
buf = nbd.Buffer(4096)
cookie = h.aio_pread(buf, 0)
time.sleep(0.5)                       # the request is in the plugin now
srv.proc.send_signal(signal.SIGTERM)
seen = None
deadline = time.time() + 2
while time.time() < deadline:
    try:
        seen = get(mport, "/healthz")
    except OSError:
        break
    if seen[0] == 503:
        break
    time.sleep(0.05)
check_eq(seen, (503, "draining\n"), "/healthz while draining")
while h.aio_in_flight() > 0:
    h.poll(-1)
h.aio_command_completed(cookie)
ok("the in-flight read was answered during the drain")
srv.proc.wait(20)
check_eq(srv.proc.returncode, 0, "clean exit after the drain")
print("all metrics endpoint checks passed")
