#!/usr/bin/env bash
# Is blkperf ever the bottleneck?  blkperf against fio's nbd engine on the
# same target in the same run: rounds alternate the two tools (the order
# flips every round) on nbdkit null, nbdkit memory (8G, never written: its
# reads are of holes, which nbdkit still sends as data), nbdkit memory
# prefilled (memfill: 1G written once, untimed, so reads copy real pages)
# and blkd (serving nbdkit's null plugin, holes sent as data), for
# STREAM_READ 256k QD16 and RAND_READ 4k QD32.
# Per cell it keeps each tool's rate, its client CPU per request (blkperf:
# getrusage over the window, -c; fio: the job's usr_cpu+sys_cpu over its
# runtime), the server's CPU per request while that tool ran (the server
# process's utime+stime from /proc, so what the client costs the server
# shows next to what it costs itself) and the 1-minute load average when
# the cell started; with COUNT=1 it also counts each tool's syscalls and
# context switches per request with perf stat, and the server's context
# switches and futex calls per request under each tool (the counting
# slows everything, so COUNT=1 rows are for the counts, not the rates).
# It prints one markdown row per cell: medians, the per-round
# blkperf/fio ratio's median and min..max, and the median load.  Raw
# results go to $OUT as JSON.
# Every fresh server first gets WARM seconds (default 2) of the cell's load
# from fio, untimed: a fresh nbdkit is slower for its first seconds, and
# without the warm-up whichever tool went first lost 20-40% at 256k.
# Use an even ROUNDS, so each tool goes first equally often.
# BLKPERF_ARGS adds options to every blkperf run (e.g. "--wake-replies 4").
# Each tool's CPU share (its CPU seconds per second of its run) and the
# server's while it ran say which side was the limit: a side near 1.00 is
# saturated (a single-threaded client can use one CPU, no more).  PIN=1
# puts the server on the last CPU and the clients on CPU 0, so the server
# can never use more than one CPU either and the two never share one: then
# a server near 1.00 is the limit, whatever the client.
# The runs and the CPU accounting are bench/benchlib.py's, shared with
# bench/anchors.py (make bench-anchors).
#   ROUNDS=4 LEN=5 WARM=2 TARGETS="null memory memfill blkd" COUNT=0 PIN=0 bench/blkperf-vs-fio.sh [OUTDIR]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
: "${ROUNDS:=4}" "${LEN:=5}" "${WARM:=2}" "${TARGETS:=null memory memfill blkd}" "${COUNT:=0}"
: "${PIN:=0}"
: "${BLKD:=$top/blkd}" "${BLKPERF:=$top/blkperf}"
OUT=${1:-$top/build/bench}
mkdir -p "$OUT"
for t in nbdkit fio; do
  command -v $t >/dev/null || { echo "$t is not installed (make deps)" >&2; exit 1; }
done
[ -x "$BLKPERF" ] || { echo "build blkperf first (make blkperf)" >&2; exit 1; }
if [ "$PIN" = 1 ] && [ "$(nproc)" -lt 2 ]; then
  echo "PIN=1 needs two CPUs or more" >&2; exit 1
fi
if [ "$COUNT" = 1 ] && ! command -v perf >/dev/null; then
  echo "COUNT=1 needs perf (Debian: linux-perf)" >&2; exit 1
fi

BLKPERF_ARGS=${BLKPERF_ARGS:-} TOP=$top ROUNDS=$ROUNDS LEN=$LEN WARM=$WARM TARGETS=$TARGETS COUNT=$COUNT PIN=$PIN BLKD=$BLKD BLKPERF=$BLKPERF OUT=$OUT \
/usr/bin/python3 - <<'EOF'
import json, os, statistics, subprocess, sys, tempfile, time

env = os.environ
sys.path.insert(0, os.path.join(env["TOP"], "bench"))
import benchlib  # noqa: E402
from benchlib import free_port, wait_port  # noqa: E402
rounds, length, count = int(env["ROUNDS"]), env["LEN"], env["COUNT"] == "1"
warm = int(env["WARM"])
pin = env["PIN"] == "1"
# Pinned: the server on the last CPU, every client on CPU 0.
SERVER_PIN = ["taskset", "-c", benchlib.SERVER_CPU] if pin else []
CLIENT_PIN = benchlib.CLIENT_PIN if pin else []
null_so = subprocess.run(["nbdkit", "--dump-config"], capture_output=True, text=True,
                         check=True).stdout
