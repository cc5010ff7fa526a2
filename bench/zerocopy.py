#!/usr/bin/python3
"""Zero-copy rows (issue 17 item 1): blkd hosting `ram` (which lends its
chunks to READ replies and receives aligned WRITEs in place) against
nbdkit 1.32 with Debian's memory plugin, and blkd hosting Debian's memory
plugin (the copying path) for reference.

fio's nbd engine, one connection, prefilled data (reads move real bytes,
not holes): 256k sequential read QD16 and 256k sequential write QD16.
Servers alternate (A B C, C B A, ...) for ROUNDS rounds.  Per cell: MiB/s,
server user and system CPU µs per MiB from /proc/PID/stat around the run,
and the 1-minute load average before the cell; a cell that started with
the load average above --max-load is marked '*' (something else loaded
the machine: rerun it).  The table gives medians, ratios against nbdkit
and the user-CPU ratio the issue's target names (≤ 0.2× for reads).

Usage: bench/zerocopy.py [--rounds N] [--seconds S] [--max-load L] [--json FILE]
A short sanity run: bench/zerocopy.py --rounds 1 --seconds 2
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anchors  # noqa: E402  (Server, fio, prefill, proc_cpu, med)

WORKLOADS = [
    ("256k read QD16", dict(rw="read", bs="256k", iodepth=16, numjobs=1)),
    ("256k write QD16", dict(rw="write", bs="256k", iodepth=16, numjobs=1)),
]
BASELINE = "nbdkit memory"


def servers():
    d, B = anchors.DISK, anchors.BLKD
    return [
        ("nbdkit memory", lambda p, t: ["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(p),
                                        "memory", d]),
        ("blkd ram (lending)", lambda p, t: [B, "-f", "-i", "127.0.0.1", "-p", str(p), "ram", d]),
        ("blkd memory (copying)", lambda p, t: [B, "-f", "-i", "127.0.0.1", "-p", str(p),
                                                "memory", d]),
    ]


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cell(server, spec, seconds):
    load = loadavg()
    u0, s0 = anchors.proc_cpu(server.pid)
    r = anchors.fio(server.uri, spec["rw"], spec["bs"], spec["iodepth"], spec["numjobs"], seconds)
    u1, s1 = anchors.proc_cpu(server.pid)
    mib = r["bytes"] / 1048576.0 or 1
    return {"mib_s": r["mib_s"], "p99_us": r["p99_us"], "load1": load,
            "user_us_per_mib": (u1 - u0) * 1e6 / mib, "sys_us_per_mib": (s1 - s0) * 1e6 / mib}


def table(results, max_load):
    med = anchors.med
    out = ["| workload | server | MiB/s | × nbdkit | user µs/MiB | sys µs/MiB | "
           "CPU µs/MiB | user × nbdkit | CPU × nbdkit | load1 per cell |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for wl, by in results.items():
        b = by.get(BASELINE) or []
        bm, bu = med([r["mib_s"] for r in b]), med([r["user_us_per_mib"] for r in b])
        bc = med([r["user_us_per_mib"] + r["sys_us_per_mib"] for r in b])
        for name, rs in by.items():
            m = med([r["mib_s"] for r in rs])
            u = med([r["user_us_per_mib"] for r in rs])
            s = med([r["sys_us_per_mib"] for r in rs])
            loads = " ".join("%.1f%s" % (r["load1"], "*" if r["load1"] > max_load else "")
                             for r in rs)
            out.append("| %s | %s | %.0f | %s | %.0f | %.0f | %.0f | %s | %s | %s |" % (
                wl, name, m, "%.2f" % (m / bm) if bm else "–", u, s, u + s,
                "%.2f" % (u / bu) if bu else "–", "%.2f" % ((u + s) / bc) if bc else "–", loads))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--json")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="blkd-zc-bench.")
    running = []
    try:
        for name, fn in servers():
            try:
                running.append(anchors.Server(name, fn, tmp))
            except Exception as e:
                print("skipping %s: %s" % (name, e), file=sys.stderr)
        for s in running:
            anchors.prefill(s.uri)
        results = {wl: {s.name: [] for s in running} for wl, _ in WORKLOADS}
        for rnd in range(a.rounds):
            order = running if rnd % 2 == 0 else list(reversed(running))
            for wl, spec in WORKLOADS:
                for s in order:
                    r = cell(s, spec, a.seconds)
                    results[wl][s.name].append(r)
                    print("round %d  %-16s %-22s %8.1f MiB/s  user %5.0f sys %5.0f µs/MiB  "
                          "load1 %.2f%s" % (rnd + 1, wl, s.name, r["mib_s"], r["user_us_per_mib"],
                                            r["sys_us_per_mib"], r["load1"],
                                            "  (loaded: rerun)" if r["load1"] > a.max_load else ""),
                          file=sys.stderr, flush=True)
    finally:
        for s in running:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(results, a.max_load))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
