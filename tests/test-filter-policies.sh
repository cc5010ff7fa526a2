#!/usr/bin/env bash
# Filters that change what the export offers or how requests reach the
# plugin: blocksize, blocksize-policy, fua, multi-conn, noextents, nozero,
# nocache, noparallel, protect, and a read-only (-r) stack.  Each check looks
# at what a client sees (flags, errors, data) and, where the point is what
# the plugin sees, at a log filter stacked below.
. "$(dirname "$0")/lib.sh"
. "$TOP/tests/helpers/core.sh"
. "$TOP/tests/helpers/filters.sh"
need_filter_server; need nbdinfo; need nbdcopy; need qemu-io; need_nbd_py
MODELS=$TOP/tests/plugins/nbdkit-models-plugin.so

if have_filter blocksize && have_filter log; then
  # Clients may do 1-byte I/O; the plugin, below log, sees only whole
  # 4K blocks (read-modify-write).
  serve --filter=blocksize --filter=log memory 1M minblock=4096 \
    logfile="$TMP/bs.log"
  expect_eq "$(info "$URI" block_size_minimum)" 1 "blocksize: clients may send 1-byte requests"
  qemu-io -f raw -c 'write -P 0x77 100 10' -c 'read -P 0x77 100 10' \
    -c 'read -P 0 0 100' -c 'read -P 0 110 3986' "$URI" >"$TMP/qio" \
    || fail "blocksize: small I/O: $(cat "$TMP/qio")"
  grep -q 'Pattern verification failed' "$TMP/qio" && fail "blocksize: read back differs"
  ok "blocksize: a 10-byte write at 100 reads back, its neighbours stay zero"
  grep -E ' (Read|Write) ' "$TMP/bs.log" >"$TMP/io.log" || fail "blocksize: the log filter saw no I/O"
  "$PY" - "$TMP/io.log" <<'PYEOF' || fail "blocksize: the plugin saw unaligned I/O"
import re, sys
for line in open(sys.argv[1]):
    m = re.search(r"offset=0x([0-9a-f]+) count=0x([0-9a-f]+)", line)
    if int(m.group(1), 16) % 4096 or int(m.group(2), 16) % 4096:
        sys.exit(line)
PYEOF
  ok "blocksize: the layer below saw only 4K-aligned I/O ($(wc -l <"$TMP/io.log") requests)"
fi

if have_filter blocksize-policy; then
  serve --filter=blocksize-policy memory 1M blocksize-minimum=4096 \
    blocksize-preferred=65536 blocksize-maximum=1M blocksize-error-policy=error
  expect_eq "$(info "$URI" block_size_minimum)" 4096 "blocksize-policy: minimum"
  expect_eq "$(info "$URI" block_size_preferred)" 65536 "blocksize-policy: preferred"
  qemu-io -f raw -c 'read 8k 4k' "$URI" >/dev/null || fail "blocksize-policy: an aligned read failed"
  nbd_must_fail "blocksize-policy: an unaligned read gets EINVAL" EINVAL "$URI" 'h.pread(100, 1)'
fi

if have_filter fua && have_filter log; then
  # (fuamode=none is refused by nbdkit 1.32's fua filter itself: a missing
  # "else" in its config; not checked.)  emulate: a FUA write reaches the
  # layer below as a plain write and a flush.
  serve --filter=fua --filter=log memory 1M fuamode=emulate logfile="$TMP/fua.log"
  expect_eq "$(info "$URI" can_fua)" true "fua emulate: FUA offered"
  qemu-io -f raw -c 'write -f -P 0x5 0 4k' -c 'read -P 0x5 0 4k' "$URI" >"$TMP/qio" \
    || fail "fua: FUA write"
  grep -q 'Pattern verification failed' "$TMP/qio" && fail "fua: read back differs"
  grep -q ' Write .*fua=0' "$TMP/fua.log" && grep -q ' Flush ' "$TMP/fua.log" \
    || fail "fua emulate: no plain write + flush below: $(cat "$TMP/fua.log")"
  grep -q ' Write .*fua=1' "$TMP/fua.log" && fail "fua emulate: FUA passed down"
  ok "fua emulate: a FUA write arrives below as write + flush"
  # force: every write reaches the layer below with FUA.
  serve --filter=fua --filter=log memory 1M fuamode=force logfile="$TMP/force.log"
  qemu-io -f raw -c 'write -P 0x6 0 4k' "$URI" >/dev/null || fail "fua force: write"
  grep -q ' Write .*fua=1' "$TMP/force.log" \
    || fail "fua force: write without FUA below: $(cat "$TMP/force.log")"
  ok "fua force: a plain write arrives below with FUA"
