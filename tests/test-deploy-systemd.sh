#!/usr/bin/env bash
# deploy/systemd units: `systemd-analyze verify` must be silent, the service
# must stay hardened (offline exposure score), and the environment file must
# be valid shell that yields the intended command line.
#
# verify checks that ExecStart's binary exists, so the units are copied to a
# temporary directory with ExecStart pointing at this tree's ./blkd (or, if
# it is not built, /bin/true: the unit syntax is what is under test here;
# tests/test-deploy-socket-activation.sh runs the real binary).
. "$(dirname "$0")/lib.sh"
need systemd-analyze

src=$TOP/deploy/systemd
for f in blkd.socket blkd.service blkd.env; do
  [ -f "$src/$f" ] || fail "missing deploy/systemd/$f"
done

bin=$BLKD
if [ ! -x "$bin" ]; then
  echo "note: $BLKD not built; verifying with ExecStart=/bin/true"
  bin=/bin/true
fi
units=$TMP/units
mkdir -p "$units"
cp "$src/blkd.socket" "$units/"
sed "s|^ExecStart=/usr/local/bin/blkd |ExecStart=$bin |" "$src/blkd.service" > "$units/blkd.service"
grep -q "^ExecStart=$bin " "$units/blkd.service" ||
  fail "blkd.service has no 'ExecStart=/usr/local/bin/blkd ...' line"

# Any output (unknown keys, bad values, missing binary) is a failure: verify
# exits 0 on warnings like "Unknown key".
out=$(cd "$units" && systemd-analyze verify blkd.socket blkd.service 2>&1) ||
  fail "systemd-analyze verify failed: $out"
[ -z "$out" ] || fail "systemd-analyze verify is not clean: $out"
echo "systemd-analyze verify: clean"

# Socket activation wiring.
grep -q '^ListenStream=' "$units/blkd.socket" || fail "blkd.socket has no ListenStream"
grep -q '^Service=blkd.service' "$units/blkd.socket" || fail "blkd.socket does not name blkd.service"
grep -q '^Requires=blkd.socket' "$units/blkd.service" || fail "blkd.service does not require blkd.socket"
grep -q '^EnvironmentFile=-/etc/default/blkd' "$units/blkd.service" || fail "no EnvironmentFile=-/etc/default/blkd"
# PartOf/BindsTo would take the socket down with the service, refusing
# clients during a restart: the point of holding the socket in systemd.
! grep -qE '^(PartOf|BindsTo)=' "$units/blkd.socket" || fail "blkd.socket is PartOf/BindsTo the service"

# Hardening the brief asks for, present and not weakened.
for want in 'DynamicUser=yes' 'ProtectSystem=strict' 'NoNewPrivileges=yes' \
            'PrivateTmp=yes' 'ProtectHome=yes' 'CapabilityBoundingSet=' \
            'RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6' \
            'SystemCallFilter=@system-service'; do
  grep -qx "$want" "$units/blkd.service" || fail "blkd.service lacks '$want'"
done
if grep -q -- '--offline' <<<"$(systemd-analyze security --help 2>&1)"; then
  sec=$(cd "$units" && systemd-analyze security --offline=true --threshold=20 blkd.service 2>&1) ||
    fail "exposure above 2.0: $(echo "$sec" | tail -n 3)"
  echo "$sec" | tail -n 1
else
  echo "note: systemd-analyze security has no --offline; exposure not scored"
fi

# The environment file: shell syntax, and what ExecStart makes of it.
bash -n "$src/blkd.env" || fail "blkd.env is not valid shell"
eval "$(env -i bash -c 'set -a; . "$1"; declare -p BLKD_PLUGIN BLKD_PLUGIN_ARGS BLKD_OPTIONS' _ "$src/blkd.env")" ||
  fail "blkd.env does not define BLKD_PLUGIN, BLKD_PLUGIN_ARGS, BLKD_OPTIONS"
[ "$BLKD_PLUGIN" = ram ] || fail "blkd.env: BLKD_PLUGIN=$BLKD_PLUGIN, want ram"
case "$BLKD_OPTIONS" in *-p\ *|*-i\ *|*-U\ *) fail "blkd.env sets a listen address; blkd.socket owns it" ;; esac
echo "blkd.env: blkd -f $BLKD_OPTIONS $BLKD_PLUGIN $BLKD_PLUGIN_ARGS"
