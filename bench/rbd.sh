#!/usr/bin/env bash
# Serving a Ceph RBD image over NBD: blkd's rbd plugin against qemu-nbd (qemu's rbd driver) and
# nbdkit (its python plugin over python3-rbd), with fio's rbd engine and `rbd bench` (librbd
# directly, no NBD hop) as the ceiling, on a throw-away one-node MemStore cluster.
#
#   bench/rbd.sh OUTDIR            (env: ROUNDS=3 RUN_SECONDS=10 SIZE=256M BLKD=./blkd
#                                   WORKLOADS="randread-1 randread-4 randwrite-1 ..."
#                                   SERVERS="blkd blkd-noaio qemu-nbd nbdkit-py librbd"
#                                   AB="PARAM=VALUE ..." AB_OPTS="--blkd-option ..."
#                                   BLKD_PARAMS="PARAM=VALUE ..."
#                                   AB_BLKD=/path/to/other/blkd
#                                   CLIENT=fio|blkperf FLUSH_FIRST=1
#                                   QEMU_CACHE=writeback|none
#                                   CLUSTER_CPUS=0 GATEWAY_CPUS=1)
#
# Workloads (fio; NBD servers through fio's nbd engine): 4k random read and write
# at QD32 on 1 connection and on 4 (4 jobs x QD32), 64 KiB and 1 MiB sequential
# read and write at QD8.  Not run by default: randread-img8 and randwrite-img8,
# 4k at QD16 on 8 connections, each to an image of its own (IMG8_SIZE,
# default 64M), for blkd's servers only (one blkd serves many images; the
# others would need a process per image): what many open images cost, fio
# only.  Runs alternate: every round runs each workload once on
# every server, so a drift in the machine's load hits all of them alike.
#
# Per run: IOPS, MiB/s, and the server's CPU (utime+stime of all its threads,
# librbd's included, from /proc/PID/stat) per request.  The librbd-direct rows
# have no server: their CPU column is fio's process, librbd's threads included.
# The cluster's CPU per request (its daemons' ticks over the run) says what a
# route costs the OSD: not the same for every route when they batch ops
# differently.
# OUTDIR/rbd-threads.md splits each server's CPU and context switches per
# request by thread kind (/proc/PID/task/*): the server's own event loops
# (blkd.sN, qemu-nbd's main loop), blkd's workers (blkd.sN.wM), librados'
# messenger (msgr-worker-N), librbd's io_context_pool (its op and completion
# threads) and the rest (timers, ms_dispatch, log...).
#
# A knob's A/B: AB="dispatch=caller" adds a server blkd-ab, blkd
# with those plugin parameters added (any Ceph option works as one), and
# AB_OPTS="--poll-us 0" adds blkd options to it; it runs in every round
# beside blkd, on an image of its own.  AB_BLKD=DIR/blkd runs another build
# as blkd-ab (with the rbd plugin from DIR/plugins/rbd/, where blkd looks for
# its plugins): two commits side by side, AB and AB_OPTS still apply to it.
# BLKD_PARAMS="dispatch=caller" adds plugin parameters to every blkd server
# (blkd, blkd-ab, blkd-noaio), so an A/B can be made between two settings
# that both differ from the plugin's defaults.
# blkd runs twice: with its aio path (the default) and with aio=false (the
# plugin's synchronous calls on blkd's workers), so the extension's share is
# measured, not assumed.
#
# The NBD client: CLIENT=fio (default: fio's nbd engine, what users run) or
# CLIENT=blkperf (this project's client, which costs less CPU per request:
# RAND_READ/RAND_WRITE at the same depth and connections, STREAM_READ/
# STREAM_WRITE for the sequential rows); librbd-direct is always fio's rbd
# engine.  On a machine the OSD shares, what the client spends is CPU the
# OSD does not get, so the cheaper client says how much of the hop's cost
# is the client's.
#
# librbd's cache mode: with rbd_cache_writethrough_until_flush (librbd's
# default) an image's cache writes through until its client's first flush
# and is write-back (Ceph 16: writearound) after it.  fio's rbd engine
# leaves librbd in write-back mode (its rate is within a tenth of that with
# rbd_cache_writethrough_until_flush=false and more than halves with
# rbd_cache_policy=writethrough), and a real NBD client (the kernel, qemu)
# flushes; fio's nbd engine and blkperf send no flush in a write run, which
# would leave the NBD servers' librbd writing through alone.  So before
# every NBD run one flush goes to the server (python3-libnbd, on a
# connection held open through the run), as a real client's first fsync
# would (FLUSH_FIRST=0: none).
#
# Caches, as each server ships: qemu-nbd runs with its default cache mode,
# writeback, for which qemu's rbd driver keeps librbd's cache on; blkd,
# nbdkit's python plugin and fio's engine keep librbd's default (on,
# writethrough until the first flush).  So after the flush above all of
# them acknowledge writes as librbd's write-back cache does.
# QEMU_CACHE=none gives qemu-nbd --cache=none (librbd's cache off:
# rbd_cache=false), as runs before 2026-12-02 05:00 UTC had it;
# CEPH_ARGS=--rbd_cache=false turns it off for all of them.
#
# Random offsets are uniform, with repeats, for every route: fio runs with
# --norandommap, as blkperf draws them.  fio's random map (each block once
# per pass) falls back to the next free block as a pass fills, so late in
# each pass it writes neighbours of recent writes, and librbd's I/O
# scheduler (rbd_io_scheduler=simple) merges those into one object op:
# fio's rbd engine then sent 0.85 OSD ops per 4 KiB write and ran 1.17x the
# rate it runs with the map off (0.98 ops per write) or the scheduler off
# (1.00) (2026-12-02, docs/RBD.md).
#
# Images are created with only layering,exclusive-lock: with fast-diff (and the
# object map), qemu's rbd driver asks rbd_diff_iterate2 on every read, which is
# a different workload, not a slower server.  Each server gets its own image (one
# writer per exclusive lock: no lock bouncing between servers), all filled with
# data first, so no read is answered from a missing object.  fio's rbd engine
# with 4 jobs would be 4 librbd clients bouncing one image's lock, so the
# librbd-direct "4 connections" rows are 1 job at QD128 (the same depth).
#
# What bounds these figures: one MemStore OSD, its mon, the servers and fio all
# share this machine's CPUs; the OSD's CPU is usually the limit, so compare
# ratios from one invocation only, and publish nothing from a loaded machine.
#
# CLUSTER_CPUS and GATEWAY_CPUS (taskset CPU lists, both or neither) split
# the machine as a deployment does: the cluster's daemons on the first, and
# on the second what runs on the host that uses the image (every server,
# every client, fio's rbd engine and rbd bench), as rbd-nbd and the kernel's
# client share a compute host while the OSDs run elsewhere.  Then a route's
# extra CPU per request no longer comes out of the OSD's, and the per-CPU
# busy column says which side bounds each row.
# Prints each run, then per workload the median and the ratios to blkd;
# OUTDIR/rbd.md gets the table (with `uptime` before and after).
set -euo pipefail
TOP=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:?usage: bench/rbd.sh OUTDIR}
ROUNDS=${ROUNDS:-3}
SECS=${RUN_SECONDS:-10}
SIZE=${SIZE:-256M}
BLKD=${BLKD:-$TOP/blkd}
SO=$TOP/plugins/rbd/nbdkit-rbd-plugin.so
WORKLOADS=${WORKLOADS:-"randread-1 randread-4 randwrite-1 randwrite-4 read64k write64k read1m write1m"}
PY=/usr/bin/python3
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CLIENT=${CLIENT:-fio}
FLUSH_FIRST=${FLUSH_FIRST:-1}
QEMU_CACHE=${QEMU_CACHE:-writeback}
case $CLIENT in fio|blkperf) ;; *) echo "bench/rbd.sh: CLIENT must be fio or blkperf" >&2; exit 1 ;; esac
[ "$CLIENT" = fio ] || [ -x "$TOP/blkperf" ] || { echo "bench/rbd.sh: build blkperf first" >&2; exit 1; }
for b in fio qemu-nbd nbdkit rbd ceph-mon ceph-osd; do
  command -v "$b" >/dev/null || { echo "bench/rbd.sh: $b is not installed" >&2; exit 1; }
