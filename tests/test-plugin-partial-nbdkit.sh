#!/usr/bin/env bash
# The partial TEST plugin under nbdkit: pins down its behaviour (hole in
# the first quarter, 0x5A elsewhere, reads from the second half fail with
# an error, writes discarded) so blkd's buffer-safety tests can rely on it.
. "$(dirname "$0")/lib.sh"
# The same checks run with the plugin hosted by nbdkit (this file) and by
# blkd (test-plugin-partial-blkd.sh sets PLUGIN_HOST=blkd).
PLUGIN_HOST=${PLUGIN_HOST:-nbdkit}
need nbdkit; need nbdinfo; need qemu-io
PY=/usr/bin/python3
$PY -c 'import nbd' 2>/dev/null || skip "python3-libnbd (module nbd) is not installed"
SO=$TOP/plugins/partial/nbdkit-partial-plugin.so
[ -f "$SO" ] || skip "$SO is not built (make plugins/partial/nbdkit-partial-plugin.so)"

start_server "$PLUGIN_HOST" "$SO" size=16M

# Block status: first quarter hole+zero, the rest data.
got=$(nbdinfo --map "$URI" | awk '{print $1, $2, $3}')
[ "$got" = $'0 4194304 3\n4194304 12582912 0' ] || fail "map: $got"

# Real client: hole reads zeros, middle reads 0x5A, second half fails.
qemu-io -f raw -c 'read -P 0 0 4M' -c 'read -P 0x5a 4M 4M' \
        -c 'read -P 0x5a 7M 2M' "$URI" >"$TMP/qio.log" \
  || fail "reads in the first half: $(cat "$TMP/qio.log")"
if qemu-io -f raw -c 'read 12M 64k' "$URI" >"$TMP/qio2.log" 2>&1; then
  fail "read in the second half succeeded: $(cat "$TMP/qio2.log")"
fi

$PY - "$URI" <<'EOF' || fail "partial semantics"
import nbd, sys
M = 1 << 20
h = nbd.NBD(); h.connect_uri(sys.argv[1])
assert h.get_size() == 16 * M
# Across the hole boundary: zeros then pattern, byte-exact.
d = h.pread(8192, 4 * M - 4096)
assert d == bytes(4096) + b"\x5a" * 4096, "hole/data boundary"
# A read that starts before the middle but runs into the second half is
# a first-half read: it succeeds.
assert h.pread(65536, 8 * M - 4096) == b"\x5a" * 65536, "straddling read"
# Every read starting in the second half fails, whatever its size.
for off, n in ((8 * M, 512), (8 * M, 65536), (16 * M - 4096, 4096), (12 * M + 1, 1000)):
    try:
        h.pread(n, off)
    except nbd.Error as e:
        print(f"read {n}@{off}: {e.string}")
    else:
        sys.exit(f"read {n}@{off} succeeded")
# The connection survives the errors; writes are accepted and discarded.
h.pwrite(b"\x11" * 4096, 4 * M)
h.pwrite(b"\x11" * 4096, 0)
assert h.pread(4096, 4 * M) == b"\x5a" * 4096, "write was not discarded"
assert h.pread(4096, 0) == bytes(4096), "write into the hole was not discarded"
h.shutdown()
print("partial ok")
EOF
grep -q 'fails after' "$TMP/server.log" || fail "plugin error not logged by nbdkit"
server_alive || fail "nbdkit died"
echo ok
