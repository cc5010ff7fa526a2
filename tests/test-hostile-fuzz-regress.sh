#!/usr/bin/env bash
# Replays the fuzzers' regression inputs (fuzz/regress/TARGET/*: every
# crasher or hang ever found, kept once fixed) and seed corpora
# (fuzz/corpus/TARGET/*) through the libFuzzer harnesses, built with
# clang and ASan/UBSan into build/fuzz (make fuzz-regress).  Any crash,
# sanitizer report, leak or hang fails.  Skips without clang or libFuzzer.
# The first run builds the harness (~30 s); later runs take a second.
# run.sh: serial (builds the fuzz harness with clang)
. "$(dirname "$0")/lib.sh"
command -v clang >/dev/null 2>&1 || skip "clang is not installed (needed for libFuzzer)"
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' >"$TMP/t.c"
clang -fsanitize=fuzzer,address -o "$TMP/t" "$TMP/t.c" >/dev/null 2>&1 \
  || skip "clang cannot link -fsanitize=fuzzer (libFuzzer missing)"
cd "$TOP"
# The sanitizer logs the runner collects are for blkd; the harness's own
# reports come out in its log and fail the make below.
unset ASAN_OPTIONS UBSAN_OPTIONS
make -s -f fuzz/fuzz.mk fuzz-build >"$TMP/build.log" 2>&1 \
  || { tail -30 "$TMP/build.log"; fail "building the fuzz harness failed"; }
make -s -f fuzz/fuzz.mk fuzz-regress || fail "a regression or corpus input fails"
for t in handshake request; do
  grep -E '^#[0-9]+.*DONE' "build/fuzz/regress-$t.log" | tail -1 | sed "s/^/ok: $t: /"
done
# Inputs for a bug not fixed yet (fuzz/pending/, see docs/RELIABILITY.md):
# replayed only with HOSTILE_PENDING=1, like tests/test-hostile-pending.py;
# once they pass, move them to fuzz/regress/TARGET/.
if [ "${HOSTILE_PENDING:-0}" = 1 ]; then
  for t in handshake request; do
    [ -d "fuzz/pending/$t" ] || continue
    BLKD_FUZZ_HANG_MS=3000 "build/fuzz/fuzz-$t" -runs=0 -artifact_prefix="$TMP/" "fuzz/pending/$t" \
      >"$TMP/pending-$t.log" 2>&1 \
      || { grep -a -E "HANG|ERROR|SUMMARY|Test unit" "$TMP/pending-$t.log" | head || true;
           fail "pending $t inputs still fail"; }
    echo "ok: pending $t inputs pass now: move fuzz/pending/$t/* to fuzz/regress/$t/"
  done
else
  echo "note: $(ls fuzz/pending/*/* 2>/dev/null | wc -l) pending inputs not replayed" \
       "(HOSTILE_PENDING=1 replays them)"
fi
echo "fuzz regression inputs and corpora replay cleanly"
