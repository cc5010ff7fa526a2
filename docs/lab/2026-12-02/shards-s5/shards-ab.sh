#!/usr/bin/env bash
# Two event loops on one CPU against one: blkd pinned to CPU 1 (--shards 2 as the old
# default gave under taskset, and 1 as the new), blkperf on CPU 0, 4 connections.
set -eu
cd /work/main
taskset -c 1 ./blkd -f -p 10931 -i 127.0.0.1 --shards 2 memory 1G >/dev/null 2>&1 & A=$!
taskset -c 1 ./blkd -f -p 10932 -i 127.0.0.1 --shards 1 memory 1G >/dev/null 2>&1 & B=$!
trap 'kill $A $B' EXIT
sleep 1
for p in 10931 10932; do taskset -c 0 ./blkperf -t STREAM_WRITE -b 1M -l 2 --quiet nbd://127.0.0.1:$p/ >/dev/null; done  # prefill
tk() { awk '{print $14+$15}' /proc/$1/stat; }
for t in RAND_READ RAND_WRITE; do
  a0=$(tk $A); b0=$(tk $B)
  taskset -c 0 ./blkperf compare -t $t -b 4k -q 32 -C 4 -l 3 -i 6,6 --json nbd://127.0.0.1:10931/ nbd://127.0.0.1:10932/ > /work/notes/s14/shards-$t.json 2>/dev/null || true
  a1=$(tk $A); b1=$(tk $B)
  /usr/bin/python3 - /work/notes/s14/shards-$t.json $((a1-a0)) $((b1-b0)) $t <<'P'
import json,sys
d=json.load(open(sys.argv[1])); a,b=d["a"],d["b"]; m=d["metrics"]
ra, rb = a["requests"], b["requests"]
ca, cb = int(sys.argv[2]) / 100, int(sys.argv[3]) / 100
print("%s: 1 loop / 2 loops on one CPU: IOPS %+.1f%% (CI %.1f..%.1f), p99 %.0f -> %.0f us, "
      "server CPU us/request %.2f -> %.2f (%.2fx); iterations %d/%d" % (
      sys.argv[4], d["improvement_pct"], d["ci_pct"][0], d["ci_pct"][1],
      m["latency_p99_us"]["a"], m["latency_p99_us"]["b"], ca * 1e6 / ra, cb * 1e6 / rb,
      (cb / rb) / (ca / ra), a["iterations"], b["iterations"]))
P
done
