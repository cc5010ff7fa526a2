#!/usr/bin/env bash
# blkperf -M: remote CPU and blkd delay accounting read from a /metrics
# endpoint (canned ones from a tiny Python server, blkd's own when it has
# one), n/a when absent, and scrapes that follow compare's A B, B A order.
. "$(dirname "$0")/lib.sh"
[ -x "$BLKPERF" ] || skip "blkperf is not built (make blkperf)"
PY=/usr/bin/python3

if [ -x "$BLKD" ] && [ "$(basename "$BLKD")" != nbdkit ]; then
  SRV=(); MEM=(ram size=1G)
else
  need nbdkit; SRV=(nbdkit); MEM=(memory size=1G)
fi
start_server "${SRV[@]}" "${MEM[@]}"
NBD=$URI

# A /metrics server whose counters step by a fixed amount per scrape, so
# the deltas blkperf reports are known exactly: each scrape adds 0.25 s
# user and 0.125 s system CPU, and known delay sums.
cat >"$TMP/metrics.py" <<'EOF'
import http.server, sys
port, mode, tag, log = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
n = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global n
        if self.path != "/metrics":
            self.send_error(404, "no such page"); return
        n += 1
        with open(log, "a") as f:
            f.write(tag + "\n")
        lines = ["# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.",
                 "# TYPE process_cpu_seconds_total counter",
                 "process_cpu_seconds_total %g" % (n * 0.375)]
        if mode == "blkd":
            lines += ["blkd_process_cpu_user_seconds_total %g" % (n * 0.25),
                      "blkd_process_cpu_system_seconds_total %g" % (n * 0.125),
                      'blkd_delay_queued_seconds_total{shard="0"} %g' % (n * 0.001),
                      'blkd_delay_queued_seconds_total{shard="1"} %g' % (n * 0.001),
                      'blkd_delay_plugin_seconds_total{shard="0",op="read"} %g' % (n * 0.004),
                      "blkd_delay_send_seconds_total %g 1700000000000" % (n * 0.003),
                      'unrelated_metric{label="with } brace"} 5']
        if mode == "node":
            for cpu in ("0", "1"):
                for m, v in (("user", 0.1), ("system", 0.05), ("idle", 0.35), ("softirq", 0.0)):
                    lines.append('node_cpu_seconds_total{cpu="%s",mode="%s"} %g' % (cpu, m, n * v))
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
EOF
start_metrics() {   # start_metrics MODE TAG: sets MURL
  local port
  "$PY" "$TMP/metrics.py" 0 "$1" "$2" "$TMP/scrapes.log" >>"$TMP/metrics.log" 2>&1 &
  SERVER_PIDS+=($!)
  port=$(wait_listen $!)
  wait_port "$port"
  MURL="http://127.0.0.1:$port/metrics"
}

jcheck() {   # jcheck FILE CONDITION...
  local file=$1; shift
  "$PY" - "$file" "$@" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for cond in sys.argv[2:]:
    if not eval(cond, dict(d=d, r=(d.get("cpu") or {}).get("remote"))):
        print("check failed: " + cond); print(json.dumps(d, indent=1)[:4000]); sys.exit(1)
EOF
}

# --- blkd's split CPU and delay accounting ----------------------------------
start_metrics blkd A
"$BLKPERF" -t RR -l 1 -M "$MURL" --json "$NBD" >"$TMP/blkd.json" || fail "blkperf -M exited $?"
jcheck "$TMP/blkd.json" 'r is not None' 'r["basis"] == "process"' \
  'abs(r["process"]["user_s"] - 0.25) < 1e-9 and abs(r["process"]["system_s"] - 0.125) < 1e-9' \
  'abs(r["process"]["cpu_s"] - 0.375) < 1e-9' 'r["source"].startswith("blkd_process_cpu")' \
  '20 < r["user"] < 30 and 10 < r["system"] < 15 and r["idle"] is None' \
  'abs(r["service_demand_us_per_req"] - 0.375e6 / d["requests"]) < 0.02 * r["service_demand_us_per_req"]' \
  'abs(d["delay_us_per_req"]["queued"] - 0.002e6 / d["requests"]) < 0.02 * d["delay_us_per_req"]["queued"]' \
  'abs(d["delay_us_per_req"]["plugin"] - 0.004e6 / d["requests"]) < 0.02 * d["delay_us_per_req"]["plugin"]' \
  'abs(d["delay_us_per_req"]["send"] - 0.003e6 / d["requests"]) < 0.02 * d["delay_us_per_req"]["send"]' \
  'd["cpu"]["local"] is None'
