#!/usr/bin/env bash
# make bench: each seed's before/after experiment against blkd's switches,
# measured with blkperf compare (A B, B A, ..., medians and spread per round,
# see bench/cache-ab-lib.sh).  Writes one markdown file per seed into the
# directory given (default build/bench) for docs/BENCHMARKS.md.
#   ROUNDS=3 ITER=6 LEN=3 SEEDS="000 002 004 001" bench/seeds.sh [OUTDIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../build/bench}
mkdir -p "$out"
export OUT=$out

seed000() {
  # Seed 000 (kiobuf_init): allocate and zero each request's descriptor
  # and buffer (A, --iobuf=calloc) against the recycled pool (B).  The
  # seed's load was an OLTP database on raw I/O: small random reads and
  # writes from many streams; plus large sequential reads, where the
  # per-request memset of the buffer is largest.  Debian's memory plugin,
  # not ram: ram lends its pages to READ replies and takes WRITE payloads
  # in place, so with it no request buffer carries the data and the A/B
  # would time buffers that are reserved and never used.
  . "$here/cache-ab-lib.sh"
  echo "| load | metric | A calloc | B pool | B/A median | B/A spread |"
  echo "|---|---|---|---|---|---|"
  ab_run "RAND_RW 4k, 4 conns x QD8: calloc (A) vs pool (B)" "--iobuf calloc" "--iobuf pool" \
    "memory size=1G" "-t RAND_RW -C 4 -q 8 --prefill --span 256M"
  ab_run "STREAM_READ 256k QD16: calloc (A) vs pool (B)" "--iobuf calloc" "--iobuf pool" \
    "memory size=1G" "-t STREAM_READ -q 16 --prefill --span 256M"
  ab_run "STREAM_WRITE 1M QD8: calloc (A) vs pool (B)" "--iobuf calloc" "--iobuf pool" \
    "memory size=1G" "-t STREAM_WRITE -b 1M -q 8 --span 256M"
}

seed002() {
  # Seed 002 (io_request_lock): one queue, lock and worker pool for all
  # shards (A, --queue=global) against a queue and lock per shard (B).
  # Plugin calls go to workers on both sides (--dispatch worker), so only
  # the queue differs; many streams, as in the seed's dbench runs.
  . "$here/cache-ab-lib.sh"
  echo "| load | metric | A global | B split | B/A median | B/A spread |"
  echo "|---|---|---|---|---|---|"
  for c in 4 16; do
    ab_run "RAND_READ 4k, $c conns x QD8: global (A) vs split (B)" \
      "--queue global --dispatch worker" "--queue split --dispatch worker" \
      "ram size=1G" "-t RAND_READ -C $c -q 8 --prefill --span 256M"
  done
  ab_run "RAND_RW 4k, 16 conns x QD8: global (A) vs split (B)" \
    "--queue global --dispatch worker" "--queue split --dispatch worker" \
    "ram size=1G" "-t RAND_RW -C 16 -q 8 --prefill --span 256M"
}

# SEEDS picks which experiments run (all four by default).
for seed in ${SEEDS:-000 002 004 001}; do
  case $seed in
    000) echo "== seed 000: raw-I/O buffers (--iobuf)" >&2
         seed000 | tee "$out/seed000-iobuf.md" ;;
    002) echo "== seed 002: lock-split queues (--queue)" >&2
         seed002 | tee "$out/seed002-queue.md" ;;
    004) echo "== seed 004: constructor-free cache (--cache-ctor)" >&2
         "$here/cache-ctor.sh" | tee "$out/seed004-cache-ctor.md" ;;
    001) echo "== seed 001: compact delay accounting (--delayacct)" >&2
         "$here/delayacct.sh" | tee "$out/seed001-delayacct.md" ;;
    *) echo "unknown seed $seed" >&2; exit 1 ;;
  esac
done
