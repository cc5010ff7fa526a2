#!/usr/bin/python3
"""Server-bound anchors: blkd against nbdkit (qemu-nbd, nbd-server) with fio and with blkperf.

Every row is measured twice, by two clients, in the same run:

- fio's nbd engine, unpinned: what users run.  At small requests its one
  thread is often the limit, so its ratios say as much about fio as about
  the server.
- blkperf with the server pinned to the last CPU and blkperf to CPU 0
  ("pinned apart"): a client that costs less CPU per request than the
  server, on a CPU of its own, so the server is the limit.  Against blkd,
  blkperf's request count is checked against the server's own
  (blkd_requests_total from --metrics, scraped around the run); a row
  whose counts disagree is marked invalid.

Each cell records the rate, the server's CPU per request, the client's
CPU per request, both sides' CPU shares (CPU seconds per second; one
thread is full at 1.00), the server's busiest thread, and which side was
the limit (bench/benchlib.py says how).  Where the client was full and
the server had headroom, the ratio column says "client-bound" rather than
a bare ratio.  Servers alternate (A B C, C B A, ...) and so do the two
clients, for ROUNDS rounds; the tables give medians, the spread (min-max
over the rounds) and ratios against the baseline server hosting the same
plugin (median and range of the per-round ratios).

Honesty rules built in: before each cell the script samples the machine
for a moment with nothing of its own running; a cell that starts while
something else keeps the CPUs busy (more than --max-busy percent) waits
and is retried, and if the machine never quiets down the cell is marked
"*".  The 1-minute load average before each cell is recorded.  Reads run
on prefilled data.

Usage: bench/anchors.py [--rounds N] [--seconds S]
                        [--part anchors|targets|rawio|switches|all]
                        [--clients fio,blkperf] [--workloads SUBSTR,...]
                        [--servers SUBSTR,...] [--size 1G] [--fio-pinned]
                        [--runs N --gap-minutes M]
                        [--blkd NAME=PATH ...] [--out FILE] [--json FILE]
"""

import argparse
import json
import os
import platform
import shutil
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The shared method; names re-exported for the scripts that import them
# from here (per-request.py, layers.sh, zerocopy.py).
from benchlib import (CLIENT_PIN, NCPU, SERVER_CPU, bound, busy_pct,  # noqa: E402,F401
                      bound_shared, count_agrees, free_port, machine_cpu, pin, place_rates,
                      proc_cpu,
                      ratio_cell,
                      run_blkperf, run_fio, scrape_requests, tree_cpu, wait_port, wait_quiet)

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLKD = os.path.join(TOP, "blkd")
BLKPERF = os.path.join(TOP, "blkperf")
DISK = "1G"
MAX_BUSY = 10.0          # percent of the machine others may use before a cell
EXTRA_BLKD = []          # (name, path, options): other blkd builds or options beside ./blkd
FIO_PINNED = False       # --fio-pinned: fio pinned apart too (a diagnosis)
FIO_SAME_CPU = False     # --fio-same-cpu: fio and the server on one CPU (a diagnosis)
SERVER_FILTER = []       # --servers: substrings of the server names to run


