#!/usr/bin/env bash
# blkd and the rbd plugin under valgrind's memcheck (librbd's threads and
# the aio completions included): data copied in and out over two
# connections, the pool's images listed as exports, a missing image asked
# for at connect, a client that hangs up with a write's payload
# half sent, then SIGTERM.  No memcheck error, no definite or indirect
# leak, no descriptor blkd opened left open (tests/helpers/valgrind.sh).
# run.sh: serial (memcheck runs blkd and librbd 20-50 times slower)
. "$(dirname "$0")/lib-rbd.sh"
. "$TOP/tests/helpers/core.sh"
. "$TOP/tests/helpers/valgrind.sh"
[ "$PLUGIN_HOST" = blkd ] || skip "valgrind checks blkd's own memory"
need nbdcopy; need curl
valgrind_wrap
cluster_up
rbd_ create --size 8M --image-feature layering,exclusive-lock img1
head -c 8M /dev/urandom >"$TMP/in.img"
nbd_in() { nbdcopy --flush --connections=2 "$TMP/in.img" "$1"; }

# No image= given: every image of the pool is an export.
serve
nbd_in "nbd://127.0.0.1:$PORT/img1" || fail "nbdcopy into img1 under valgrind"
expect_eq "$(nbdcopy --connections=2 "nbd://127.0.0.1:$PORT/img1" - | md5sum | cut -d' ' -f1)" \
  "$(md5sum <"$TMP/in.img" | cut -d' ' -f1)" "img1 read back under valgrind"
nbdinfo --list "nbd://127.0.0.1:$PORT/" >"$TMP/list" || fail "nbdinfo --list"
grep -q 'export="img1"' "$TMP/list" || { cat "$TMP/list"; fail "img1 not listed"; }
nbdinfo "nbd://127.0.0.1:$PORT/no-such-image" >/dev/null 2>&1 && fail "a missing image was served"
ok "a missing image is refused at connect"
# A 1 MiB write with a quarter of its payload, then the client is gone.
$PY - "$PORT" <<'PYEOF' || fail "the hanging-up client could not run"
import socket, struct, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
def recv(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        assert c, "server closed during the handshake"
        b += c
    return b
assert recv(18)[:16] == b"NBDMAGICIHAVEOPT"
s.sendall(struct.pack(">I", 3) + b"IHAVEOPT" + struct.pack(">II", 1, 4) + b"img1")
recv(10)
s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, 1, 0, 1 << 20) + b"y" * (1 << 18))
s.close()
PYEOF
expect_eq "$(nbdinfo --size "nbd://127.0.0.1:$PORT/img1")" 8388608 "img1's size after the client hung up"
valgrind_stop "rbd plugin, image and exports"
