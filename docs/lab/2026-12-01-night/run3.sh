#!/usr/bin/env bash
set -u
Q=/work/notes/s9/quiet
while ! grep -q " done " $Q/times.log; do sleep 3; done
cd /work/main
log() { echo "=== $(date -u +%H:%M:%S) $* | $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $Q/times.log; }
log "start tls-s1"; SIZE=1G PIN=1 REQ=262144 BASE=/tmp/tlsw/blkd-s1 timeout 300 bench/tls.sh 3 > $Q/tls-s1.out 2>&1; log "end tls-s1"
log "start tls-nopoll"; SIZE=1G PIN=1 REQ=262144 BASE=/tmp/tlsw/blkd-nopoll timeout 300 bench/tls.sh 3 > $Q/tls-nopoll.out 2>&1; log "end tls-nopoll"
R=/work/notes/s9/fulltest2; mkdir -p $R
rm -rf /tmp/ci3 && git clone -q /work/main /tmp/ci3 && cd /tmp/ci3
run() { local n=$1; shift; echo "=== $(date -u +%H:%M:%S) start $n" >> $R/times.log; "$@" > $R/$n.log 2>&1; echo "=== $(date -u +%H:%M:%S) end $n rc=$?" >> $R/times.log; }
run check make check -j2 NO_DEPS=1 WERROR=1
run rbd make rbd-check NO_DEPS=1
run vm make vm-check NO_DEPS=1
run clean make clean
run checksan make check -j2 NO_DEPS=1 SANITIZE=1
echo "=== $(date -u +%H:%M:%S) all done" >> $R/times.log
