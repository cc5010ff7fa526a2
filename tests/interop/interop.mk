# The interop matrix's newer clients (tests/interop/): qemu-utils 10 from
# Debian's bookworm-backports and libnbd 1.22 built from Debian trixie's
# source package, cached under /var/tmp/blkd-interop and never installed
# over the system's.  `make interop-clients` fetches and builds them once
# (a later run finds the cache and returns at once); tests/test-interop-*.sh
# skip their cells, saying why, when the cache is missing.

# Building libnbd: GnuTLS, libxml2 and Python headers (nbdsh), dpkg-dev
# (apt-get source); the rest of its build needs are in the base DEPS.
DEPS += libgnutls28-dev libxml2-dev python3-dev dpkg-dev

.PHONY: interop-clients
interop-clients: $(if $(filter 1,$(NO_DEPS)),,deps)
	tests/interop/fetch-clients.sh all

# What extended headers buy on a 64 GiB sparse export and a 1 TiB map
# (bench/ext-headers.sh): requests and seconds per client, on and off.
.PHONY: bench-ext
bench-ext: all
	bench/ext-headers.sh build/bench