class Server:
    def __init__(self, name, argv_fn, tmp, export=""):
        self.name = name
        self.port = free_port()
        self.metrics = None
        argv = argv_fn(self.port, tmp)
        if argv[0] in [BLKD] + [path for _, path, _ in EXTRA_BLKD]:
            mport = free_port()
            argv = argv[:1] + ["--metrics", "127.0.0.1:%d" % mport] + argv[1:]
            self.metrics = "http://127.0.0.1:%d/metrics" % mport
        self.log = open(os.path.join(tmp, name.replace("/", "_") + ".log"), "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.pidfile = os.path.join(tmp, "nbd-server.pid") if name.startswith("nbd-server") else None
        if self.pidfile:
            # nbd-server forks into the background; its children serve.
            self.proc.wait(10)
            time.sleep(0.3)
            with open(self.pidfile) as f:
                self.pid = int(f.read().strip())
            wait_port(self.port, None)
        else:
            self.pid = self.proc.pid
            wait_port(self.port, self.proc)
        self.uri = "nbd://127.0.0.1:%d/%s" % (self.port, export)

    def stop(self):
        if self.pidfile:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def prefill(uri):
    """Write the whole disk so reads hit real data, not holes."""
    subprocess.run(["fio", "--name=fill", "--ioengine=nbd", "--uri=" + uri, "--rw=write",
                    "--bs=1M", "--iodepth=8", "--size=" + DISK, "--output=/dev/null"],
                   check=True, cwd=tempfile.gettempdir())


def measure(server, wl, seconds, client):
    """One cell: one client run against one server.  fio runs unpinned
    (unless --fio-pinned), blkperf pinned apart."""
    busy, quiet = wait_quiet(MAX_BUSY)
    load1 = os.getloadavg()[0]
    same = client == "fio" and FIO_SAME_CPU and NCPU > 1
    pinned = (client == "blkperf" or FIO_PINNED or same) and NCPU > 1
    wrap = ["taskset", "-c", SERVER_CPU] if same else CLIENT_PIN if pinned else []
    if pinned:
        pin(server.pid, SERVER_CPU)
    n0 = scrape_requests(server.metrics) if server.metrics else None
    u0, s0 = tree_cpu(server.pid)
    m0, t0 = machine_cpu(), time.monotonic()
    try:
        if client == "fio":
            extra = ["--rate_iops=%d" % wl["rate_iops"]] if wl.get("rate_iops") else []
            r = run_fio(server.uri, wl["rw"], wl["bs"], wl["iodepth"], wl["numjobs"], seconds,
                        DISK, extra, wrap, server.pid)
        else:
            r = run_blkperf(BLKPERF, server.uri, wl["test"], wl["bs"], wl["iodepth"],
                            wl["numjobs"], seconds, (), wrap, server.pid)
    finally:
        wall = time.monotonic() - t0
        u1, s1 = tree_cpu(server.pid)
        m1 = machine_cpu()
        if pinned:
            pin(server.pid, "0-%d" % (NCPU - 1))
    n1 = scrape_requests(server.metrics) if server.metrics else None
    r.update(client=client, pinned=pinned, same_cpu_pinned=same, busy_before_pct=busy,
             quiet=quiet, load1=load1)
    cpu = (u1 - u0) + (s1 - s0)
    mib = r["bytes"] / 1048576.0
    r["srv_user_s"], r["srv_sys_s"] = u1 - u0, s1 - s0
    r["srv_us_req"] = cpu * 1e6 / r["requests"] if r["requests"] else None
    r["srv_share"] = cpu / wall if wall else None
    r["cpu_us_per_mib"] = cpu * 1e6 / mib if mib else 0
    r["user_us_per_mib"] = (u1 - u0) * 1e6 / mib if mib else 0
    r["client_cap"] = min(wl["numjobs"], 1 if pinned else NCPU)
    # What the server could use: its CPU pinned, else what the client left.
    r["srv_cap"] = 1.0 if pinned else max(1.0, NCPU - (r["client_share"] or 0))
    srv_share = r["srv_share_mid"] if r["srv_share_mid"] is not None else r["srv_share"]
    r["bound"] = (bound_shared(r["client_share"], srv_share) if same else
                  bound(r["client_share"], r["client_cap"], srv_share, r["srv_cap"],
                        r["srv_thread_max"]))
    r.update(place_rates(r))
    r["srv_requests"] = None if n0 is None else n1 - n0
    r["count_ok"] = count_agrees(r["requests"], r["srv_requests"],
                                 wl["iodepth"] * wl["numjobs"])
    tot = sum(m1) - sum(m0) or 1
    r["machine_idle_pct"] = 100.0 * (m1[2] - m0[2]) / tot
    return r


def iperf3_mib_s(seconds):
    port = free_port()
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(int(seconds)),
                          "-J"], capture_output=True, text=True)
    srv.wait(10)
    j = json.loads(out.stdout)
    return j["end"]["sum_received"]["bits_per_second"] / 8 / 1048576.0


