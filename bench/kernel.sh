#!/usr/bin/env bash
# The kernel's NBD client as the load: fio in a qemu guest on /dev/nbd0
# (Debian's nbd.ko and nbd-client 3.24, the tests/vm harness), the servers
# on the host, side by side in one run with servers alternating inside
# each round: blkd (memory, ram), nbdkit (memory), nbd-server and qemu-nbd
# (each on a file in tmpfs).
#
#   bench/kernel.sh [OUTDIR]     (default build/bench-kernel; env:
#     ROUNDS=3 SECONDS_PER_RUN=10 SIZE=268435456 CONNS="1 4"
#     SERVERS="blkd-memory blkd-ram nbdkit-memory nbd-server qemu-nbd"
#     JOBS="randread4k-qd1 randwrite4k-qd1 randread4k-qd32 randwrite4k-qd32
#           read128k write128k read1m write1m"
#     NET=tap|user  VM_CPUS=4
#     VARIANTS="NAME=PATH [OPTION...];..."  TRACE=perf-record|perf-dwarf|
#       perf-stat|strace-c|strace)
#
# A/B in one run: each VARIANTS entry is a blkd binary (or this one) with
# options, served as blkd-memory.NAME or blkd-ram.NAME in SERVERS, e.g.
#   VARIANTS="main=/tmp/blkd-main;nopoll=./blkd --poll-us 0"
#   SERVERS="blkd-memory blkd-memory.main blkd-memory.nopoll nbdkit-memory"
# TRACE runs the tool on each server's process over each run (perf
# record -g, perf record with DWARF call graphs, perf stat, strace -c -f,
# or a full strace -f -tt -T), its output in OUTDIR/trace/ as
# ROUND-CONNS-JOB.SERVER.TOOL; the tool's own overhead lands in the CPU
# column then (strace's most of all): use a traced run for the profile,
# an untraced one for the figures.
#
# The link is a tap device inside a network namespace this script creates
# (192.0.2.2 the host's end, 192.0.2.15 the guest's): qemu's user
# networking is a user-space TCP stack that would measure itself.  Where
# the namespace or the tap cannot be made, it falls back to user
# networking and says so in the table's heading.
#
# Per run: guest IOPS and MiB/s (fio), the requests the kernel sent and
# their mean size (/sys/block/nbd0/stat), and the server's CPU per
# request: exact, from the process's CPU clock (the run time of all its
# threads in ns, threads that exited during the run included), and as a
# cross-check from utime + stime (/proc/PID/stat, 10 ms ticks).  Under TCG (no
# real KVM: /dev/kvm missing or PVM) the emulated guest is the bottleneck
# and shares the host's CPUs with the server: only CPU per request means
# anything there, and the table says which accelerator ran.
# OUTDIR gets raw.txt (every run), kernel.md (medians) and console.log.
set -euo pipefail
TOP=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$TOP/build/bench-kernel}
. "$TOP/tests/vm/vm.sh"
BLKD=${BLKD:-$TOP/blkd}

why=$(vm_can_run) || { echo "bench-kernel: skipped: $why"; exit 77; }
[ -x "$BLKD" ] || { echo "bench-kernel: $BLKD is not built (make all)"; exit 1; }
for c in nbdkit nbd-server qemu-nbd; do
  command -v "$c" >/dev/null || { echo "bench-kernel: skipped: $c is not installed"; exit 77; }
done
vm_base
mkdir -p "$OUT"

ROUNDS=${ROUNDS:-3}
SECS=${SECONDS_PER_RUN:-10}
SIZE=${SIZE:-268435456}
CONNS=${CONNS:-1 4}
SERVERS=${SERVERS:-blkd-memory blkd-ram nbdkit-memory nbd-server qemu-nbd}
JOBS=${JOBS:-randread4k-qd1 randwrite4k-qd1 randread4k-qd32 randwrite4k-qd32 read128k write128k read1m write1m}
export VM_CPUS=${VM_CPUS:-4}
ACCEL=$(vm_accel)

# nbd-server's and qemu-nbd's disks are files here: tmpfs keeps them in
# memory like the other servers' plugins.
RUN=$(mktemp -d /dev/shm/blkd-bench-kernel.XXXXXX)
NS=blkd-bench-$$
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  ip netns del "$NS" 2>/dev/null || true
  rm -rf "$RUN"
}
trap cleanup EXIT

NET=${NET:-tap}
WRAP=() BIND=127.0.0.1
if [ "$NET" = tap ]; then
  if ip netns add "$NS" 2>"$RUN/ns.err" &&
     ip netns exec "$NS" ip link set lo up 2>>"$RUN/ns.err" &&
     ip netns exec "$NS" ip tuntap add dev tap0 mode tap 2>>"$RUN/ns.err" &&
     ip netns exec "$NS" ip addr add 192.0.2.2/24 dev tap0 2>>"$RUN/ns.err" &&
     ip netns exec "$NS" ip link set tap0 up 2>>"$RUN/ns.err"; then
    WRAP=(ip netns exec "$NS") BIND=192.0.2.2
    vhost=off; [ "$ACCEL" = kvm ] && [ -w /dev/vhost-net ] && vhost=on
    export VM_NET="-netdev tap,id=n0,ifname=tap0,script=no,downscript=no,vhost=$vhost -device virtio-net-pci,netdev=n0"
    export VM_WRAP="ip netns exec $NS"
  else
    echo "bench-kernel: no tap in a network namespace ($(tr '\n' ' ' <"$RUN/ns.err")); using qemu's user networking"
    NET=user
  fi
fi

