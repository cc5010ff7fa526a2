#!/usr/bin/env bash
# The session's quiet benchmark runs, one after another, with the load recorded before each.
set -u
cd /work/main
Q=/work/notes/s9/quiet
BEFORE=/tmp/before/blkd
log() { echo "=== $(date -u +%H:%M:%S) $* | $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $Q/times.log; }
step() { local name=$1; shift; log "start $name"; timeout 1500 "$@" > $Q/$name.out 2>&1; echo "rc=$?" >> $Q/$name.out; log "end $name"; }
fio4k() { step fio4k-$1 python3 bench/anchors.py --part targets --clients fio --workloads "4k randread QD32" \
  --servers "nbdkit memory,blkd memory" --rounds 3 --seconds 4 --out $Q/fio4k-$1.md --json $Q/fio4k-$1.json; }
step rb4k python3 bench/per-request.py --client blkperf --rw randread --bs 4k --iodepth 32 --rounds 5 --seconds 4 "./blkd --reply-batch 8" ./blkd nbdkit
step rb4kw python3 bench/per-request.py --client blkperf --rw randwrite --bs 4k --iodepth 32 --rounds 5 --seconds 4 "./blkd --reply-batch 8" ./blkd nbdkit
step rb4k16 python3 bench/per-request.py --client blkperf --rw randread --bs 4k --iodepth 16 --rounds 3 --seconds 4 "./blkd --reply-batch 8" ./blkd
step rb256w python3 bench/per-request.py --client blkperf --rw write --bs 256k --iodepth 16 --rounds 5 --seconds 4 "./blkd --reply-batch 8" ./blkd
step blkperf4k python3 bench/anchors.py --part targets --clients blkperf --workloads "4k randread QD32,4k randwrite QD32" \
  --servers "nbdkit memory,blkd memory,blkd ram" --rounds 3 --seconds 4 --blkd before=$BEFORE --out $Q/blkperf4k.md --json $Q/blkperf4k.json
fio4k 1
step write make bench-write NO_DEPS=1 ROUNDS=5 SECONDS=4 ANCHORS_ARGS="--blkd before=$BEFORE"
cp build/bench-write.md $Q/bench-write.md 2>/dev/null; cp build/bench-write.json $Q/bench-write.json 2>/dev/null
step tls env SIZE=1G PIN=1 bench/tls.sh 3
fio4k 2
step rbd env ROUNDS=2 RUN_SECONDS=6 AB_BLKD=$BEFORE SERVERS="blkd qemu-nbd librbd" \
  WORKLOADS="randread-1 randread-4 randwrite-1 randwrite-4 read64k read1m" bench/rbd.sh $Q/rbd
step kernel env ROUNDS=2 SECONDS_PER_RUN=6 CONNS="1 4" SERVERS="blkd-memory blkd-ram nbdkit-memory" \
  JOBS="randread4k-qd32 randwrite4k-qd32 read128k write128k read1m write1m" bench/kernel.sh $Q/kernel
log done
