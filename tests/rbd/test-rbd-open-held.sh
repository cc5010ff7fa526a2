#!/usr/bin/env bash
# Opening an image waits for the cluster (rbd_open reads its header from an
# OSD); with the OSD away that open is held, and it must hold only the
# client that asked.  On one shard (--shards 1): client T has img1 open;
# the OSD stops; client A asks for img2 and its open waits; client B then
# connects to img1 (already open, shared: no cluster call) and must finish
# its handshake while A is still waiting.  Once the OSD is back, A's open
# completes.  blkd only: nbdkit runs .open in the connection's own thread.
# run.sh: serial
. "$(dirname "$0")/lib-rbd.sh"
[ "$PLUGIN_HOST" = blkd ] || skip "the shard's event loop is blkd's"
$PY -c 'import nbd' 2>/dev/null || skip "python3-libnbd (module nbd) is not installed"
cluster_up
rbd_ create --size 16M img1
rbd_ create --size 16M img2
start_server blkd -v --shards 1 --metrics 127.0.0.1:0 "$RBD_SO" conf="$CEPH_CONF" id=blkd image=img1

timeout 300 $PY - "$URI" "$CLUSTER" "$TMP/ceph" "$TMP/server.log" <<'PYEOF' || { tail -n 40 "$TMP/server.log"; fail "a held rbd open stalled the shard"; }
import nbd, re, subprocess, sys, threading, time
uri, cluster, cdir, log = sys.argv[1:5]

def gos():
    with open(log, errors="replace") as f:
        return len(re.findall(r"option 7, ", f.read()))

t = nbd.NBD(); t.connect_uri(uri + "/img1")
t.pread(4096, 0)
subprocess.run([cluster, "osd-stop", cdir], check=True, timeout=120)
try:
    res = {}
    def connect(who, name):
        try:
            h = nbd.NBD(); h.connect_uri(uri + "/" + name)
            res[who] = h
        except Exception as e:
            res[who] = e
    before = gos()
    a = threading.Thread(target=connect, args=("A", "img2"), daemon=True)
    a.start()
    deadline = time.time() + 30
    while gos() <= before and time.time() < deadline:
        time.sleep(0.05)
    assert gos() > before, "A's GO never reached the server"
    b = threading.Thread(target=connect, args=("B", "img1"), daemon=True)
    b.start()
    b.join(60)
    assert not b.is_alive(), "B's handshake did not finish while A's open was held"
    assert isinstance(res.get("B"), nbd.NBD), "B failed: %r" % res.get("B")
    assert a.is_alive(), "A's open returned with the OSD away (nothing was held)"
    print("B connected while A's open of img2 waited for the OSD")
finally:
    subprocess.run([cluster, "osd-start", cdir], check=True, timeout=120)
a.join(120)
assert not a.is_alive(), "A's open never returned after the OSD came back"
assert isinstance(res.get("A"), nbd.NBD), "A failed: %r" % res.get("A")
assert res["A"].get_size() == 16 << 20
res["A"].pread(4096, 0)
print("A connected once the OSD was back")
PYEOF
server_alive || fail "the server died"
echo "ok"
