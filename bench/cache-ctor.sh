#!/usr/bin/env bash
# Seed 004 as an A/B: the block cache's slab entries initialised when
# allocated (A: --cache-ctor=no, the default) or kept constructed (B:
# --cache-ctor=yes, the "before").  Loads: CHURN (blkperf's create-delete:
# write a 16 MiB region, trim it, again and again -- every write allocates
# cache entries and every trim frees them) with 64 KiB and with 4 KiB cache
# blocks, the same in writeback mode, and a read-heavy load whose working
# set fits the cache (all hits after the warm-up).
#   ROUNDS=3 ITER=6 LEN=3 bench/cache-ctor.sh     (defaults shown)
. "$(dirname "$0")/cache-ab-lib.sh"
echo "| load | metric | A ctor=no | B ctor=yes | B/A median | B/A spread |"
echo "|---|---|---|---|---|---|"
ab_run "A/A control (ctor=no twice)" "--cache 64M --cache-ctor no" "--cache 64M --cache-ctor no" \
  "ram size=256M" "-t CHURN"
ab_run "CHURN 64k, 64k blocks" "--cache 64M --cache-ctor no" "--cache 64M --cache-ctor yes" \
  "ram size=256M" "-t CHURN"
ab_run "CHURN 4k, 4k blocks" "--cache 64M --cache-block 4K --cache-ctor no" \
  "--cache 64M --cache-block 4K --cache-ctor yes" "ram size=256M" "-t CHURN -b 4k"
ab_run "CHURN 64k, writeback" "--cache 64M --cache-mode writeback --cache-ctor no" \
  "--cache 64M --cache-mode writeback --cache-ctor yes" "ram size=256M" "-t CHURN"
ab_run "RAND_READ 4k, hits" "--cache 64M --cache-ctor no" "--cache 64M --cache-ctor yes" \
  "ram size=256M" "-t RAND_READ -b 4k --span 32M -w 1"
