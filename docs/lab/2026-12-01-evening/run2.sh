#!/usr/bin/env bash
set -u
cd /work/main
Q=/work/notes/s8/quiet
while pgrep -f quiet.sh >/dev/null; do sleep 5; done
log() { echo "=== $(date -u +%H:%M:%S) $* | $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $Q/times.log; }
step() { local name=$1; shift; log "start $name"; timeout 1200 "$@" > $Q/$name.out 2>&1; echo "rc=$?" >> $Q/$name.out; log "end $name"; }
step blkperf4k python3 bench/anchors.py --part targets --clients blkperf --workloads "4k randread QD32,4k randwrite QD32" \
  --servers "nbdkit memory,blkd memory,blkd ram" --rounds 3 --seconds 4 --out $Q/blkperf4k.md --json $Q/blkperf4k.json
step rbdpoll env ROUNDS=2 RUN_SECONDS=6 SERVERS="blkd qemu-nbd" AB_OPTS="--poll-us 0" \
  WORKLOADS="randread-1 randread-4 randwrite-1 randwrite-4" bench/rbd.sh $Q/rbdpoll
log done2
