#!/usr/bin/env bash
# make bench-anchors' script: which side limited a run, the "client-bound"
# and "invalid" labels and the count check, on made-up cells; then one
# tiny real run (2 runs of 1 round of 1 s, 64 MiB) that must produce both
# clients' tables with blkd's /metrics count agreeing with fio's and blkperf's.
# Nothing here is timed: rates are printed, never compared.
# run.sh: serial (pins processes to CPUs and samples their CPU time)
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3

# --- the reporting logic on made-up cells -------------------------------------
"$PY" - "$TOP/bench" <<'EOF' || fail "anchors' reporting logic"
import sys
sys.path.insert(0, sys.argv[1])
import anchors
from benchlib import bound, count_agrees, ratio_cell

def eq(got, want, what):
    if got != want:
        print("%s: got %r, want %r" % (what, got, want)); sys.exit(1)

# bound(client share, client cap, server share, server cap, busiest thread)
eq(bound(0.97, 1, 0.50, 1, 0.50), "client", "fio full, server half idle")
eq(bound(0.80, 1, 0.99, 1, 0.99), "server", "pinned server full")
eq(bound(0.70, 1, 0.97, 1.3, 0.97), "server", "one shard thread full, process not")
eq(bound(0.97, 1, 0.95, 1.03, 0.95), "both", "unpinned, machine full")
eq(bound(0.30, 1, 0.30, 1, 0.30), "-", "QD1: neither")
eq(bound(1.85, 2, 0.10, 1, 0.10), "client", "four jobs filling two CPUs")
eq(bound(None, 1, None, 1, None), "-", "nothing measured")

eq(ratio_cell(1.5, (1.2, 1.8), "server", "server"), "1.50 (1.20–1.80)", "bare ratio")
eq(ratio_cell(1.5, None, "client", "server"), "client-bound: ≥ 1.50", "cell client-bound")
eq(ratio_cell(0.8, None, "server", "client"), "client-bound: ≤ 0.80", "baseline client-bound")
eq(ratio_cell(1.1, None, "client", "client"), "client-bound", "both client-bound")
eq(ratio_cell(1.1, None, "server", "server", valid=False), "invalid (counts disagree)", "invalid")

eq(count_agrees(100000, 100032, 32), True, "drain of one queue")
eq(count_agrees(100000, 100000 + 2 * 32 + 1000, 32), True, "within 1% + 2 queues")
eq(count_agrees(100000, 110000, 32), False, "10% more on the server")
eq(count_agrees(100000, 50000, 32), False, "half on the server")
eq(count_agrees(100000, None, 32), None, "no server count")

def cell(rnd, iops, srv_share, client_share, count_ok=True):
    return dict(round=rnd, iops=iops, mib_s=iops * 4096 / 2**20, bytes=iops * 4096,
                requests=iops, srv_us_req=1e6 * srv_share / iops,
                client_us_req=1e6 * client_share / iops, client_share=client_share,
                client_cap=1, srv_share=srv_share, srv_share_mid=srv_share,
                srv_thread_max=srv_share, srv_cap=1.0, p99_us=100.0, load1=0.1, quiet=True,
                pinned=True, count_ok=count_ok)

# nbdkit full in every round; blkd twice as fast but its client full.
res = {"4k": {"nbdkit": [cell(1, 1000, 0.99, 0.5), cell(2, 1100, 0.99, 0.5)],
              "blkd": [cell(1, 2000, 0.40, 0.97), cell(2, 2400, 0.40, 0.98)],
              "bad": [cell(1, 3000, 0.99, 0.5), cell(2, 3000, 0.99, 0.5, count_ok=False)]}}
rows = {r.split(" | ")[1]: r for r in anchors.table(res, "nbdkit", "blkperf").splitlines()[2:]}
for name, want in (("nbdkit", "| 1.00 |"), ("blkd", "client-bound: ≥ 2.09 (2.00–2.18)"),
                   ("bad", "invalid (counts disagree)")):
    if want not in rows[name]:
        print("row %s lacks %r:\n%s" % (name, want, rows[name])); sys.exit(1)
if "DISAGREE in 1 of 2" not in rows["bad"] or "| client |" not in rows["blkd"]:
    print("count or bound column wrong:\n" + "\n".join(rows.values())); sys.exit(1)

# Across runs: the second run's blkd is server-bound at 1.5x.
res2 = {"4k": {"nbdkit": [cell(1, 1000, 0.99, 0.5)], "blkd": [cell(1, 1500, 0.99, 0.6)],
               "bad": [cell(1, 3000, 0.99, 0.5, count_ok=False)]}}
rows = {r.split(" | ")[2]: r for r in anchors.runs_table(
    [("10:00 UTC", {"blkperf": res}), ("11:00 UTC", {"blkperf": res2})],
    "nbdkit").splitlines()[2:]}
for name, want in (("blkd", "| 2.09 (client-bound), 1.50 | 1.50 | 1.80 | 2.09 | 1 of 2 | "
                             "–/–, –/– |"),
                   ("bad", "2.86 invalid, 3.00 invalid")):
    if want not in rows[name]:
        print("runs row %s lacks %r:\n%s" % (name, want, rows[name])); sys.exit(1)
