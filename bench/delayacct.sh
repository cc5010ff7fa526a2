#!/usr/bin/env bash
# Seed 001 as an A/B: --delayacct=locked (A, the "before": a mutex per
# shard, command and phase, start/end timestamps kept in the struct, updated
# where the time is taken -- worker threads included) against compact (B,
# the default: single-writer counters, no lock, durations in the request),
# and off (A) against compact (B) for what accounting costs at all.
# Loads as in the seed, 32 streams: SEQ_REWRITE and RAND_RW over 4
# connections x 8 in flight; the ram plugin called on the shard thread
# (its default) and on worker threads (--dispatch worker), where the locked
# struct is shared between the workers and the shard thread.
#   ROUNDS=3 ITER=4 LEN=3 bench/delayacct.sh     (defaults shown)
: "${ITER:=4}"
. "$(dirname "$0")/cache-ab-lib.sh"
echo "| load | metric | A | B | B/A median | B/A spread |"
echo "|---|---|---|---|---|---|"
for dispatch in auto worker; do
  for t in SEQ_REWRITE RAND_RW; do
    # SEQ_REWRITE prefills its span itself; RAND_RW reads written data too.
    extra=""
    [ "$t" = RAND_RW ] && extra="--prefill --span 256M"
    ab_run "$t 32 streams, dispatch $dispatch: locked (A) vs compact (B)" \
      "--dispatch $dispatch --delayacct locked" "--dispatch $dispatch --delayacct compact" \
      "ram size=1G" "-t $t -C 4 -q 8 $extra"
    ab_run "$t 32 streams, dispatch $dispatch: off (A) vs compact (B)" \
      "--dispatch $dispatch --delayacct off" "--dispatch $dispatch --delayacct compact" \
      "ram size=1G" "-t $t -C 4 -q 8 $extra"
  done
done
