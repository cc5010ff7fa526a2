#!/usr/bin/env bash
# `systemctl restart blkd` under a real systemd keeps a client connected:
# systemd 252 runs as PID 1 of a podman container (Debian's base image from
# deploy/make-base-image.sh plus systemd and blkd's libraries), with the
# shipped blkd.socket and blkd.service (Type=notify, --fdstore,
# FileDescriptorStoreMax=) installed by `make install-systemd`, and this
# tree's blkd and rawio plugin mounted in.  One libnbd connection from the
# host keeps verified writes and reads in flight while blkd.service is
# restarted several times (tests/helpers/fdstore-client.py): no error, the
# data intact, the same socket throughout, each restart a new process, the
# store emptied by each new process, and `systemctl stop` closing the
# connection.  Then the same with a unit of the test's own, no socket unit:
# blkd binds the port itself and its listener goes through the store too.
# Skips where podman or the base image is missing; the test image is built
# once and kept (its tag names what went into it).
# run.sh: serial (a podman container with systemd)
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/systemd-image.sh"

need podman
need dpkg
PY=/usr/bin/python3
"$PY" -c 'import nbd' 2>/dev/null || skip "python3-libnbd (the nbd module) is not installed"
[ -x "$BLKD" ] || fail "$BLKD is not built"
RAWIO=$TOP/plugins/rawio/nbdkit-rawio-plugin.so
[ -f "$RAWIO" ] || fail "$RAWIO is not built"
PODMAN=$TOP/deploy/podman.sh
BASE=${BASE:-localhost/debian:bookworm}
RESTARTS=4

sd_image "$BASE" "$TMP/image" "$BLKD" "$RAWIO" || skip "$SD_WHY"
IMAGE=$SD_IMAGE

# The shipped units, paths as `make install-systemd` writes them; the
# environment file names this tree's rawio on a file in the unit's
# StateDirectory, which outlives each blkd process as a disk must.
sd_units "$TMP/root" ||
  fail "make install-systemd, or the installed blkd.service lacks --fdstore or FileDescriptorStoreMax="
units=$SD_UNITS
cat > "$TMP/blkd.env" <<'EOF'
BLKD_PLUGIN=/usr/local/lib/blkd/plugins/nbdkit-rawio-plugin.so
BLKD_PLUGIN_ARGS="file=/var/lib/blkd/disk.img"
BLKD_OPTIONS="-v --shards 2"
EOF

NAME=blkd-fdstore-test-$$
ctr_cleanup() {
  local rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
    echo "--- journal of blkd.service:"
    "$PODMAN" exec "$NAME" journalctl -u blkd.service -u blkd.socket --no-pager 2>&1 | tail -n 60
  fi
  "$PODMAN" rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
  cleanup "$rc"
}
trap ctr_cleanup EXIT
"$PODMAN" run -d --name "$NAME" --systemd=always -p 127.0.0.1::10809 -p 127.0.0.1::10810 \
  -v "$BLKD:/usr/local/bin/blkd:ro" \
  -v "$RAWIO:/usr/local/lib/blkd/plugins/nbdkit-rawio-plugin.so:ro" \
  -v "$units/blkd.service:/etc/systemd/system/blkd.service:ro" \
  -v "$units/blkd.socket:/etc/systemd/system/blkd.socket:ro" \
  -v "$TMP/blkd.env:/etc/default/blkd:ro" \
  "$IMAGE" >/dev/null || fail "podman run (systemd as PID 1)"
sd() { timeout 60 "$PODMAN" exec "$NAME" "$@"; }
for ((i = 0; i < 100; i++)); do
  state=$(sd systemctl is-system-running 2>/dev/null || true)
  case "$state" in running|degraded) break ;; esac
  sleep 0.2
done
case "$state" in running|degraded) ;; *) fail "systemd in the container is '$state' after 20 s" ;; esac
echo "systemd $(sd systemctl --version | head -n 1 | cut -d' ' -f2) is PID 1 ($state)"

