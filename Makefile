# blkd build: the server, its plugins, blkperf, tests, benchmarks and deployment.
# Each area keeps its own rules in a fragment (plugins/plugins.mk,
# client/client.mk, tests/tests.mk, deploy/deploy.mk) so they can grow apart.
#
# The user's CFLAGS, CPPFLAGS and LDFLAGS (make CFLAGS='-O1 -g', a Debian
# package's dpkg-buildflags) are honoured everywhere and never replace the
# project's own flags, which live in BLKD_* variables and come first.
# WERROR=0 turns -Werror off (for packagers on newer compilers); NO_DEPS=1
# keeps `make run` and `make check` away from apt.

# gcc unless the user names another (make's built-in default is cc).
ifeq ($(origin CC),default)
CC        = gcc
endif
PKG_CONFIG ?= pkg-config
PREFIX   ?= /usr/local
DESTDIR  ?=
BINDIR    = $(PREFIX)/bin
LIBDIR    = $(PREFIX)/lib/blkd
PLUGINDIR = $(LIBDIR)/plugins
MANDIR    = $(PREFIX)/share/man
FILTERDIR = $(LIBDIR)/filters
INCLUDEDIR = $(PREFIX)/include
PKGCONFIGDIR = $(PREFIX)/lib/pkgconfig
# The one place the release version lives (blkd -V, blkperf -V, /stats,
# make dist).
VERSION  := $(shell cat VERSION)

# SANITIZE=1 builds everything with AddressSanitizer + UBSan into its own
# object tree, so a sanitizer build never mixes with a plain one.
ifeq ($(SANITIZE),1)
SANFLAGS  = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
BUILD     = build/san
else
SANFLAGS  =
BUILD     = build/plain
endif

# pkg-config is asked when a recipe first needs the answer, not when the
# Makefile is read: on a fresh machine `make check` installs pkg-config and
# the -dev packages (deps) before anything is compiled.
lazy = $(eval $(1) := $$(shell $(2)))$($(1))
EVENT_LIBS       = $(call lazy,EVENT_LIBS,$(PKG_CONFIG) --libs libevent_core libevent_extra)
SSL_LIBS         = $(call lazy,SSL_LIBS,$(PKG_CONFIG) --libs openssl)
NBD_CFLAGS       = $(call lazy,NBD_CFLAGS,$(PKG_CONFIG) --cflags libnbd)
NBD_LIBS         = $(call lazy,NBD_LIBS,$(PKG_CONFIG) --libs libnbd)
NBDKIT_CFLAGS    = $(call lazy,NBDKIT_CFLAGS,$(PKG_CONFIG) --cflags nbdkit)
NBDKIT_PLUGINDIR = $(call lazy,NBDKIT_PLUGINDIR,$(PKG_CONFIG) --variable=plugindir nbdkit)
NBDKIT_FILTERDIR = $(call lazy,NBDKIT_FILTERDIR,$(PKG_CONFIG) --variable=filterdir nbdkit)

WERROR   ?= 1
CFLAGS   ?= -O2 -g
WARN      = -Wall -Wextra -Wshadow -Wno-unused-parameter $(if $(filter 1,$(WERROR)),-Werror)
# -MMD -MP: each object depends on exactly the headers it includes.
BLKD_CPPFLAGS = -D_GNU_SOURCE -Iinclude -Icommon $(NBDKIT_CFLAGS) $(NBD_CFLAGS) \
                -DBLKD_VERSION='"$(VERSION)"' -DBLKD_PLUGINDIR='"$(PLUGINDIR)"' \
                -DBLKD_FILTERDIR='"$(FILTERDIR)"' -DNBDKIT_PLUGINDIR='"$(NBDKIT_PLUGINDIR)"' \
                -DNBDKIT_FILTERDIR='"$(NBDKIT_FILTERDIR)"' $(TEST_HOOK_FLAGS)
