#!/usr/bin/env bash
set -u
Q=/work/notes/s9/quiet
while ! grep -q "all done" /work/notes/s9/fulltest2/times.log; do sleep 3; done
sleep 15
cd /work/main
log() { echo "=== $(date -u +%H:%M:%S) $* | $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $Q/times.log; }
log "start tls-rec"; SIZE=1G PIN=1 BASE=/tmp/tlsrec/blkd timeout 300 bench/tls.sh 3 > $Q/tls-rec.out 2>&1; log "end tls-rec"
log "start kernel-rb0"; VARIANTS="rb0=$PWD/blkd --reply-batch 0" ROUNDS=2 SECONDS_PER_RUN=6 CONNS="1 4" \
  SERVERS="blkd-memory blkd-memory.rb0 nbdkit-memory" JOBS="randwrite4k-qd32 read1m" timeout 600 bench/kernel.sh $Q/kernel-rb0 > $Q/kernel-rb0.out 2>&1; log "end kernel-rb0"
log "ab done"
