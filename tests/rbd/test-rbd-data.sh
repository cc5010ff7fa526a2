#!/usr/bin/env bash
# The rbd plugin on a real one-node cluster: data in and out (nbdcopy, rbd export, fio verify),
# four connections on one image, zero/trim/FUA/block status, export list, namespace, snapshot.
. "$(dirname "$0")/lib-rbd.sh"
need nbdcopy; need fio
$PY -c 'import nbd' 2>/dev/null || skip "python3-libnbd (module nbd) is not installed"
grep -qx '[[:space:]]*nbd' <<<"$(fio --enghelp 2>/dev/null)" || skip "fio has no nbd engine"
cluster_up

# img1 with the object map (block status), img2 without, one in a namespace.
rbd_ create --size 64M --image-feature layering,exclusive-lock,object-map,fast-diff img1
rbd_ create --size 32M --image-feature layering,exclusive-lock img2
rbd_ create --size 8M rbd/ns1/nsimg
serve image=img1

# The export list is the pool's images; the default export is image=.
nbdinfo --list --json "$URI" >"$TMP/list.json"
$PY - "$TMP/list.json" <<'PYEOF' || fail "export list: $(cat "$TMP/list.json")"
import json, sys
ex = {e["export-name"]: e for e in json.load(open(sys.argv[1]))["exports"]}
assert set(ex) == {"img1", "img2"}, set(ex)
assert ex["img1"]["export-size"] == 64 << 20 and ex["img2"]["export-size"] == 32 << 20
for e in ex.values():
    assert e["can_multi_conn"] and e["can_fua"] and e["can_flush"] and not e["is_read_only"], e
PYEOF
[ "$(nbdinfo --size "$URI")" = $((64 << 20)) ] || fail "the default export is not img1"

# nbdcopy in (multi-conn: several connections), out, and the cluster's own view.
head -c 32M /dev/urandom >"$TMP/in.bin"
nbdcopy "$TMP/in.bin" "$URI/img2"
want=$(md5sum <"$TMP/in.bin" | cut -d' ' -f1)
[ "$(sum_nbd "$URI/img2")" = "$want" ] || fail "nbdcopy out differs from what went in"
[ "$(rbd_ export img2 - 2>/dev/null | md5sum | cut -d' ' -f1)" = "$want" ] \
  || fail "rbd export differs from what nbdcopy wrote"

# fio: four jobs, each its own connection, each verifying its quarter.
fio --name=v --ioengine=nbd --uri="$URI/img2" --rw=randwrite --bs=4k --iodepth=16 \
    --numjobs=4 --size=8M --offset_increment=8M --verify=crc32c --verify_fatal=1 \
    --do_verify=1 --verify_state_save=0 --group_reporting >"$TMP/fio.log" 2>&1 || { cat "$TMP/fio.log"; fail "fio verify"; }
grep -q 'err= 0' "$TMP/fio.log" || { cat "$TMP/fio.log"; fail "fio reported errors"; }

# Four connections on one image: each writes its quarter, one flush, and
# every connection reads every quarter (one image handle underneath).
$PY - "$URI/img1" <<'PYEOF' || fail "four connections on one image"
import nbd, os, sys
hs = []
for i in range(4):
    h = nbd.NBD(); h.connect_uri(sys.argv[1]); hs.append(h)
data = [os.urandom(1 << 20) for _ in range(4)]
for i, h in enumerate(hs):
    h.pwrite(data[i], i << 20)
hs[3].flush()
for j, h in enumerate(hs):
    for i in range(4):
        assert h.pread(1 << 20, i << 20) == data[i], (j, i)
# FUA write on one, read on another without a flush in between.
hs[0].pwrite(b"F" * 4096, 5 << 20, nbd.CMD_FLAG_FUA)
assert hs[2].pread(4096, 5 << 20) == b"F" * 4096
PYEOF