done
[ -x "$BLKD" ] && [ -f "$SO" ] || { echo "bench/rbd.sh: build blkd and the rbd plugin first" >&2; exit 1; }
grep -qx '[[:space:]]*rbd' <<<"$(fio --enghelp 2>/dev/null)" || { echo "fio has no rbd engine" >&2; exit 1; }

CLUSTER_CPUS=${CLUSTER_CPUS:-}
GATEWAY_CPUS=${GATEWAY_CPUS:-}
ON_CLUSTER=() ON_GATEWAY=()
if [ -n "$CLUSTER_CPUS$GATEWAY_CPUS" ]; then
  [ -n "$CLUSTER_CPUS" ] && [ -n "$GATEWAY_CPUS" ] \
    || { echo "bench/rbd.sh: set both CLUSTER_CPUS and GATEWAY_CPUS, or neither" >&2; exit 1; }
  ON_CLUSTER=(taskset -c "$CLUSTER_CPUS")
  ON_GATEWAY=(taskset -c "$GATEWAY_CPUS")
fi

W=$(mktemp -d /tmp/blkd-bench-rbd.XXXXXX)
PIDS=()
HOLDER=                               # the flush's connection (run), while it is open
finish() {
  local p
  for p in "${PIDS[@]}" $HOLDER; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  "$TOP/tests/rbd/cluster.sh" stop "$W/ceph" || true
  rm -rf "$W"
}
trap finish EXIT

