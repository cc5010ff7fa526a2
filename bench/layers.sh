#!/usr/bin/env bash
# What the layer stack costs per request.  Two experiments, each
# a set of cells run in alternating order round after round:
#
#  1. No filter: the server before the layer stack (A: $BASE, default the
#     `main` branch, built here from `git archive`) against this tree (B),
#     both serving `memory size=1G` with no --filter and no --cache.  B/A
#     near 1.000 within the spread is "the request path costs nothing extra".
#  2. One pass-through layer: `--filter=nofilter` and no filter, under blkd
#     and under nbdkit.  The cost of the layer per request is
#     1/IOPS(nofilter) - 1/IOPS(plain) for each server, in microseconds.
#
# Loads: RR (one request in flight: per-request latency is all there is)
# and RAND_READ 4k at QD32 over 2 connections.  Every cell records the
# 1-minute load average when it started, so a noisy round can be seen and
# discarded: run it on a quiet machine.  Raw JSON lands in $OUT.
#   ROUNDS=5 LEN=5 BASE=main bench/layers.sh     (defaults shown)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
: "${ROUNDS:=5}" "${LEN:=5}" "${BASE:=main}" "${OUT:=$top/build/bench}"
: "${BLKD:=$top/blkd}" "${BLKPERF:=$top/blkperf}" "${NBDKIT:=$(command -v nbdkit || true)}"
mkdir -p "$OUT"
[ -x "$BLKD" ] && [ -x "$BLKPERF" ] || { echo "build blkd and blkperf first (make)" >&2; exit 1; }
[ -n "$NBDKIT" ] || { echo "nbdkit is not installed" >&2; exit 1; }

# The "before" binary: $BLKD_BASE if given, else $BASE built in a scratch tree.
if [ -z "${BLKD_BASE:-}" ]; then
  base_dir=$OUT/base-$BASE
  rm -rf "$base_dir"
  mkdir -p "$base_dir"
  git -C "$top" archive "$BASE" | tar -x -C "$base_dir"
  make -C "$base_dir" -j2 blkd >"$OUT/base-build.log" 2>&1 \
    || { echo "building $BASE failed: see $OUT/base-build.log" >&2; exit 1; }
  BLKD_BASE=$base_dir/blkd
fi

TOP=$top ROUNDS=$ROUNDS LEN=$LEN OUT=$OUT BLKD=$BLKD BLKD_BASE=$BLKD_BASE BLKPERF=$BLKPERF \
NBDKIT=$NBDKIT /usr/bin/python3 - <<'EOF'
import json, os, statistics, subprocess, sys, time

env = os.environ
sys.path.insert(0, os.path.join(env["TOP"], "bench"))
from benchlib import free_port, wait_port  # noqa: E402
rounds, length = int(env["ROUNDS"]), env["LEN"]
PLUGIN = ["memory", "size=1G"]
# Both loads read written data: on an unwritten disk blkd answers with
# hole chunks where nbdkit's memory plugin sends zeroes, another path.
LOADS = {"RR 4k QD1": ["-t", "RR", "-b", "4k", "--prefill", "--span", "256M"],
         "RAND_READ 4k 2x QD32": ["-t", "RAND_READ", "-b", "4k", "-C", "2", "-q", "32",
                                  "--prefill", "--span", "256M"]}
CELLS = {
    "base": [env["BLKD_BASE"]],
    "blkd": [env["BLKD"]],
    "blkd+nofilter": [env["BLKD"], "--filter=nofilter"],
    "nbdkit": [env["NBDKIT"]],
    "nbdkit+nofilter": [env["NBDKIT"], "--filter=nofilter"],
}


def run_cell(cmd, load):
    p = free_port()
    proc = subprocess.Popen(cmd[:1] + ["-f", "-i", "127.0.0.1", "-p", str(p)] + cmd[1:] + PLUGIN,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(p, proc)
        with open("/proc/loadavg") as f:
            load1 = float(f.read().split()[0])
        out = subprocess.run([env["BLKPERF"], "--json", "--quiet", "-l", length] + load
                             + ["nbd://127.0.0.1:%d" % p], check=True, capture_output=True,
                             text=True).stdout
    finally:
        proc.terminate()
        proc.wait()
    d = json.loads(out)
    return {"iops": d["iops"], "p50_us": d["latency_us"]["p50"], "load1": load1}


results = {l: {c: [] for c in CELLS} for l in LOADS}
names = list(CELLS)
for r in range(rounds):
    order = names[r % len(names):] + names[:r % len(names)]   # rotate: order effects cancel
    for load, args in LOADS.items():
        for c in order:
            res = run_cell(CELLS[c], args)
            results[load][c].append(res)
            print("  round %d %s %s: %.0f IOPS (load %.2f)" % (r + 1, load, c, res["iops"],
                                                              res["load1"]), file=sys.stderr)

stamp = time.strftime("%Y%m%dT%H%M%S")
with open(os.path.join(env["OUT"], "layers-%s.json" % stamp), "w") as f:
    json.dump({"rounds": rounds, "length_s": length, "plugin": PLUGIN, "loads": LOADS,
               "cells": CELLS, "results": results}, f, indent=1)


def med(load, cell, key="iops"):
    return statistics.median(x[key] for x in results[load][cell])


def ratio(load, a, b):
    rs = [y["iops"] / x["iops"] for x, y in zip(results[load][a], results[load][b])]
    return statistics.median(rs), min(rs), max(rs)


print("| load | cell | IOPS (median) | p50 us | 1-min load (median, max) |")
print("|---|---|---|---|---|")
for load in LOADS:
    for c in CELLS:
        loads = [x["load1"] for x in results[load][c]]
        print("| %s | %s | %.0f | %.0f | %.2f, %.2f |" % (
            load, c, med(load, c), med(load, c, "p50_us"), statistics.median(loads), max(loads)))
print()
print("| load | comparison | B/A median | spread |")
print("|---|---|---|---|")
for load in LOADS:
    for a, b, what in (("base", "blkd", "no filter: before (A) vs layer stack (B)"),
                       ("blkd", "blkd+nofilter", "blkd: plain (A) vs nofilter (B)"),
                       ("nbdkit", "nbdkit+nofilter", "nbdkit: plain (A) vs nofilter (B)"),
                       ("nbdkit+nofilter", "blkd+nofilter", "nofilter: nbdkit (A) vs blkd (B)")):
        m, lo, hi = ratio(load, a, b)
        print("| %s | %s | %.3f | %.3f..%.3f |" % (load, what, m, lo, hi))
print()
print("| load | server | nofilter layer cost, us per request (1/IOPS difference) |")
print("|---|---|---|")
for load in LOADS:
    conns = 2 * 32 if "QD32" in load else 1          # requests in flight
    for srv in ("blkd", "nbdkit"):
        cost = conns * 1e6 * (1 / med(load, srv + "+nofilter") - 1 / med(load, srv))
        print("| %s | %s | %.2f |" % (load, srv, cost))
EOF
