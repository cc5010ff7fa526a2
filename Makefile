# blkd build: the server, its plugins, blkperf, tests, benchmarks and deployment.
# Each area keeps its own rules in a fragment (plugins/plugins.mk,
# client/client.mk, tests/tests.mk, deploy/deploy.mk) so they can grow apart.

CC       ?= gcc
PREFIX   ?= /usr/local
DESTDIR  ?=
BINDIR    = $(PREFIX)/bin
LIBDIR    = $(PREFIX)/lib/blkd
PLUGINDIR = $(LIBDIR)/plugins
FILTERDIR = $(LIBDIR)/filters
# nbdkit's own directories, searched after the tree's and blkd's.
NBDKIT_PLUGINDIR := $(shell pkg-config --variable=plugindir nbdkit)
NBDKIT_FILTERDIR := $(shell pkg-config --variable=filterdir nbdkit)
VERSION   = 0.1.0

# SANITIZE=1 builds everything with AddressSanitizer + UBSan into its own
# object tree, so a sanitizer build never mixes with a plain one.
ifeq ($(SANITIZE),1)
SANFLAGS  = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
BUILD     = build/san
else
SANFLAGS  =
BUILD     = build/plain
endif

WARN      = -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
CFLAGS   ?= -O2 -g
CFLAGS   += -std=gnu11 $(WARN) $(SANFLAGS) -D_GNU_SOURCE -Iinclude -pthread \
            -DBLKD_VERSION='"$(VERSION)"' -DBLKD_PLUGINDIR='"$(PLUGINDIR)"' \
            -DBLKD_FILTERDIR='"$(FILTERDIR)"' -DNBDKIT_PLUGINDIR='"$(NBDKIT_PLUGINDIR)"' \
            -DNBDKIT_FILTERDIR='"$(NBDKIT_FILTERDIR)"'
LDFLAGS  += $(SANFLAGS) -pthread

# Test hooks (environment knobs such as BLKD_TLS_REKEY_RECORDS) exist only
# in a test build: `make check` makes one, in its own object tree, and
# `make all` after it rebuilds ./blkd without them.  TEST_HOOKS=1 asks for
# one explicitly (for tests/run.sh by hand).
ifneq ($(filter check,$(MAKECMDGOALS)),)
TEST_HOOKS = 1
endif
ifeq ($(TEST_HOOKS),1)
CFLAGS   += -DBLKD_TEST_HOOKS
BUILD    := $(BUILD)-test
endif

# Packages the build, tests and benchmarks need (Debian 12 names).
DEPS = build-essential pkg-config libevent-dev libssl-dev openssl \
       nbdkit nbdkit-plugin-dev libnbd-dev libnbd-bin python3-libnbd \
       python3-prometheus-client qemu-utils qemu-system-common fuse3 \
       e2fsprogs fio nbd-client nbd-server iperf3 clang valgrind \
       systemd iproute2 procps psmisc curl python3-yaml bc \
       python3-cryptography gnuplot-nox librsvg2-bin strace cryptsetup-bin

SERVER_SRCS = $(wildcard server/*.c)
SERVER_OBJS = $(SERVER_SRCS:%.c=$(BUILD)/%.o)
SERVER_LIBS = -levent_core -levent_extra -lssl -lcrypto -ldl -lm

.PHONY: all deps run check install clean bench bench-anchors
all: blkd

# The binary always lands at the top of the tree so ./blkd runs uninstalled;
# it is rebuilt when the build flavour changes (a stamp names the flavour).
blkd: $(SERVER_OBJS) $(BUILD)/.flavour
	$(CC) $(LDFLAGS) -rdynamic -o $@ $(SERVER_OBJS) $(SERVER_LIBS)

$(BUILD)/.flavour:
	@mkdir -p $(BUILD)
	@rm -f build/*/.flavour
	@touch $@

$(BUILD)/%.o: %.c $(wildcard include/*.h server/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fvisibility=default -c -o $@ $<

include plugins/plugins.mk
include client/client.mk
include tests/tests.mk
include deploy/deploy.mk
include fuzz/fuzz.mk

# Install only what is missing: a machine that has everything runs no apt.
deps:
	@missing=$$(for p in $(DEPS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing$$(echo $$missing | tr '\n' ' ')"; \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi

run: deps all
	./blkd -f -i 127.0.0.1 -p 10809 ram size=1G

# Side-by-side fio anchors against nbdkit, qemu-nbd and nbd-server (issue 3).
# ROUNDS and SECONDS trade time for confidence; the tables land in
# build/bench-anchors.md for pasting into docs/BENCHMARKS.md.
ROUNDS  ?= 3
SECONDS ?= 5
bench-anchors: deps all
	@mkdir -p build
	/usr/bin/python3 bench/anchors.py --rounds $(ROUNDS) --seconds $(SECONDS) \
	  --out build/bench-anchors.md --json build/bench-anchors.json

# Each seed's before/after experiment, reproduced with blkperf against
# blkd's switches (and the cache and delay-accounting A/B scripts); the
# tables land in build/bench/ for docs/BENCHMARKS.md.
bench: deps all
	@mkdir -p build/bench
	bench/seeds.sh build/bench

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(PLUGINDIR)
	install -m 0755 blkd $(DESTDIR)$(BINDIR)/blkd
	install -m 0755 blkperf $(DESTDIR)$(BINDIR)/blkperf
	for p in $(PLUGINS); do install -m 0755 $$p $(DESTDIR)$(PLUGINDIR)/; done

clean:
	rm -rf build blkd blkperf $(PLUGINS) $(TEST_BINS) $(TEST_HELPERS)
