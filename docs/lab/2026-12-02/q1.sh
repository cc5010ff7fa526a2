#!/usr/bin/env bash
set -u
cd /work/main
Q=/work/notes/s10/quiet
log() { echo "=== $(date -u +%H:%M:%S) $* | $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $Q/times.log; }
step() { local name=$1; shift; log "start $name"; timeout 1500 "$@" > $Q/$name.out 2>&1; echo "rc=$?" >> $Q/$name.out; log "end $name"; }
step rbdnb env ROUNDS=2 RUN_SECONDS=6 AB="rbd_non_blocking_aio=false" SERVERS="blkd qemu-nbd librbd" \
  WORKLOADS="randread-1 randread-4 randwrite-1 randwrite-4" bench/rbd.sh $Q/rbdnb
log done
