#!/usr/bin/env bash
# blkd with requests in flight on the cluster through the aio calls: a client that hangs up,
# and a server told to stop, while the OSD is away.  Nothing leaks (run under SANITIZE=1 for
# ASan's leak check), the server stays up for others, and a stop waits for the requests.
# run.sh: serial
. "$(dirname "$0")/lib-rbd.sh"
[ "$PLUGIN_HOST" = blkd ] || skip "blkd's aio path only"
$PY -c 'import nbd' 2>/dev/null || skip "python3-libnbd (module nbd) is not installed"
need curl
cluster_up
rbd_ create --size 16M --image-feature layering,exclusive-lock img1
serve image=img1
before=$(aio_count)

# inflight URI MODE: connect, stop the OSD, queue 64 writes and 64 reads
# (they stall on the cluster), then MODE: "hangup" leaves without waiting;
# "wait" waits for every reply and checks them.
inflight() {
  timeout 120 $PY - "$1" "$CLUSTER" "$TMP/ceph" "$2" <<'PYEOF'
import nbd, os, subprocess, sys, time
uri, cluster, cdir, mode = sys.argv[1:5]
h = nbd.NBD(); h.connect_uri(uri)
h.pread(4096, 0)                        # the image is open before the OSD goes
subprocess.run([cluster, "osd-stop", cdir], check=True, timeout=120)
bufs, cookies = [], []
for i in range(64):
    cookies.append(h.aio_pwrite(bytes([i + 1]) * 65536, i * 65536))
    b = nbd.Buffer(65536); bufs.append(b)
    cookies.append(h.aio_pread(b, (64 + i) * 65536))
end = time.time() + 2
while time.time() < end and h.aio_in_flight() > 0:
    h.poll(1)                           # push every request onto the wire
print("in flight:", h.aio_in_flight(), flush=True)
if mode == "hangup":
    os._exit(0)                         # the socket closes with them in flight
open(sys.argv[3] + "/../waiting", "w").close()
while h.aio_in_flight() > 0:
    h.poll(1)
for c in cookies:
    assert h.aio_command_completed(c), c  # raises if the request failed
assert all(b.to_bytearray() == bytes(65536) for b in bufs)
print("all %d replies in, data checked" % len(cookies))
PYEOF
}

inflight "$URI" hangup || fail "the hangup client"
server_alive || fail "blkd died when a client hung up with requests in flight"
"$CLUSTER" osd-start "$TMP/ceph"
# The stalled requests complete into a closed connection; a new client is served.
nbdpy "$URI" 'h.pwrite(b"x" * 4096, 0, nbd.CMD_FLAG_FUA); assert h.pread(4096, 0) == b"x" * 4096'
check_aio_path "$before"
[ $(( $(aio_count) - before )) -ge 128 ] || fail "fewer than 128 requests took the aio path"

# A stop while requests wait on the absent OSD: the server waits for them,
# the client gets every reply, then the server exits 0.
rm -f "$TMP/waiting"
inflight "$URI" wait >"$TMP/wait.out" 2>&1 &
client=$!
for ((i = 0; i < 600; i++)); do [ -e "$TMP/waiting" ] && break; sleep 0.1; done
[ -e "$TMP/waiting" ] || { cat "$TMP/wait.out"; fail "the waiting client did not get its requests out"; }
kill -TERM "$SERVER_PID"
sleep 2
server_alive || fail "blkd exited with requests still waiting on the cluster"
"$CLUSTER" osd-start "$TMP/ceph"
wait "$client" || { cat "$TMP/wait.out"; fail "the client saw a failed request or no reply"; }
cat "$TMP/wait.out"
rc=0
for ((i = 0; i < 600; i++)); do server_alive || break; sleep 0.1; done
server_alive && fail "blkd did not exit once its requests completed"
wait "$SERVER_PID" || rc=$?
[ $rc -eq 0 ] || fail "blkd exited $rc"
# The writes the stopping server acknowledged are in the image.
rbd_ export img1 "$TMP/img1.bin" >/dev/null 2>&1
$PY -c 'import sys
d = open(sys.argv[1], "rb").read()
assert all(d[i << 16:(i + 1) << 16] == bytes([i + 1]) * 65536 for i in range(64))' "$TMP/img1.bin" \
  || fail "writes acknowledged during the stop are not in the image"
echo "ok"
