#!/bin/sh
# make-base-image.sh IMAGE: make the Debian bookworm base image locally when
# it does not exist yet -- no registry is reachable from the build machines.
#   debootstrap --variant=minbase bookworm ROOTFS MIRROR
#   tar -C ROOTFS -c . | podman import - IMAGE
# MIRROR is the one this host's apt uses (deploy/apt-mirror.sh; override
# with MIRROR=...); debootstrap writes it into the image's
# /etc/apt/sources.list, so apt inside the build works against the same
# mirror as the host. About 40 s; done once per machine.
set -eu
image=${1:-localhost/debian:bookworm}
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
podman=$here/podman.sh

if "$podman" image exists "$image"; then
  echo "base image $image exists"
  exit 0
fi
case "$image" in
  localhost/*) ;;
  *) echo "make-base-image: $image is not local and cannot be made here;" \
          "pull it, or leave BASE at its default" >&2; exit 1 ;;
esac

mirror=${MIRROR:-$("$here/apt-mirror.sh" bookworm)}
work=$top/build/container
rootfs=$work/rootfs
mkdir -p "$work"
rm -rf "$rootfs"
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap --variant=minbase bookworm $rootfs $mirror"
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  echo "make-base-image: debootstrap failed (log: $work/debootstrap.log)" >&2
  exit 1
}
# debootstrap wrote "deb MIRROR bookworm main" to etc/apt/sources.list;
# no package lists or caches go into the image.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
       "$rootfs"/var/cache/apt/archives/*.deb
tar --numeric-owner -C "$rootfs" -c . \
  | "$podman" import --change 'CMD ["/bin/bash"]' - "$image"
echo "made base image $image from $mirror"