fi

if have_filter multi-conn; then
  serve memory 1M
  expect_eq "$(info "$URI" can_multi_conn)" true "memory alone offers multi-conn"
  serve --filter=multi-conn memory 1M multi-conn-mode=disable
  expect_eq "$(info "$URI" can_multi_conn)" false "multi-conn mode=disable: not offered"
fi

if have_filter noextents; then
  serve memory 1M
  expect_eq "$(nbdinfo --map "$URI" | awk '{print $3}')" 3 "memory alone: a fresh disk is a hole"
  serve --filter=noextents memory 1M
  expect_eq "$(nbdinfo --map "$URI" | awk '{print $1, $2, $3}')" "0 1048576 0" \
    "noextents: the whole disk is data"
fi

if have_filter nozero; then
  serve --filter=nozero memory 1M
  expect_eq "$(info "$URI" can_zero)" false "nozero (default zeromode=none): no WRITE_ZEROES"
  serve --filter=nozero memory 1M zeromode=emulate
  expect_eq "$(info "$URI" can_zero)" true "nozero zeromode=emulate: WRITE_ZEROES offered"
  qemu-io -f raw -c 'write -P 0x9 0 64k' -c 'write -z 4k 8k' -c 'read -P 0 4k 8k' \
    -c 'read -P 0x9 0 4k' "$URI" >"$TMP/qio" || fail "nozero: zero"
  grep -q 'Pattern verification failed' "$TMP/qio" && fail "nozero: emulated zero reads wrong"
  ok "nozero emulate: zeroed range reads as zeros"
fi

if have_filter nocache; then
  serve memory 1M
  expect_eq "$(info "$URI" can_cache)" true "memory alone offers CACHE"
  serve --filter=nocache memory 1M cachemode=none
  expect_eq "$(info "$URI" can_cache)" false "nocache cachemode=none: no CACHE"
  serve --filter=nocache memory 1M cachemode=emulate
  expect_eq "$(info "$URI" can_cache)" true "nocache cachemode=emulate: CACHE offered"
fi

if have_filter noparallel && [ -f "$MODELS" ]; then
  # The models plugin reports the most calls it ever had in flight at once.
  # 16 reads in flight on one connection: with noparallel only one at a time
  # reaches the plugin.
  concurrency() {
    "$PY" - "$1" <<'PYEOF'
import nbd, struct, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
bufs = [nbd.Buffer(4096) for _ in range(16)]
for i, b in enumerate(bufs):
    h.aio_pread(b, i * 4096)
while h.aio_in_flight() > 0:
    h.poll(-1)
print(struct.unpack(">I", h.pread(4096, 0)[:4])[0])
PYEOF
  }
  # Every serializing mode means one call at a time on a connection; with
  # connections, the strictest, also one connection at a time (nbdkit:
  # "all requests happen from one thread").
  for mode in requests all-requests connections; do
    serve --filter=noparallel "$MODELS" serialize=$mode
    expect_eq "$(concurrency "$URI")" 1 "noparallel serialize=$mode: one plugin call at a time"
  done
  serve "$MODELS"
  n=$(concurrency "$URI")
  [ "$n" -gt 1 ] || note "models alone saw $n call(s) at once (expected more; the machine may be too loaded)"
elif [ ! -f "$MODELS" ]; then
  note "$MODELS not built (make tests/plugins/nbdkit-models-plugin.so): noparallel not checked"
fi

if have_filter protect; then
  serve --filter=protect memory 1M protect=0-65535
  nbd_must_fail "protect: changing a protected byte is EPERM" EPERM "$URI" \
    'h.pwrite(b"\x01" * 4096, 4096)'
  qemu-io -f raw -c 'write -P 0 4k 4k' -c 'write -P 0x2 64k 4k' -c 'read -P 0 4k 4k' \
    -c 'read -P 0x2 64k 4k' "$URI" >"$TMP/qio" || fail "protect: allowed writes: $(cat "$TMP/qio")"
  grep -q 'Pattern verification failed' "$TMP/qio" && fail "protect: read back differs"
  ok "protect: writing the same bytes, or outside the range, is fine"
fi

if have_filter nozero; then
  # -r under a filter stack: read-only all the way down.
  serve -r --filter=nozero memory 1M
  expect_eq "$(info "$URI" is_read_only)" true "-r with a filter: read-only export"
  nbd_must_fail "-r with a filter: a write gets EPERM" EPERM "$URI" 'h.pwrite(b"x", 0)'
fi
check_alive
echo "ok"
