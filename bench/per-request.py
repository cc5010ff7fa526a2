#!/usr/bin/python3
"""Per-request costs of a server and of fio, the measures that hold up on a
loaded machine: syscalls, wake-ups (context switches), page faults and
mmaps per request, and CPU microseconds per request, for the server
process and for fio itself.  Rates are printed too, but only as a
direction: read them from alternating runs on a quiet machine.

Each SERVER is "nbdkit" or a path to a blkd build, optionally followed by
its options ("./blkd --poll-us 0").  The servers run in turn, the order
reversed on alternate rounds, each on a fresh process with the plugin
prefilled (reads measure data, not holes).  Counting uses perf's syscall
tracepoints (perf stat -p), so it needs perf and permission to trace.

With --client blkperf the load is blkperf pinned apart from the server
(server on the last CPU, blkperf on CPU 0), as the anchors' targets rows
run it, and blkperf's own CPU per request is shown where fio's is.

With --profile the server is also sampled (perf record -g, cpu-clock)
during each run, and a second table splits its CPU by part: user-space
memcpy (a plugin's copy, and blkd's of small WRITE payloads out of its
read buffer), the rest of the plugin, the server's own code (with its
event loop and clock reads), the kernel's send path (and within it the
wake-up of a sleeping client, the copy into the socket, and the
pacing timers BBR arms when a sender runs ahead of its rate), receives,
waits (epoll, futex) and the rest.  Shares of the server's samples; times
them by its CPU per request for microseconds.

Usage: bench/per-request.py [--rounds N] [--seconds S] [--plugin memory]
          [--rw write --bs 256k --iodepth 16] [--prefill-bs 1M]
          [--client fio|blkperf] [--profile] [--env VAR=VALUE] SERVER [SERVER ...]
Example: bench/per-request.py --rw write --bs 256k --iodepth 16 \\
          nbdkit ./blkd "./blkd --poll-us 0"
The 256 KiB WRITE row, pinned apart (make bench-write-counts):
         bench/per-request.py --client blkperf --rw write --bs 256k \\
          --iodepth 16 nbdkit ./blkd
Where a 4 KiB READ's server CPU goes (docs/ARCHITECTURE.md, "What a
small request costs"):
         bench/per-request.py --client blkperf --rw randread --bs 4k \\
          --iodepth 32 --profile nbdkit ./blkd
"""

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchors import BLKPERF, TOP, free_port, proc_cpu, wait_port  # noqa: E402
from benchlib import (CLIENT_PIN, NCPU, SERVER_CPU, blkperf_argv, parse_blkperf,  # noqa: E402
                      pin, proc_cpu_ns)

# fio's --rw as blkperf's test.
BLKPERF_TEST = {"read": "STREAM_READ", "write": "STREAM_WRITE", "randread": "RAND_READ",
                "randwrite": "RAND_WRITE"}

SYSCALLS = ["read", "readv", "recvfrom", "recvmsg", "write", "writev", "sendto", "sendmsg",
            "epoll_wait", "poll", "ppoll", "futex", "setsockopt", "mmap", "munmap", "madvise"]
EVENTS = ["syscalls:sys_enter_" + s for s in SYSCALLS] + [
    "context-switches", "cpu-migrations", "page-faults", "timer:hrtimer_start"]


def perf_counts(path):
    out = {}
    with open(path) as f:
        for line in f:
            v = line.strip().split(",")
            if len(v) > 2 and v[0] and v[0][0].isdigit():
                out[re.sub(r"^(syscalls:sys_enter_|timer:)", "", v[2])] = float(v[0])
    return out