# Zero (may-trim and not), trim, fast zero, block status from the object map.
$PY - "$URI/img1" <<'PYEOF' || fail "zero/trim/block status"
import nbd, os, sys
h = nbd.NBD(); h.add_meta_context("base:allocation"); h.connect_uri(sys.argv[1])
M = 1 << 20
for o in range(8, 64, 8):
    h.pwrite(os.urandom(8 * M), o * M)
h.zero(8 * M, 0)                                  # may trim
h.zero(4096 + 512, 9 * M + 100, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(8 * M, 0) == bytes(8 * M)
assert h.pread(4096 + 512, 9 * M + 100) == bytes(4096 + 512)
assert h.pread(100, 9 * M) != bytes(100)          # around it, data stays
try:
    h.zero(4096, 30 * M, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
    raise SystemExit("a fast zero that must allocate was accepted")
except nbd.Error as e:
    assert e.errno == "ENOTSUP", e.errno
h.trim(8 * M, 16 * M)                             # whole objects go
ext = []
h.block_status(64 * M, 0, lambda m, o, e, err: ext.extend(e))
runs = [(ext[i], ext[i + 1]) for i in range(0, len(ext), 2)]
want = [(8 * M, 3), (8 * M, 0), (8 * M, 3), (40 * M, 0)]
assert runs == want, runs
h.flush()
PYEOF

check_aio_path 0

# A namespace is its own image list.
img2_sum=$(sum_nbd "$URI/img2")
stop_server
serve namespace=ns1
[ "$(nbdinfo --list --json "$URI" | $PY -c 'import json,sys; print(" ".join(e["export-name"] for e in json.load(sys.stdin)["exports"]))')" = nsimg ] \
  || fail "namespace=ns1 does not list exactly nsimg"
head -c 8M "$TMP/in.bin" >"$TMP/ns.bin"
nbdcopy "$TMP/ns.bin" "$URI/nsimg"
[ "$(rbd_ export rbd/ns1/nsimg - 2>/dev/null | md5sum | cut -d' ' -f1)" = "$(md5sum <"$TMP/ns.bin" | cut -d' ' -f1)" ] \
  || fail "what went into ns1/nsimg is not what rbd export reads"
stop_server

# A snapshot is served read-only, with the snapshot's bytes.
rbd_ snap create img2@s1 2>/dev/null
snap_sum=$(rbd_ export img2@s1 - 2>/dev/null | md5sum | cut -d' ' -f1)
serve image=img2
nbdpy "$URI" 'h.pwrite(b"after the snapshot", 0); h.flush()'
stop_server
serve image=img2 snap=s1
[ "$(nbdinfo --json "$URI" | $PY -c 'import json,sys; print(json.load(sys.stdin)["exports"][0]["is_read_only"])')" = True ] \
  || fail "a snapshot is not served read-only"
[ "$(sum_nbd "$URI")" = "$snap_sum" ] || fail "the snapshot's bytes differ"
[ "$snap_sum" = "$img2_sum" ] || fail "the snapshot does not hold what was written before it"
[ "$(rbd_ export img2 - 2>/dev/null | md5sum | cut -d' ' -f1)" != "$snap_sum" ] \
  || fail "the write after the snapshot did not reach the image"
if nbdpy "$URI" 'h.pwrite(b"x", 0)' 2>"$TMP/ro.err"; then fail "a write to a snapshot succeeded"; fi
grep -qiE 'read-only|EPERM|EROFS' "$TMP/ro.err" || fail "a refused write said: $(cat "$TMP/ro.err")"

# What the cluster handle gets (the debug line says): Ceph's defaults with
# dispatch=librbd, the default (but one io_context_pool thread on at most
# two CPUs); with dispatch=caller one librbd thread and
# librados' throttle off, the plugin's count in its place; a parameter over
# the plugin's choice.  Then an image whose own rbd config makes the caller
# dispatch while librados' throttle counts alone (the default): its
# requests go to blkd's workers, with the same bytes.
if [ "$PLUGIN_HOST" = blkd ] && [ -z "${RBD_EXTRA:-}" ]; then
  logged() {
    local i
    for i in $(seq 100); do
      grep -q "$1" "$TMP/server.log" && return 0
      sleep 0.1
    done
    fail "the server did not report '$1': $(grep -o 'dispatch=[^ ]* librados_thread_count=[^,]*' "$TMP/server.log" | tail -1)"
  }
  img2_now=$(rbd_ export img2 - 2>/dev/null | md5sum | cut -d' ' -f1)
  stop_server
  : >"$TMP/server.log"
  # One librbd io_context_pool thread where blkd may run on at most two
  # CPUs (its affinity mask), Ceph's two elsewhere; a count other than
  # Ceph's 2 from CEPH_ARGS (or ceph.conf) stays, and a parameter wins,
  # 2 included.  Run on the CPUs this test has, and where it has more,
  # pinned to the first two (the most that get one thread) and three.
  threads_seen() {     # threads_seen EXPECTED [SERVER ARGS...]
    local want=$1; shift
    : >"$TMP/server.log"
    start_server blkd -v "$RBD_SO" conf="$CEPH_CONF" id=blkd image=img2 "$@"
    logged "dispatch=librbd, librados_thread_count=$want, librados' throttle alone"
  }
  thread_cases() {     # thread_cases CPUS: with this shell's mask at CPUS
    if [ "$1" -le 2 ]; then
      threads_seen 1
      logged "rbd: $1 CPUs\? to run on: one librbd io_context_pool thread"
    else
      threads_seen 2
    fi
    stop_server
    threads_seen 2 librados_thread_count=2; stop_server
    threads_seen 3 librados_thread_count=3; stop_server
    CEPH_ARGS="--librados_thread_count=4" threads_seen 4; stop_server
  }
  cpus=$($PY -c 'import os; print(len(os.sched_getaffinity(0)))')
  thread_cases "$cpus"
  if [ "$cpus" -gt 2 ] && command -v taskset >/dev/null; then
    cpus_before=$(taskset -pc $$ | sed 's/.*: //')
    for n in 2 3; do
      first=$($PY -c 'import os, sys; print(",".join(map(str, sorted(os.sched_getaffinity(0))[:int(sys.argv[1])])))' "$n")
      taskset -pc "$first" $$ >/dev/null
      thread_cases "$n"
      taskset -pc "$cpus_before" $$ >/dev/null
    done
  else
    echo "$cpus CPUs here (or no taskset): the default on more than two CPUs, Ceph's two threads, not seen"
  fi
  : >"$TMP/server.log"
  start_server blkd -v "$RBD_SO" conf="$CEPH_CONF" id=blkd image=img2 dispatch=caller
  logged "dispatch=caller, librados_thread_count=1, aio path caps 1024 ops, 104857600 bytes (librados' throttle off)"
  stop_server
  : >"$TMP/server.log"
  start_server blkd -v "$RBD_SO" conf="$CEPH_CONF" id=blkd image=img2 dispatch=caller librados_thread_count=3
  logged "dispatch=caller, librados_thread_count=3,"
  stop_server
  rbd_ config image set img2 rbd_non_blocking_aio 0     # Ceph reads 0 as false
  : >"$TMP/server.log"
  start_server blkd -v --metrics 127.0.0.1:0 "$RBD_SO" conf="$CEPH_CONF" id=blkd image=img2
  before=$(aio_count)
  [ -n "$before" ] || fail "no blkd_plugin_aio_total in /metrics"
  [ "$(sum_nbd "$URI")" = "$img2_now" ] || fail "an image the workers serve reads differently"
  logged "image 'img2': rbd_non_blocking_aio=0 from the image's rbd config makes the caller dispatch"
  [ "$(aio_count)" = "$before" ] || fail "$(( $(aio_count) - before )) requests to that image took the aio path"
  echo "an image whose rbd config says the caller dispatches, under the default: aio requests $before -> $(aio_count), reads and writes $(request_count)"
  stop_server
  rbd_ config image rm img2 rbd_non_blocking_aio
fi
echo "ok ($PLUGIN_HOST ${RBD_EXTRA:-})"
