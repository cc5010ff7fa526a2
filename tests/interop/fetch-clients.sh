#!/usr/bin/env bash
# Newer NBD clients for the interop tests, cached under /var/tmp/blkd-interop
# and never installed over the system's: qemu-utils 10 from Debian's
# bookworm-backports (unpacked with dpkg-deb -x) and libnbd 1.22 built from
# Debian trixie's source package.  Both come from Debian's archive through
# apt with a private sources list and lists directory, so the system's apt
# state is untouched.  Runs once; a finished step leaves a stamp and is
# skipped next time.  Usage: fetch-clients.sh [qemu|libnbd|all]
set -euo pipefail

CACHE=${BLKD_INTEROP_CACHE:-/var/tmp/blkd-interop}
MIRROR=${BLKD_INTEROP_MIRROR:-http://deb.debian.org/debian}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
what=${1:-all}
APTD=$CACHE/apt

log () { echo "fetch-clients: $*" >&2; }

apt_cache_private () {
  apt-cache -o Dir::Etc::SourceList="$APTD/sources.list" -o Dir::Etc::SourceParts=- \
    -o Dir::State::Lists="$APTD/lists" -o Dir::Cache="$APTD/cache" "$@"
}

apt_private () {
  timeout 600 apt-get -q -o Dir::Etc::SourceList="$APTD/sources.list" -o Dir::Etc::SourceParts=- \
    -o Dir::State::Lists="$APTD/lists" -o Dir::Cache="$APTD/cache" \
    -o APT::Get::List-Cleanup=0 "$@"
}

apt_setup () {
  [ -f "$APTD/.updated" ] && return 0
  mkdir -p "$APTD/lists/partial" "$APTD/cache/archives/partial"
  # The release's own lists come along so dependency names resolve; the
  # newer suites are only read for the packages named below.
  cat > "$APTD/sources.list" <<SRC
deb [signed-by=$KEYRING] $MIRROR bookworm-backports main
deb-src [signed-by=$KEYRING] $MIRROR trixie main
SRC
  log "apt-get update (private lists in $APTD)"
  apt_private update
  touch "$APTD/.updated"
}

fetch_qemu () {
  local dest=$CACHE/qemu10
  [ -f "$dest/.done" ] && { log "qemu 10: cached in $dest"; return 0; }
  apt_setup
  rm -rf "$dest" "$CACHE/debs"
  mkdir -p "$dest" "$CACHE/debs"
  local ver
  ver=$(apt_cache_private policy qemu-utils | awk '/Candidate:/ {print $2}')
  case $ver in *bpo12*) ;; *) ver= ;; esac
  [ -n "$ver" ] || { log "no qemu-utils in bookworm-backports"; return 1; }
  log "qemu-utils $ver: downloading"
  (cd "$CACHE/debs" && apt_private download "qemu-utils=$ver")
  for deb in "$CACHE"/debs/*.deb; do
    dpkg-deb -x "$deb" "$dest"
  done
  "$dest/usr/bin/qemu-img" --version | head -1 >&2
  touch "$dest/.done"
}

fetch_libnbd () {
  local dest=$CACHE/libnbd122 src=$CACHE/src
  [ -f "$dest/.done" ] && { log "libnbd 1.22: cached in $dest"; return 0; }
  apt_setup
  rm -rf "$src" "$dest"
  mkdir -p "$src"
  log "libnbd source (trixie): downloading"
  (cd "$src" && apt_private source --download-only libnbd/trixie)
  local tarball
  tarball=$(ls "$src"/libnbd_*.orig.tar.* | head -1)
  tar -C "$src" -xf "$tarball"
  local dir
  dir=$(ls -d "$src"/libnbd-*/ | head -1)
  log "libnbd: configure and build in $dir"
  local t0=$SECONDS
  (cd "$dir" && ./configure --prefix="$dest" --disable-ocaml --disable-golang \
      --disable-rust --disable-fuse --disable-ublk --without-libfuzzer \
      --with-python-installdir="$dest/python" \
      PYTHON=/usr/bin/python3 >"$src/configure.log" 2>&1 \
   && make -j"${JOBS:-2}" >"$src/build.log" 2>&1 \
   && make install >"$src/install.log" 2>&1) || {
    log "libnbd build failed: see $src/*.log"; tail -20 "$src"/*.log >&2; return 1; }
  log "libnbd built in $((SECONDS - t0)) s"
  LD_LIBRARY_PATH=$dest/lib "$dest/bin/nbdinfo" --version >&2
  touch "$dest/.done"
}

case $what in
  qemu) fetch_qemu ;;
  libnbd) fetch_libnbd ;;
  all) fetch_qemu; fetch_libnbd ;;
  *) echo "usage: $0 [qemu|libnbd|all]" >&2; exit 2 ;;
esac