# Each workload as fio runs it and as blkperf does (test; numjobs is
# blkperf's -C).  test None: fio only (blkperf has no rate limit).
WORKLOADS = [
    ("4k randread QD32", dict(rw="randread", bs="4k", iodepth=32, numjobs=1, test="RAND_READ")),
    ("4k randwrite QD32", dict(rw="randwrite", bs="4k", iodepth=32, numjobs=1,
                               test="RAND_WRITE")),
    ("4x QD16 4k randread", dict(rw="randread", bs="4k", iodepth=16, numjobs=4,
                                 test="RAND_READ")),
    ("QD1 4k randread", dict(rw="randread", bs="4k", iodepth=1, numjobs=1, test="RR")),
    ("256k read QD16", dict(rw="read", bs="256k", iodepth=16, numjobs=1, test="STREAM_READ")),
    ("256k write QD16", dict(rw="write", bs="256k", iodepth=16, numjobs=1, test="STREAM_WRITE")),
    # A client that waits between requests: what an idle-ish connection
    # costs the server (CPU per request), e.g. with --poll-us.
    ("QD1 4k randread at 2000 IOPS", dict(rw="randread", bs="4k", iodepth=1, numjobs=1,
                                          rate_iops=2000, test=None)),
]


def blkd_server(path, *args):
    return lambda p, t: [path, "-f", "-i", "127.0.0.1", "-p", str(p)] + list(args)


def target_servers(tmp):
    """The single-connection targets: nbdkit and blkd on Debian's memory
    plugin and on this tree's ram (nbdkit loads it by path and copies:
    the same plugin code, without lending), and any other blkd builds or
    options named with --blkd."""
    ram_so = os.path.join(TOP, "plugins", "ram", "nbdkit-ram-plugin.so")
    s = [
        ("nbdkit memory", lambda p, t: ["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(p),
                                        "memory", DISK]),
        ("nbdkit ram", lambda p, t: ["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(p),
                                     ram_so, DISK]),
        ("blkd memory", blkd_server(BLKD, "memory", DISK)),
        ("blkd ram", blkd_server(BLKD, "ram", DISK)),
    ]
    for name, path, opts in EXTRA_BLKD:
        s.append((name + " memory", blkd_server(path, *opts, "memory", DISK)))
        s.append((name + " ram", blkd_server(path, *opts, "ram", DISK)))
    return s, None


def anchor_servers(tmp):
    img = os.path.join("/dev/shm", "blkd-bench-%d.img" % os.getpid())
    subprocess.run(["truncate", "-s", DISK, img], check=True)
    nbd_conf = os.path.join(tmp, "nbd-server.conf")

    def nbd_server(port, t):
        with open(nbd_conf, "w") as f:
            f.write("[generic]\nport = %d\nlistenaddr = 127.0.0.1\n"
                    "allowlist = true\n[disk]\nexportname = %s\n" % (port, img))
        return ["nbd-server", "-C", nbd_conf, "-p", os.path.join(t, "nbd-server.pid")]

    s = [
        ("nbdkit memory", lambda p, t: ["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(p),
                                        "memory", DISK]),
        ("blkd memory", blkd_server(BLKD, "memory", DISK)),
        ("blkd ram", blkd_server(BLKD, "ram", DISK)),
        ("blkd rawio (tmpfs)", blkd_server(BLKD, "rawio", "file=" + img)),
        ("qemu-nbd (tmpfs)", lambda p, t: ["qemu-nbd", "-f", "raw", "-b", "127.0.0.1", "-p",
                                           str(p), "-x", "", "-t", "-e", "64", img]),
        ("nbd-server (tmpfs)", nbd_server),
    ]
    return s, img


DISK_FILE = "/var/tmp/blkd-bench-disk.img"


