#!/usr/bin/env bash
# The OSD stops (SIGTERM) and restarts in the middle of I/O through the rbd plugin: requests
# wait and complete, no error reaches a client, and every block holds its last write (nothing
# lost, no old write replayed).  Then timeout=: a request on an absent OSD fails, bounded.
# run.sh: serial
. "$(dirname "$0")/lib-rbd.sh"
$PY -c 'import nbd' 2>/dev/null || skip "python3-libnbd (module nbd) is not installed"
cluster_up
rbd_ create --size 16M --image-feature layering,exclusive-lock img1
serve image=img1

$PY - "$URI" "$CLUSTER" "$TMP/ceph" <<'PYEOF' || fail "I/O across an OSD restart"
import nbd, os, random, subprocess, sys, threading, time
uri, cluster, cdir = sys.argv[1:4]
BS, NB, NT = 4096, 512, 4            # 4 writers, 2 MiB each
expect = {}                           # (thread, block) -> bytes last written
done = [0] * NT
errors = []
stop = threading.Event()

def block(t, b, gen):
    return (b"%d:%d:%d;" % (t, b, gen)).ljust(64, b".") * (BS // 64)

def writer(t):
    h = nbd.NBD(); h.connect_uri(uri)
    rnd = random.Random(t)
    gen = 0
    try:
        while not stop.is_set() and gen < 10000:
            gen += 1
            for b in rnd.sample(range(NB), 64):
                off = (t * NB + b) * BS
                data = block(t, b, gen)
                h.pwrite(data, off, nbd.CMD_FLAG_FUA if b % 7 == 0 else 0)
                expect[(t, b)] = data
                c = rnd.randrange(NB)
                if (t, c) in expect:
                    got = h.pread(BS, (t * NB + c) * BS)
                    if got != expect[(t, c)]:
                        errors.append("thread %d block %d read back stale" % (t, c))
                        return
                done[t] += 1
        h.flush()
    except Exception as e:
        errors.append("thread %d: %s" % (t, e))

ts = [threading.Thread(target=writer, args=(t,)) for t in range(NT)]
for x in ts: x.start()
def ops(): return sum(done)
deadline = time.time() + 20
while ops() < 2000 and time.time() < deadline and not errors: time.sleep(0.05)
assert ops() >= 2000, "no I/O progress before the OSD stop: %d" % ops()
before = ops()
subprocess.run([cluster, "osd-stop", cdir], check=True, timeout=120)
t0 = time.time(); time.sleep(3)
during = ops() - before
subprocess.run([cluster, "osd-start", cdir], check=True, timeout=120)
after_start = ops()
deadline = time.time() + 60
while ops() < after_start + 2000 and time.time() < deadline and not errors: time.sleep(0.05)
stop.set()
for x in ts: x.join(timeout=120)
assert not any(x.is_alive() for x in ts), "a writer is still stuck"
assert not errors, errors
assert ops() >= after_start + 2000, "I/O did not resume after the OSD restart"
print("ops before %d, while the OSD was away %d, total %d; outage %.1fs" %
      (before, during, ops(), time.time() - t0))
h = nbd.NBD(); h.connect_uri(uri)
for (t, b), data in expect.items():
    got = h.pread(BS, (t * NB + b) * BS)
    assert got == data, "block %d of writer %d: %r, want %r" % (b, t, got[:24], data[:24])
print("verified %d blocks" % len(expect))
PYEOF

check_aio_path 0

# The cluster's own view agrees with what the clients read (first block).
stop_server
rbd_ export img1 "$TMP/img1.bin" >/dev/null 2>&1
grep -aq '^0:' <<<"$(head -c 4096 "$TMP/img1.bin" | tr -d '\0')" || fail "rbd export lost what the clients wrote"

# timeout=: with the OSD away, a request fails once the timeout has passed
# instead of waiting (a never-read range, so no cache can answer it).
serve image=img1 timeout=2
timeout 90 $PY - "$URI" "$CLUSTER" "$TMP/ceph" <<'PYEOF' || fail "timeout=2 with no OSD"
import nbd, subprocess, sys, time
uri, cluster, cdir = sys.argv[1:4]
h = nbd.NBD(); h.connect_uri(uri)      # holds the image open across the outage
h.pread(4096, 0)
subprocess.run([cluster, "osd-stop", cdir], check=True, timeout=120)
try:
    try:
        h.pread(4096, 15 << 20)
        raise SystemExit("a read with no OSD and timeout=2 succeeded")
    except nbd.Error as e:
        assert e.errno == "EIO", e.errno
        print("refused:", e.errno)
finally:
    subprocess.run([cluster, "osd-start", cdir], check=True, timeout=120)
PYEOF
grep -q "Connection timed out" "$TMP/server.log" || fail "no timeout message in the server log"
echo "ok ($PLUGIN_HOST)"