plugindir = [l.split("=", 1)[1] for l in null_so.splitlines() if l.startswith("plugindir=")][0]
SIZE = "8G"
TARGETS = {
    "null": ["nbdkit", "-f", "-i", "127.0.0.1", "-p", "{port}", "null", SIZE],
    "memory": ["nbdkit", "-f", "-i", "127.0.0.1", "-p", "{port}", "memory", SIZE],
    # 1G, not 8G: prefilled, it holds its size in RAM.
    "memfill": ["nbdkit", "-f", "-i", "127.0.0.1", "-p", "{port}", "memory", "1G"],
    # Holes off: blkd would otherwise answer the null plugin's reads with
    # OFFSET_HOLE chunks, and no data would cross the socket.
    "blkd": [env["BLKD"], "-f", "-i", "127.0.0.1", "-p", "{port}", "--sparse-reads", "no",
             os.path.join(plugindir, "nbdkit-null-plugin.so"), "size=" + SIZE],
}
TSIZE = {"memfill": "1G"}  # the export size fio is told, where not SIZE
LOADS = [  # name, blkperf test, fio rw, block size, depth, metric
    ("STREAM_READ 256k QD16", "STREAM_READ", "read", "256k", 16, "mib_s"),
    ("RAND_READ 4k QD32", "RAND_READ", "randread", "4k", 32, "iops"),
]


def start(target):
    port = free_port()
    argv = SERVER_PIN + [a.replace("{port}", str(port)) for a in TARGETS[target]]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
    except RuntimeError:
        proc.kill()
        raise
    uri = "nbd://127.0.0.1:%d" % port
    if target == "memfill":
        # Every page written once, untimed: reads then copy allocated pages.
        subprocess.run(CLIENT_PIN + [env["BLKPERF"], "--quiet", "-t", "STREAM_WRITE", "-b", "1M", "-q", "8",
                        "-n", "1024", uri], check=True, stdout=subprocess.DEVNULL)
    return proc, uri


def proc_cpu_s(pid):
    """utime+stime of a whole process, exited threads included."""
    return sum(benchlib.proc_cpu(pid))


