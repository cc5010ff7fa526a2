# The kernel's NBD client in a qemu guest (tests/vm/, docs/KERNEL.md):
# `make vm-check` runs the guest's cases against blkd and nbdkit;
# `make bench-kernel` measures the servers through /dev/nbd0.
# The guest is built from this host's Debian binaries and Debian's kernel
# package (fetched with apt-get download into /var/tmp/blkd-vm, never
# installed); qemu-system-x86 boots it.
DEPS += qemu-system-x86 busybox-static cpio binutils nbd-client nbd-server \
        fio e2fsprogs util-linux nbdkit qemu-utils iproute2

# apt first unless NO_DEPS=1, as for `make check`.
VM_DEPS_STEP = $(if $(filter 1,$(NO_DEPS)),,deps)

.PHONY: vm-check bench-kernel
# Exit 77 (qemu cannot run here, or no kernel package to be had) is a
# skip: it prints why and does not fail the build.
vm-check: $(VM_DEPS_STEP) all
	@tests/vm/vm-check.sh; rc=$$?; [ $$rc = 77 ] && rc=0; exit $$rc

bench-kernel: $(VM_DEPS_STEP) all
	@mkdir -p build/bench-kernel
	bench/kernel.sh build/bench-kernel