{ echo "uptime before: $(uptime)"
  [ -z "$CLUSTER_CPUS" ] || echo "cluster on CPUs $CLUSTER_CPUS, servers and clients on CPUs $GATEWAY_CPUS"
} | tee "$OUT/rbd.uptime"

SERVERS=${SERVERS:-"blkd blkd-noaio qemu-nbd nbdkit-py librbd"}
AB=${AB:-}
AB_OPTS=${AB_OPTS:-}
AB_BLKD=${AB_BLKD:-}
AB_SO=$SO
if [ -n "$AB_BLKD" ]; then
  AB_SO=$(dirname "$AB_BLKD")/plugins/rbd/nbdkit-rbd-plugin.so
  [ -x "$AB_BLKD" ] && [ -f "$AB_SO" ] || { echo "bench/rbd.sh: no $AB_BLKD or $AB_SO" >&2; exit 1; }
fi
if [ -n "$AB$AB_OPTS$AB_BLKD" ]; then
  s2="blkd blkd-ab"
  for s in $SERVERS; do case $s in blkd|blkd-ab) ;; *) s2="$s2 $s" ;; esac; done
  SERVERS=$s2
fi
has() { case " $SERVERS " in *" $1 "*) return 0 ;; esac; return 1; }
IMG8_SIZE=${IMG8_SIZE:-64M}
case " $WORKLOADS " in *-img8" "*) IMG8=1 ;; *) IMG8=0 ;; esac
[ "$IMG8" = 0 ] || [ "$CLIENT" = fio ] || { echo "bench/rbd.sh: the -img8 workloads run with fio only" >&2; exit 1; }

# MemStore keeps every image, written in full, in memory and hangs writes once its
# device is full: twice what the images take, at least 3 GiB.  (rbd reads a
# size without a unit as MiB, numfmt and fio as bytes: a unit is required.)
for v in "$SIZE" "$IMG8_SIZE"; do
  case $v in *[KMGT]) ;; *) echo "bench/rbd.sh: sizes need a unit (K, M, G, T): $v" >&2; exit 1 ;; esac
