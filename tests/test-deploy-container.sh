#!/usr/bin/env bash
# The container image, for real: run the default command, connect with
# nbdinfo, nbdcopy a random file in and out, ask the health endpoint and the
# image's own HEALTHCHECK, check blkd runs as a non-root user, and stop it
# with `podman stop` (SIGTERM) while a client is connected: it must exit 0
# well inside the stop timeout. Then the argument form (PLUGIN key=value) with
# metrics off, whose health check falls back to a TCP check; blkperf from
# the image against the first container; TLS from a mounted BLKD_TLS_DIR;
# the k8s pod's settings (ConfigMap, init command, read-only root, rawio on
# a volume); and the systemd units under a real systemd in a container.
#
# Slow and needs podman plus a built image, so `make check` skips it; run it
# with `make container-test` (which builds the image first).
# run.sh: serial (podman containers)
. "$(dirname "$0")/lib.sh"

[ "${BLKD_CONTAINER_TEST:-}" = 1 ] ||
  skip "container test runs under 'make container-test' (builds the image; needs podman)"
need podman; need nbdinfo; need nbdcopy; need nbdsh; need curl
PY=/usr/bin/python3
"$PY" -c 'import yaml' 2>/dev/null || skip "python3-yaml is not installed"
# nbdsh and its nbd module need the system interpreter, not whatever
# python3 comes first in PATH.
nbdsh() { "$PY" -m nbd "$@"; }

IMAGE=${CONTAINER_IMAGE:-localhost/blkd:latest}
PODMAN=$TOP/deploy/podman.sh
STOP_TIMEOUT=20
CONTAINERS=()

ctr_cleanup() {
  local rc=${1:-$?} c
  for c in "${CONTAINERS[@]}"; do
    if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
      echo "--- logs of $c:"; "$PODMAN" logs "$c" 2>&1 | tail -n 30
    fi
    if [ -n "${KEEP_CONTAINERS:-}" ]; then echo "kept container $c"; continue; fi
    "$PODMAN" rm -f -t 0 "$c" >/dev/null 2>&1 || true
  done
  cleanup "$rc"
}
trap ctr_cleanup EXIT

"$PODMAN" image exists "$IMAGE" || fail "no image $IMAGE: run 'make container' first"
echo "== image $IMAGE"

# --- what the image is, before running it ---------------------------------
user=$("$PODMAN" image inspect -f '{{.Config.User}}' "$IMAGE")
[ "$user" = 10809:10809 ] || fail "image USER is '$user', want 10809:10809"
stopsig=$("$PODMAN" image inspect -f '{{.Config.StopSignal}}' "$IMAGE")
[ "$stopsig" = SIGTERM ] || fail "image STOPSIGNAL is '$stopsig'"
hc=$("$PODMAN" image inspect -f '{{.HealthCheck}}' "$IMAGE" 2>/dev/null || true)
case "$hc" in *blkd-healthcheck*) ;; *) fail "image has no HEALTHCHECK ('$hc'): built without --format docker?" ;; esac
echo "image: user $user, stop signal $stopsig, healthcheck $hc"