def rawio_servers(tmp):
    """O_DIRECT on a file on the machine's own disk: blkd's rawio against
    qemu-nbd with the cache off and io_uring.  The file must be written well
    before the run (a fresh file's write-back skews the first minutes)."""
    if not os.path.exists(DISK_FILE):
        raise SystemExit("write %s first, well before the run: dd if=/dev/zero of=%s "
                         "bs=1M count=1024 oflag=direct" % (DISK_FILE, DISK_FILE))
    return [
        ("qemu-nbd io_uring direct", lambda p, t: [
            "qemu-nbd", "-f", "raw", "--cache=none", "--aio=io_uring", "-b", "127.0.0.1",
            "-p", str(p), "-x", "", "-t", "-e", "64", DISK_FILE]),
        ("blkd rawio direct", blkd_server(BLKD, "rawio", "file=" + DISK_FILE, "direct=true")),
    ], None


RAWIO_WORKLOADS = [
    ("4k randread QD32 (disk)", dict(rw="randread", bs="4k", iodepth=32, numjobs=1,
                                     test="RAND_READ")),
    ("256k read QD16 (disk)", dict(rw="read", bs="256k", iodepth=16, numjobs=1,
                                   test="STREAM_READ")),
]


def switch_servers(tmp):
    def b(*opts):
        return lambda p, t: [BLKD, "-f", "-i", "127.0.0.1", "-p", str(p)] + list(opts) + \
            ["memory", DISK]
    return [
        ("iobuf=pool", b("--iobuf=pool")),
        ("iobuf=calloc", b("--iobuf=calloc")),
        # Both on workers: the queues are what the plugin calls go through.
        ("queue=split (workers)", b("--queue=split", "--dispatch=worker")),
        ("queue=global (workers)", b("--queue=global", "--dispatch=worker")),
    ], None


def run_part(title, servers_fn, workloads, rounds, seconds, clients, fill=True):
    """Run every workload on every server with every client, for rounds
    rounds.  Servers alternate (A B C, C B A, ...), and so do the clients
    (fio first in odd rounds, blkperf first in even ones).  Returns
    {client: {workload: {server: [cell, ...]}}}."""
    tmp = tempfile.mkdtemp(prefix="blkd-bench.")
    specs, img = servers_fn(tmp)
    servers = []
    try:
        for name, fn in specs:
            if SERVER_FILTER and not any(k in name for k in SERVER_FILTER):
                continue
            try:
                servers.append(Server(name, fn, tmp, "disk" if name.startswith("nbd-server") else ""))
            except Exception as e:
                print("skipping %s: %s" % (name, e), file=sys.stderr)
        for s in servers:
            if fill:
                prefill(s.uri)
        results = {c: {wl: {s.name: [] for s in servers} for wl, spec in workloads
                        if c == "fio" or spec.get("test")} for c in clients}
        for rnd in range(rounds):
            order = servers if rnd % 2 == 0 else list(reversed(servers))
            corder = clients if rnd % 2 == 0 else list(reversed(clients))
            for wl, spec in workloads:
                for s in order:
                    for c in corder:
                        if wl not in results[c]:
                            continue
                        r = measure(s, spec, seconds, c)
                        r["round"] = rnd + 1
                        results[c][wl][s.name].append(r)
                        print("%-8s round %d %-7s %-28s %-22s %9.0f IOPS %8.1f MiB/s  "
                              "srv %6.1f us/req share %s thread %s  client %s  %-6s count %s  "
                              "same-cpu %s load %.2f busy %.0f%%%s" % (
                                  title, rnd + 1, c, wl, s.name, r["iops"], r["mib_s"],
                                  r["srv_us_req"] or 0, fmt(r["srv_share_mid"]),
                                  fmt(r["srv_thread_max"]), fmt(r["client_share"]), r["bound"],
                                  {None: "n/a", True: "ok", False: "DISAGREE"}[r["count_ok"]],
                                  fmt(r["same_cpu"]), r["load1"], r["busy_before_pct"],
                                  "" if r["quiet"] else " NOT QUIET"),
                              file=sys.stderr, flush=True)
        return results
    finally:
        for s in servers:
            s.stop()
        if img:
            os.unlink(img)
        shutil.rmtree(tmp, ignore_errors=True)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(v, f="%.2f"):
    return "n/a" if v is None else f % v


