#!/usr/bin/env bash
# With blkd's event loop doing librbd's dispatch (dispatch=caller), an OSD that goes
# away under a writing client must not hold the loop: librbd's writearound cache acknowledges
# writes whose object ops are still in flight, and they would fill librados' op throttle, where
# the loop's next submission would wait.  The plugin runs without that throttle, its own count
# in its place.  Probe: a handshake on the same shard (--shards 1) during the outage answers at
# once; afterwards every write completes and reads back.  The client writes past
# rbd_cache_max_dirty (24 MiB), so the cache stops acknowledging early and requests wait in the
# plugin; on an image with Ceph's default features (object map: writes to new objects wait for
# its update) and on one without the object map.  The same probe with librados' throttle kept (limits given as plugin parameters) times
# out: the case exists.
# run.sh: serial
. "$(dirname "$0")/lib-rbd.sh"
$PY -c 'import nbd' 2>/dev/null || skip "python3-libnbd (module nbd) is not installed"
need nbdinfo
cluster_up
rbd_ create --size 64M img1                       # the cluster's default features

# outage_probe WRITES MIN: up to WRITES 4 KiB writes through the outage (10 s at most), at
# least MIN of them started; prints "handshake RC" and "writes N".
outage_probe() {
  $PY - "$URI" "$CLUSTER" "$TMP/ceph" "$1" "$2" <<'PYEOF'
import nbd, subprocess, sys, time
uri, cluster, cdir = sys.argv[1:4]
want, least = int(sys.argv[4]), int(sys.argv[5])
h = nbd.NBD(); h.connect_uri(uri)
h.pwrite(b"x" * 4096, 0)
h.flush()                               # librbd's cache now acknowledges writes early
subprocess.run([cluster, "osd-stop", cdir], check=True, timeout=120)
t0 = time.time()
n = 0
while n < want and time.time() - t0 < 10:
    h.aio_pwrite(bytes([n % 251 + 1]) * 4096, n * 4096)
    n += 1
    while h.aio_in_flight() > 256 and time.time() - t0 < 10:
        h.poll(1)
r = subprocess.run(["timeout", "10", "nbdinfo", "--size", uri], capture_output=True, text=True)
print("handshake", r.returncode)
subprocess.run([cluster, "osd-start", cdir], check=True, timeout=120)
t1 = time.time()
while h.aio_in_flight() > 0 and time.time() - t1 < 120:
    h.poll(1)
assert h.aio_in_flight() == 0, "writes still in flight 120 s after the OSD came back"
assert n >= least, "only %d writes were started while the OSD was away" % n
h.flush()
for i in range(n):
    assert h.pread(4096, i * 4096) == bytes([i % 251 + 1]) * 4096, "block %d of %d" % (i, n)
print("writes", n)
PYEOF
}

serve_loop() {
  start_server blkd --shards 1 "$RBD_SO" conf="$CEPH_CONF" id=blkd dispatch=caller "$@"
}

# 32 MiB of writes; the cache acknowledges 24 MiB of them early (6144), then holds the rest.
# Once on the default features, once without the object map (whose updates hold writes to
# new objects back inside librbd), the kind of image the control below shows the case on.
rbd_ create --size 64M --image-feature layering,exclusive-lock img2
for img in img1 img2; do
  serve_loop image=$img
  out=$(outage_probe 8192 6144) || fail "$img: writes through the outage, with the plugin's count as the throttle"
  echo "$img: $out"
  grep -qx "handshake 0" <<<"$out" || fail "$img: the event loop was held while the OSD was away"
  stop_server
done

# librados' throttle kept: limits given as plugin parameters.  16 MiB of writes to an image
# without the object map, so the early-acknowledged writes' ops fill the 1000-op throttle.
rbd_ create --size 64M --image-feature layering,exclusive-lock img3
serve_loop image=img3 objecter_inflight_ops=1000
out=$(outage_probe 4000 1) || fail "writes through the outage, with librados' throttle"
echo "$out"
grep -qx "handshake 124" <<<"$out" || fail "with librados' throttle the loop was not held: the probe proves nothing"
stop_server
echo ok
