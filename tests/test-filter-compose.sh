#!/usr/bin/env bash
# Stacks of several filters: the first --filter is the outermost, as in
# nbdkit (offset over truncate is not truncate over offset); keys reach the
# layer that takes them; cow + partition + rate works as one stack; and, on
# blkd, stacks combine with its own --cache, TLS and metrics (delay filter
# time shows in the plugin delay counters).
. "$(dirname "$0")/lib.sh"
. "$TOP/tests/helpers/core.sh"
. "$TOP/tests/helpers/filters.sh"
. "$TOP/tests/helpers/tls.sh"
need_filter_server; need nbdinfo; need nbdcopy; need qemu-io; need curl; need_nbd_py
for f in offset truncate cow partition rate delay cache blocksize; do
  [ -f "$FILTERDIR/nbdkit-$f-filter.so" ] || skip "filter $f is not installed"
done

head -c 4M /dev/urandom >"$TMP/disk.img"
disk_sum=$(sha "$TMP/disk.img")

# offset outermost: truncate (below) cuts the plugin to 2M, offset shows
# [1M, 2M) of that.
serve -r --filter=offset --filter=truncate file "$TMP/disk.img" offset=1M truncate=2M
expect_eq "$(nbd_size "$URI")" 1048576 "offset over truncate: size"
nbd_get "$URI" "$TMP/got"; slice "$TMP/disk.img" 1048576 1048576 >"$TMP/want"
same_bytes "offset over truncate: data is disk[1M, 2M)" "$TMP/got" "$TMP/want"
# truncate outermost: offset (below) shows [1M, 4M), truncate keeps 2M.
serve -r --filter=truncate --filter=offset file "$TMP/disk.img" offset=1M truncate=2M
expect_eq "$(nbd_size "$URI")" 2097152 "truncate over offset: size"
nbd_get "$URI" "$TMP/got"; slice "$TMP/disk.img" 1048576 2097152 >"$TMP/want"
same_bytes "truncate over offset: data is disk[1M, 3M)" "$TMP/got" "$TMP/want"

# cow over partition over rate over the file plugin.
head -c 8M /dev/urandom >"$TMP/mbr.img"
"$PY" - "$TMP/mbr.img" <<'PYEOF' || fail "cannot write the MBR"
import struct, sys
def entry(start, count):
    return struct.pack("<B3sB3sII", 0, b"\0\0\0", 0x83, b"\0\0\0", start, count)
with open(sys.argv[1], "r+b") as f:
    f.seek(446)
    f.write(entry(2048, 4096) + entry(6144, 8192) + bytes(32) + b"\x55\xaa")
PYEOF
sum=$(sha "$TMP/mbr.img")
serve --filter=cow --filter=partition --filter=rate file "$TMP/mbr.img" \
  partition=1 rate=800M
expect_eq "$(nbd_size "$URI")" 2097152 "cow+partition+rate: the partition's size"
qemu-io -f raw -c 'write -P 0x2a 0 64k' -c 'read -P 0x2a 0 64k' "$URI" >"$TMP/qio" \
  || fail "cow+partition+rate: I/O"
grep -q 'Pattern verification failed' "$TMP/qio" && fail "cow+partition+rate: read back differs"
nbd_get "$URI" "$TMP/got"
slice "$TMP/got" 65536 1048576 >"$TMP/got1"; slice "$TMP/mbr.img" $((1048576 + 65536)) 1048576 >"$TMP/want"
same_bytes "cow+partition+rate: unwritten data is the partition's" "$TMP/got1" "$TMP/want"
expect_eq "$(sha "$TMP/mbr.img")" "$sum" "cow+partition+rate: the image is untouched"

# Many requests in flight on several connections through filters that keep
# state (cow's overlay, cache's blocks, blocksize's read-modify-write): the
# data must survive.  Each filter's thread model is what limits it.
head -c 8M /dev/urandom >"$TMP/rand"
serve --filter=cow --filter=cache --filter=blocksize memory 8M minblock=4096
nbdcopy --connections=4 --requests=32 --request-size=65536 "$TMP/rand" "$URI" \
  || fail "parallel copy into cow+cache+blocksize"
nbd_get "$URI" "$TMP/back"
same_bytes "cow+cache+blocksize: 4 connections x 32 requests, data intact" "$TMP/back" "$TMP/rand"
"$PY" - "$URI" <<'PYEOF' || fail "parallel unaligned writers through blocksize"
import nbd, os, sys, threading
uri = sys.argv[1]
# Four writers, each owning every fourth 1000-byte slot: neighbours share
# 4K blocks, so blocksize's read-modify-write must not lose a slot.
data = [os.urandom(1000) for _ in range(256)]
err = []
def writer(k):
    try:
        h = nbd.NBD(); h.connect_uri(uri)
        for i in range(k, 256, 4):
            h.pwrite(data[i], i * 1000)
        h.flush(); h.shutdown()
    except Exception as e:
        err.append(repr(e))
ts = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
for t in ts: t.start()
for t in ts: t.join()
assert not err, err
h = nbd.NBD(); h.connect_uri(uri)
got = h.pread(256000, 0)
bad = [i for i in range(256) if got[i * 1000:(i + 1) * 1000] != data[i]]
assert not bad, "slots lost: %r" % bad[:10]
print("256 interleaved unaligned writes intact")
PYEOF
ok "blocksize: concurrent unaligned writers sharing blocks lose nothing"

if blkd_only "filters with --cache, TLS and --metrics" "blkd's own options"; then
  make_tls_material "$TMP/tls"
  MPORT=$(free_port)
  serve --cache 16M --tls=require --tls-certificates="$TMP/tls/server" \
    --metrics "127.0.0.1:$MPORT" --filter=cow --filter=delay \
    file "$TMP/disk.img" delay-read=200ms
  TURI="nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/tls/client-ca"
  "$PY" - "$TURI" "$TMP/disk.img" <<'PYEOF' || fail "stack + cache + TLS"
import nbd, sys
h = nbd.NBD(); h.set_uri_allow_local_file(True); h.connect_uri(sys.argv[1])
img = open(sys.argv[2], "rb").read()
for i in range(4):                        # cached after the first
    assert h.pread(65536, 0) == img[:65536]
h.pwrite(b"\x99" * 65536, 0)
assert h.pread(65536, 0) == b"\x99" * 65536
print("TLS + cache + cow ok")
PYEOF
  ok "blkd: cow+delay under --cache over TLS: reads, writes read back"
  curl -sf "http://127.0.0.1:$MPORT/metrics" >"$TMP/metrics" || fail "no /metrics"
  "$PY" - "$TMP/metrics" <<'PYEOF' || fail "metrics do not show the delayed reads"
import re, sys
m = open(sys.argv[1]).read()
def val(name, cmd):
    r = re.search(r'^%s\{cmd="%s"\} (\S+)$' % (name, cmd), m, re.M)
    return float(r.group(1)) if r else None
reads = val("blkd_requests_total", "read")
plugin = val("blkd_delay_plugin_seconds_total", "read")
assert reads is not None and reads >= 5, reads
# At least the first read went through the 200 ms delay filter.
assert plugin is not None and plugin >= 0.19, plugin
print("reads %d, plugin time %.3f s" % (reads, plugin))
PYEOF
  ok "blkd: metrics count the reads and the delay filter's time in the plugin"
  expect_eq "$(sha "$TMP/disk.img")" "$disk_sum" "blkd: cow under --cache: the file is untouched"
fi
check_alive
echo "ok"