# Runtime stage: no toolchain, and every shared library the binaries and
# plugins need resolves.
"$PODMAN" run --rm --no-healthcheck --entrypoint /bin/bash "$IMAGE" -c '
  set -e
  for t in cc gcc make; do
    if command -v "$t" >/dev/null; then echo "toolchain in runtime image: $t"; exit 1; fi
  done
  ls /usr/local/bin/blkd /usr/local/bin/blkperf /usr/local/lib/blkd/plugins/nbdkit-ram-plugin.so /usr/local/lib/blkd/plugins/nbdkit-rawio-plugin.so
  for f in /usr/local/bin/blkd /usr/local/bin/blkperf /usr/local/lib/blkd/plugins/*.so; do
    if ldd "$f" | grep "not found"; then echo "unresolved library in $f"; exit 1; fi
  done
  dpkg -l | awk "/^ii/ && /-dev / {print; bad=1} END {exit bad}"
' || fail "runtime image check"

# Containers publish on host ports podman picks (-p 127.0.0.1::PORT), never
# on one the test guessed free: other tests run alongside.
# ctr_port NAME PORT: the host port podman gave NAME's container PORT.
ctr_port() {
  local p
  p=$("$PODMAN" port "$1" "$2/tcp" | sed -n 's/.*:\([0-9][0-9]*\)$/\1/p' | head -n1)
  [ -n "$p" ] || fail "podman port $1 $2: no host port published"
  echo "$p"
}

# --- the default command: ram 1 GiB on :10809, metrics on :9100 ------------
NAME=blkd-test-$$-a
CONTAINERS+=("$NAME")
# podman logs "unable to get systemd connection ... healthchecks" here: it
# schedules health checks with systemd timers and there is no systemd on the
# build machines. Harmless: `podman healthcheck run` below runs the image's
# HEALTHCHECK by hand.
"$PODMAN" run -d --name "$NAME" \
  -p 127.0.0.1::10809 -p 127.0.0.1::9100 "$IMAGE" >/dev/null ||
  fail "podman run failed"
NBD_PORT=$(ctr_port "$NAME" 10809)
MET_PORT=$(ctr_port "$NAME" 9100)
wait_port "$NBD_PORT" 30
URI="nbd://127.0.0.1:$NBD_PORT"
"$PODMAN" logs "$NAME" 2>&1 | sed 's/^/container: /'

size=$(nbdinfo --size "$URI") || fail "nbdinfo $URI"
[ "$size" = 1073741824 ] || fail "default export is $size bytes, want 1 GiB"
echo "nbdinfo: $size bytes"

# nbdcopy round trip: 32 MiB of random data in, the whole disk out.
head -c 32M /dev/urandom > "$TMP/in.img"
nbdcopy "$TMP/in.img" "$URI" || fail "nbdcopy to the container"
nbdcopy "$URI" "$TMP/out.img" || fail "nbdcopy from the container"
[ "$(stat -c %s "$TMP/out.img")" = 1073741824 ] || fail "copied-out size"
cmp -n 33554432 "$TMP/in.img" "$TMP/out.img" || fail "data read back differs"
cmp -i 33554432:0 -n $((1073741824 - 33554432)) "$TMP/out.img" /dev/zero ||
  fail "bytes past the written range are not zero"
echo "nbdcopy round trip: ok"

# Health: the endpoint itself, then the image's HEALTHCHECK command.
code=$(curl -s -o "$TMP/healthz" -w '%{http_code}' "http://127.0.0.1:$MET_PORT/healthz" || true)
echo "GET /healthz -> $code: $(head -c 200 "$TMP/healthz" 2>/dev/null)"
[ "$code" = 200 ] || fail "/healthz answered '$code'"
curl -fsS "http://127.0.0.1:$MET_PORT/metrics" -o "$TMP/metrics" || fail "GET /metrics"
echo "GET /metrics: $(wc -l < "$TMP/metrics") lines"
"$PODMAN" healthcheck run "$NAME" || fail "podman healthcheck run: unhealthy"
echo "podman healthcheck: healthy"

# Non-root: inside the container and as the host sees the process.
uid=$("$PODMAN" exec "$NAME" id -u)
[ "$uid" = 10809 ] || fail "container user is uid $uid"
pid=$("$PODMAN" inspect -f '{{.State.Pid}}' "$NAME")
hostuid=$(ps -o uid= -p "$pid" | tr -d ' ')
comm=$(ps -o comm= -p "$pid")
[ "$hostuid" != 0 ] || fail "blkd runs as root on the host"
[ "$comm" = blkd ] || fail "PID 1 of the container is '$comm', not blkd (entrypoint must exec)"
echo "non-root: uid $uid in the container, $hostuid on the host, PID 1 is $comm"

# blkperf from the image against this server (host network: 127.0.0.1).
"$PODMAN" run --rm --no-healthcheck --network=host "$IMAGE" \
  blkperf --json -t STREAM_READ -l 2 "$URI" > "$TMP/blkperf.json" ||
  fail "blkperf in the image"
"$PY" -c 'import json,sys; json.load(open(sys.argv[1]))' "$TMP/blkperf.json" ||
  fail "blkperf --json printed no JSON: $(head -c 300 "$TMP/blkperf.json")"
echo "blkperf from the image: $(head -c 200 "$TMP/blkperf.json")"

# Graceful stop with an idle client connected: SIGTERM, drain, exit 0.
nbdsh -u "$URI" -c 'import time; time.sleep(60)' >/dev/null 2>&1 &
client=$!
sleep 1
kill -0 "$client" 2>/dev/null || fail "the idle client did not stay connected"
start=$(date +%s.%N)
"$PODMAN" stop -t "$STOP_TIMEOUT" "$NAME" >/dev/null || fail "podman stop"
took=$(echo "$(date +%s.%N) - $start" | bc)
kill "$client" 2>/dev/null || true; wait "$client" 2>/dev/null || true
rc=$("$PODMAN" inspect -f '{{.State.ExitCode}}' "$NAME")
"$PODMAN" logs "$NAME" 2>&1 | tail -n 5 | sed 's/^/container: /'
echo "podman stop: exit code $rc after ${took}s (timeout ${STOP_TIMEOUT}s)"
[ "$rc" = 0 ] || fail "blkd exited $rc on SIGTERM, want 0"
(( $(echo "$took < $STOP_TIMEOUT / 2" | bc) )) ||
  fail "stop took ${took}s: not well inside the ${STOP_TIMEOUT}s timeout"

# --- argument form, metrics off: health falls back to a TCP check ----------
NAME=blkd-test-$$-b
CONTAINERS+=("$NAME")
"$PODMAN" run -d --name "$NAME" -e BLKD_METRICS=off \
  -p 127.0.0.1::10809 "$IMAGE" ram size=64M >/dev/null ||
  fail "podman run (argument form)"
NBD_PORT=$(ctr_port "$NAME" 10809)
wait_port "$NBD_PORT" 30
size=$(nbdinfo --size "nbd://127.0.0.1:$NBD_PORT") || fail "nbdinfo (argument form)"
[ "$size" = 67108864 ] || fail "argument form export is $size bytes, want 64 MiB"
"$PODMAN" healthcheck run "$NAME" || fail "healthcheck with metrics off"
"$PODMAN" stop -t "$STOP_TIMEOUT" "$NAME" >/dev/null
rc=$("$PODMAN" inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$rc" = 0 ] || fail "argument-form container exited $rc"
echo "argument form: 64 MiB, TCP health check, exit 0"

# --- TLS from a mounted BLKD_TLS_DIR: required, so plain NBD is refused ---
need openssl
tls=$TMP/tls
mkdir -p "$tls"
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$tls/ca-key.pem" -out "$tls/ca-cert.pem" \
  -days 2 -subj "/CN=blkd test CA" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$tls/server-key.pem" -out "$tls/server.csr" \
  -subj "/CN=localhost" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$tls/ext.cnf"
openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca-cert.pem" -CAkey "$tls/ca-key.pem" \
  -CAcreateserial -out "$tls/server-cert.pem" -days 2 -extfile "$tls/ext.cnf" 2>/dev/null ||
  fail "openssl could not make a test certificate"
chmod 0755 "$tls"; chmod 0644 "$tls"/*.pem     # readable by uid 10809 (test keys only)
NAME=blkd-test-$$-c
CONTAINERS+=("$NAME")
"$PODMAN" run -d --name "$NAME" -e BLKD_METRICS=off -e BLKD_TLS_DIR=/etc/blkd/tls \
  -v "$tls:/etc/blkd/tls:ro" -p 127.0.0.1::10809 "$IMAGE" ram size=16M >/dev/null ||
  fail "podman run (TLS)"
NBD_PORT=$(ctr_port "$NAME" 10809)
wait_port "$NBD_PORT" 30
size=$(nbdinfo --size "nbds://localhost:$NBD_PORT/?tls-certificates=$tls") ||
  fail "nbdinfo over TLS"
[ "$size" = 16777216 ] || fail "TLS export is $size bytes, want 16 MiB"
if nbdinfo --size "nbd://127.0.0.1:$NBD_PORT" >/dev/null 2>&1; then
  fail "plain NBD accepted although BLKD_TLS_DIR implies --tls=require"
fi
"$PODMAN" stop -t "$STOP_TIMEOUT" "$NAME" >/dev/null
rc=$("$PODMAN" inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$rc" = 0 ] || fail "TLS container exited $rc"
echo "TLS: BLKD_TLS_DIR served nbds://, refused plain NBD, exit 0"

# --- the Kubernetes pod, approximated in podman: the ConfigMap's variables,
# the init container's command, a read-only root, no capabilities, rawio
# with direct=true on a volume owned by the pod's group ---
"$PY" - "$TOP/deploy/k8s" "$TMP" <<'PYEOF' || fail "could not read the k8s manifests"
import sys, yaml
d, out = sys.argv[1], sys.argv[2]
cm = yaml.safe_load(open(f"{d}/configmap.yaml"))
with open(f"{out}/k8s.env", "w") as f:
    for k, v in cm["data"].items():
        f.write(f"{k}={v}\n")
sts = yaml.safe_load(open(f"{d}/statefulset.yaml"))
init = sts["spec"]["template"]["spec"]["initContainers"][0]
open(f"{out}/init.cmd", "w").write(init["command"][-1])
PYEOF
data=$TOP/build/container/test-data-$$      # not /tmp: O_DIRECT needs a real filesystem
rm -rf "$data"; mkdir -p "$data"; chown 10809:10809 "$data"
trap 'rc=$?; rm -rf "$data"; ctr_cleanup "$rc"' EXIT
k8s_run=(--read-only --tmpfs /tmp --cap-drop=ALL --security-opt=no-new-privileges
         --env-file "$TMP/k8s.env" -v "$data:/data")
"$PODMAN" run --rm --no-healthcheck "${k8s_run[@]}" --entrypoint /bin/bash "$IMAGE" \
  -c "$(cat "$TMP/init.cmd")" || fail "the StatefulSet's init container command failed"
disk_size=$(sed -n 's/^BLKD_DISK_SIZE=//p' "$TMP/k8s.env")
NAME=blkd-test-$$-d
CONTAINERS+=("$NAME")
"$PODMAN" run -d --name "$NAME" "${k8s_run[@]}" \
  -p 127.0.0.1::10809 -p 127.0.0.1::9100 "$IMAGE" >/dev/null ||
  fail "podman run (k8s pod settings)"
NBD_PORT=$(ctr_port "$NAME" 10809)
MET_PORT=$(ctr_port "$NAME" 9100)
wait_port "$NBD_PORT" 30
"$PODMAN" logs "$NAME" 2>&1 | grep -v 'systemd connection' | sed 's/^/container: /'
size=$(nbdinfo --size "nbd://127.0.0.1:$NBD_PORT") || fail "nbdinfo (k8s pod settings)"
[ "$size" = "$(numfmt --from=iec "$disk_size")" ] || fail "rawio export is $size bytes, want $disk_size"
nbdsh -u "nbd://127.0.0.1:$NBD_PORT" -c '
import os
buf = os.urandom(1 << 20)
h.pwrite(buf, 4 << 20)
h.flush()
assert h.pread(1 << 20, 4 << 20) == buf, "read back differs"
' || fail "write/read through rawio direct=true"
curl -fsS "http://127.0.0.1:$MET_PORT/healthz" >/dev/null || fail "/healthz (k8s pod settings)"
"$PODMAN" stop -t "$STOP_TIMEOUT" "$NAME" >/dev/null
rc=$("$PODMAN" inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$rc" = 0 ] || fail "k8s-settings container exited $rc"
[ "$(stat -c %s "$data/disk.img")" = "$size" ] || fail "disk.img is not on the volume"
echo "k8s pod settings: rawio direct=true on a $disk_size volume, read-only root, exit 0"

# --- the systemd units under a real systemd: PID 1 of a container made from
# this image plus systemd, units installed by `make install-systemd`. Checks
# socket activation (blkd.service starts on the first connection), that the
# hardening is really applied to the running blkd (dynamic non-root user,
# no capabilities, no_new_privs, seccomp, own mount namespace), /healthz
# with blkd.env's --metrics, `systemctl stop` -> exit 0, and that the socket
# activates a new blkd after that ---
ctx=$TMP/systemd-ctx
mkdir -p "$ctx"
make -s -C "$TOP" install-systemd DESTDIR="$ctx/root" >/dev/null || fail "make install-systemd"
# No static blkd user here, so DynamicUser= really allocates one.
cat > "$ctx/Containerfile" <<CFEOF
FROM $IMAGE
USER root
RUN apt-get update -q \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends systemd \\
 && rm -rf /var/lib/apt/lists/* && userdel blkd
COPY root/ /
RUN systemctl enable blkd.socket
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/lib/systemd/systemd"]
CFEOF
SD_IMAGE=localhost/blkd-systemd-test:latest
"$PODMAN" build -q --format docker --pull=never --network=host -t "$SD_IMAGE" "$ctx" >/dev/null ||
  fail "building the systemd test image"
NAME=blkd-test-$$-e
CONTAINERS+=("$NAME")
"$PODMAN" run -d --name "$NAME" --systemd=always --health-cmd=none -p 127.0.0.1::10809 "$SD_IMAGE" >/dev/null ||
  fail "podman run (systemd)"
NBD_PORT=$(ctr_port "$NAME" 10809)
sd() { "$PODMAN" exec "$NAME" "$@"; }
for ((i = 0; i < 100; i++)); do
  [ "$(sd systemctl is-active blkd.socket 2>/dev/null)" = active ] && break; sleep 0.2
done
[ "$(sd systemctl is-active blkd.socket)" = active ] || fail "blkd.socket is not listening: $(sd systemctl status blkd.socket --no-pager 2>&1)"
[ "$(sd systemctl is-active blkd.service || true)" = inactive ] || fail "blkd.service ran before any connection"
size=$(nbdinfo --size "nbd://127.0.0.1:$NBD_PORT") ||
  fail "nbdinfo through blkd.socket: $(sd journalctl -u blkd.service --no-pager 2>&1 | tail -n 20)"
[ "$size" = 1073741824 ] || fail "blkd.env's export is $size bytes, want 1 GiB"
[ "$(sd systemctl is-active blkd.service)" = active ] || fail "blkd.service not running after a connection"
sd bash -c '
  p=$(systemctl show -p MainPID --value blkd.service)
  s=/proc/$p/status
  uid=$(awk "/^Uid:/ {print \$2}" $s)
  echo "blkd.service: pid $p uid $uid $(grep -E "^(CapEff|CapBnd|NoNewPrivs|Seccomp):" $s | tr -s "\t\n" "  ")"
  bad() { echo "blkd.service: $*"; exit 1; }
  # DynamicUser= takes uids from 61184-65519 (the image has no static blkd).
  [ "$uid" -ge 61184 ] && [ "$uid" -le 65519 ] || bad "uid $uid is not a dynamic user"
  grep -q "^CapEff:[[:space:]]*0*$" $s || bad "has capabilities"
  grep -q "^CapBnd:[[:space:]]*0*$" $s || bad "capability bounding set not empty"
  grep -q "^NoNewPrivs:[[:space:]]*1" $s || bad "no_new_privs not set"
  grep -q "^Seccomp:[[:space:]]*2" $s || bad "no seccomp filter"
  [ "$(readlink /proc/$p/ns/mnt)" != "$(readlink /proc/1/ns/mnt)" ] || bad "no mount namespace (ProtectSystem/PrivateTmp)"
  BLKD_METRICS=127.0.0.1:9100 blkd-healthcheck || bad "/healthz with blkd.env options"
' || fail "blkd.service under systemd: hardening or health"
# systemctl reload sends SIGHUP (ExecReload): blkd keeps serving, same pid.
pid0=$(sd systemctl show -p MainPID --value blkd.service)
sd systemctl reload blkd.service || fail "systemctl reload blkd.service failed"
sleep 0.5
[ "$(sd systemctl show -p MainPID --value blkd.service)" = "$pid0" ] || fail "systemctl reload restarted blkd"
[ "$(nbdinfo --size "nbd://127.0.0.1:$NBD_PORT")" = 1073741824 ] || fail "blkd stopped serving after systemctl reload"
sd systemctl stop blkd.service 2>/dev/null
res=$(sd systemctl show -p Result -p ExecMainStatus blkd.service | tr '\n' ' ')
[ "$res" = "Result=success ExecMainStatus=0 " ] || fail "systemctl stop blkd.service: $res"
size=$(nbdinfo --size "nbd://127.0.0.1:$NBD_PORT") || fail "blkd.socket did not reactivate blkd after a stop"
echo "systemd: socket-activated, hardened (dynamic user, no caps, seccomp), stop -> $res, reactivated"
"$PODMAN" stop -t "$STOP_TIMEOUT" "$NAME" >/dev/null 2>&1 || true

echo "container test: all checks passed"
