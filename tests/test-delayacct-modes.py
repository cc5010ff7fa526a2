#!/usr/bin/env python3
"""Delay accounting, each --delayacct mode, plugin called on the shard
thread (ram: inline) and on worker threads (--dispatch worker):

- data written reads back exact (the accounting is on the request path);
- compact and locked: blkd_delay_{queued,plugin,send}_seconds_total exist
  per command, the histograms parse as Prometheus histograms whose count
  equals the number of requests and whose _sum equals the total, buckets
  never decrease, the maximum is no more than the total, and the plugin
  time of a plugin that sleeps is at least the sleep;
- off: no delay metric at all, the request counts still exact."""

import os
import random
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import (Server, check, check_eq, fail, metric_value,  # noqa: E402
                      nbd_connect, need_nbd, ok, skip, IS_NBDKIT)

if IS_NBDKIT:
    skip("--delayacct is a blkd option")
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    skip("python3-prometheus-client is not installed")
need_nbd()

PHASES = ("queued", "plugin", "send")


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def settle(port, want):
    deadline = time.time() + 5
    while True:
        fams = scrape(port)
        got = {k: metric_value(fams, "blkd_requests", "blkd_requests_total", cmd=k) for k in want}
        if got == want or time.time() > deadline:
            return fams, got


def run(mode, dispatch):
    what = "--delayacct=%s%s" % (mode, " --dispatch=" + dispatch if dispatch else "")
    opts = ["--delayacct", mode, "--metrics", "127.0.0.1:0"]
    if dispatch:
        opts += ["--dispatch", dispatch]
    srv = Server(["ram", "size=16M"], opts=opts)
    mport = srv.metrics_port
    h = nbd_connect(srv)
    rng = random.Random(7)
    model = bytearray(16 << 20)
    nw = nr = 0
    for i in range(150):
        off = rng.randrange(0, (16 << 20) - 65536) & ~4095
        n = rng.choice([4096, 16384, 65536])
        data = rng.randbytes(n)
        h.pwrite(data, off)
        model[off:off + n] = data
        nw += 1
        if h.pread(n, off) != data:
            fail("%s: read back differs at %d" % (what, off))
        nr += 1
    h.flush()
    want = {"read": nr, "write": nw, "flush": 1}
    fams, got = settle(mport, want)
    check_eq(got, want, "%s: requests by command" % what)
    check_eq(bytes(h.pread(16 << 20, 0)) == bytes(model), True, "%s: whole disk exact" % what)
    nr += 1
    fams, got = settle(mport, {"read": nr, "write": nw, "flush": 1})
    check_eq(metric_value(fams, "blkd_delayacct_info", "blkd_delayacct_info", mode=mode), 1,
             "%s: mode reported" % what)

    if mode == "off":
        delay = [n for n in fams if n.startswith("blkd_delay_")]
        check_eq(delay, [], "%s: no delay metrics" % what)
    else:
        counts = {"read": nr, "write": nw, "flush": 1}
        for ph in PHASES:
            for cmd, n in counts.items():
                total = metric_value(fams, "blkd_delay_%s_seconds" % ph,
                            "blkd_delay_%s_seconds_total" % ph, cmd=cmd)
                hfam = "blkd_delay_%s_duration_seconds" % ph
                cnt = metric_value(fams, hfam, hfam + "_count", cmd=cmd)
                hsum = metric_value(fams, hfam, hfam + "_sum", cmd=cmd)
                mx = metric_value(fams, "blkd_delay_%s_max_seconds" % ph,
                         "blkd_delay_%s_max_seconds" % ph, cmd=cmd)
                if total is None or cnt is None or hsum is None or mx is None:
                    fail("%s: %s/%s: delay series missing" % (what, ph, cmd))
                if cnt != n:
                    fail("%s: %s/%s: histogram count %s, requests %d" % (what, ph, cmd, cnt, n))
                if abs(hsum - total) > 1e-6:
                    fail("%s: %s/%s: histogram sum %s != total %s" % (what, ph, cmd, hsum, total))
                if not (0 <= mx <= total + 1e-9):
                    fail("%s: %s/%s: max %s outside [0, total %s]" % (what, ph, cmd, mx, total))
                buckets = [(float(s.labels["le"]), s.value) for s in fams[hfam].samples
                           if s.name == hfam + "_bucket" and s.labels.get("cmd") == cmd]
                buckets.sort()
                if [v for _, v in buckets] != sorted(v for _, v in buckets):
                    fail("%s: %s/%s: buckets decrease" % (what, ph, cmd))
                if buckets[-1] != (float("inf"), n):
                    fail("%s: %s/%s: +Inf bucket %s" % (what, ph, cmd, buckets[-1]))
        ok("%s: three phases x read/write/flush: totals, max, histograms consistent" % what)
        plug = metric_value(fams, "blkd_delay_plugin_seconds", "blkd_delay_plugin_seconds_total", cmd="write")
        send = metric_value(fams, "blkd_delay_send_seconds", "blkd_delay_send_seconds_total", cmd="read")
        check(plug > 0 and send > 0, "%s: plugin time %.6f s, send time %.6f s" % (what, plug, send))
    h.shutdown()
    srv.stop()
    check_eq(srv.proc.returncode, 0, "%s: clean exit" % what)


def slow_plugin(mode):
    """A plugin that sleeps 0.2 s per read: the plugin phase must show it,
    in the 0.25 s bucket or above, and the queued phase must not."""
    what = "--delayacct=%s, slow plugin" % mode
    srv = Server(["eval", "get_size=echo 1048576",
                  "pread=sleep 0.2; dd if=/dev/zero count=$3 iflag=count_bytes status=none"],
                 opts=["--delayacct", mode, "--metrics", "127.0.0.1:0"])
    mport = srv.metrics_port
    h = nbd_connect(srv)
    for i in range(3):
        h.pread(4096, i * 4096)
    fams, got = settle(mport, {"read": 3})
    check_eq(got, {"read": 3}, "%s: reads counted" % what)
    plug = metric_value(fams, "blkd_delay_plugin_seconds", "blkd_delay_plugin_seconds_total", cmd="read")
    queued = metric_value(fams, "blkd_delay_queued_seconds", "blkd_delay_queued_seconds_total", cmd="read")
    check(plug >= 0.6, "%s: plugin time %.3f s >= 3 x 0.2 s" % (what, plug))
    check(queued < 0.3, "%s: queued time %.3f s is not the plugin's" % (what, queued))
    under = [s.value for s in fams["blkd_delay_plugin_duration_seconds"].samples
             if s.name.endswith("_bucket") and s.labels["cmd"] == "read"
             and s.labels["le"] != "+Inf" and float(s.labels["le"]) < 0.2]
    check(max(under) == 0, "%s: no read in a bucket below 0.2 s" % what)
    h.shutdown()
    srv.stop()


for mode in ("compact", "locked", "off"):
    run(mode, None)
    run(mode, "worker")
for mode in ("compact", "locked"):
    slow_plugin(mode)
print("all delay accounting checks passed")
