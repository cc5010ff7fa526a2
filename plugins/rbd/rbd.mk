# The rbd plugin (Ceph RBD through librbd), its tests on a throw-away
# cluster (`make rbd-check`) and its benchmark (`make bench-rbd`).
# Debian's librbd and librados ship no pkg-config files: plain -l flags.
DEPS += ceph-mon ceph-osd ceph-mgr ceph-common librbd-dev librados-dev librbd1 \
        python3-rbd qemu-block-extra uuid-runtime bc \
        nbdkit-plugin-python time
PLUGIN_LIBS_rbd = -lrbd -lrados

# rbd-check installs what is missing first, as check does (NO_DEPS=1: not).
ifneq ($(NO_DEPS),1)
ifneq ($(filter rbd-check,$(MAKECMDGOALS)),)
DEPS_STEP = deps
endif
endif

# Built when librbd's header is there, or when make installs the packages
# first (check, run, rbd-check), or on request (WITH_RBD=1): a machine
# without Ceph's -dev packages still builds everything else.
ifneq ($(wildcard /usr/include/rbd/librbd.h)$(DEPS_STEP)$(filter 1,$(WITH_RBD)),)
PLUGIN_NAMES += rbd
endif

RBD_TESTS = $(sort $(wildcard tests/rbd/test-*.sh))

.PHONY: rbd-check bench-rbd
# Each test starts and stops its own cluster (tests/rbd/cluster.sh), so a
# failed test leaves none behind for the next.
rbd-check: $(DEPS_STEP) check-build plugins/rbd/nbdkit-rbd-plugin.so
	@tests/run.sh $(RBD_TESTS)

bench-rbd: deps all plugins/rbd/nbdkit-rbd-plugin.so
	@mkdir -p build/bench
	bench/rbd.sh build/bench

# The container image serving an RBD image (tests/rbd/test-rbd-container.sh).
.PHONY: rbd-container-test
rbd-container-test: container plugins/rbd/nbdkit-rbd-plugin.so
	BLKD_CONTAINER_TEST=1 CONTAINER_IMAGE=$(CONTAINER_IMAGE) \
	  tests/run.sh tests/rbd/test-rbd-container.sh
