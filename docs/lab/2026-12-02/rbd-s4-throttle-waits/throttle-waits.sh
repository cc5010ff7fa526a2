#!/bin/bash
# Does the loop wait in librados' throttle under 4 KiB writes at depth? perf counters via admin socket.
set -u
cd "$(dirname "$0")/../../../.."
D=$(mktemp -d /tmp/tw.XXXXXX)
tests/rbd/cluster.sh start $D/ceph >/dev/null || exit 1
export CEPH_CONF=$D/ceph/ceph.conf
rbd create --size 256M --image-feature layering,exclusive-lock img >/dev/null
rbd bench --io-type write --io-size 4M --io-pattern seq --io-total 256M img >/dev/null
run() {
  local name=$1; shift
  ./blkd -f -i 127.0.0.1 -p 10999 plugins/rbd/nbdkit-rbd-plugin.so conf=$CEPH_CONF image=img admin_socket=$D/$name.asok "$@" > $D/$name.log 2>&1 &
  local pid=$!
  sleep 2
  /usr/bin/python3 -c 'import nbd,time
h=nbd.NBD(); h.connect_uri("nbd://127.0.0.1:10999/"); h.flush(); time.sleep(30)' &
  local hold=$!
  sleep 1
  fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:10999/ --rw=randwrite --bs=4k --iodepth=32 --numjobs=4 --size=256M --time_based --runtime=8 --group_reporting --output-format=json --output=$D/$name.fio >/dev/null 2>&1
  ceph --admin-daemon $D/$name.asok perf dump > $D/$name.perf 2>&1
  /usr/bin/python3 - $D/$name.perf $D/$name.fio $name <<'PY'
import json,sys
p=json.load(open(sys.argv[1])); f=json.load(open(sys.argv[2]))["jobs"][0]
ios=f["write"]["total_ios"]
out=[sys.argv[3], "writes %d" % ios]
for k in ("throttle-objecter_ops","throttle-objecter_bytes"):
    t=p.get(k,{})
    out.append("%s: max %s get %s wait %s (%.3f s)" % (k, t.get("max"), t.get("get"), t.get("wait",{}).get("avgcount"), t.get("wait",{}).get("sum",0)))
print("; ".join(out))
PY
  kill $hold 2>/dev/null; kill $pid; wait $pid 2>/dev/null
}
run caller-kept dispatch=caller objecter_inflight_ops=1024 objecter_inflight_op_bytes=104857600
run librbd
run caller-takeover dispatch=caller
tests/rbd/cluster.sh stop $D/ceph >/dev/null
rm -rf $D