def per_request(iops, n, srv_ns, srv_user_s, client_us, sp, fp):
    """One run's result: the server's CPU (its CPU clock, exact; the user
    share from ticks) and both sides' perf counts per request (the
    client's under "fio" whichever client ran)."""
    s, f = perf_counts(sp), perf_counts(fp)
    return {
        "iops": iops, "n": n,
        "srv_cpu_us": srv_ns / 1e3 / n,
        "srv_user_us": srv_user_s * 1e6 / n,
        "fio_cpu_us": client_us,
        "srv": {k: v / n for k, v in s.items()},
        "fio": {k: v / n for k, v in f.items()},
    }


# --profile: the parts of the server's CPU, from its perf samples.
PARTS = ["memcpy", "plugin", "server code", "send", "  wake client", "  copy to socket",
         "  pacing timers", "receive", "wait", "other"]


def perf_report(path, args):
    return subprocess.run(["perf", "report", "-i", path, "--stdio", "-g", "none"] + args,
                          capture_output=True, text=True).stdout


def pacing_share(path):
    """Percent of the samples spent on TCP's pacing timers (BBR): arming
    one in tcp_write_xmit (a tail call to hrtimer_start, so the sample
    lands on the interrupt-enabling unlock with tcp_write_xmit as its
    caller) and the timer interrupts, whose expiry sends what the pacing
    held back.  The timer interrupt also carries the scheduler tick, a
    small share (what is left with a congestion control that does not
    pace)."""
    out = subprocess.run(["perf", "script", "-i", path, "-F", "ip,sym"],
                         capture_output=True, text=True).stdout
    total = pacing = 0
    for block in out.split("\n\n"):
        frames = [line.split()[-1] for line in block.strip().splitlines() if line.strip()]
        if not frames:
            continue
        total += 1
        if (frames[:2] == ["_raw_spin_unlock_irqrestore", "tcp_write_xmit"]
                or "asm_sysvec_apic_timer_interrupt" in frames):
            pacing += 1
    return 100.0 * pacing / total if total else 0.0


def profile_split(path):
    """Shares (percent) of the server's samples by part."""
    total = {}          # symbol -> children share (the symbol and what it calls)
    for line in perf_report(path, ["--children", "--sort", "sym"]).splitlines():
        m = re.match(r"\s+([\d.]+)%\s+([\d.]+)%\s+\[.\]\s+(\S+)", line)
        if m:
            total[m.group(3)] = (float(m.group(1)), float(m.group(2)))
    dso, memcpy = {}, 0.0
    for line in perf_report(path, ["--no-children", "--sort", "dso,sym"]).splitlines():
        m = re.match(r"\s+([\d.]+)%\s+(\S+)\s+\[.\]\s+(\S+)", line)
        if not m:
            continue
        share, d, sym = float(m.group(1)), m.group(2), m.group(3)
        if d.startswith("libc") and re.match(r"__mem(move|cpy)", sym):
            memcpy += share
        else:
            dso[d] = dso.get(d, 0.0) + share

    def ch(*syms):
        return sum(total.get(k, (0, 0))[0] for k in syms)
    out = {
        "memcpy": memcpy,
        "plugin": sum(v for k, v in dso.items() if "plugin" in k or "filter" in k),
        "server code": sum(v for k, v in dso.items()
                           if k.startswith("blkd") or k == "nbdkit" or "libevent" in k
                           or k == "[vdso]"),
        "send": ch("__sys_sendmsg", "__sys_sendto", "do_writev", "__x64_sys_sendfile64"),
        "  wake client": ch("sock_def_readable"),
        "  copy to socket": total.get("_copy_from_iter", (0, 0))[1],
        "  pacing timers": pacing_share(path),
        "receive": ch("ksys_read", "do_readv", "__sys_recvfrom", "__sys_recvmsg"),
        "wait": ch("do_epoll_wait", "do_futex"),
    }
    out["other"] = 100.0 - sum(v for k, v in out.items() if not k.startswith(" "))
    return out


