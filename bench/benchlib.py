"""Shared measuring for the bench/ scripts: servers' and clients' CPU, pinning, fio and blkperf runs.

One method, used by bench/anchors.py (make bench-anchors) and
bench/blkperf-vs-fio.sh, so both tell the same thing the same way:

- A client's CPU comes from the client's own report over its measurement
  window: fio's usr_cpu+sys_cpu over the job's run time, blkperf's
  getrusage (-c).  Its CPU *share* is those CPU seconds per second of the
  window; one thread is full at 1.00.
- A server's CPU comes from /proc: utime+stime of the server process and
  of its children (nbd-server serves each client in a forked child), over
  the client's whole run (connecting included, so slightly high per
  request and slightly low as a share, the same way for every server and
  client).  While the client runs, the server's threads are sampled twice
  in the middle of the window, which gives its share in steady state and
  its busiest thread's share: a server whose one event-loop thread is
  full is saturated even when the process as a whole is not.
- Pinned ("apart"): the server on the last CPU, the client on CPU 0, so
  neither can take the other's CPU and a server near 1.00 is the limit
  whatever the client.
- Which side is the limit (bound()): a side is full when its share is at
  least FULL of what it could use.  "client" means the client was full
  and the server had headroom: the rate is the client's, not the server's.
"""

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1
FULL = 0.9          # a share at or above this fraction of its cap is "full"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, proc, secs=20):
    deadline = time.time() + secs
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("server exited at start-up: %s" % proc.args)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not listen: %s" % (proc.args if proc else port))


def _stat_fields(path):
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


def proc_cpu(pid):
    """(user, system) seconds of a process, its threads and its reaped
    children."""
    f = _stat_fields("/proc/%d/stat" % pid)
    return ((int(f[11]) + int(f[13])) / CLK_TCK, (int(f[12]) + int(f[14])) / CLK_TCK)


def proc_cpu_ns(pid):
    """A process's CPU clock in ns (clock_getcpuclockid(3) for another
    process): every thread's run time, exited threads' too, exact where
    proc_cpu counts clock ticks."""
    return time.clock_gettime_ns(((~pid) << 3) | 2)     # CPUCLOCK_SCHED


def tree_pids(pid):
    """pid and its live descendants (best effort: they may exit meanwhile)."""
    out, todo = [], [pid]
    while todo and len(out) < 256:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, t)) as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def tree_cpu(pid):
    """(user, system) seconds of pid with its reaped and live descendants."""
    u = s = 0.0
    for p in tree_pids(pid):
        try:
            pu, ps = proc_cpu(p)
        except OSError:
            continue
        u, s = u + pu, s + ps
    return u, s


def thread_ticks(pid):
    """{(pid, tid): utime+stime ticks} for every thread of pid and its
    live descendants, and the processes' totals under key (pid, 0)."""
    out = {}
    for p in tree_pids(pid):
        try:
            f = _stat_fields("/proc/%d/stat" % p)
            out[(p, 0)] = int(f[11]) + int(f[12])
            for t in os.listdir("/proc/%d/task" % p):
                f = _stat_fields("/proc/%d/task/%s/stat" % (p, t))
                out[(p, int(t))] = int(f[11]) + int(f[12])
        except OSError:
            continue
    return out


def sample_shares(a, b, dt):
    """From two thread_ticks() samples dt seconds apart: (process share,
    busiest thread's share), over what was alive at both."""
    if dt <= 0:
        return None, None
    proc = sum(b[k] - a[k] for k in b if k in a and k[1] == 0)
    threads = [b[k] - a[k] for k in b if k in a and k[1] != 0]
    return proc / CLK_TCK / dt, (max(threads) if threads else 0) / CLK_TCK / dt


def machine_cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = v[:7]
    return user + nice, system + irq + softirq, idle + iowait


def busy_pct(secs=0.5):
    """Share of the machine that something else uses while we run nothing."""
    m0 = machine_cpu()
    time.sleep(secs)
    m1 = machine_cpu()
    tot = sum(m1) - sum(m0) or 1
    return 100.0 * (tot - (m1[2] - m0[2])) / tot


def wait_quiet(max_busy, tries=6):
    """Wait (bounded) until others use at most max_busy % of the machine;
    returns (busy %, quiet?)."""
    busy = busy_pct()
    for _ in range(tries):
        if busy <= max_busy:
            return busy, True
        time.sleep(2)
        busy = busy_pct()
    return busy, busy <= max_busy


