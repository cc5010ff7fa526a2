#!/usr/bin/env bash
# The in-tree ram plugin under the reference server (nbdkit): flags, sparse
# block status, pattern I/O, trim/zero, nbdcopy round trip, 4 parallel
# writers, and a trim-vs-read race that would expose use-after-free.
. "$(dirname "$0")/lib.sh"
# The same checks run with the plugin hosted by nbdkit (this file) and by
# blkd (test-plugin-ram-blkd.sh sets PLUGIN_HOST=blkd).
PLUGIN_HOST=${PLUGIN_HOST:-nbdkit}
need nbdkit; need nbdinfo; need nbdcopy; need qemu-io
PY=/usr/bin/python3
$PY -c 'import nbd' 2>/dev/null || skip "python3-libnbd (module nbd) is not installed"
SO=$TOP/plugins/ram/nbdkit-ram-plugin.so
[ -f "$SO" ] || skip "$SO is not built (make plugins/ram/nbdkit-ram-plugin.so)"

# --dump-plugin shows our own key, so we know nbdkit loaded this .so.
grep -qx 'ram_chunk_size=65536' <<<"$(nbdkit "$SO" --dump-plugin)" \
  || fail "--dump-plugin lacks ram_chunk_size=65536"

start_server "$PLUGIN_HOST" "$SO" size=64M

# Size and every flag the plugin promises.
nbdinfo --json "$URI" >"$TMP/info.json"
$PY - "$TMP/info.json" <<'EOF' || fail "nbdinfo --json mismatch: $(cat "$TMP/info.json")"
import json, sys
e = json.load(open(sys.argv[1]))["exports"][0]
want = {"export-size": 64 << 20, "is_read_only": False, "is_rotational": False,
        "can_multi_conn": True, "can_flush": True, "can_fua": True,
        "can_trim": True, "can_zero": True, "can_fast_zero": True,
        "can_cache": True}
bad = {k: (e.get(k), v) for k, v in want.items() if e.get(k) != v}
if bad:
    print("got/want:", bad); sys.exit(1)
EOF

# map URI: nbdinfo --map as "offset length type" lines.
map() { nbdinfo --map "$1" | awk '{print $1, $2, $3}'; }

# A fresh disk is one hole.
[ "$(map "$URI")" = "0 67108864 3" ] || fail "fresh disk not all hole: $(map "$URI")"

# Pattern write then read back; qemu-io's read -P fails on any mismatch.
qemu-io -f raw -c 'write -P 0xab 1M 1M' -c 'read -P 0xab 1M 1M' \
        -c 'read -P 0 0 1M' -c 'read -P 0 2M 1M' "$URI" >"$TMP/qio.log" \
  || fail "pattern write/read: $(cat "$TMP/qio.log")"
grep -q 'Pattern verification failed' "$TMP/qio.log" && fail "pattern mismatch"
want=$'0 1048576 3\n1048576 1048576 0\n2097152 65011712 3'
[ "$(map "$URI")" = "$want" ] || fail "map after write: $(map "$URI")"

# Trim one whole 64K chunk back to a hole; zero a partial chunk (stays
# data, reads zeros); zero with unmap of a whole chunk (hole); FUA write.
qemu-io -f raw -c 'discard 1M 64k' -c 'read -P 0 1M 64k' \
        -c 'write -z 1152k 4k' -c 'read -P 0 1152k 4k' -c 'read -P 0xab 1156k 60k' \
        -c 'write -z -u 1216k 64k' -c 'read -P 0 1216k 64k' \
        -c 'write -f -P 0xcd 3M 8k' -c 'read -P 0xcd 3M 8k' -c flush \
        "$URI" >"$TMP/qio2.log" || fail "trim/zero/fua: $(cat "$TMP/qio2.log")"
grep -q 'Pattern verification failed' "$TMP/qio2.log" && fail "pattern mismatch after trim/zero"
want=$'0 1114112 3\n1114112 131072 0\n1245184 65536 3\n1310720 786432 0\n2097152 1048576 3\n3145728 65536 0\n3211264 63897600 3'
[ "$(map "$URI")" = "$want" ] || fail "map after trim/zero: $(map "$URI")"

# Partial zeroes that leave a chunk all-zero give the chunk back.
qemu-io -f raw -c 'write -z 3M 4k' -c 'write -z 3076k 4k' "$URI" >/dev/null \
  || fail "partial zero"