def summarise(rs):
    """Medians of one cell's rounds, and which side was the limit, judged
    from the median shares."""
    big = any(r["bytes"] / max(r["requests"], 1) >= 65536 for r in rs)
    rate = [r["mib_s"] if big else r["iops"] for r in rs]
    share = [r["srv_share_mid"] if r["srv_share_mid"] is not None else r["srv_share"]
             for r in rs]
    m = {
        "unit": "MiB/s" if big else "IOPS", "rate": med(rate), "lo": min(rate), "hi": max(rate),
        "srv_us_req": med([r["srv_us_req"] for r in rs]),
        "client_us_req": med([r["client_us_req"] for r in rs]),
        "client_share": med([r["client_share"] for r in rs]),
        "srv_share": med(share), "srv_thread_max": med([r["srv_thread_max"] for r in rs]),
        "p99_us": med([r["p99_us"] for r in rs]),
        "load_lo": min(r["load1"] for r in rs), "load_hi": max(r["load1"] for r in rs),
        "quiet": all(r.get("quiet", True) for r in rs),
        "pinned": all(r.get("pinned") for r in rs),
    }
    m["bound"] = (bound_shared(m["client_share"], m["srv_share"])
                  if all(r.get("same_cpu_pinned") for r in rs) else
                  bound(m["client_share"], med([r["client_cap"] for r in rs]), m["srv_share"],
                        med([r["srv_cap"] for r in rs]), m["srv_thread_max"]))
    m["same_cpu"] = med([r.get("same_cpu") for r in rs])
    for k in ("srv_cs_req", "client_cs_req", "srv_invol_req", "client_invol_req",
              "srv_migr_s", "client_migr_s"):
        m[k] = med([r.get(k) for r in rs])
    checks = [r["count_ok"] for r in rs if r["count_ok"] is not None]
    m["count"] = "n/a" if not checks else ("ok" if all(checks) else
                                           "DISAGREE in %d of %d" % (checks.count(False),
                                                                     len(checks)))
    m["valid"] = all(checks)
    return m


def per_round_ratio(rs, base, key):
    """Median and range of cell/baseline per round (same round, same
    client), over the rounds both have."""
    b = {r["round"]: r for r in base}
    xs = [r[key] / b[r["round"]][key] for r in rs
          if r["round"] in b and r[key] and b[r["round"]][key]]
    return (statistics.median(xs), (min(xs), max(xs))) if xs else (None, None)


def place_cell(m):
    """Where the busiest client and server threads ran (share of samples
    on one CPU) and their context switches per request (involuntary ones
    in brackets): what tells one placement from another when a ratio
    swings between runs."""
    if m.get("same_cpu") is None:
        return "–"
    cs = ""
    if m.get("srv_cs_req") is not None:
        cs = "; cs/req srv %.2f (%.2f), client %.2f (%.2f)" % (
            m["srv_cs_req"], m["srv_invol_req"], m["client_cs_req"], m["client_invol_req"])
    migr = ""
    if m.get("srv_migr_s") is not None and m.get("client_migr_s") is not None:
        migr = "; migr/s %.0f, %.0f" % (m["srv_migr_s"], m["client_migr_s"])
    return "same CPU %.0f%%%s%s" % (100 * m["same_cpu"], cs, migr)


TABLE_HEAD = ("| workload | server | rate (median) | spread | × {base} rate | server CPU µs/req "
              "| × {base} CPU/req | client CPU µs/req | client share | server share (busiest "
              "thread) | bound | placement | count check | p99 µs | load1 |")


