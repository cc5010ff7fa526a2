#!/usr/bin/env bash
# What the block cache buys over a real file read with O_DIRECT (the rawio
# plugin, direct=true, so the page cache is out of the way): A serves the
# file without a cache, B with --cache 256M.  Working sets: 128 MiB (fits
# the cache: the hit rate approaches 1 after the warm-up) and 1 GiB (four
# times the cache: mostly misses, each one reading a whole 64 KiB block --
# and again with 4 KiB cache blocks).
# Needs a filesystem with O_DIRECT for the file ($BENCH_DIR, default
# /var/tmp; tmpfs will not do).
#   ROUNDS=3 ITER=4 LEN=3 bench/cache-rawio.sh     (defaults shown)
: "${ITER:=4}"
. "$(dirname "$0")/cache-ab-lib.sh"
dir=${BENCH_DIR:-/var/tmp}
file=$(mktemp "$dir/blkd-bench-rawio.XXXXXX")
trap 'rm -f "$file"' EXIT
# Real data, not a sparse file: a hole costs the filesystem nothing to read.
dd if=/dev/urandom of="$file" bs=1M count=1280 status=none
plugin="$top/plugins/rawio/nbdkit-rawio-plugin.so file=$file direct=true"
echo "| load | metric | A no cache | B --cache 256M | B/A median | B/A spread |"
echo "|---|---|---|---|---|---|"
ab_run "RAND_READ 4k, 128M working set" "" "--cache 256M" "$plugin" \
  "-t RAND_READ -b 4k --span 128M -w 2"
ab_run "RAND_READ 4k, 1G working set" "" "--cache 256M" "$plugin" \
  "-t RAND_READ -b 4k --span 1G -w 2"
ab_run "RAND_READ 4k, 1G working set, 4k cache blocks" "" "--cache 256M --cache-block 4K" \
  "$plugin" "-t RAND_READ -b 4k --span 1G -w 2"
ab_run "RAND_RW 4k 60/40, 128M working set" "" "--cache 256M" "$plugin" \
  "-t RAND_RW -b 4k --span 128M -w 2"
ab_run "STREAM_READ 256k, 128M working set" "" "--cache 256M" "$plugin" \
  "-t STREAM_READ --span 128M -w 2"