def pin(pid, cpus):
    """Move every thread of pid and of its live children to the CPU list
    (children forked later inherit it)."""
    for p in tree_pids(pid):
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(p)], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


SERVER_CPU = str(NCPU - 1)           # pinned apart: the server here...
CLIENT_PIN = ["taskset", "-c", "0"]  # ...and the client here


def thread_places(pid, counts=False):
    """{(pid, tid): (CPU it last ran on, voluntary, involuntary context
    switches, migrations)} for every thread of pid and its live
    descendants.  Only the CPU unless counts (the rest None): the cheap
    sample taken often.  Migrations come from /proc/.../sched, which
    kernels without CONFIG_SCHED_DEBUG lack (None)."""
    out = {}
    for p in tree_pids(pid):
        try:
            tids = os.listdir("/proc/%d/task" % p)
        except OSError:
            continue
        for t in tids:
            d = "/proc/%d/task/%s/" % (p, t)
            vol = invol = migr = None
            try:
                cpu = int(_stat_fields(d + "stat")[36])
                if counts:
                    with open(d + "status") as f:
                        for line in f:
                            if line.startswith("voluntary_ctxt_switches:"):
                                vol = int(line.split(":")[1])
                            elif line.startswith("nonvoluntary_ctxt_switches:"):
                                invol = int(line.split(":")[1])
                    try:
                        with open(d + "sched") as f:
                            for line in f:
                                if line.startswith("se.nr_migrations"):
                                    migr = int(line.split(":")[1])
                    except OSError:
                        pass
            except (OSError, IndexError, ValueError):
                continue
            out[(p, int(t))] = (cpu, vol, invol, migr)
    return out


def placement(places, srv_a, srv_b, cli_a, cli_b):
    """Where the busiest server thread and the busiest client thread ran,
    and what scheduling cost them, from periodic thread_places() samples
    [(server's, client's)] and each side's thread_ticks() before and after.
    Returns {"same_cpu": share of samples with both last on one CPU,
    "srv_cs", "client_cs": context switches (voluntary + involuntary) of
    that thread over the samples' span, "srv_invol", "client_invol": the
    involuntary ones (preempted while runnable), "srv_migr",
    "client_migr": its moves between CPUs}; None where unknown.  Callers
    divide the counts by the requests of the span."""
    out = dict.fromkeys(("same_cpu", "srv_cs", "client_cs", "srv_invol", "client_invol",
                         "srv_migr", "client_migr", "span_s"))

    def busiest(a, b):
        ks = [k for k in b if k[1] != 0 and k in a]
        return max(ks, key=lambda k: b[k] - a[k]) if ks else None
    ks, kc = busiest(srv_a or {}, srv_b or {}), busiest(cli_a or {}, cli_b or {})
    both = [(t, s[ks], c[kc]) for t, s, c in places if ks in s and kc in c]
    if ks is None or kc is None or len(both) < 2:
        return out
    out["same_cpu"] = sum(s[0] == c[0] for _, s, c in both) / len(both)
    (t0, s0, c0), (t1, s1, c1) = both[0], both[-1]
    out["span_s"] = t1 - t0

    def diff(i):
        return (None if None in (s0[i], s1[i]) else s1[i] - s0[i],
                None if None in (c0[i], c1[i]) else c1[i] - c0[i])
    (sv, cv), (si, ci) = diff(1), diff(2)
    if None not in (sv, si, cv, ci):
        out["srv_cs"], out["client_cs"] = sv + si, cv + ci
        out["srv_invol"], out["client_invol"] = si, ci
    out["srv_migr"], out["client_migr"] = diff(3)
    return out


def place_rates(r):
    """A run's placement() counts as rates: its same-CPU share, context
    switches and involuntary ones per request, migrations per second
    (keys same_cpu, srv_cs_req, client_cs_req, srv_invol_req,
    client_invol_req, srv_migr_s, client_migr_s; None where unknown).
    The requests of the sampled span are estimated from the run's rate."""
    pl = r.get("place") or {}
    span = pl.get("span_s")
    n = r["iops"] * span if span and r.get("iops") else None
    out = {"same_cpu": pl.get("same_cpu")}
    for side in ("srv", "client"):
        for key, per in (("cs", n), ("invol", n), ("migr", span)):
            v = pl.get("%s_%s" % (side, key))
            out["%s_%s_%s" % (side, key, "s" if key == "migr" else "req")] = \
                v / per if v is not None and per else None
    return out


