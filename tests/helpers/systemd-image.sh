# The podman image with systemd 252 as PID 1 that blkd.service runs in for
# the `systemctl restart` tests (tests/test-restart-systemd.sh, the vm
# check's fdstore case).  Source it after tests/lib.sh.
#
# sd_image BASE CTX FILES...: builds (once; the tag names what went into
# it) Debian's BASE plus systemd and the Debian packages owning the
# libraries FILES (blkd, its plugins) load, so the host-built binaries
# run inside; the build context goes in CTX.  Sets SD_IMAGE, or returns 1
# with the reason in SD_WHY (no podman, no base image, no apt mirror: the
# callers skip).
# sd_units DIR: the shipped units and /etc/default/blkd as
# `make install-systemd` writes them, under DIR; sets SD_UNITS (their
# directory) or returns 1.
# shellcheck shell=bash disable=SC2034  # SD_* are for the caller
: "${PODMAN:=$TOP/deploy/podman.sh}"

sd_image() {
  local base=$1 ctx=$2; shift 2
  SD_IMAGE='' SD_WHY=''
  command -v podman >/dev/null 2>&1 || { SD_WHY="podman is not installed"; return 1; }
  command -v dpkg >/dev/null 2>&1 || { SD_WHY="dpkg is not installed"; return 1; }
  "$PODMAN" info >/dev/null 2>&1 ||
    { SD_WHY="podman cannot run here: $("$PODMAN" info 2>&1 | tail -n 1)"; return 1; }
  "$PODMAN" image exists "$base" ||
    { SD_WHY="no base image $base (make container-base makes it)"; return 1; }
  local pkgs
  pkgs=$(for f in "$@"; do ldd "$f"; done |
         awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
         while read -r so; do dpkg -S "$(readlink -f "$so")" 2>/dev/null || dpkg -S "$so"; done |
         sed -n 's/:.*//p' | sort -u | tr '\n' ' ')
  [ -n "$pkgs" ] || { SD_WHY="cannot tell which Debian packages hold blkd's libraries"; return 1; }
  mkdir -p "$ctx"
  cat > "$ctx/Containerfile" <<EOF
FROM $base
RUN apt-get update -q \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends systemd $pkgs \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/lib/systemd/systemd"]
EOF
  local tag
  tag=$( (cat "$ctx/Containerfile"; "$PODMAN" image inspect -f '{{.Id}}' "$base") | sha256sum | cut -c1-12)
  SD_IMAGE=localhost/blkd-fdstore-test:$tag
  if ! "$PODMAN" image exists "$SD_IMAGE"; then
    echo "building $SD_IMAGE (systemd $pkgs)"
    if ! timeout 600 "$PODMAN" build -q --format docker --pull=never --network=host \
         -t "$SD_IMAGE" "$ctx" >"$ctx/build.log" 2>&1; then
      SD_WHY="cannot build the systemd test image (apt mirror unreachable?): $(tail -n 3 "$ctx/build.log")"
      SD_IMAGE=
      return 1
    fi
  fi
}

sd_units() {
  make -s -C "$TOP" install-systemd DESTDIR="$1" >/dev/null || return 1
  SD_UNITS=$1/etc/systemd/system
  grep -q -- '--fdstore' "$SD_UNITS/blkd.service" &&
    grep -q '^FileDescriptorStoreMax=[1-9]' "$SD_UNITS/blkd.service"
}
