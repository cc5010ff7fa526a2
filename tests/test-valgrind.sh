#!/usr/bin/env bash
# blkd under valgrind's memcheck, through what a server's day holds: many
# connections copying data in and out, TLS with certificates and with a
# wrong key, a filter stack, metrics scraped, block status, clients that
# send garbage or hang up halfway through a write's payload, the engine's
# other modes and its cache on a file, then SIGTERM.  blkperf runs under
# memcheck too, against the first of them.
# Memcheck must report no error (no invalid access, no uninitialised value
# that decides a branch or reaches a syscall) and no definite or indirect
# leak at exit, and no descriptor blkd opened may be left open.
# The plugins are blkd's own: Debian's memory plugin leaks the 24 bytes its
# allocator registry reallocs in a constructor, under nbdkit as here.
# AddressSanitizer (the SANITIZE=1 suite) covers much of the same, but not
# uninitialised reads, and only what its build instruments: valgrind sees
# the plugins and the libraries too (helpers/valgrind.sh).
# run.sh: serial (valgrind runs blkd 20-50 times slower, on every CPU it gets)
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
. "$(dirname "$0")/helpers/tls.sh"
. "$(dirname "$0")/helpers/valgrind.sh"
need nbdcopy; need nbdinfo; need curl
[ -x "$BLKPERF" ] || skip "blkperf is not built (make blkperf)"
valgrind_wrap

# A raw client that completes a fixed-newstyle handshake, then does
# something no well-behaved client does; the server must only drop it.
hostile() {
  "$PY" - "$PORT" "$1" <<'EOF'
import socket, struct, sys
port, what = int(sys.argv[1]), sys.argv[2]
s = socket.create_connection(("127.0.0.1", port), timeout=30)
def recv(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            sys.exit("server closed during the handshake")
        b += c
    return b
assert recv(18)[:16] == b"NBDMAGICIHAVEOPT"
if what == "garbage-option":
    s.sendall(struct.pack(">I", 3) + b"IHAVEOPT" + struct.pack(">II", 0xdead, 1 << 30) + b"x" * 4096)
else:
    s.sendall(struct.pack(">I", 3))                       # fixed newstyle, no zeroes
    s.sendall(b"IHAVEOPT" + struct.pack(">II", 1, 0))     # NBD_OPT_EXPORT_NAME ""
    recv(10)
    if what == "half-write":
        # a 1 MiB write with a quarter of its payload, then gone
        s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, 1, 0, 1 << 20) + b"y" * (1 << 18))
    elif what == "bad-magic":
        s.sendall(struct.pack(">IHHQQI", 0x12345678, 0, 0, 1, 0, 4096))
        s.recv(1)
    elif what == "read-beyond":
        s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, 7, 1 << 40, 4096))
        recv(16)
s.close()
EOF
}

echo "# ram on two shards: copies over four connections, metrics, hostile clients"
head -c 12M /dev/urandom >"$TMP/in.img"
start_server --shards 2 --metrics 127.0.0.1:0 ram size=64M
nbdcopy --connections=4 "$TMP/in.img" "$URI" || fail "nbdcopy into blkd under valgrind"
nbdcopy --connections=4 "$URI" "$TMP/out.img" || fail "nbdcopy out of blkd under valgrind"
cmp -n $((12 << 20)) "$TMP/in.img" "$TMP/out.img" || fail "data read back differs"
nbdinfo --map "$URI" >/dev/null || fail "nbdinfo --map"
curl -sf -o "$TMP/metrics" "http://127.0.0.1:$METRICS_PORT/metrics" || fail "no metrics"
grep -q '^blkd_requests_total' "$TMP/metrics" || fail "metrics without request counts"
for h in garbage-option half-write bad-magic read-beyond; do
  hostile "$h" || fail "hostile client $h could not run"
