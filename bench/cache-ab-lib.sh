# A/B driver shared by bench/cache-*.sh and bench/delayacct.sh.  Source it,
# then call:
#
#   ab_run NAME "A's blkd options" "B's blkd options" "plugin and args" \
#          "blkperf test options"
#
# Each of $ROUNDS rounds starts fresh A and B servers (same plugin, options
# differing only in the switch under test) and runs one `blkperf compare`
# of $ITER iterations of $LEN seconds each, alternating A B, B A; odd rounds
# give B first so order effects cancel.  Per round it keeps each side's
# IOPS, server CPU per request (blkd's own counters via -M) and delay
# accounting per request, and charts round 1 (--plot, into $OUT/NAME.svg,
# when gnuplot is there); at the end it prints one markdown table row per
# metric: median of each side over the rounds, the median of the per-round
# B/A ratios and their spread (min..max).  Raw JSON goes to $OUT.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${ROUNDS:=3}" "${ITER:=6}" "${LEN:=3}" "${OUT:=$top/build/bench}"
: "${BLKD:=$top/blkd}" "${BLKPERF:=$top/blkperf}"
mkdir -p "$OUT"
[ -x "$BLKD" ] && [ -x "$BLKPERF" ] || { echo "build blkd and blkperf first (make)" >&2; exit 1; }

ab_run() {
  NAME=$1 A_OPTS=$2 B_OPTS=$3 PLUGIN=$4 TEST=$5 \
  BLKD=$BLKD BLKPERF=$BLKPERF ROUNDS=$ROUNDS ITER=$ITER LEN=$LEN OUT=$OUT TOP=$top \
  /usr/bin/python3 - <<'EOF'
import json, os, shlex, shutil, statistics, subprocess, sys, time, urllib.request

env = os.environ
sys.path.insert(0, os.path.join(env["TOP"], "bench"))
from benchlib import free_port as port, wait_port  # noqa: E402
name, rounds, iters, length = env["NAME"], int(env["ROUNDS"]), int(env["ITER"]), env["LEN"]
a_opts, b_opts = shlex.split(env["A_OPTS"]), shlex.split(env["B_OPTS"])
plugin, test = shlex.split(env["PLUGIN"]), shlex.split(env["TEST"])
slug = "".join(ch if ch.isalnum() else "-" for ch in name).strip("-").lower()


def start(opts):
    p, m = port(), port()
    proc = subprocess.Popen([env["BLKD"], "-f", "-i", "127.0.0.1", "-p", str(p),
                             "--metrics", "127.0.0.1:%d" % m] + opts + plugin,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(p, proc)
    wait_port(m, proc)
    return proc, "nbd://127.0.0.1:%d" % p, "http://127.0.0.1:%d/metrics" % m


def side(d):
    cpu = (d.get("cpu") or {}).get("remote") or {}
    delay = d.get("delay_us_per_req") or {}
    return {"iops": d["iops"], "mib_s": d["throughput_mib_s"],
            "cpu_us_req": cpu.get("service_demand_us_per_req"),
            "p50_us": d["latency_us"]["p50"], "p99_us": d["latency_us"]["p99"],
            "plugin_us": delay.get("plugin"), "queued_us": delay.get("queued"),
            "send_us": delay.get("send"),
            "samples": [s["iops"] for s in d.get("samples", [])]}


results = []
for r in range(rounds):
    pa, ua, ma = start(a_opts)
    pb, ub, mb = start(b_opts)
    first_b = r % 2 == 1
    uris, mets = ([ub, ua], [mb, ma]) if first_b else ([ua, ub], [ma, mb])
    cmd = [env["BLKPERF"], "compare", "--json", "--quiet", "-l", length,
           "-i", "%d,%d" % (iters, iters), "-M", mets[0], "-M", mets[1]] + test + uris
    if r == 0 and shutil.which("gnuplot"):
        # One chart per A/B, from the round that ran A first.
        cmd[2:2] = ["--plot", os.path.join(env["OUT"], slug + ".svg"),
                    "--label", " ".join(a_opts) or "defaults",
                    "--label", " ".join(b_opts) or "defaults"]
    cache = {}
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        for label, murl in (("a", ma), ("b", mb)):
            with urllib.request.urlopen(murl.replace("/metrics", "/stats"), timeout=10) as f:
                c = json.loads(f.read())["cache"]
            if c and c["hits"] + c["misses"]:
                cache[label] = c["hits"] / (c["hits"] + c["misses"])
    finally:
        for p in (pa, pb):
            p.terminate()
            p.wait()
    d = json.loads(out)
    x, y = side(d["a"]), side(d["b"])
    a, b = (y, x) if first_b else (x, y)
    a["hit_rate"], b["hit_rate"] = cache.get("a"), cache.get("b")
    results.append({"a": a, "b": b})
    print("  round %d%s: A %.0f IOPS, B %.0f IOPS (B/A %.3f)" % (
        r + 1, " (B first)" if first_b else "", a["iops"], b["iops"], b["iops"] / a["iops"]),
        file=sys.stderr)

stamp = time.strftime("%Y%m%dT%H%M%S")
with open(os.path.join(env["OUT"], "%s-%s.json" % (slug, stamp)), "w") as f:
    json.dump({"name": name, "a_opts": a_opts, "b_opts": b_opts, "plugin": plugin, "test": test,
               "rounds": rounds, "iterations": iters, "length_s": length, "results": results}, f,
              indent=1)


def row(metric, label, fmt):
    av = [x["a"][metric] for x in results if x["a"][metric] is not None]
    bv = [x["b"][metric] for x in results if x["b"][metric] is not None]
    if not av and bv:
        print("| %s | %s | - | %s | | |" % (name, label, fmt % statistics.median(bv)))
        return
    if not av or not bv:
        return
    ratios = [x["b"][metric] / x["a"][metric] for x in results
              if x["a"][metric] and x["b"][metric] is not None]
    print("| %s | %s | %s | %s | %.3f | %.3f..%.3f |" % (
        name, label, fmt % statistics.median(av), fmt % statistics.median(bv),
        statistics.median(ratios), min(ratios), max(ratios)))


row("iops", "IOPS", "%.0f")
row("cpu_us_req", "server CPU us/req", "%.1f")
row("plugin_us", "plugin us/req", "%.1f")
row("p99_us", "p99 latency us", "%.0f")
row("hit_rate", "cache hit rate", "%.3f")
EOF
}