def table(results, baseline, client):
    """One row per workload and server for one client.  "*" marks a row
    with a cell that began while the machine was not quiet."""
    lines = [TABLE_HEAD.format(base=baseline), "|" + "---|" * 15]
    for wl, by_server in results.items():
        base = by_server.get(baseline) or []
        bsum = summarise(base) if base else None
        for name, rs in by_server.items():
            if not rs:
                continue
            m = summarise(rs)
            key = "mib_s" if m["unit"] == "MiB/s" else "iops"
            rate_r, rate_sp = per_round_ratio(rs, base, key)
            cpu_r, cpu_sp = per_round_ratio(rs, base, "srv_us_req")
            lines.append("| %s%s | %s | %.0f %s | %.0f–%.0f | %s | %s | %s | %s | %s | %s (%s) "
                         "| %s | %s | %s | %s | %.2f–%.2f |" % (
                             wl, "" if m["quiet"] else " *", name, m["rate"], m["unit"],
                             m["lo"], m["hi"],
                             ratio_cell(rate_r, None if name == baseline else rate_sp,
                                        m["bound"], bsum and bsum["bound"],
                                        m["valid"] and (not bsum or bsum["valid"])),
                             fmt(m["srv_us_req"], "%.1f"),
                             "1" if name == baseline else
                             "%.2f (%.2f–%.2f)" % ((cpu_r,) + cpu_sp) if cpu_r else "–",
                             fmt(m["client_us_req"], "%.1f"), fmt(m["client_share"]),
                             fmt(m["srv_share"]), fmt(m["srv_thread_max"]), m["bound"],
                             place_cell(m), m["count"], fmt(m["p99_us"], "%.0f"), m["load_lo"], m["load_hi"]))
    return "\n".join(lines)


LEGEND = """\
Rate: median over the rounds (IOPS, or MiB/s for 64 KiB requests and
more); spread: min–max.  × columns: the median of the per-round ratios
against {base} under the same client, with their range.  Shares are CPU
seconds per second (one thread full: 1.00), the server's sampled in the
middle of the run.  bound: which side was the limit (server: its busiest
thread or the process near full; client: the client near full while the
server had headroom; both: unpinned, the machine full, or pinned to one
CPU together and that CPU full; -: neither).  placement: the share of
samples (every 50 ms, mid-run) in which the busiest client thread and the
busiest server thread last ran on the same CPU, and each one's context
switches per request, involuntary (preempted) in brackets, and its
migrations between CPUs per second where the kernel reports them.
Where a cell or its baseline is client-bound the × column says so: the
rate is the client's, and the ratio given is only a bound.  count check:
blkd's own request count (its /metrics, scraped around the run) against
the client's; "DISAGREE" makes the row invalid."""


def client_title(client):
    if client == "fio" and FIO_SAME_CPU and NCPU > 1:
        return "fio, pinned with the server (both on CPU %s)" % SERVER_CPU
    if client == "blkperf" or FIO_PINNED:
        return ("%s, pinned apart (server on CPU %s, client on CPU 0)" % (client, SERVER_CPU)
                if NCPU > 1 else "%s (one CPU: not pinned)" % client)
    return "%s, unpinned" % client


def part_tables(title, res, baseline):
    md = []
    for client, by_wl in res.items():
        md.append("\n### %s: %s\n" % (title, client_title(client)))
        md.append(table(by_wl, baseline, client))
    md.append("\n" + LEGEND.format(base=baseline))
    return md


def run_repeated(title, servers_fn, workloads, a, clients, fill=True):
    """run_part --runs times, --gap-minutes apart (fresh servers each run):
    a ratio that holds in one run and not an hour later is the machine's
    or the client's, not the server's.  Returns [(start UTC, results)]."""
    out = []
    for i in range(a.runs):
        if i:
            time.sleep(a.gap_minutes * 60)
        when = time.strftime("%H:%M UTC", time.gmtime())
        out.append((when, run_part(title, servers_fn, workloads, a.rounds, a.seconds, clients,
                                   fill)))
    return out