want=$'0 1114112 3\n1114112 131072 0\n1245184 65536 3\n1310720 786432 0\n2097152 65011712 3'
[ "$(map "$URI")" = "$want" ] || fail "all-zero chunk not freed: $(map "$URI")"
stop_server

# nbdcopy round trip of 32 MiB of random data through a fresh 64 MiB disk.
start_server "$PLUGIN_HOST" "$SO" size=64M
head -c 32M /dev/urandom >"$TMP/rand"
nbdcopy "$TMP/rand" "$URI" || fail "nbdcopy file -> nbd"
nbdcopy "$URI" "$TMP/back" || fail "nbdcopy nbd -> file"
[ "$(stat -c %s "$TMP/back")" = 67108864 ] || fail "copied back $(stat -c %s "$TMP/back") bytes"
a=$(sha256sum <"$TMP/rand" | cut -d' ' -f1)
b=$(head -c 32M "$TMP/back" | sha256sum | cut -d' ' -f1)
[ "$a" = "$b" ] || fail "nbdcopy round trip: sha256 $a != $b"
cmp -s -n 33554432 <(tail -c 32M "$TMP/back") /dev/zero || fail "unwritten half not zero"
stop_server

# Four connections write disjoint 8 MiB regions at once, 64 requests in
# flight each, then a fifth connection reads everything back.
start_server "$PLUGIN_HOST" "$SO" size=64M
$PY - "$URI" <<'EOF' || fail "parallel writers"
import nbd, os, sys, threading
uri, region, piece = sys.argv[1], 8 << 20, 128 << 10
data = [os.urandom(region) for _ in range(4)]
errors = []
def writer(i):
    try:
        h = nbd.NBD(); h.connect_uri(uri)
        assert h.can_multi_conn(), "no multi-conn"
        bufs = []
        for off in range(0, region, piece):
            b = nbd.Buffer.from_bytearray(bytearray(data[i][off:off + piece]))
            bufs.append((h.aio_pwrite(b, i * region + off), b))
            while h.aio_in_flight() >= 64:
                h.poll(-1)
        while h.aio_in_flight() > 0:
            h.poll(-1)
        for c, _ in bufs:
            h.aio_command_completed(c)   # raises if the write failed
        h.flush(); h.shutdown()
    except Exception as e:
        errors.append(f"writer {i}: {e}")
ts = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
for t in ts: t.start()
for t in ts: t.join()
if errors: sys.exit("\n".join(errors))
h = nbd.NBD(); h.connect_uri(uri)
for i in range(4):
    got = h.pread(region, i * region)
    if got != data[i]:
        sys.exit(f"region {i} mismatch")
if h.pread(32 << 20, 32 << 20) != bytes(32 << 20):
    sys.exit("untouched half not zero")
print("parallel writers ok")
EOF

# Trim races reads on the same chunks, in the untouched upper half.
# Writers only ever store whole 64K chunks of 0xcc and trims free whole
# chunks, so every aligned 64K a reader sees must be all 0xcc or all 0x00;
# anything else is a torn read of freed or uninitialised memory.
$PY - "$URI" <<'EOF' || fail "trim/read race"
import nbd, random, sys, threading, time
uri, base, span, ck = sys.argv[1], 48 << 20, 4 << 20, 64 << 10
stop = time.time() + 2.0
errors = []
full, zero = b"\xcc" * ck, bytes(ck)
def run(kind):
    try:
        h = nbd.NBD(); h.connect_uri(uri); r = random.Random(kind)
        n = 0
        while time.time() < stop:
            off = r.randrange(0, span // ck) * ck
            cnt = min(ck * r.randint(1, 4), span - off)
            off += base
            if kind.startswith("w"):
                h.pwrite(b"\xcc" * cnt, off)
            elif kind.startswith("t"):
                h.trim(cnt, off)
            else:
                d = h.pread(cnt, off)
                for i in range(0, cnt, ck):
                    if d[i:i + ck] not in (full, zero):
                        raise Exception(f"torn chunk at {off + i}")
            n += 1
        h.shutdown()
    except Exception as e:
        errors.append(f"{kind}: {e}")
ts = [threading.Thread(target=run, args=(k,)) for k in ("w1", "w2", "t1", "t2", "r1", "r2")]
for t in ts: t.start()
for t in ts: t.join()
if errors: sys.exit("\n".join(errors))
print("race ok")
EOF
server_alive || fail "nbdkit died during the race"
echo "ok"
