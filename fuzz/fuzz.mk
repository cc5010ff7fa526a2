# libFuzzer targets for the option-haggling and request parsers (see
# fuzz/fuzz_nbd.c and docs/RELIABILITY.md).  Included by the top Makefile;
# also usable alone: make -f fuzz/fuzz.mk fuzz-build
#
#   make fuzz-build              build build/fuzz/fuzz-{handshake,request}
#   make fuzz FUZZ_SECONDS=N     fuzz each target N s (default 60) from its
#                                seed corpus; fails on any crash, leak,
#                                sanitizer report or hang; findings land in
#                                build/fuzz/findings/TARGET/
#   make fuzz-regress            replay fuzz/regress/TARGET/* and the seed
#                                corpora once (what tests/test-hostile-fuzz-
#                                regress.sh runs)
#   make fuzz-corpus             regenerate fuzz/corpus/* from
#                                fuzz/make-corpus.py
#   make fuzz-clean              remove build/fuzz
#
# Everything is built with clang into build/fuzz, apart from the normal
# build: server objects with -fsanitize=fuzzer-no-link,address,undefined,
# the in-tree ram plugin with address,undefined, and the harness linked
# with -fsanitize=fuzzer.

FUZZ_CC       ?= clang
FUZZ_BUILD     = build/fuzz
FUZZ_SECONDS  ?= 60
FUZZ_JOBS     ?= 1            # >1: libFuzzer -fork=N (parallel, keeps going)
FUZZ_TARGETS   = handshake request
FUZZ_SAN       = -fsanitize=address,undefined -fno-sanitize-recover=undefined \
                 -fno-omit-frame-pointer
FUZZ_CFLAGS    = -g -O1 -std=gnu11 -D_GNU_SOURCE -Iinclude -Iserver -pthread $(FUZZ_SAN) \
                 -DBLKD_VERSION='"$(or $(VERSION),fuzz)"' \
                 -DBLKD_PLUGINDIR='"$(or $(PLUGINDIR),/usr/local/lib/blkd/plugins)"' \
                 -DBLKD_FILTERDIR='"$(or $(FILTERDIR),/usr/local/lib/blkd/filters)"' \
                 -DNBDKIT_PLUGINDIR='"$(or $(NBDKIT_PLUGINDIR),$(shell pkg-config --variable=plugindir nbdkit))"' \
                 -DNBDKIT_FILTERDIR='"$(or $(NBDKIT_FILTERDIR),$(shell pkg-config --variable=filterdir nbdkit))"'
FUZZ_LIBS      = $(or $(SERVER_LIBS),-levent_core -levent_extra -levent_pthreads \
                   -lssl -lcrypto -ldl -lm)
FUZZ_SRCS      = $(filter-out server/main.c,$(wildcard server/*.c))
FUZZ_OBJS      = $(FUZZ_SRCS:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_BINS      = $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz-%)
FUZZ_PLUGIN    = $(FUZZ_BUILD)/nbdkit-ram-plugin.so
# Sanitizer settings for every run: leaks fail, UBSan stops at the first
# report, and the server's own log lines (one per bad input) are dropped
# by libFuzzer's -close_fd_mask=2 (reports still get through).
FUZZ_ENV       = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:symbolize=1 \
                 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

.PHONY: fuzz fuzz-build fuzz-regress fuzz-corpus fuzz-clean
# Keep the objects: make would otherwise delete them as intermediates.
.SECONDARY: $(FUZZ_OBJS) $(FUZZ_PLUGIN)

fuzz-build: $(FUZZ_BINS) $(FUZZ_PLUGIN)

$(FUZZ_BUILD)/server/%.o: server/%.c $(wildcard include/*.h server/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

$(FUZZ_BUILD)/fuzz-handshake: FUZZ_DEF = -DFUZZ_TARGET_HANDSHAKE
$(FUZZ_BUILD)/fuzz-request:   FUZZ_DEF = -DFUZZ_TARGET_REQUEST
$(FUZZ_BUILD)/fuzz-%: fuzz/fuzz_nbd.c $(FUZZ_OBJS) $(FUZZ_PLUGIN)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_DEF) -fsanitize=fuzzer -rdynamic -o $@ \
	  fuzz/fuzz_nbd.c $(FUZZ_OBJS) $(FUZZ_LIBS)

$(FUZZ_PLUGIN): plugins/ram/ram.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fPIC -shared -o $@ $<

# Each target fuzzes a scratch copy of its corpus (new inputs do not
# clutter the tree; `make fuzz-merge`-style minimising is left to hand).
fuzz: fuzz-build
	@set -e; for t in $(FUZZ_TARGETS); do \
	  work=$(FUZZ_BUILD)/work/$$t; out=$(FUZZ_BUILD)/findings/$$t; \
	  rm -rf $$work; mkdir -p $$work $$out; cp fuzz/corpus/$$t/* $$work/; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s (findings: $$out)"; \
	  if ! $(FUZZ_ENV) $(FUZZ_BUILD)/fuzz-$$t -max_total_time=$(FUZZ_SECONDS) \
	       -timeout=30 -max_len=65536 -close_fd_mask=2 -print_final_stats=1 \
	       $(if $(filter-out 1,$(FUZZ_JOBS)),-fork=$(FUZZ_JOBS)) \
	       -artifact_prefix=$$out/ $$work $$(test -d fuzz/regress/$$t && echo fuzz/regress/$$t) \
	       >$(FUZZ_BUILD)/fuzz-$$t.log 2>&1; then \
	    tail -60 $(FUZZ_BUILD)/fuzz-$$t.log; \
	    echo "fuzz: $$t FOUND A PROBLEM: input saved in $$out/;" \
	         "keep it as fuzz/regress/$$t/NAME once fixed"; exit 1; \
	  fi; \
	  grep -E '^(stat::|#[0-9]+.*DONE)' $(FUZZ_BUILD)/fuzz-$$t.log | tail -4; \
	  echo "fuzz: $$t clean ($$(ls $$work | wc -l) inputs in its corpus now)"; \
	done

fuzz-regress: fuzz-build
	@set -e; for t in $(FUZZ_TARGETS); do \
	  echo "fuzz-regress: $$t: $$(ls fuzz/regress/$$t 2>/dev/null | wc -l) regression" \
	       "inputs, $$(ls fuzz/corpus/$$t | wc -l) corpus inputs"; \
	  $(FUZZ_ENV) $(FUZZ_BUILD)/fuzz-$$t -runs=0 -close_fd_mask=2 \
	    -artifact_prefix=$(FUZZ_BUILD)/regress-$$t- \
	    fuzz/corpus/$$t $$(test -d fuzz/regress/$$t && echo fuzz/regress/$$t) \
	    >$(FUZZ_BUILD)/regress-$$t.log 2>&1 \
	    || { tail -60 $(FUZZ_BUILD)/regress-$$t.log; exit 1; }; \
	done

fuzz-corpus:
	/usr/bin/python3 fuzz/make-corpus.py fuzz/corpus

fuzz-clean:
	rm -rf $(FUZZ_BUILD)
