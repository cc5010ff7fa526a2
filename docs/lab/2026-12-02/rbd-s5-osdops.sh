#!/usr/bin/env bash
# OSD ops and CPU per client write: blkd+blkperf against fio's rbd engine, cluster on CPU 0.
set -euo pipefail
TOP=/work/main
W=$(mktemp -d /tmp/osdops.XXXXXX)
trap 'kill $BP 2>/dev/null; wait 2>/dev/null; $TOP/tests/rbd/cluster.sh stop $W/ceph; rm -rf $W' EXIT
BP=
RBD_CLUSTER_BYTES=$((3<<30)) taskset -c 0 $TOP/tests/rbd/cluster.sh start $W/ceph
export CEPH_CONF=$W/ceph/ceph.conf
for i in a b; do rbd create --size 256M --image-feature layering,exclusive-lock img-$i; rbd bench --io-type write --io-size 4M --io-pattern seq --io-total 256M img-$i >/dev/null; done
dump() { ceph daemon $W/ceph/run/osd.0.asok perf dump | /usr/bin/python3 -c '
import json,sys; d=json.load(sys.stdin)["osd"]; print(d["op"], d["op_w"], d["op_r"], d["op_in_bytes"])'; }
osdpid=$(cat $W/ceph/run/osd.0.pid)
tk() { awk '{print $14+$15}' /proc/$osdpid/stat; }
taskset -c 1 $TOP/blkd -f -i 127.0.0.1 -p 10999 $TOP/plugins/rbd/nbdkit-rbd-plugin.so conf=$CEPH_CONF image=img-a ${BLKD_PARAMS:-} & BP=$!
sleep 2
/usr/bin/python3 -c 'import nbd,time; h=nbd.NBD(); h.connect_uri("nbd://127.0.0.1:10999/"); h.flush(); time.sleep(40)' & H=$!
sleep 1
for r in 1 2; do
a=$(dump); t0=$(tk)
taskset -c 1 $TOP/blkperf -t RAND_WRITE -b 4k -q 32 -C 1 -l 6 -w 1 --quiet --json nbd://127.0.0.1:10999/ > $W/bp.json
b=$(dump); t1=$(tk)
/usr/bin/python3 - "$a" "$b" $W/bp.json $t0 $t1 blkd <<'P'
import sys,json
a=list(map(int,sys.argv[1].split())); b=list(map(int,sys.argv[2].split())); j=json.load(open(sys.argv[3]))
n=j["writes"]; d=[y-x for x,y in zip(a,b)]
print(sys.argv[6], "client writes(after warm-up)", n, "osd op", d[0], "op_w", d[1], "bytes/op_w", d[3]/max(d[1],1), "osd cpu us per op_w %.1f" % ((int(sys.argv[5])-int(sys.argv[4]))/100*1e6/d[1]), "iops %.0f"%(n/j["elapsed_s"]))
P
a=$(dump); t0=$(tk)
env ${FIO_ENV:-} taskset -c 1 fio --name=x --ioengine=rbd --clientname=admin --pool=rbd --rbdname=img-b --rw=randwrite --bs=4k --iodepth=32 --size=256M --time_based --runtime=6 --output-format=json --output=$W/fio.json ${FIO_EXTRA:-} >/dev/null
b=$(dump); t1=$(tk)
/usr/bin/python3 - "$a" "$b" $W/fio.json $t0 $t1 fio <<'P'
import sys,json
a=list(map(int,sys.argv[1].split())); b=list(map(int,sys.argv[2].split())); j=json.load(open(sys.argv[3]))["jobs"][0]
n=j["write"]["total_ios"]; d=[y-x for x,y in zip(a,b)]
print(sys.argv[6], "client writes", n, "osd op", d[0], "op_w", d[1], "bytes/op_w", d[3]/max(d[1],1), "osd cpu us per op_w %.1f" % ((int(sys.argv[5])-int(sys.argv[4]))/100*1e6/d[1]), "iops %.0f"%j["write"]["iops"])
P
done
kill $H