def runs_table(runs, baseline):
    """Across runs: each run's median rate ratio against the baseline (as
    the × column shows it, client-bound or not), and how many runs were
    client-bound."""
    lines = ["| client | workload | server | × %s rate, per run (%s) | min | median | max | "
             "runs client-bound | same CPU per run (server, %s) |" % (
                 baseline, ", ".join(w for w, _ in runs), baseline),
             "|---|---|---|---|---|---|---|---|---|"]
    first = runs[0][1]
    for client, by_wl in first.items():
        for wl, by_server in by_wl.items():
            for name in by_server:
                if name == baseline:
                    continue
                cells, ratios, cb, places = [], [], 0, []
                for _, res in runs:
                    rs = res.get(client, {}).get(wl, {}).get(name) or []
                    base = res.get(client, {}).get(wl, {}).get(baseline) or []
                    if not rs or not base:
                        cells.append("–")
                        continue
                    m, bm = summarise(rs), summarise(base)
                    places.append("/".join("–" if x is None else "%.2f" % x
                                           for x in (m["same_cpu"], bm["same_cpu"])))
                    key = "mib_s" if m["unit"] == "MiB/s" else "iops"
                    r, _ = per_round_ratio(rs, base, key)
                    if r is None:
                        cells.append("–")
                        continue
                    ratios.append(r)
                    client_bound = "client" in (m["bound"], bm["bound"])
                    cb += client_bound
                    invalid = not (m["valid"] and bm["valid"])
                    cells.append("%.2f%s" % (r, " invalid" if invalid else
                                             " (client-bound)" if client_bound else ""))
                lines.append("| %s | %s | %s | %s | %s | %s | %s | %d of %d | %s |" % (
                    client, wl, name, ", ".join(cells),
                    "%.2f" % min(ratios) if ratios else "–",
                    "%.2f" % statistics.median(ratios) if ratios else "–",
                    "%.2f" % max(ratios) if ratios else "–", cb, len(runs),
                    ", ".join(places) or "–"))
    return "\n".join(lines)


def part_output(title, runs, baseline):
    """Markdown for one part: each run's tables, and with several runs
    the ratios across them."""
    md = []
    for i, (when, res) in enumerate(runs):
        if len(runs) > 1:
            md.append("\n## %s, run %d of %d (%s)" % (title, i + 1, len(runs), when))
        md += part_tables(title, res, baseline)
    if len(runs) > 1:
        md.append("\n## %s across the %d runs\n\n%s" % (title, len(runs),
                                                         runs_table(runs, baseline)))
    return md


def client_table(results):
    """What each server costs fio: its CPU and context switches per
    request (fio's one thread is the limit at QD32, so a server that makes
    fio cheaper raises the ceiling)."""
    lines = ["| workload | server | fio CPU µs/request | fio context switches/request |",
             "|---|---|---|---|"]
    for wl, by_server in results.items():
        for name, rs in by_server.items():
            rs = [r for r in rs if r.get("requests")]
            if not rs:
                continue
            lines.append("| %s | %s | %.1f | %.2f |" % (
                wl, name, med([r["client_us_req"] for r in rs]),
                med([r["client_ctx"] / r["requests"] for r in rs])))
    return "\n".join(lines)


def versions():
    def first(argv):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "%s: not found" % argv[0]
    rev = first(["git", "-C", TOP, "describe", "--always", "--dirty"])
    return "; ".join([
        "blkd " + rev, first(["nbdkit", "--version"]), first(["fio", "--version"]),
        first(["qemu-nbd", "--version"]), first(["nbd-server", "-V"]),
        first([BLKPERF, "--version"])])