# Placement: where the busiest threads ran, from made-up samples.
from benchlib import bound_shared, place_rates, placement
eq(bound_shared(0.6, 0.35), "both", "one CPU shared and full")
eq(bound_shared(0.3, 0.2), "-", "one CPU shared, both waiting")
srv_a, srv_b = {(1, 0): 0, (1, 1): 0, (1, 2): 0}, {(1, 0): 90, (1, 1): 80, (1, 2): 10}
cli_a, cli_b = {(2, 0): 0, (2, 3): 0}, {(2, 0): 50, (2, 3): 50}
def smp(t, cpu_s, cpu_c, counts=None):
    c = counts or (None, None, None, None)
    return (t, {(1, 1): (cpu_s,) + c[:1] + c[1:2] + (c[2],), (1, 2): (1, 0, 0, 0)},
            {(2, 3): (cpu_c,) + c[:1] + c[1:2] + (c[3],)})
places = [smp(0.0, 0, 0, (10, 5, 1, 2)), smp(0.05, 0, 1), smp(0.1, 1, 1),
          smp(0.2, 1, 1, (110, 25, 4, 6))]
pl = placement(places, srv_a, srv_b, cli_a, cli_b)
eq(pl["same_cpu"], 0.75, "3 of 4 samples on one CPU")
eq((pl["srv_cs"], pl["srv_invol"], pl["client_cs"], pl["client_invol"]), (120, 20, 120, 20),
   "switches of the busiest threads")
eq((pl["srv_migr"], pl["client_migr"]), (3, 4), "migrations")
rates = place_rates({"iops": 1000, "place": pl})
eq((round(rates["srv_cs_req"], 3), round(rates["srv_migr_s"], 3)), (0.6, 15.0), "per request")
eq(placement(places[:1], srv_a, srv_b, cli_a, cli_b)["same_cpu"], None, "one sample: unknown")
row = anchors.table({"4k": {"nbdkit": [dict(cell(1, 1000, 0.99, 0.5), **rates)]}}, "nbdkit",
                    "fio")
if "same CPU 75%; cs/req srv 0.60 (0.10), client 0.60 (0.10); migr/s 15, 20" not in row:
    print("placement column wrong:\n" + row); sys.exit(1)
print("ok: reporting logic")
EOF

# --- one tiny real run ---------------------------------------------------------
need fio
need nbdkit
need taskset
# bench/anchors.py runs the tree's own ./blkd and ./blkperf.
[ -x "$TOP/blkd" ] || skip "no blkd binary at $TOP/blkd"
[ -x "$TOP/blkperf" ] || skip "blkperf is not built (make blkperf)"
timeout 300 "$PY" "$TOP/bench/anchors.py" --part targets --rounds 1 --seconds 1 --size 64M \
  --runs 2 --max-busy 100 --workloads "4k randread QD32" --servers "nbdkit memory,blkd ram" \
  --json "$TMP/a.json" --out "$TMP/a.md" >"$TMP/out" 2>"$TMP/err" \
  || { tail -30 "$TMP/err"; fail "bench/anchors.py exited $?"; }
cat "$TMP/a.md"
grep -q "^### targets: fio, unpinned" "$TMP/a.md" || fail "no fio table"
grep -q "^### targets: blkperf, " "$TMP/a.md" || fail "no blkperf table"
grep -q "^## targets across the 2 runs" "$TMP/a.md" || fail "no table across the runs"
"$PY" - "$TMP/a.json" "$(nproc)" <<'EOF' || fail "anchors' JSON"
import json, sys
runs, ncpu = json.load(open(sys.argv[1]))["targets"], int(sys.argv[2])
assert len(runs) == 2, len(runs)
for client, run in (("fio", 0), ("blkperf", 0), ("fio", 1), ("blkperf", 1)):
    cells = runs[run]["results"][client]["4k randread QD32"]
    for server in ("nbdkit memory", "blkd ram"):
        (r,) = cells[server]
        assert r["requests"] > 0 and r["srv_us_req"] > 0, (client, server, r)
        assert r["bound"] in ("server", "client", "both", "-"), r["bound"]
        assert r["pinned"] == (client == "blkperf" and ncpu > 1), (client, r["pinned"])
        # Placement sampled mid-run (1 s runs: a few samples at least).
        assert r["same_cpu"] is not None and 0 <= r["same_cpu"] <= 1, (client, server, r["place"])
        assert r["srv_cs_req"] is not None and r["client_cs_req"] is not None, r["place"]
    b = cells["blkd ram"][0]
    # blkd's own count, scraped around the run, against the client's.
    assert b["srv_requests"] is not None and b["count_ok"] is True, (client, b["requests"],
                                                                      b["srv_requests"])
    assert cells["nbdkit memory"][0]["count_ok"] is None
print("ok: both clients measured both servers; blkd's counts agree")
EOF
echo "bench anchors checks passed"