CTL_ARGS=()
IFS=';' read -ra variants <<<"${VARIANTS:-}"
for v in "${variants[@]}"; do
  v=${v#"${v%%[! ]*}"}              # leading blanks
  [ -n "$v" ] && CTL_ARGS+=(--variant "$v")
done
TRACE=${TRACE:-}
if [ -n "$TRACE" ]; then
  mkdir -p "$OUT/trace"
  CTL_ARGS+=(--trace "$TRACE" --trace-dir "$OUT/trace")
fi
"${WRAP[@]}" /usr/bin/python3 "$TOP/tests/vm/control.py" --tmp "$RUN" --top "$TOP" --blkd "$BLKD" \
  --bind "$BIND" --port-file "$RUN/ctl.port" "${CTL_ARGS[@]}" 2>"$OUT/control.log" &
PIDS+=("$!")
for ((i = 0; i < 100; i++)); do [ -s "$RUN/ctl.port" ] && break; sleep 0.1; done
[ -s "$RUN/ctl.port" ] || { cat "$OUT/control.log"; exit 1; }

cat >"$RUN/bench.conf" <<EOF
BENCH_SERVERS="$SERVERS"
BENCH_JOBS="$JOBS"
BENCH_CONNS="$CONNS"
BENCH_SECONDS=$SECS
BENCH_ROUNDS=$ROUNDS
BENCH_SIZE=$SIZE
BENCH_TRACE=${TRACE:+1}
EOF
n_srv=$(wc -w <<<"$SERVERS") n_jobs=$(wc -w <<<"$JOBS") n_conns=$(wc -w <<<"$CONNS")
per_run=$((SECS + 5)); [ -n "$TRACE" ] && per_run=$((SECS + 20))   # attach, write out
limit=$((ROUNDS * n_srv * n_conns * (n_jobs * per_run + 10) + n_srv * 120 + 120))
echo "bench 100000 bench" >"$RUN/plan"
vm_initrd "$RUN/initrd" "$RUN/plan" "$RUN/bench.conf"
load=$(uptime)
echo "bench-kernel: kernel $VM_KVER, accel $ACCEL, $VM_CPUS guest CPUs, $NET networking;" \
  "$ROUNDS rounds of ${SECS}s runs; limit ${limit}s; $load"
rc=0
vm_boot "$RUN/initrd" "$OUT/console.log" "$limit" "vm.ctlport=$(cat "$RUN/ctl.port")" || rc=$?
grep -a '^BENCH ' "$OUT/console.log" >"$OUT/raw.txt" || true
grep -a '^CASE ' "$OUT/console.log" || true
[ "$rc" = 0 ] || echo "bench-kernel: qemu ended with status $rc"
[ -s "$OUT/raw.txt" ] || { echo "bench-kernel: no results"; tail -n 30 "$OUT/console.log"; exit 1; }

/usr/bin/python3 - "$OUT/raw.txt" "$OUT/kernel.md" "$ACCEL" "$NET" "$load" "$(getconf CLK_TCK)" <<'PY'
import statistics, sys
raw, out, accel, net, load, tck = sys.argv[1:7]
tck = int(tck)
runs = {}
order = []
notes = []
for line in open(raw):
    f = line.split()
    if len(f) not in (10, 11):   # an attach refused (-C 4 without multi-conn) or fio failed
        notes.append("| %s | %s | %s | | | | | | | |" % (f[2], f[3], " ".join(f[4:]).replace("_", " ")))
        continue
    _, rnd, srv, conns, job, iops, mibs, reqs, avgkb, ticks = f[:10]
    ns = int(f[10]) if len(f) == 11 else None      # raw.txt of an older run: ticks only
    key = (srv, conns, job)
    if key not in runs:
        runs[key] = []
        order.append(key)
    runs[key].append((float(iops), float(mibs), int(reqs), int(avgkb), int(ticks), ns))
lines = ["Kernel client (nbd.ko, nbd-client -C N) against each server: %s guest, %s"
         " networking; %s" % (accel.upper(), net, load.strip()), ""]
if accel != "kvm":
    lines += ["Under TCG the guest is emulated and shares the host's CPUs with the"
              " server: IOPS and MiB/s say little; CPU per request is the figure.", ""]
lines += ["Server CPU: its process CPU clock (ns, exact) over the requests of all"
          " rounds, and each run's own (range); the ticks column is utime+stime"
          " (10 ms ticks), a cross-check.", ""]
lines += ["| server | -C | job | IOPS (median) | MiB/s (median) | requests | mean request KiB"
          " | server CPU µs/request | runs' range | from ticks |",
          "|---|---|---|---|---|---|---|---|---|---|"]
jobs = []
for k in order:
    if k[2] not in jobs:
        jobs.append(k[2])
for job in jobs:
    for k in order:
        if k[2] != job:
            continue
        r = runs[k]
        reqs = sum(x[2] for x in r)
        cpu_t = sum(x[4] for x in r) * 1e6 / tck / reqs if reqs else 0
        exact = all(x[5] is not None for x in r)
        cpu = (sum(x[5] for x in r) / 1e3 / reqs if reqs else 0) if exact else None
        each = [x[5] / 1e3 / x[2] for x in r if x[2]] if exact else []
        spread = "%.2f–%.2f" % (min(each), max(each)) if len(each) > 1 else ""
        lines.append("| %s | %s | %s | %.0f | %.1f | %d | %d | %s | %s | %.1f |" % (
            k[0], k[1], job, statistics.median(x[0] for x in r),
            statistics.median(x[1] for x in r), reqs,
            round(statistics.median(x[3] for x in r)),
            "%.2f" % cpu if cpu is not None else "n/a", spread, cpu_t))
lines += sorted(set(notes))
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "bench-kernel: tables in $OUT/kernel.md, every run in $OUT/raw.txt"