# The disk, in the state directory systemd hands to the dynamic user (it
# chowns the directory, file included, at each start).
sd sh -c 'mkdir -p /var/lib/private/blkd && chmod 0700 /var/lib/private &&
          truncate -s 64M /var/lib/private/blkd/disk.img' || fail "creating the disk image"
# A SANITIZE=1 build: LeakSanitizer cannot stop the world inside the
# hardened unit's sandbox (it exits 1 at every exit); leaks are checked in
# blkd-own.service below, which has no sandbox, and ASan and UBSan stay on.
if built_with_asan "$BLKD"; then
  echo "sanitized blkd: LeakSanitizer off in blkd.service (a drop-in), on in blkd-own.service"
  printf '[Service]\nEnvironment=ASAN_OPTIONS=detect_leaks=0\n' |
    timeout 60 "$PODMAN" exec -i "$NAME" sh -c 'mkdir -p /etc/systemd/system/blkd.service.d &&
      cat > /etc/systemd/system/blkd.service.d/lsan.conf && systemctl daemon-reload' ||
    fail "adding the LeakSanitizer drop-in"
fi
sd systemctl start blkd.socket || fail "systemctl start blkd.socket"
# host_port PORT: the host port podman published for the container's PORT.
host_port() {
  local p
  p=$("$PODMAN" port "$NAME" "$1/tcp" | sed -n 's/.*:\([0-9][0-9]*\)$/\1/p' | head -n1)
  [ -n "$p" ] || fail "podman published no host port for $1"
  echo "$p"
}

timeout 300 "$PY" "$TOP/tests/helpers/fdstore-client.py" "nbd://127.0.0.1:$(host_port 10809)" \
  "$PODMAN" "$NAME" blkd.service 10809 "$RESTARTS" ||
  fail "the connection did not survive systemctl restart"
sd journalctl -u blkd.service --no-pager -o cat |
  grep -E "file descriptor store|live restart .* done" | sed 's/^/journal: /' | tail -n 4
echo "blkd.service: systemctl restart x$RESTARTS, one connection, no error, data verified; stop closed it"

# No socket unit: blkd binds port 10810 itself, and stores its listener.
timeout 60 "$PODMAN" exec -i "$NAME" sh -c 'truncate -s 64M /var/lib/blkd-own.img &&
  cat > /etc/systemd/system/blkd-own.service' <<'EOF' ||
[Service]
Type=notify
NotifyAccess=main
FileDescriptorStoreMax=16
ExecStart=/usr/local/bin/blkd -f --fdstore -v -p 10810 /usr/local/lib/blkd/plugins/nbdkit-rawio-plugin.so file=/var/lib/blkd-own.img
EOF
  fail "writing blkd-own.service"
sd systemctl daemon-reload || fail "systemctl daemon-reload"
sd systemctl start blkd-own.service ||
  fail "systemctl start blkd-own.service: $(sd journalctl -u blkd-own.service --no-pager | tail -n 20)"
timeout 300 "$PY" "$TOP/tests/helpers/fdstore-client.py" "nbd://127.0.0.1:$(host_port 10810)" \
  "$PODMAN" "$NAME" blkd-own.service 10810 2 ||
  fail "the connection did not survive systemctl restart (blkd's own listener)"
echo "blkd-own.service: its own listener and the connection kept across 2 restarts; stop closed it"

# Nothing went wrong quietly: no error line from blkd (a connection the
# store lost, a removal that failed) and no sanitizer report (a SANITIZE=1
# build runs here as it is: its libraries are installed in the image).
bad=$(sd journalctl -u blkd.service -u blkd-own.service --no-pager -o cat |
      grep -E 'blkd: error:|AddressSanitizer|LeakSanitizer|runtime error:' || true)
[ -z "$bad" ] || fail "the journal has errors: $bad"
echo "journal: no error lines, no sanitizer reports"