BLKD_CFLAGS   = -std=gnu11 $(WARN) -pthread -MMD -MP
# Project flags first, the user's after them so theirs win (-O, -g, -f...).
ALL_CFLAGS    = $(BLKD_CPPFLAGS) $(CPPFLAGS) $(BLKD_CFLAGS) $(SANFLAGS) $(CFLAGS)
ALL_LDFLAGS   = $(SANFLAGS) -pthread $(LDFLAGS)

# Test hooks (environment knobs such as BLKD_TLS_REKEY_RECORDS) exist only
# in a test build: `make check` makes one, in its own object tree, and
# `make all` after it rebuilds ./blkd without them.  TEST_HOOKS=1 asks for
# one explicitly (for tests/run.sh by hand).
ifneq ($(filter check,$(MAKECMDGOALS)),)
TEST_HOOKS = 1
endif
ifeq ($(TEST_HOOKS),1)
TEST_HOOK_FLAGS = -DBLKD_TEST_HOOKS
BUILD    := $(BUILD)-test
endif

# Packages the build, tests and benchmarks need (Debian 12 names).
DEPS = build-essential pkg-config libevent-dev libssl-dev openssl \
       nbdkit nbdkit-plugin-dev libnbd-dev libnbd-bin python3-libnbd \
       python3-prometheus-client qemu-utils qemu-system-common fuse3 \
       e2fsprogs fio nbd-client nbd-server iperf3 clang valgrind \
       systemd iproute2 procps psmisc curl python3-yaml bc groff-base man-db \
       python3-cryptography gnuplot-nox librsvg2-bin strace cryptsetup-bin

