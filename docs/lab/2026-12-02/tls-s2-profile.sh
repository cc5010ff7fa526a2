#!/bin/bash
# profile blkd and nbdkit serving 256 KiB TLS reads to blkperf, pinned apart
cd /work/main
T=$(mktemp -d /tmp/tlsprof.XXXX)
. tests/helpers/tls.sh
make_tls_material $T/tls >/dev/null 2>&1
OUT=/work/notes/s11/tlsprof; mkdir -p $OUT
for srv in blkd nbdkit; do
  port=$((20000 + RANDOM % 1000))
  if [ $srv = blkd ]; then taskset -c 1 ./blkd -f -i 127.0.0.1 -p $port --tls=require --tls-certificates=$T/tls/server memory 1G > $T/$srv.log 2>&1 &
  else taskset -c 1 nbdkit -f -i 127.0.0.1 -p $port --tls=require --tls-certificates=$T/tls/server memory 1G > $T/$srv.log 2>&1 & fi
  pid=$!; sleep 1
  URI="nbds://127.0.0.1:$port/?tls-certificates=$T/tls/client-ca"
  nbdcopy -- [ nbdkit pattern 1G ] "$URI"
  taskset -c 0 ./blkperf -t STREAM_READ -b 256k -l 12 --quiet "$URI" > $OUT/$srv-blkperf.txt 2>&1 &
  bp=$!
  sleep 2
  perf record -q -g -o $T/$srv.data -p $pid -- sleep 6 2>/dev/null
  perf stat -x, -o $OUT/$srv.stat -e raw_syscalls:sys_enter,context-switches,task-clock -p $pid -- sleep 2 2>/dev/null
  wait $bp
  perf report -q --stdio --no-children --percent-limit 0.7 -g none -i $T/$srv.data > $OUT/$srv.report 2>/dev/null
  perf report -q --stdio --no-children --sort dso --percent-limit 0.5 -g none -i $T/$srv.data > $OUT/$srv.dso 2>/dev/null
  kill $pid; wait $pid
done
rm -rf $T
