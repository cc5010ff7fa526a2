#!/usr/bin/python3
"""Zero-copy rows: blkd hosting `ram` (which lends its
chunks to READ replies and receives aligned WRITEs in place) against
nbdkit 1.32 with Debian's memory plugin, with blkd hosting Debian's memory
plugin (blkd's copying path) beside them for reference.

fio's nbd engine, one connection, prefilled data (reads move real bytes,
not holes): 256k sequential read QD16 and 256k sequential write QD16.
Cells are run by bench/anchors.py's machinery: servers alternate (A B C,
C B A, ...), each cell waits for a quiet machine and records the 1-minute
load average before it, and server CPU comes from /proc/PID/stat around
the run.  This script only picks the rows and prints what the zero-copy
targets name: MiB/s, server user and system CPU µs per MiB, and their
ratios against nbdkit (read target: user ≤ 0.2×, total ≤ 0.75×, MiB/s
≥ 1.3×; write target: MiB/s ≥ 1.1×, CPU ≤ 0.8×).  "*" marks a row with a
cell begun while the machine was not quiet: rerun it.

Usage: bench/zerocopy.py [--rounds N] [--seconds S] [--json FILE]
A short sanity run: bench/zerocopy.py --rounds 1 --seconds 2
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anchors  # noqa: E402

WORKLOADS = [(name, spec) for name, spec in anchors.WORKLOADS
             if name in ("256k read QD16", "256k write QD16")]
BASELINE = "nbdkit memory"


def servers(tmp):
    specs, img = anchors.target_servers(tmp)
    return [(n, fn) for n, fn in specs if n in (BASELINE, "blkd ram", "blkd memory")], img


def table(results):
    med = anchors.med
    out = ["| workload | server | MiB/s | × nbdkit | user µs/MiB | sys µs/MiB | CPU µs/MiB | "
           "user × nbdkit | CPU × nbdkit | load1 per cell |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for wl, by in results.items():
        b = by.get(BASELINE) or []
        bm = med([r["mib_s"] for r in b])
        bu = med([r["user_us_per_mib"] for r in b])
        bc = med([r["cpu_us_per_mib"] for r in b])
        for name, rs in by.items():
            if not rs:
                continue
            m = med([r["mib_s"] for r in rs])
            u = med([r["user_us_per_mib"] for r in rs])
            c = med([r["cpu_us_per_mib"] for r in rs])
            mark = "" if all(r.get("quiet", True) for r in rs) else " *"
            out.append("| %s%s | %s | %.0f | %s | %.0f | %.0f | %.0f | %s | %s | %s |" % (
                wl, mark, name, m, "%.2f" % (m / bm) if bm else "–", u, c - u, c,
                "%.2f" % (u / bu) if bu else "–", "%.2f" % (c / bc) if bc else "–",
                " ".join("%.1f" % r["load1"] for r in rs)))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    results = anchors.run_part("zerocopy", servers, WORKLOADS, a.rounds, a.seconds, ["fio"])["fio"]
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
