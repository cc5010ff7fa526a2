#!/usr/bin/env bash
# The kernel client's user-space handshake: nbd-client -l HOST PORT lists
# the exports with NBD_OPT_LIST (this kernel has no nbd driver, so there is
# no attach; the handshake is what nbd-client shares with the kernel path).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
need_server
command -v nbd-client >/dev/null 2>&1 || [ -x /usr/sbin/nbd-client ] || skip "nbd-client is not installed"
NBDC=$(command -v nbd-client || echo /usr/sbin/nbd-client)

echo "# nbd-client -l against the default export"
start_server memory size=64M
"$NBDC" -l 127.0.0.1 "$PORT" >"$TMP/list" 2>&1 || { cat "$TMP/list"; fail "nbd-client -l failed"; }
cat "$TMP/list"
grep -q '^Negotiation: \.\.' "$TMP/list" || fail "nbd-client did not complete the negotiation"
ok "nbd-client negotiated"
grep -Eiq 'error|E: ' "$TMP/list" && fail "nbd-client printed an error"
# After the "Negotiation" line nbd-client prints one line per export; the
# default export's name is empty.
expect_eq "$(sed 1d "$TMP/list" | wc -l)" 1 "exports listed"
check_alive
stop_server

echo "# nbd-client -l with a named export (-e)"
start_server -e blkd-disk0 memory size=64M
"$NBDC" -l 127.0.0.1 "$PORT" >"$TMP/list" 2>&1 || { cat "$TMP/list"; fail "nbd-client -l failed"; }
cat "$TMP/list"
grep -q '^Negotiation: \.\.' "$TMP/list" || fail "nbd-client did not complete the negotiation"
if blkd_only "nbd-client -l lists the -e export name" "nbdkit lists the plugin's default export, not -e"; then
  grep -qx 'blkd-disk0' "$TMP/list" || fail "export blkd-disk0 is not listed"
  ok "export blkd-disk0 listed"
fi

echo "# nbd-client -l against a port with nothing listening fails"
stop_server
dead_port
expect_fail "nbd-client -l on a closed port" "$NBDC" -l 127.0.0.1 "$DEAD_PORT"
echo "all nbd-client checks passed"