done
need=0
for s in $SERVERS; do
  need=$((need + $(numfmt --from=iec "$SIZE")))
  if [ "$IMG8" = 1 ]; then
    case $s in blkd*) need=$((need + 8 * $(numfmt --from=iec "$IMG8_SIZE"))) ;; esac
  fi
done
cluster_bytes=$((2 * need > (3 << 30) ? 2 * need : (3 << 30)))
RBD_CLUSTER_BYTES=$cluster_bytes "${ON_CLUSTER[@]}" "$TOP/tests/rbd/cluster.sh" start "$W/ceph"
export CEPH_CONF=$W/ceph/ceph.conf

fill_image() {
  timeout 60 rbd create --size "$2" --image-feature layering,exclusive-lock "$1"
  timeout 600 rbd bench --io-type write --io-size 4M --io-pattern seq --io-total "$2" "$1" >/dev/null
}
for s in $SERVERS; do
  fill_image "img-$s" "$SIZE"
  case $s in
    blkd*) if [ "$IMG8" = 1 ]; then for k in 0 1 2 3 4 5 6 7; do fill_image "img-$s-$k" "$IMG8_SIZE"; done; fi ;;
  esac
done

# start NAME CMD...: a server on a port of its own; NAME's port and pid.
declare -A PORT=() SPID=()
free_port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start() {
  local name=$1 port i; shift
  port=$(free_port)
  "${ON_GATEWAY[@]}" "${@//@PORT@/$port}" >"$W/$name.log" 2>&1 &
  PIDS+=("$!"); SPID[$name]=$!; PORT[$name]=$port
  for ((i = 0; i < 200; i++)); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    kill -0 "${SPID[$name]}" 2>/dev/null || break
    sleep 0.1
  done
  cat "$W/$name.log" >&2; echo "bench/rbd.sh: $name did not start" >&2; exit 1
}
BLKD_PARAMS=${BLKD_PARAMS:-}
# shellcheck disable=SC2086 # AB, AB_OPTS and BLKD_PARAMS are word lists
has blkd && start blkd "$BLKD" -f -i 127.0.0.1 -p @PORT@ "$SO" conf="$CEPH_CONF" image=img-blkd \
  $BLKD_PARAMS
# shellcheck disable=SC2086
has blkd-ab && start blkd-ab "${AB_BLKD:-$BLKD}" -f -i 127.0.0.1 -p @PORT@ $AB_OPTS "$AB_SO" conf="$CEPH_CONF" \
  image=img-blkd-ab $BLKD_PARAMS $AB
# shellcheck disable=SC2086
has blkd-noaio && start blkd-noaio "$BLKD" -f -i 127.0.0.1 -p @PORT@ "$SO" conf="$CEPH_CONF" \
  image=img-blkd-noaio $BLKD_PARAMS aio=false
# qemu-nbd: --shared=8 lets the 4-connection runs in.
has qemu-nbd && start qemu-nbd qemu-nbd --persistent -b 127.0.0.1 -p @PORT@ -f raw --shared=8 \
  --cache="$QEMU_CACHE" --aio=threads "rbd:rbd/img-qemu-nbd:conf=$CEPH_CONF"