def srv_count_start(pid, statfile):
    if not count:
        return None
    return subprocess.Popen(["perf", "stat", "-x", ",", "-o", statfile, "-p", str(pid), "-e",
                             "context-switches,syscalls:sys_enter_futex"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def srv_count_stop(p, statfile):
    if p is None:
        return {}
    p.send_signal(2)
    p.wait()
    return perf_counts(statfile, lambda ev: "srv_futex" if "futex" in ev else "srv_cswitch")


def perf_wrap(argv, statfile):
    if not count:
        return CLIENT_PIN + argv
    return ["perf", "stat", "-x", ",", "-o", statfile, "-e",
            "raw_syscalls:sys_enter,context-switches"] + CLIENT_PIN + argv


def perf_counts(statfile, key=lambda ev: "syscalls" if "sys_enter" in ev else "cswitch"):
    """perf stat -x , output: {key(event name): count}."""
    got = {}
    for line in open(statfile):
        f = line.strip().split(",")
        if len(f) > 2 and f[0].replace(".", "").isdigit():
            got[key(f[2])] = float(f[0])
    return got


def run_blkperf(uri, load, statfile, target):
    _, test, _, bs, qd, _ = load
    r = benchlib.run_blkperf(env["BLKPERF"], uri, test, bs, qd, 1, float(length),
                             env["BLKPERF_ARGS"].split(), perf_wrap([], statfile))
    return {"iops": r["iops"], "mib_s": r["mib_s"], "requests": r["requests"],
            "cpu_us_req": r["client_us_req"], "cpu_share": r["client_share"]}


def run_fio(uri, load, statfile, target, seconds=None):
    _, _, rw, bs, qd, _ = load
    size = TSIZE.get(target, SIZE)
    if seconds:                      # the untimed warm-up
        benchlib.run_fio(uri, rw, bs, qd, 1, seconds, size, wrap=CLIENT_PIN)
        return None
    r = benchlib.run_fio(uri, rw, bs, qd, 1, float(length), size,
                         wrap=perf_wrap([], statfile))
    return {"iops": r["iops"], "mib_s": r["mib_s"], "requests": r["requests"],
            "cpu_us_req": r["client_us_req"], "cpu_share": r["client_share"]}


results = []
statfile = tempfile.mktemp(prefix="blkperf-vs-fio.")
srvstat = statfile + ".srv"
for r in range(rounds):
    for target in env["TARGETS"].split():
        for load in LOADS:
            proc, uri = start(target)
            try:
                load1 = float(open("/proc/loadavg").read().split()[0])
                cell = {"round": r + 1, "target": target, "load": load[0], "loadavg_1m": load1}
                # A fresh nbdkit runs its first seconds slower (the tool
                # that went first lost 20-40% at 256k, whichever it was):
                # warm every server with the load, untimed, so the order
                # of the two tools does not decide the ratio.
                if warm > 0:
                    run_fio(uri, load, statfile, target, seconds=warm)
                order = ["blkperf", "fio"] if r % 2 == 0 else ["fio", "blkperf"]
                for tool in order:
                    # The server's CPU over the whole client run, start-up
                    # and the probe connection included (a few ms).
                    sc, s0 = srv_count_start(proc.pid, srvstat), proc_cpu_s(proc.pid)
                    t0 = time.monotonic()
                    res = (run_blkperf if tool == "blkperf" else run_fio)(uri, load, statfile,
                                                                         target)
                    srv_s = proc_cpu_s(proc.pid) - s0
                    res["srv_cpu_us_req"] = srv_s * 1e6 / res["requests"]
                    # Over the client's whole run, connecting included: a
                    # little low, the same way for both tools.
                    res["srv_share"] = srv_s / (time.monotonic() - t0)
                    for k, v in srv_count_stop(sc, srvstat).items():
                        res[k + "_req"] = v / res["requests"]
                    if count:
                        c = perf_counts(statfile)
                        # Per request, counting the whole process: start-up
                        # and the probe connection are a few hundred calls.
                        res["syscalls_req"] = c.get("syscalls", 0) / res["requests"]
                        res["cswitch_req"] = c.get("cswitch", 0) / res["requests"]
                    cell[tool] = res
            finally:
                proc.terminate()
                proc.wait()
            m = load[5]
            print("  round %d %s %s: blkperf %.0f fio %.0f %s (x%.3f), load %.1f" % (
                r + 1, target, load[0], cell["blkperf"][m], cell["fio"][m],
                "MiB/s" if m == "mib_s" else "IOPS", cell["blkperf"][m] / cell["fio"][m], load1),
                file=sys.stderr)
            results.append(cell)
for f in (statfile, srvstat):
    if os.path.exists(f):
        os.unlink(f)

stamp = time.strftime("%Y%m%dT%H%M%S")
with open(os.path.join(env["OUT"], "blkperf-vs-fio-%s.json" % stamp), "w") as f:
    json.dump({"rounds": rounds, "length_s": length, "warm_s": warm, "count": count, "pin": pin,
               "blkperf_args": env["BLKPERF_ARGS"], "results": results}, f,
              indent=1)

med = statistics.median
hdr = ("| target | load | fio | blkperf | blkperf/fio median | min..max | fio CPU us/req"
       " | blkperf CPU us/req | server CPU us/req under fio | under blkperf"
       " | fio CPU share | blkperf CPU share | server CPU share under fio | under blkperf |")
if count:
    hdr += (" fio syscalls/req | blkperf syscalls/req | fio cswitch/req | blkperf cswitch/req"
            " | server cswitch/req under fio | under blkperf"
            " | server futex/req under fio | under blkperf |")
hdr += " load avg 1m median (min..max) |"
print(hdr)
print("|" + "---|" * (hdr.count("|") - 1))
for target in env["TARGETS"].split():
    for load in LOADS:
        cells = [c for c in results if c["target"] == target and c["load"] == load[0]]
        m = load[5]
        unit = " MiB/s" if m == "mib_s" else " IOPS"
        ratios = [c["blkperf"][m] / c["fio"][m] for c in cells if c["fio"][m]]

        def mv(tool, key, fmt):
            v = [c[tool][key] for c in cells if c[tool].get(key) is not None]
            return fmt % med(v) if v else "n/a"

        loads = [c["loadavg_1m"] for c in cells]
        row = "| %s | %s | %s | %s | %.3f | %.3f..%.3f | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            target, load[0], mv("fio", m, "%.0f") + unit, mv("blkperf", m, "%.0f") + unit,
            med(ratios), min(ratios), max(ratios),
            mv("fio", "cpu_us_req", "%.1f"), mv("blkperf", "cpu_us_req", "%.1f"),
            mv("fio", "srv_cpu_us_req", "%.1f"), mv("blkperf", "srv_cpu_us_req", "%.1f"),
            mv("fio", "cpu_share", "%.2f"), mv("blkperf", "cpu_share", "%.2f"),
            mv("fio", "srv_share", "%.2f"), mv("blkperf", "srv_share", "%.2f"))
        if count:
            row += " %s | %s | %s | %s | %s | %s | %s | %s |" % (
                mv("fio", "syscalls_req", "%.2f"), mv("blkperf", "syscalls_req", "%.2f"),
                mv("fio", "cswitch_req", "%.2f"), mv("blkperf", "cswitch_req", "%.2f"),
                mv("fio", "srv_cswitch_req", "%.2f"), mv("blkperf", "srv_cswitch_req", "%.2f"),
                mv("fio", "srv_futex_req", "%.2f"), mv("blkperf", "srv_futex_req", "%.2f"))
        row += " %.1f (%.1f..%.1f) |" % (med(loads), min(loads), max(loads))
        print(row)
EOF
