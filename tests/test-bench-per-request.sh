#!/usr/bin/env bash
# bench/per-request.py --profile: one tiny real run (1 round of 1 s, 64 MiB,
# blkperf pinned apart) must print the per-request counts and the split of
# the server's CPU by part, every part's share a number between 0 and 100
# and the parts of the whole adding up to 100.  Nothing here is timed:
# shares are printed, never compared with a figure.
# run.sh: serial (pins processes to CPUs and samples their CPU time)
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
need perf
need fio
[ -x "$TOP/blkperf" ] || skip "blkperf is not built"
perf record -q -o /dev/null -- true >/dev/null 2>&1 || skip "perf cannot sample here"

out=$(timeout 120 "$PY" "$TOP/bench/per-request.py" --client blkperf --rw randread --bs 4k \
        --iodepth 8 --rounds 1 --seconds 1 --size 64M --prefill-bs 1M --profile \
        "$TOP/blkd" 2>&1) || fail "per-request.py failed: $out"
echo "$out"
"$PY" - "$out" <<'PYEOF' || fail "the profile table"
import re, sys
lines = sys.argv[1].splitlines()
head = [i for i, l in enumerate(lines) if l.startswith("| server | memcpy |")]
assert head, "no profile table"
cols = [c.strip() for c in lines[head[0]].strip("|").split("|")][1:]
row = [c.strip() for c in lines[head[0] + 2].strip("|").split("|")]
shares = {}
for name, cell in zip(cols, row[1:]):
    m = re.match(r"(\d+)% \(([\d.]+)\)$", cell)
    assert m, "cell %s: %r" % (name, cell)
    shares[name] = int(m.group(1))
    assert 0 <= shares[name] <= 100, (name, cell)
whole = ["memcpy", "plugin", "server code", "send", "receive", "wait", "other"]
assert abs(sum(shares[k] for k in whole) - 100) <= len(whole), shares
assert shares["send"] > 0, "a READ's replies are sent: %r" % shares
print("ok: the server's CPU split into %d parts" % len(cols))
PYEOF
echo "per-request profile checks passed"