done
expect_eq "$(nbdinfo --size "$URI")" 67108864 "size after the hostile clients"
# blkperf, the project's client, under memcheck too: its wire loop with
# CPU and server metrics, repeated iterations with a chart, the libnbd
# engine with a prefill, round trips, and the reply-batching wake-ups.
blkperf_vg() {
  valgrind --quiet --error-exitcode=99 --leak-check=full --show-leak-kinds=definite,indirect \
    --errors-for-leak-kinds=definite,indirect "$BLKPERF" "$@" --quiet ${BP_URIS:-"$URI/"} \
    >"$TMP/blkperf.out" 2>"$TMP/blkperf.err" ||
    { cat "$TMP/blkperf.err"; fail "blkperf $* under valgrind"; }
  ok "blkperf $*: no memcheck error, no leak"
}
blkperf_vg -t RAND_RW -b 4k -q 8 -C 2 -l 1 -c -M "http://127.0.0.1:$METRICS_PORT/metrics"
if command -v gnuplot >/dev/null; then
  blkperf_vg -t RAND_READ -b 4k -n 2000 -i 3,2 --plot "$TMP/p.svg"
else
  echo "note: gnuplot is not installed: blkperf --plot is not run under memcheck"
fi
blkperf_vg -t STREAM_READ --io libnbd -n 64 --prefill --span 8M
blkperf_vg -t RR -n 500
blkperf_vg -t RAND_READ -b 4k -n 2000 --wake-replies 4
BP_URIS="$URI/ $URI/" blkperf_vg compare -t RAND_WRITE -b 4k -n 1000 -i 2,2
valgrind_stop "ram, 2 shards"

echo "# TLS with certificates and PSK, a filter stack"
T=$TMP/tls
make_tls_material "$T"
start_server --tls=require --tls-certificates="$T/server" --tls-psk="$T/keys.psk" \
  --filter=blocksize --filter=cache ram size=16M
XURI="nbds://127.0.0.1:$PORT/?tls-certificates=$T/client-ca"
# --flush: nbdkit's cache filter (Debian's, loaded unmodified) holds
# written blocks until a flush and passes block status through from the
# plugin, so before one a reader that trusts block status (nbdcopy) would
# see holes; nbdkit behaves the same.
nbdcopy --flush --connections=2 "$TMP/in.img" "$XURI" || fail "nbdcopy over TLS"
nbdcopy "nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$T/keys.psk" "$TMP/out2.img" ||
  fail "nbdcopy over PSK"
cmp -n $((12 << 20)) "$TMP/in.img" "$TMP/out2.img" || fail "data read back over TLS differs"
nbdinfo "nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$T/wrong.psk" >/dev/null 2>&1 &&
  fail "a wrong PSK was let in"
nbdinfo "nbd://127.0.0.1:$PORT/" >/dev/null 2>&1 && fail "a plaintext client was let in"
BP_URIS="nbds://127.0.0.1:$PORT/" blkperf_vg -t RAND_RW -b 4k -n 1000 -C 2 \
  --tls-certificates "$T/client-ca"
BP_URIS="nbds://127.0.0.1:$PORT/" blkperf_vg -t STREAM_WRITE -n 16 --tls-psk "$T/keys.psk" \
  --tls-username alice
valgrind_stop "TLS, blocksize and cache filters"

echo "# rawio on a file over a Unix socket, the seeds' before switches and the cache"
truncate -s 32M "$TMP/disk.img"
start_server_unix --dispatch worker --queue global --iobuf calloc --delayacct locked \
  --cache 4M --cache-mode writeback --cache-ctor yes rawio file="$TMP/disk.img"
nbdcopy --flush --connections=2 "$TMP/in.img" "$URI" || fail "nbdcopy into rawio"
nbdcopy --connections=2 "$URI" "$TMP/out3.img" || fail "nbdcopy out of rawio"
cmp -n $((12 << 20)) "$TMP/in.img" "$TMP/out3.img" || fail "rawio read back differs"
valgrind_stop "rawio, worker dispatch, global queue, calloc buffers, writeback cache"
cmp -n $((12 << 20)) "$TMP/in.img" "$TMP/disk.img" || fail "the file does not hold what was written"
ok "the file holds what was written"
