#!/usr/bin/env bash
# The session's quiet benchmark runs, one after another, with the load recorded before each.
set -u
cd /work/main
Q=/work/notes/s8/quiet
BEFORE=/work/wt-before/blkd
log() { echo "=== $(date -u +%H:%M:%S) $* | $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $Q/times.log; }
step() { local name=$1; shift; log "start $name"; timeout 1500 "$@" > $Q/$name.out 2>&1; echo "rc=$?" >> $Q/$name.out; log "end $name"; }
fio4k() { step fio4k-$1 python3 bench/anchors.py --part targets --clients fio --workloads "4k randread QD32" \
  --servers "nbdkit memory,blkd memory" --rounds 3 --seconds 4 --out $Q/fio4k-$1.md --json $Q/fio4k-$1.json; }
fio4k 1
step layers env ROUNDS=3 LEN=4 BLKD_BASE=$BEFORE OUT=$Q/layers bench/layers.sh
step write make bench-write NO_DEPS=1 ROUNDS=5 SECONDS=4 ANCHORS_ARGS="--blkd before=$BEFORE"
cp build/bench-write.md $Q/bench-write.md 2>/dev/null
fio4k 2
step perreq-write python3 bench/per-request.py --client blkperf --rw write --bs 256k --iodepth 16 nbdkit ./blkd
step perreq-read python3 bench/per-request.py --client blkperf --rw read --bs 256k --iodepth 16 nbdkit ./blkd
step tls4k env SIZE=1G bench/tls.sh 3
fio4k 3
step rbd env ROUNDS=2 RUN_SECONDS=6 AB="rbd_non_blocking_aio=false" SERVERS="blkd qemu-nbd librbd" \
  WORKLOADS="randread-1 randread-4 randwrite-1 randwrite-4 read1m" bench/rbd.sh $Q/rbd
fio4k 4
step kernel env ROUNDS=1 SECONDS_PER_RUN=6 CONNS="1 4" SERVERS="blkd-memory blkd-ram nbdkit-memory" \
  JOBS="randread4k-qd32 randwrite4k-qd32 read128k read1m write1m" bench/kernel.sh $Q/kernel
fio4k 5
log done