has nbdkit-py && start nbdkit-py nbdkit -f -i 127.0.0.1 -p @PORT@ python "$TOP/bench/nbdkit-rbd.py" \
  conf="$CEPH_CONF" image=img-nbdkit-py

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# cluster_ticks: the cluster's daemons' CPU ticks so far (mon and OSD; a mgr
# too, if one was started).
cluster_ticks() {
  local f n=0 t
  for f in "$W"/ceph/run/*.pid; do
    t=$(cpu_ticks "$(cat "$f")" 2>/dev/null) && n=$((n + t))
  done
  echo "$n"
}
# thread_snap PID FILE: per thread, its kind, id, CPU ticks and context switches.
thread_snap() {
  local t comm ticks cs
  for t in /proc/"$1"/task/*; do
    comm=$(cat "$t/comm" 2>/dev/null) || continue
    ticks=$(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{ print $12 + $13 }') || continue
    cs=$(awk '/ctxt_switches/ { n += $2 } END { print n + 0 }' "$t/status" 2>/dev/null) || continue
    case $comm in
      blkd.s*.w*) echo "workers ${t##*/} $ticks $cs" ;;
      blkd.s*|qemu-nbd|nbdkit) echo "loop ${t##*/} $ticks $cs" ;;
      msgr-worker-*) echo "msgr ${t##*/} $ticks $cs" ;;
      io_context_poo*) echo "librbd-io ${t##*/} $ticks $cs" ;;
      *) echo "other ${t##*/} $ticks $cs" ;;
    esac
  done >"$2"
}
HZ=$(getconf CLK_TCK)
NCPU=$(getconf _NPROCESSORS_ONLN)   # /proc/stat's "cpu" line: every online CPU
# busy_ticks: the machine's busy and total CPU ticks so far, as BUSY:TOTAL,
# then each CPU's, all comma-separated.
busy_ticks() {
  awk '/^cpu/ { t = 0; for (i = 2; i <= 9; i++) t += $i; printf "%s%d:%d", sep, t - $5 - $6, t; sep = "," }
       END { print "" }' /proc/stat
}

# fio_args WORKLOAD: rw, bs, iodepth, numjobs.
fio_args() {
  case $1 in
    randread-1) echo "randread 4k 32 1" ;;  randread-4) echo "randread 4k 32 4" ;;
    randwrite-1) echo "randwrite 4k 32 1" ;; randwrite-4) echo "randwrite 4k 32 4" ;;
    read64k) echo "read 64k 8 1" ;;  write64k) echo "write 64k 8 1" ;;
    read1m) echo "read 1m 8 1" ;;    write1m) echo "write 1m 8 1" ;;
    randread-img8) echo "randread 4k 16 8" ;; randwrite-img8) echo "randwrite 4k 16 8" ;;
    *) echo "unknown workload $1" >&2; exit 1 ;;
  esac
}

# blkperf_run SERVER RW BS QD JOBS: the same load from blkperf (JOBS
# connections), its counts written as fio's JSON would have them, so the
# rest of run() reads one format.  One iteration (no -i): blkperf's JSON
# sums counts over iterations but gives elapsed_s per iteration.
blkperf_run() {
  local s=$1 rw=$2 bs=$3 qd=$4 jobs=$5 t
  case $rw in
    randread) t=RAND_READ ;; randwrite) t=RAND_WRITE ;;
    read) t=STREAM_READ ;; write) t=STREAM_WRITE ;;
  esac
  /usr/bin/time -f "%U %S" -o "$W/time.out" \
    "${ON_GATEWAY[@]}" "$TOP/blkperf" -t "$t" -b "$bs" -q "$qd" -C "$jobs" -l "$SECS" -w 1 --quiet --json \
      "nbd://127.0.0.1:${PORT[$s]}/" >"$W/blkperf.json" 2>"$W/fio.err" \
    || { cat "$W/fio.err" >&2; echo "bench/rbd.sh: blkperf failed ($s $rw)" >&2; exit 1; }
  $PY - "$W/blkperf.json" "$W/fio.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
if j["errors"]:
    sys.exit("blkperf counted %d errors" % j["errors"])
side = lambda n: {"total_ios": n, "iops": n / j["elapsed_s"],
                  "bw_bytes": j["bytes"] * n / max(j["requests"], 1) / j["elapsed_s"]}
json.dump({"jobs": [{"read": side(j["reads"]), "write": side(j["writes"])}]}, open(sys.argv[2], "w"))
EOF
}