PLACE_EVERY = 0.05      # seconds between placement samples


def run_sampled(argv, seconds, sample_pid=None, timeout=None):
    """Run a client; while it runs, sample sample_pid's threads at about a
    quarter and two thirds of its window, and in between, every
    PLACE_EVERY seconds, which CPU the server's and the client's threads
    last ran on (placement()).  Returns (stdout, shares, place) where
    shares is (process share, busiest thread share) or (None, None) and
    place is placement()'s dict."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=tempfile.gettempdir())
    shares = (None, None)
    place = placement([], None, None, None, None)
    if sample_pid is not None:
        start = time.monotonic()
        # Start-up (connect, fio's fork) is well under this allowance.
        first = start + min(0.3, seconds / 4) + seconds * 0.25
        second = start + min(0.3, seconds / 4) + seconds * 0.65
        while p.poll() is None and time.monotonic() < first:
            time.sleep(min(0.05, max(0.0, first - time.monotonic())))
        a = b = None
        places = []
        if p.poll() is None:
            a = (time.monotonic(), thread_ticks(sample_pid), thread_ticks(p.pid))
            while p.poll() is None:
                # The first and the last sample (at the second share sample)
                # also read the counts.
                last = time.monotonic() >= second
                counts = last or not places
                places.append((time.monotonic(), thread_places(sample_pid, counts),
                               thread_places(p.pid, counts)))
                if last:
                    break
                time.sleep(min(PLACE_EVERY, max(0.0, second - time.monotonic())))
            if p.poll() is None:
                b = (time.monotonic(), thread_ticks(sample_pid), thread_ticks(p.pid))
        if a and b:
            shares = sample_shares(a[1], b[1], b[0] - a[0])
            place = placement(places, a[1], b[1], a[2], b[2])
    try:
        out, err = p.communicate(timeout=timeout or seconds * 4 + 60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise RuntimeError("client did not finish: %s" % " ".join(argv))
    if p.returncode != 0:
        raise RuntimeError("client failed (%d): %s\n%s" % (p.returncode, " ".join(argv), err))
    return out, shares, place


def fio_argv(uri, rw, bs, iodepth, numjobs, seconds, size, extra=()):
    return ["fio", "--name=b", "--ioengine=nbd", "--uri=" + uri, "--rw=" + rw, "--bs=" + bs,
            "--iodepth=%d" % iodepth, "--numjobs=%d" % numjobs, "--size=" + size,
            "--time_based", "--runtime=%g" % seconds, "--group_reporting",
            "--output-format=json"] + list(extra)


def parse_fio(out):
    """fio's JSON (one group): rate, requests, latency and the client's own
    CPU over its window.  With group_reporting, usr_cpu and sys_cpu are
    per job on average and job_runtime is the jobs' sum, so their product
    is the CPU of all jobs together."""
    j = json.loads(out[out.index("{"):])["jobs"][0]
    io = j["read"] if j["read"]["io_bytes"] else j["write"]
    pct = io["clat_ns"].get("percentile", {})
    ios = io.get("total_ios", 0)
    window_s = io["runtime"] / 1000.0
    cpu_s = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * j.get("job_runtime",
                                                          j["elapsed"] * 1000) / 1000.0
    return {
        "iops": io["iops"], "mib_s": io["bw_bytes"] / 2**20, "bytes": io["io_bytes"],
        "requests": ios, "window_s": window_s,
        "client_cpu_s": cpu_s,
        "client_share": cpu_s / window_s if window_s else None,
        "client_us_req": cpu_s * 1e6 / ios if ios else None,
        "client_ctx": j.get("ctx", 0),
        "p50_us": pct.get("50.000000", 0) / 1000.0, "p99_us": pct.get("99.000000", 0) / 1000.0,
    }


def run_fio(uri, rw, bs, iodepth, numjobs, seconds, size, extra=(), wrap=(), sample_pid=None):
    """fio's nbd engine; wrap prefixes the command (taskset, perf stat)."""
    return run_parsed(list(wrap) + fio_argv(uri, rw, bs, iodepth, numjobs, seconds, size, extra),
                      parse_fio, seconds, sample_pid)


