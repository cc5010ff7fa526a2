#!/usr/bin/env bash
# Quiet runs after the day's merges (c143c4c), the build before them in /tmp/before.
set -u
cd /work/main
Q=/work/notes/s10/quiet
B=/tmp/before/blkd
log() { echo "=== $(date -u +%H:%M:%S) $* | $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $Q/times.log; }
step() { local name=$1; shift; log "start $name"; timeout 1500 "$@" > $Q/$name.out 2>&1; echo "rc=$?" >> $Q/$name.out; log "end $name"; }
make -j2 all > $Q/build.out 2>&1
log "built $(git rev-parse --short HEAD)"
step qd4w python3 bench/per-request.py --client blkperf --rw randwrite --bs 4k --iodepth 4 --seconds 3 --rounds 6 nbdkit "$B --poll-us 0" "./blkd --poll-us 0"
step qd4r python3 bench/per-request.py --client blkperf --rw randread --bs 4k --iodepth 4 --seconds 3 --rounds 6 nbdkit "$B --poll-us 0" "./blkd --poll-us 0"
step qd4wd python3 bench/per-request.py --client blkperf --rw randwrite --bs 4k --iodepth 4 --seconds 3 --rounds 6 nbdkit $B ./blkd
step write make bench-write NO_DEPS=1 ROUNDS=5 SECONDS=4 ANCHORS_ARGS="--blkd 'reno=./blkd --tcp-congestion reno' --blkd 'before=$B'"
cp build/bench-write.md $Q/bench-write2.md 2>/dev/null
step kernel env ROUNDS=2 SECONDS_PER_RUN=6 CONNS="1 4" VARIANTS="before=$B" \
  SERVERS="blkd-memory blkd-memory.before blkd-ram blkd-ram.before nbdkit-memory" \
  JOBS="randwrite4k-qd32 randread4k-qd32 write128k read1m" bench/kernel.sh $Q/kernel
step rbd env ROUNDS=2 RUN_SECONDS=6 AB_BLKD=$B SERVERS="blkd qemu-nbd librbd" \
  WORKLOADS="randread-1 randread-4 randwrite-1 randwrite-4" bench/rbd.sh $Q/rbd
log done