"$BLKPERF" -t RR -l 1 -c -M "$MURL" "$NBD" >"$TMP/blkd.txt" || fail "table run"
cat "$TMP/blkd.txt"
grep -q "^Remote .*server process" "$TMP/blkd.txt" || fail "remote CPU row"
grep -q "queued [0-9]" "$TMP/blkd.txt" || fail "delay accounting row"

# --- only process_cpu_seconds_total: no split, no delay accounting -----------
start_metrics proc P
"$BLKPERF" -t RAND_READ -l 1 -M "$MURL" --json "$NBD" >"$TMP/proc.json" || fail "proc run"
jcheck "$TMP/proc.json" 'r is not None and r["source"] == "process_cpu_seconds_total"' \
  'r["user"] is None and r["system"] is None and 30 < r["util"] < 45' \
  'abs(r["process"]["cpu_s"] - 0.375) < 1e-9' 'd["delay_us_per_req"] is None'
"$BLKPERF" -t RAND_READ -l 1 -M "$MURL" "$NBD" >"$TMP/proc.txt" || fail "proc table"
grep -q "queued n/a   plugin n/a   send n/a" "$TMP/proc.txt" || fail "absent delay sums should read n/a"

# --- node_exporter's machine split -------------------------------------------
start_metrics node N
"$BLKPERF" -t RAND_READ -l 1 -M "$MURL" --json "$NBD" >"$TMP/node.json" || fail "node run"
jcheck "$TMP/node.json" 'r["basis"] == "machine"' \
  'abs(r["user"] - 20) < 1e-6 and abs(r["system"] - 10) < 1e-6 and abs(r["idle"] - 70) < 1e-6'

# --- unreachable and wrong endpoints: the run stands, remote is n/a -----------
dead_port
dead="http://127.0.0.1:$DEAD_PORT/metrics"
"$BLKPERF" -t RR -l 1 -M "$dead" --json "$NBD" >"$TMP/dead.json" || fail "dead endpoint changed the exit status"
jcheck "$TMP/dead.json" 'r is None' '"refused" in d["metrics_error"]' 'd["iops"] > 0'
"$BLKPERF" -t RR -l 1 -M "${MURL%/metrics}/nope" --json "$NBD" >"$TMP/404.json" || fail "404 run"
jcheck "$TMP/404.json" 'r is None' '"404" in d["metrics_error"]'
rc=0; "$BLKPERF" -M ftp://x/metrics "$NBD" 2>"$TMP/err" || rc=$?
[ $rc -eq 2 ] && grep -q "expected http://" "$TMP/err" || fail "-M ftp:// accepted"

# --- compare scrapes A's and B's endpoints in A B, B A, A B order -----------
rm -f "$TMP/scrapes.log"
start_metrics blkd A; MA=$MURL
start_metrics blkd B; MB=$MURL
"$BLKPERF" compare -t RR -n 500 -i 3,3 -M "$MA" -M "$MB" --json "$NBD" "$NBD" >"$TMP/cmp.json" \
  || fail "compare -M exited $?"
order=$(tr -d '\n' <"$TMP/scrapes.log")
[ "$order" = AABBBBAAAABB ] || fail "scrape order $order, expected AABBBBAAAABB"
"$PY" - "$TMP/cmp.json" <<'EOF' || fail "compare remote CPU"
import json, sys
d = json.load(open(sys.argv[1]))
for s in "ab":
    r = d[s]["cpu"]["remote"]
    assert r and abs(r["process"]["cpu_s"] - 3 * 0.375) < 1e-9 and r["windows"] == 3, r
EOF

# --- blkd's real endpoint, once it serves one ---------------------------------
if [ ${#SRV[@]} -eq 0 ] && grep -q -- "--metrics" <<<"$("$BLKD" --help 2>/dev/null)"; then
  start_server --metrics 127.0.0.1:0 "${MEM[@]}"
  mport=$METRICS_PORT
  if "$PY" -c 'import sys, urllib.request; sys.exit(0 if b"cpu_seconds_total" in urllib.request.urlopen(sys.argv[1], timeout=3).read() else 1)' \
       "http://127.0.0.1:$mport/metrics" 2>/dev/null; then
    "$BLKPERF" -t RAND_RW -l 1 -M "http://127.0.0.1:$mport/metrics" --json "$URI" >"$TMP/real.json" \
      || fail "blkperf against blkd's /metrics exited $?"
    jcheck "$TMP/real.json" 'r is not None and r["process"]["cpu_s"] > 0'
    echo "blkd /metrics: $("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["cpu"]["remote"], d["delay_us_per_req"])' "$TMP/real.json")"
  else
    echo "note: blkd's /metrics does not answer with CPU counters yet; real-endpoint part skipped"
  fi
fi
echo "metrics checks passed"
