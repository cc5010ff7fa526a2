#!/bin/bash
# podman with this project's settings (deploy/containers.conf: runc, explicit
# ulimits). The make targets and the container test run podman through this.
#
# containers.conf names nofile at the hard limit of the build machines; if
# this host's hard limit differs, a copy with this host's value is written to
# build/container/containers.conf and used instead (a nofile above the hard
# limit makes every container fail to start; nproc is capped at 32768).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
conf=$here/containers.conf

hard=$(ulimit -Hn)
[ "$hard" = unlimited ] && hard=$(cat /proc/sys/fs/nr_open)
nproc=$(ulimit -Hu)
{ [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
want_nofile="nofile=$hard:$hard"
want_nproc="nproc=$nproc:$nproc"
if ! grep -q "\"$want_nofile\"" "$conf" || ! grep -q "\"$want_nproc\"" "$conf"; then
  out=$(cd "$here/.." && pwd)/build/container
  mkdir -p "$out"
  sed -e "s/\"nofile=[0-9]*:[0-9]*\"/\"$want_nofile\"/" \
      -e "s/\"nproc=[0-9]*:[0-9]*\"/\"$want_nproc\"/" "$conf" > "$out/containers.conf.tmp"
  mv "$out/containers.conf.tmp" "$out/containers.conf"
  conf=$out/containers.conf
fi
CONTAINERS_CONF=$conf
export CONTAINERS_CONF
exec podman "$@"
