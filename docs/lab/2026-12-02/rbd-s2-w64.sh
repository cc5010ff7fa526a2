#!/bin/bash
# why 64 KiB sequential writes through an NBD hop run at a third of librbd-direct's rate
set -u
cd /work/main
W=$(mktemp -d /tmp/w64.XXXX)
RBD_CLUSTER_BYTES=$((2 << 30)) tests/rbd/cluster.sh start $W/ceph >/dev/null
export CEPH_CONF=$W/ceph/ceph.conf
rbd create --size 256M --image-feature layering,exclusive-lock imgA
rbd create --size 256M --image-feature layering,exclusive-lock imgB
rbd bench --io-type write --io-size 4M --io-pattern seq --io-total 256M imgA >/dev/null
rbd bench --io-type write --io-size 4M --io-pattern seq --io-total 256M imgB >/dev/null
f() { fio --name=x "$@" --rw=write --bs=64k --iodepth=8 --size=256M --time_based --runtime=5 --output-format=json --output=$W/f.json >/dev/null 2>&1; python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]["write"]; print("%.0f IOPS lat_mean %.0f us" % (j["iops"], j["lat_ns"]["mean"]/1000))' $W/f.json; }
echo "librbd direct (defaults): $(f --ioengine=rbd --clientname=admin --pool=rbd --rbdname=imgA)"
echo "librbd direct policy=writethrough: $(CEPH_ARGS=--rbd_cache_policy=writethrough f --ioengine=rbd --clientname=admin --pool=rbd --rbdname=imgA)"
echo "librbd direct writethrough_until_flush=false: $(CEPH_ARGS=--rbd_cache_writethrough_until_flush=false f --ioengine=rbd --clientname=admin --pool=rbd --rbdname=imgA)"
for opts in "" "rbd_cache_writethrough_until_flush=false" "rbd_cache_policy=writethrough"; do
  ./blkd -f -i 127.0.0.1 -p 20999 plugins/rbd/nbdkit-rbd-plugin.so conf=$CEPH_CONF image=imgB $opts > $W/blkd.log 2>&1 &
  p=$!; sleep 2
  echo "blkd rbd $opts: $(f --ioengine=nbd --uri=nbd://127.0.0.1:20999/)"
  kill $p; wait $p
done
tests/rbd/cluster.sh stop $W/ceph >/dev/null
rm -rf $W