def main():
    global MAX_BUSY, DISK, FIO_PINNED, FIO_SAME_CPU, SERVER_FILTER
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--part", default="all", choices=["anchors", "targets", "rawio", "switches", "all"])
    ap.add_argument("--clients", default="fio,blkperf",
                    help="which clients measure each row: fio (unpinned), blkperf (pinned apart)")
    ap.add_argument("--workloads", default=None,
                    help="comma-separated substrings: run only the matching workloads")
    ap.add_argument("--servers", default=None,
                    help="comma-separated substrings: run only the matching servers")
    ap.add_argument("--size", default=DISK, help="disk size (default 1G)")
    ap.add_argument("--runs", type=int, default=1,
                    help="repeat the whole part this many times (fresh servers each time)")
    ap.add_argument("--gap-minutes", type=float, default=0,
                    help="wait this long between runs (e.g. 12 for five runs over an hour)")
    ap.add_argument("--fio-pinned", action="store_true",
                    help="pin fio apart from the server too (to tell placement from the server)")
    ap.add_argument("--fio-same-cpu", action="store_true",
                    help="pin fio and the server to one CPU together (the other placement)")
    ap.add_argument("--blkd", action="append", default=[], metavar="NAME=PATH [OPTIONS]",
                    help="another blkd build, or options, to run beside ./blkd (targets "
                    "part), e.g. --blkd 'reno=./blkd --tcp-congestion reno'")
    ap.add_argument("--max-busy", type=float, default=MAX_BUSY,
                    help="percent of the machine others may use before a cell")
    ap.add_argument("--out", default=None, help="write the markdown tables here")
    ap.add_argument("--json", default=None, help="write raw results here")
    a = ap.parse_args()
    MAX_BUSY, DISK, FIO_PINNED, FIO_SAME_CPU = a.max_busy, a.size, a.fio_pinned, a.fio_same_cpu
    if FIO_PINNED and FIO_SAME_CPU:
        ap.error("--fio-pinned and --fio-same-cpu are two placements: choose one")
    SERVER_FILTER = a.servers.split(",") if a.servers else []
    clients = [c for c in a.clients.split(",") if c]
    if not clients or any(c not in ("fio", "blkperf") for c in clients):
        ap.error("--clients takes fio, blkperf or both")
    if "blkperf" in clients and not os.access(BLKPERF, os.X_OK):
        ap.error("build blkperf first (make blkperf), or --clients fio")
    for spec in a.blkd:
        name, cmd = spec.split("=", 1)
        argv = shlex.split(cmd)
        if not name or not argv:
            ap.error("--blkd takes NAME=PATH [OPTIONS]")
        EXTRA_BLKD.append((name, os.path.abspath(argv[0]), argv[1:]))
    workloads = WORKLOADS
    if a.workloads:
        keys = a.workloads.split(",")
        workloads = [w for w in WORKLOADS if any(k in w[0] for k in keys)]

    cpu_model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    if a.runs < 1 or a.gap_minutes < 0:
        ap.error("--runs takes 1 or more, --gap-minutes 0 or more")
    header = ["Machine: %s, %d CPUs, kernel %s; %s; %s; %d rounds of %gs, medians; "
              "load average at start %.2f; a cell starts only when others use "
              "under %.0f%% of the machine (\"*\": one did not)." % (
                  cpu_model, NCPU, platform.release(), versions(),
                  time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  a.rounds, a.seconds, os.getloadavg()[0], MAX_BUSY)]
    raw = {"header": header[0]}
    md = list(header)

    def part(title, servers_fn, wls, baseline, fill=True):
        runs = run_repeated(title, servers_fn, wls, a, clients, fill)
        raw[title] = runs[0][1] if len(runs) == 1 else [{"start": w, "results": r}
                                                       for w, r in runs]
        md.extend(part_output(title, runs, baseline))
        return runs

    if a.part in ("anchors", "all"):
        iperf = [iperf3_mib_s(3) for _ in range(a.rounds)]
        md.append("\niperf3, one TCP stream over loopback: median %.0f MiB/s (%.0f–%.0f)\n" % (
            med(iperf), min(iperf), max(iperf)))
        raw["iperf3_mib_s"] = iperf
        part("anchors", anchor_servers, workloads, "nbdkit memory")
    if a.part == "rawio":
        part("rawio", rawio_servers, RAWIO_WORKLOADS, "qemu-nbd io_uring direct", fill=False)
    if a.part == "targets":
        runs = part("targets", target_servers, workloads, "nbdkit memory")
        if "fio" in runs[-1][1]:
            md.append("\nWhat each server costs fio:\n\n" + client_table(runs[-1][1]["fio"]))
    if a.part in ("switches", "all"):
        sw = []
        for conns in (1, 4, 16, 64):
            depth = max(1, 64 // conns)
            sw.append(("%d conn × QD%d 4k randread" % (conns, depth),
                       dict(rw="randread", bs="4k", iodepth=depth, numjobs=conns,
                            test="RAND_READ")))
        part("switches", switch_servers, sw, "iobuf=pool")
    text = "\n".join(md) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