def run_parsed(argv, parse, seconds, sample_pid):
    """Run a client with the server sampled mid-run; its parsed result
    with the server's CPU shares and the placement added."""
    out, shares, place = run_sampled(argv, seconds, sample_pid)
    r = parse(out)
    r["srv_share_mid"], r["srv_thread_max"] = shares
    r["place"] = place
    return r


def blkperf_argv(blkperf, uri, test, bs, iodepth, conns, seconds, extra=()):
    return [blkperf, "--json", "--quiet", "-c", "-t", test, "-b", bs, "-q", str(iodepth),
            "-C", str(conns), "-l", "%g" % seconds] + list(extra) + [uri]


def parse_blkperf(out):
    d = json.loads(out)
    proc = d["cpu"]["local"]["process"] if d["cpu"]["local"] else None
    cpu_s = proc["user_s"] + proc["system_s"] if proc else None
    n = d["requests"]
    return {
        "iops": d["iops"], "mib_s": d["throughput_mib_s"], "bytes": d["bytes"], "requests": n,
        "window_s": d["elapsed_s"], "errors": d["errors"],
        "client_cpu_s": cpu_s,
        "client_share": cpu_s / d["elapsed_s"] if cpu_s is not None and d["elapsed_s"] else None,
        "client_us_req": cpu_s * 1e6 / n if cpu_s is not None and n else None,
        "p50_us": d["latency_us"]["p50"], "p99_us": d["latency_us"]["p99"],
    }


def run_blkperf(blkperf, uri, test, bs, iodepth, conns, seconds, extra=(), wrap=(),
                sample_pid=None):
    return run_parsed(list(wrap) + blkperf_argv(blkperf, uri, test, bs, iodepth, conns, seconds,
                                                extra),
                      parse_blkperf, seconds, sample_pid)


def scrape_requests(url, timeout=5):
    """blkd's own count of requests answered, from its /metrics: the sum
    of blkd_requests_total over the commands that carry I/O (a
    connection's NBD_CMD_DISC is not a request either client counts)."""
    body = urllib.request.urlopen(url, timeout=timeout).read().decode()
    n = 0
    for line in body.splitlines():
        if line.startswith("blkd_requests_total{") and 'cmd="disc"' not in line:
            n += int(float(line.split()[1]))
    return n


def count_agrees(client_n, server_n, in_flight):
    """Does the server's count over the client's run match the client's
    count over its window?  They differ by what crossed the window's
    edges: at most what was in flight, twice, plus 1% for the requests a
    client counts or drops around its own start-up and stop."""
    if client_n is None or server_n is None:
        return None
    return abs(server_n - client_n) <= 2 * in_flight + 0.01 * client_n


def bound(client_share, client_cap, srv_share, srv_cap, srv_thread_max):
    """Which side limited a run: "server" (saturated: its busiest thread
    or the process near its cap), "client" (the client near its cap while
    the server had headroom), "both" (unpinned and the machine full), or
    "-" (neither: latency, a rate limit, or the network)."""
    def full(share, cap):
        return share is not None and cap and share >= FULL * cap
    server_full = full(srv_share, srv_cap) or full(srv_thread_max, 1.0)
    client_full = full(client_share, client_cap)
    if server_full and client_full:
        return "both"
    if server_full:
        return "server"
    if client_full:
        return "client"
    return "-"


def bound_shared(client_share, srv_share):
    """bound() for a client and a server pinned to one CPU together: the
    CPU was the limit ("both") when their shares add up to a full one,
    else neither ("-"): each waited on the other."""
    if client_share is None or srv_share is None:
        return "-"
    return "both" if client_share + srv_share >= FULL else "-"


def ratio_cell(ratio, spread, cell_bound, base_bound, valid=True):
    """The × column: a bare ratio only where neither side was client-bound.
    A client-bound cell says so, with the ratio as the bound it gives:
    "≥" when the server under test could have gone faster with a faster
    client, "≤" when the baseline could have."""
    if not valid:
        return "invalid (counts disagree)"
    if ratio is None:
        return "–"
    r = "%.2f" % ratio + (" (%.2f–%.2f)" % spread if spread else "")
    if cell_bound == "client" and base_bound == "client":
        return "client-bound"
    if cell_bound == "client":
        return "client-bound: ≥ " + r
    if base_bound == "client":
        return "client-bound: ≤ " + r
    return r