# run SERVER WORKLOAD: one fio run; appends "server workload iops mibs cpu_us
# client_us busy" to results.  CPU: the server's ticks over the run; for
# librbd-direct, fio's own process (its librbd threads included), from
# /usr/bin/time.  client_us: fio's own CPU per request (for NBD servers, the
# hop's client); busy: how many of the machine's CPUs were busy over the run
# (/proc/stat), which says whether the OSD, server and client together
# filled the machine.
run() {
  local s=$1 wl=$2 rw bs qd jobs eng t0 t1 pid cpu ccpu b0 b1 c0 c1 size=$SIZE k
  local uris=("nbd://127.0.0.1:${PORT[$s]:-}/")
  read -r rw bs qd jobs <<<"$(fio_args "$wl")"
  case $wl in
    *-img8)
      case $s in blkd*) ;; *) return 0 ;; esac
      uris=(); for k in 0 1 2 3 4 5 6 7; do uris+=("nbd://127.0.0.1:${PORT[$s]}/img-$s-$k"); done
      size=$IMG8_SIZE ;;
  esac
  if [ "$s" = librbd ]; then
    [ "$jobs" = 4 ] && { qd=$((qd * 4)); jobs=1; }
    eng=(--name="$s-$wl" --ioengine=rbd --clientname=admin --pool=rbd --rbdname=img-librbd --numjobs="$jobs")
  elif [ ${#uris[@]} = 1 ]; then
    eng=(--name="$s-$wl" --ioengine=nbd --uri="${uris[0]}" --numjobs="$jobs")
  else                                # a job per image, each with its own connection
    eng=(--ioengine=nbd)
    for k in "${!uris[@]}"; do eng+=(--name="$s-$wl-$k" --uri="${uris[$k]}"); done
  fi
  pid=${SPID[$s]:-}
  # The flush's connection stays open through the run: blkd closes an
  # image when its last connection goes, and a reopened image writes
  # through again until its next flush.
  local i
  if [ "$s" != librbd ] && [ "$FLUSH_FIRST" = 1 ]; then
    rm -f "$W/flushed"
    "${ON_GATEWAY[@]}" $PY -c 'import nbd, sys, time
hs = []
for u in sys.argv[2:]:
    h = nbd.NBD(); h.connect_uri(u); h.flush(); hs.append(h)
open(sys.argv[1], "w").close()
time.sleep(3600)' "$W/flushed" "${uris[@]}" &
    HOLDER=$!
    for ((i = 0; i < 600; i++)); do
      [ -e "$W/flushed" ] && break
      kill -0 "$HOLDER" 2>/dev/null || break
      sleep 0.1
    done
    [ -e "$W/flushed" ] || { echo "bench/rbd.sh: the flush before $s $wl failed" >&2; exit 1; }
  fi
  t0=$([ -n "$pid" ] && cpu_ticks "$pid" || echo 0)
  [ -z "$pid" ] || thread_snap "$pid" "$W/threads0"
  b0=$(busy_ticks)
  c0=$(cluster_ticks)
  if [ "$s" != librbd ] && [ "$CLIENT" = blkperf ]; then
    blkperf_run "$s" "$rw" "$bs" "$qd" "$jobs"
  else
    /usr/bin/time -f "%U %S" -o "$W/time.out" \
      "${ON_GATEWAY[@]}" fio --rw="$rw" --bs="$bs" --iodepth="$qd" --norandommap \
        --size="$size" --time_based --runtime="$SECS" --ramp_time=1 --group_reporting \
        --output-format=json --output="$W/fio.json" "${eng[@]}" >/dev/null 2>"$W/fio.err" \
      || { cat "$W/fio.err" >&2; echo "bench/rbd.sh: fio failed ($s $wl)" >&2; exit 1; }
  fi
  b1=$(busy_ticks)
  c1=$(cluster_ticks)
  if [ -n "$HOLDER" ]; then kill "$HOLDER" 2>/dev/null; wait "$HOLDER" 2>/dev/null || true; HOLDER=; fi
  ccpu=$(awk '{ print $1 + $2 }' "$W/time.out")
  if [ -n "$pid" ]; then
    t1=$(cpu_ticks "$pid")
    thread_snap "$pid" "$W/threads1"
    cpu=$(echo "($t1 - $t0) / $HZ" | bc -l)
  else
    cpu=$ccpu
    : >"$W/threads0"; : >"$W/threads1"
  fi
  # Per thread kind: CPU us and context switches per request, and how many
  # of its threads ran at all, over the threads that lived through the run.
  $PY - "$W/fio.json" "$s" "$wl" "$HZ" "$W/threads0" "$W/threads1" <<'EOF' >>"$W/threads"
import json, sys
from collections import defaultdict
f, s, wl, hz, a, b = sys.argv[1:7]
j = json.load(open(f))["jobs"][0]
ios = max(j["read"]["total_ios"] + j["write"]["total_ios"], 1)
def load(p):
    return {tid: (k, int(t), int(c)) for k, tid, t, c in (l.split() for l in open(p))}
t0, t1 = load(a), load(b)
d = defaultdict(lambda: [0, 0, 0])
for tid, (k, t, c) in t1.items():
    if tid in t0:
        dt, dc = t - t0[tid][1], c - t0[tid][2]
        d[k][0] += dt; d[k][1] += dc; d[k][2] += dt > 0 or dc > 0
for k, (t, c, n) in d.items():
    print(s, wl, k, "%.2f" % (t / int(hz) * 1e6 / ios), "%.3f" % (c / ios), n)
EOF
  # The CPU covers the whole run (ramp included), the requests only those
  # after the ramp: a slight overestimate, the same for every server.
  $PY - "$W/fio.json" "$s" "$wl" "$cpu" "$ccpu" "$b0" "$b1" "$NCPU" "$(((c1 - c0)))" "$HZ" <<'EOF' \
    | tee -a "$W/results"
import json, sys
f, s, wl = sys.argv[1:4]
cpu, ccpu = float(sys.argv[4]), float(sys.argv[5])
a, b = ([[int(x) for x in c.split(":")] for c in v.split(",")] for v in sys.argv[6:8])
j = json.load(open(f))["jobs"][0]
ios = max(j["read"]["total_ios"] + j["write"]["total_ios"], 1)
iops = j["read"]["iops"] + j["write"]["iops"]
mibs = (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 2**20
frac = [(u1 - u0) / max(t1 - t0, 1) for (u0, t0), (u1, t1) in zip(a, b)]
busy = frac[0] * int(sys.argv[8])
clcpu = int(sys.argv[9]) / int(sys.argv[10])
print("%s %s %.0f %.1f %.1f %.1f %.2f %s %.1f" % (s, wl, iops, mibs, cpu * 1e6 / ios, ccpu * 1e6 / ios, busy,
                                                "/".join("%.2f" % x for x in frac[1:]), clcpu * 1e6 / ios))
EOF
}

: >"$W/results"
: >"$W/threads"
for ((r = 1; r <= ROUNDS; r++)); do
  echo "--- round $r of $ROUNDS"
  for wl in $WORKLOADS; do
    for s in $SERVERS; do run "$s" "$wl"; done
  done
done

# rbd bench on the same cluster: librbd's own tool, 4k random, 32 threads.
has librbd && for t in read write; do
  ops=$(timeout 300 "${ON_GATEWAY[@]}" rbd bench --io-type "$t" --io-size 4K --io-threads 32 --io-pattern rand \
        --io-total $((SECS * 8000 * 4096)) img-librbd 2>/dev/null \
        | sed -nE 's/.*elapsed: *[0-9.]+ +ops: *[0-9]+ +ops\/sec: *([0-9.]+).*/\1/p')
  echo "rbd-bench rand$t-1 ${ops:-0} $(echo "${ops:-0} * 4 / 1024" | bc -l | xargs printf '%.1f') 0 0 0 0 0" \
    | tee -a "$W/results"
done
echo "uptime after: $(uptime)" | tee -a "$OUT/rbd.uptime"

$PY - "$W/results" "$OUT/rbd.md" "$ROUNDS" "$SECS" "$OUT/rbd.uptime" "$NCPU" <<'EOF'
import statistics, sys
from collections import defaultdict
res, out, rounds, secs, up = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
NCPU = int(sys.argv[6])
runs = defaultdict(list)
for line in open(res):
    s, wl, iops, mibs, cpu, ccpu, busy, percpu, clcpu = line.split()
    runs[(wl, s)].append((float(iops), float(mibs), float(cpu), float(ccpu), float(busy),
                          [float(x) for x in percpu.split("/")], float(clcpu)))
wls = list(dict.fromkeys(k[0] for k in runs))
servers = list(dict.fromkeys(k[1] for k in runs))
lines = ["# rbd: NBD servers over one MemStore OSD (bench/rbd.sh)", "",
         "%s rounds of %s s, medians; ratios against blkd (aio path)." % (rounds, secs),
         "Only ratios from one run mean anything; the OSD shares the machine's CPUs.", "",
         "```", open(up).read().strip(), "```", "",
         "client CPU: fio's own per request (for librbd, fio is the whole client and",
         "its server); CPUs busy: of the machine's %d, over the run, and each CPU's" % NCPU,
         "share busy (cpu0/cpu1/...); cluster CPU: its daemons' (mon, OSD) per request.", "",
         "| workload | server | IOPS | MiB/s | server CPU us/request | client CPU us/request "
         "| cluster CPU us/request | CPUs busy | per CPU | IOPS vs blkd | CPU vs blkd |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
for wl in wls:
    base = runs.get((wl, "blkd"))
    bi = statistics.median(r[0] for r in base) if base else 0
    bc = statistics.median(r[2] for r in base) if base else 0
    for s in servers:
        if (wl, s) not in runs:
            continue
        v = runs[(wl, s)]
        i, m, c, cc, busy = (statistics.median(r[k] for r in v) for k in range(5))
        ncpu = min(len(r[5]) for r in v)
        pc = "/".join("%.2f" % statistics.median(r[5][k] for r in v) for k in range(ncpu)) or "-"
        ri = "%.2f" % (i / bi) if bi else "-"
        rc = "%.2f" % (c / bc) if bc and c and s not in ("librbd", "rbd-bench") else "-"
        cs = "%.1f" % c if s != "rbd-bench" else "-"
        ccs = "%.1f" % cc if s not in ("librbd", "rbd-bench") else "-"
        bs = "%.2f" % busy if s != "rbd-bench" else "-"
        cl = "%.1f" % statistics.median(r[6] for r in v)
        if s == "rbd-bench":
            pc = cl = "-"
        lines.append("| %s | %s | %.0f | %.1f | %s | %s | %s | %s | %s | %s | %s |"
                     % (wl, s, i, m, cs, ccs, cl, bs, pc, ri, rc))
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF

# Per thread kind, medians over the rounds: where each server's CPU per request goes.
$PY - "$W/threads" "$OUT/rbd-threads.md" "$OUT/rbd.uptime" <<'EOF'
import statistics, sys
from collections import defaultdict
res, out, up = sys.argv[1:4]
v = defaultdict(list)
for line in open(res):
    s, wl, k, us, cs, n = line.split()
    v[(wl, s, k)].append((float(us), float(cs), int(n)))
kinds = ["loop", "workers", "msgr", "librbd-io", "other"]
rows = list(dict.fromkeys((wl, s) for wl, s, _ in v))
lines = ["# rbd: server CPU per request by thread kind (bench/rbd.sh)", "",
         "Medians over the rounds: CPU us per request (context switches per request)",
         "[threads of that kind that ran].",
         "", "```", open(up).read().strip(), "```", "",
         "| workload | server | " + " | ".join(kinds) + " | total |",
         "|---" * (len(kinds) + 3) + "|"]
for wl, s in rows:
    cells, tu, tc = [], 0.0, 0.0
    for k in kinds:
        r = v.get((wl, s, k))
        if not r:
            cells.append("-")
            continue
        us = statistics.median(x[0] for x in r); cs = statistics.median(x[1] for x in r)
        tu += us; tc += cs
        cells.append("%.1f (%.2f) [%d]" % (us, cs, max(x[2] for x in r)))
    lines.append("| %s | %s | %s | %.1f (%.2f) |" % (wl, s, " | ".join(cells), tu, tc))
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
