#!/usr/bin/env bash
# The container image serving an RBD image, for real: the image's entrypoint with the k8s
# example's ConfigMap settings (BLKD_PLUGIN=rbd, ceph.conf and keyring mounted read-only at
# /etc/ceph as the Secret is), as the image's non-root user, against the test's own cluster on
# the host's loopback; data copied in and out, then `podman stop` and a clean exit.
#
# Needs podman and a built image: runs with BLKD_CONTAINER_TEST=1 after `make container`
# (BLKD_CONTAINER_TEST=1 tests/run.sh tests/rbd/test-rbd-container.sh).
# run.sh: serial (podman containers)
. "$(dirname "$0")/lib-rbd.sh"
[ "${BLKD_CONTAINER_TEST:-}" = 1 ] ||
  skip "container test runs with BLKD_CONTAINER_TEST=1 after 'make container' (needs podman)"
need podman; need nbdcopy
IMAGE=${CONTAINER_IMAGE:-localhost/blkd:latest}
PODMAN=$TOP/deploy/podman.sh
"$PODMAN" image exists "$IMAGE" || fail "no image $IMAGE: run 'make container' first"
NAME=blkd-rbd-test-$$
ctr_cleanup() {
  local rc=$?
  "$PODMAN" rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
  rbd_cleanup "$rc"
}
trap ctr_cleanup EXIT

cluster_up
rbd_ create --size 16M disk0
# What the Secret holds: the cluster's ceph.conf (the test cluster's paths
# for admin sockets and logs do not exist in the container: turned off)
# and client.blkd's keyring, readable by the image's user only.
mkdir -p "$TMP/etc-ceph"
sed -e '/^\[client\]/,$d' "$CEPH_CONF" >"$TMP/etc-ceph/ceph.conf"
printf '[client]\nadmin socket =\nlog file =\n' >>"$TMP/etc-ceph/ceph.conf"
cp "$TMP/ceph/ceph.client.blkd.keyring" "$TMP/etc-ceph/keyring"
chown -R 10809:10809 "$TMP/etc-ceph"
chmod 0440 "$TMP/etc-ceph"/*
chmod 0550 "$TMP/etc-ceph"

# blkd in the container cannot be asked which port it got (-p 0): a port
# the kernel just handed out, as cluster.sh picks the mon's.
port=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PODMAN" run -d --name "$NAME" --network=host --no-healthcheck --read-only \
  -v "$TMP/etc-ceph:/etc/ceph:ro" \
  -e BLKD_PLUGIN=rbd \
  -e BLKD_PLUGIN_ARGS="conf=/etc/ceph/ceph.conf keyring=/etc/ceph/keyring id=blkd pool=rbd image=disk0 connect-timeout=20" \
  -e BLKD_ADDR=127.0.0.1 -e BLKD_PORT="$port" -e BLKD_METRICS=off \
  "$IMAGE" >/dev/null
wait_port "$port" 60
URI=nbd://127.0.0.1:$port
[ "$(nbdinfo --size "$URI")" = $((16 << 20)) ] || fail "the container does not serve disk0"
head -c 16M /dev/urandom >"$TMP/in.bin"
nbdcopy "$TMP/in.bin" "$URI"
[ "$(sum_nbd "$URI")" = "$(md5sum <"$TMP/in.bin" | cut -d' ' -f1)" ] || fail "data through the container"
[ "$(rbd_ export disk0 - 2>/dev/null | md5sum | cut -d' ' -f1)" = "$(md5sum <"$TMP/in.bin" | cut -d' ' -f1)" ] \
  || fail "rbd export differs from what went in through the container"
"$PODMAN" stop -t 30 "$NAME" >/dev/null
rc=$("$PODMAN" inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$rc" = 0 ] || { "$PODMAN" logs "$NAME" | tail -20; fail "the container exited $rc"; }
echo ok