SERVER_SRCS = $(wildcard server/*.c) $(wildcard common/*.c)
SERVER_OBJS = $(SERVER_SRCS:%.c=$(BUILD)/%.o)
SERVER_LIBS = $(EVENT_LIBS) $(SSL_LIBS) -ldl -lm

# `make run` and `make check` install what is missing first, unless
# NO_DEPS=1; every compile waits for that step (order-only), so -j cannot
# start compiling before the headers are there.  Plain `make` never runs apt.
ifneq ($(NO_DEPS),1)
ifneq ($(filter run check,$(MAKECMDGOALS)),)
DEPS_STEP = deps
endif
endif

.PHONY: all deps run check install uninstall clean dist bench bench-anchors bench-write
all: blkd

# The binary always lands at the top of the tree so ./blkd runs uninstalled;
# it is rebuilt when the build flavour changes (a stamp names the flavour).
# Plugins and filters see exactly the nbdkit API: the objects are built
# with hidden visibility (public.c marks the API default) and the version
# script keeps everything else out of the dynamic symbol table.
BLKD_SYMS = server/blkd.syms
blkd: $(SERVER_OBJS) $(BLKD_SYMS) $(BUILD)/.flavour
	$(CC) $(ALL_CFLAGS) -rdynamic -Wl,--version-script=$(BLKD_SYMS) -o $@ $(SERVER_OBJS) \
	  $(ALL_LDFLAGS) $(SERVER_LIBS)

$(BUILD)/.flavour:
	@mkdir -p $(BUILD)
	@rm -f build/*/.flavour
	@touch $@

# VERSION and the directories are compiled in: a new version rebuilds.
$(BUILD)/%.o: %.c VERSION | $(DEPS_STEP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -fvisibility=hidden -c -o $@ $<

-include $(SERVER_OBJS:.o=.d)

include plugins/plugins.mk
include client/client.mk
include tests/tests.mk
include deploy/deploy.mk
include fuzz/fuzz.mk
include tests/interop/interop.mk
include man/man.mk
include tests/vm/vm.mk

# Install only what is missing: a machine that has everything runs no apt.
deps:
	@missing=$$(for p in $(DEPS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing$$(echo $$missing | tr '\n' ' ')"; \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi

run: $(DEPS_STEP) all
	./blkd -f -i 127.0.0.1 -p 10809 ram size=1G

# Side-by-side anchors against nbdkit, qemu-nbd and nbd-server: every row
# measured with fio, unpinned, and with blkperf pinned apart from the
# server, whose counts are checked against blkd's /metrics
# (docs/BENCHMARKS.md says how to read them).  ROUNDS and SECONDS trade
# time for confidence; ANCHORS_ARGS passes more (e.g. --part targets); the
# tables land in build/bench-anchors.md, the raw cells in .json.
ROUNDS  ?= 3
SECONDS ?= 5
ANCHORS_ARGS ?=
bench-anchors: deps all
	@mkdir -p build
	/usr/bin/python3 bench/anchors.py --rounds $(ROUNDS) --seconds $(SECONDS) $(ANCHORS_ARGS) \
	  --out build/bench-anchors.md --json build/bench-anchors.json

# The 256 KiB WRITE and READ rows alone, blkperf pinned apart: nbdkit's
# memory against blkd's memory and ram (ANCHORS_ARGS="--blkd NAME=PATH"
# adds another build); build/bench-write.md.
bench-write: deps all
	@mkdir -p build
	/usr/bin/python3 bench/anchors.py --part targets --clients blkperf \
	  --workloads "256k write,256k read" --rounds $(ROUNDS) --seconds $(SECONDS) $(ANCHORS_ARGS) \
	  --out build/bench-write.md --json build/bench-write.json

# Each seed's before/after experiment, reproduced with blkperf against
# blkd's switches (and the cache and delay-accounting A/B scripts); the
# tables land in build/bench/ for docs/BENCHMARKS.md.
bench: deps all
	@mkdir -p build/bench
	bench/seeds.sh build/bench

# blkd.pc tells plugin authors where blkd-plugin.h is (with nbdkit's
# headers, which it requires) and where blkd looks for plugins and
# filters; made at install time so it names the PREFIX installed to.
PC_SUBST = -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
           -e 's|@PLUGINDIR@|$(PLUGINDIR)|g' -e 's|@FILTERDIR@|$(FILTERDIR)|g' \
           -e 's|@VERSION@|$(VERSION)|g'

# The binaries, the in-tree plugins, the header and .pc for plugin
# authors, and the manual pages.
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(PLUGINDIR) $(DESTDIR)$(MANDIR)/man1 \
	  $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR)
	install -m 0755 blkd $(DESTDIR)$(BINDIR)/blkd
	install -m 0755 blkperf $(DESTDIR)$(BINDIR)/blkperf
	for p in $(PLUGINS); do install -m 0755 $$p $(DESTDIR)$(PLUGINDIR)/ || exit 1; done
	install -m 0644 $(MAN_PAGES) $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 include/blkd-plugin.h $(DESTDIR)$(INCLUDEDIR)/blkd-plugin.h
	sed $(PC_SUBST) include/blkd.pc.in >$(DESTDIR)$(PKGCONFIGDIR)/blkd.pc
	chmod 0644 $(DESTDIR)$(PKGCONFIGDIR)/blkd.pc

# Removes what install put there, and the directories only if now empty.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/blkd $(DESTDIR)$(BINDIR)/blkperf
	rm -f $(foreach p,$(PLUGINS),$(DESTDIR)$(PLUGINDIR)/$(notdir $(p)))
	rm -f $(foreach m,$(MAN_PAGES),$(DESTDIR)$(MANDIR)/man1/$(notdir $(m)))
	rm -f $(DESTDIR)$(INCLUDEDIR)/blkd-plugin.h $(DESTDIR)$(PKGCONFIGDIR)/blkd.pc
	-rmdir $(DESTDIR)$(PLUGINDIR) $(DESTDIR)$(LIBDIR) 2>/dev/null

# A release tarball of the committed tree (git archive: only what is
# tracked), named after VERSION.  Uncommitted changes are not in it.
DIST = blkd-$(VERSION)
dist:
	@mkdir -p build
	git archive --format=tar.gz --prefix=$(DIST)/ -o build/$(DIST).tar.gz HEAD
	@echo "dist: build/$(DIST).tar.gz"

clean:
	rm -rf build blkd blkperf $(PLUGINS) $(TEST_BINS) $(TEST_HELPERS)
