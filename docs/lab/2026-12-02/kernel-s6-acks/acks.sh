#!/bin/bash
# Count the server's outgoing segments (pure ACKs vs data) per request in the kernel bench.
OUT=${1:-build/kernel-acks}
mkdir -p $OUT
cd "$(dirname "$0")/../../../.."
( for i in $(seq 1 600); do
    ns=$(ip netns list 2>/dev/null | awk '/blkd-bench-/{print $1; exit}')
    if [ -n "$ns" ]; then
      echo "T $(date +%s.%N)"; ip netns exec $ns ss -tinpH state established 2>/dev/null
    fi
    sleep 1
  done ) > $OUT/ss.log 2>&1 &
SP=$!
ROUNDS=${ROUNDS:-1} SECONDS_PER_RUN=6 CONNS="1" JOBS="${JOBS:-randwrite4k-qd32}" SERVERS="${SERVERS:-blkd-memory nbdkit-memory}" bench/kernel.sh $OUT > $OUT/run.log 2>&1
kill $SP