def run_one(spec, a, tmp):
    argv = shlex.split(spec)
    port = free_port()
    if argv[0] == "nbdkit":
        # blkd's own plugins (ram, rawio) load into nbdkit by path.
        own = os.path.join(TOP, "plugins", a.plugin, "nbdkit-%s-plugin.so" % a.plugin)
        cmd = ["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(port)] + argv[1:] + \
            [own if os.path.exists(own) else a.plugin, a.size]
    else:
        cmd = [os.path.abspath(argv[0]), "-f", "-i", "127.0.0.1", "-p", str(port)] + \
            argv[1:] + [a.plugin, a.size]
    env = dict(os.environ)
    for e in a.env:
        k, v = e.split("=", 1)
        env[k] = v
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           stdin=subprocess.DEVNULL, env=env)
    try:
        wait_port(port, srv)
        uri = "nbd://127.0.0.1:%d/" % port
        fio_base = ["fio", "--ioengine=nbd", "--uri=" + uri, "--size=" + a.size]
        subprocess.run(fio_base + ["--name=fill", "--rw=write", "--bs=" + a.prefill_bs,
                                   "--iodepth=8", "--output=/dev/null"], check=True,
                       cwd=tmp, stderr=subprocess.DEVNULL)
        sp, fp = os.path.join(tmp, "srv.perf"), os.path.join(tmp, "fio.perf")
        u0, s0 = proc_cpu(srv.pid)
        n0 = proc_cpu_ns(srv.pid)
        perf = subprocess.Popen(["perf", "stat", "-x,", "-e", ",".join(EVENTS), "-p",
                                 str(srv.pid), "-o", sp])
        rec = None
        if a.profile:
            rec_path = os.path.join(tmp, "srv.data")
            rec = subprocess.Popen(["perf", "record", "-q", "-g", "-F", "999", "-p",
                                    str(srv.pid), "-o", rec_path],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.2)
        if a.client == "blkperf":
            r = run_blkperf_counted(a, srv, uri, sp, fp, perf, u0, n0)
            if rec:
                rec.send_signal(signal.SIGINT)
                rec.wait(30)
                r["split"] = profile_split(rec_path)
            return r
        out = subprocess.run(["perf", "stat", "-x,", "-e", ",".join(EVENTS), "-o", fp] +
                             fio_base + ["--name=b", "--rw=" + a.rw, "--bs=" + a.bs,
                                         "--iodepth=%d" % a.iodepth, "--time_based",
                                         "--runtime=%g" % a.seconds, "--output-format=json"],
                             capture_output=True, text=True, cwd=tmp)
        u1, s1 = proc_cpu(srv.pid)
        n1 = proc_cpu_ns(srv.pid)
        perf.send_signal(signal.SIGINT)
        perf.wait(10)
        if rec:
            rec.send_signal(signal.SIGINT)
            rec.wait(30)
        if out.returncode != 0:
            raise RuntimeError("fio failed: %s" % out.stderr)
        j = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
        io = j["read"] if j["read"]["io_bytes"] else j["write"]
        n = io["total_ios"] or 1
        r = per_request(io["iops"], n, n1 - n0, u1 - u0,
                        (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * j["job_runtime"] * 1e3 / n,
                        sp, fp)
        if rec:
            r["split"] = profile_split(rec_path)
        return r
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(15)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def run_blkperf_counted(a, srv, uri, sp, fp, perf, u0, n0):
    """One blkperf run pinned apart from the server (the server on the
    last CPU for the run), counted like fio's."""
    if a.rw not in BLKPERF_TEST:
        raise SystemExit("--client blkperf: --rw must be one of %s" % ", ".join(BLKPERF_TEST))
    pinned = NCPU > 1
    if pinned:
        pin(srv.pid, SERVER_CPU)
    try:
        out = subprocess.run(["perf", "stat", "-x,", "-e", ",".join(EVENTS), "-o", fp] +
                             (CLIENT_PIN if pinned else []) +
                             blkperf_argv(BLKPERF, uri, BLKPERF_TEST[a.rw], a.bs, a.iodepth, 1,
                                          a.seconds),
                             capture_output=True, text=True)
        u1, _ = proc_cpu(srv.pid)
        n1 = proc_cpu_ns(srv.pid)
    finally:
        if pinned:
            pin(srv.pid, "0-%d" % (NCPU - 1))
    perf.send_signal(signal.SIGINT)
    perf.wait(10)
    if out.returncode != 0:
        raise RuntimeError("blkperf failed: %s" % out.stderr)
    r = parse_blkperf(out.stdout)
    return per_request(r["iops"], r["requests"] or 1, n1 - n0, u1 - u0,
                       r["client_us_req"] or 0, sp, fp)


def fmt(d, keys):
    return " ".join("%s %.2f" % (k, d.get(k, 0)) for k in keys if d.get(k, 0) >= 0.005)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--plugin", default="memory")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--rw", default="write")
    ap.add_argument("--bs", default="256k")
    ap.add_argument("--iodepth", type=int, default=16)
    ap.add_argument("--prefill-bs", default="1M")
    ap.add_argument("--env", action="append", default=[], help="VAR=VALUE for the servers")
    ap.add_argument("--client", choices=["fio", "blkperf"], default="fio",
                    help="the load: fio (unpinned), or blkperf pinned apart from the server")
    ap.add_argument("--profile", action="store_true",
                    help="also sample the server (perf record) and split its CPU by part")
    ap.add_argument("servers", nargs="+")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="blkd-per-request.")
    res = {s: [] for s in a.servers}
    for rnd in range(a.rounds):
        order = a.servers if rnd % 2 == 0 else list(reversed(a.servers))
        for s in order:
            r = run_one(s, a, tmp)
            res[s].append(r)
            print("round %d %-30s %8.0f IOPS  server %6.1f us/req (user %5.1f)  fio %6.1f us/req"
                  % (rnd + 1, s, r["iops"], r["srv_cpu_us"], r["srv_user_us"], r["fio_cpu_us"]),
                  file=sys.stderr, flush=True)
    pinned = " (blkperf pinned apart)" if a.client == "blkperf" else " (fio)"
    print("%s %s QD%d%s, plugin %s, %d rounds of %gs, medians per request; load average %.2f"
          % (a.rw, a.bs, a.iodepth, pinned, a.plugin, a.rounds, a.seconds, os.getloadavg()[0]))
    print()
    print("| server | IOPS (direction only) | server CPU µs (user) | %s CPU µs | "
          "server syscalls, wake-ups, faults | %s syscalls, wake-ups |" % (a.client, a.client))
    print("|---|---|---|---|---|---|")
    for s, rs in res.items():
        def m(key, sub=None):
            return statistics.median([(r[sub].get(key, 0) if sub else r[key]) for r in rs])
        keys = SYSCALLS + ["context-switches", "cpu-migrations", "page-faults", "hrtimer_start"]
        srv = {k: m(k, "srv") for k in keys}
        fio = {k: m(k, "fio") for k in keys}
        print("| %s | %.0f | %.1f (%.1f) | %.1f | %s | %s |" % (
            s, m("iops"), m("srv_cpu_us"), m("srv_user_us"), m("fio_cpu_us"),
            fmt(srv, keys), fmt(fio, keys)))
    if not a.profile:
        return
    print()
    print("Where the server's CPU goes (share of its samples, median; in brackets µs: the share "
          "times its CPU per request)")
    print()
    print("| server | " + " | ".join(p.strip() for p in PARTS) + " |")
    print("|---|" + "---|" * len(PARTS))
    for s, rs in res.items():
        us = statistics.median(r["srv_cpu_us"] for r in rs)
        cells = []
        for p in PARTS:
            v = statistics.median(r["split"][p] for r in rs)
            cells.append("%.0f%% (%.2f)" % (v, v * us / 100))
        print("| %s | %s |" % (s, " | ".join(cells)))


if __name__ == "__main__":
    main()
