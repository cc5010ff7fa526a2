#!/usr/bin/env bash
# Fault and timing filters: error (injected errors reach the client with
# their errno, switched by a file), delay and rate (requests take at least
# as long as asked: lower bounds only, which load cannot break), retry and
# retry-request (a failure that goes away is retried into a success), and
# pause (requests hang while paused and complete once resumed).
. "$(dirname "$0")/lib.sh"
. "$TOP/tests/helpers/core.sh"
. "$TOP/tests/helpers/filters.sh"
need_filter_server; need nbdinfo; need qemu-io; need_nbd_py

if have_filter error; then
  serve --filter=error memory 1M error=EIO error-pread-rate=1
  qemu-io -f raw -c 'write -P 0x77 0 4k' "$URI" >/dev/null || fail "error: a write failed"
  ok "error: error-pread-rate=1 lets writes pass"
  nbd_must_fail "error: error-pread-rate=1 gives the client EIO on a read" EIO "$URI" \
    'h.pread(4096, 0)'

  serve --filter=error memory 1M error-pwrite=ENOSPC error-pwrite-rate=1 \
    error-pwrite-file="$TMP/inject"
  "$PY" - "$URI" "$TMP/inject" <<'PYEOF' || fail "error: error-file"
import errno, nbd, os, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"a" * 4096, 0)                       # no file: no error
open(sys.argv[2], "w").close()
try:
    h.pwrite(b"b" * 4096, 0)
    sys.exit("write succeeded while the error file exists")
except nbd.Error as e:
    assert e.errnum == errno.ENOSPC, e
os.unlink(sys.argv[2])
h.pwrite(b"c" * 4096, 0)
assert h.pread(4096, 0) == b"c" * 4096
print("error-file ok")
PYEOF
  ok "error: ENOSPC only while error-pwrite-file exists"
fi

if have_filter delay; then
  serve --filter=delay memory 1M delay-read=1 delay-write=0
  "$PY" - "$URI" <<'PYEOF' || fail "delay: a read came back sooner than delay-read"
import nbd, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1])
t = time.monotonic(); h.pread(4096, 0); d = time.monotonic() - t
print("read took %.2f s" % d)
assert d >= 0.95, d
PYEOF
  ok "delay: delay-read=1 holds a read at least 1 s"
fi

if have_filter rate; then
  # 4 Mbit/s with nbdkit's 2 s bucket: 2 MiB (16.8 Mbit) needs > 2 s even
  # if the bucket starts full.
  serve --filter=rate memory 2M rate=4M
  "$PY" - "$URI" <<'PYEOF' || fail "rate: 2 MiB came faster than rate=4M allows"
import nbd, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1])
t = time.monotonic()
for off in range(0, 2 << 20, 256 << 10):
    h.pread(256 << 10, off)
d = time.monotonic() - t
print("2 MiB took %.2f s" % d)
assert d >= 1.5, d
PYEOF
  ok "rate: rate=4M bounds the read throughput"
fi

# retry_case FILTER KEYS...: reads fail while $TMP/fault exists (error filter
# below the retrying one); the file is removed once the server has logged
# the first injected error, and the read must then succeed.
retry_case() {
  local f=$1; shift
  touch "$TMP/fault"
  serve --filter="$f" --filter=error memory 1M error=EIO error-pread-rate=1 \
    error-pread-file="$TMP/fault" "$@"
  "$PY" - "$URI" "$TMP/fault" "$TMP/server.log" <<'PYEOF' || fail "$f: the read was not retried into a success"
import nbd, os, sys, threading, time
uri, fault, log = sys.argv[1:]
def heal():
    for _ in range(1200):                 # up to 60 s: the server may be slow
        if "injecting" in open(log).read():
            break
        time.sleep(0.05)
    os.unlink(fault)
threading.Thread(target=heal).start()
h = nbd.NBD(); h.connect_uri(uri)
assert h.pread(4096, 0) == bytes(4096)
print("read succeeded after the fault went away")
PYEOF
  grep -q injecting "$TMP/server.log" || fail "$f: no error was injected (check is void)"
  ok "$f: a read failing with EIO succeeds once the fault is gone"
}
have_filter error && have_filter retry && retry_case retry retries=30 retry-delay=1
have_filter error && have_filter retry-request &&
  retry_case retry-request retry-request-retries=30 retry-request-delay=1

if have_filter pause; then
  serve --filter=pause memory 1M pause-control="$TMP/pause.sock"
  "$PY" - "$URI" "$TMP/pause.sock" <<'PYEOF' || fail "pause"
import nbd, socket, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1])
c = socket.socket(socket.AF_UNIX); c.settimeout(60); c.connect(sys.argv[2])
c.sendall(b"p"); assert c.recv(1) == b"P"
buf = nbd.Buffer(4096)
cookie = h.aio_pread(buf, 0)
end = time.monotonic() + 1.0
while time.monotonic() < end:
    h.poll(100)
    assert not h.aio_command_completed(cookie), "read completed while paused"
c.sendall(b"r"); assert c.recv(1) == b"R"
while not h.aio_command_completed(cookie):
    h.poll(-1)
print("paused read completed after resume")
PYEOF
  ok "pause: a read hangs while paused and completes on resume"
fi
check_alive
echo "ok"
