# Deployment: container image, Kubernetes manifests, systemd units.
# See deploy/README.md.
#
#   make container        build localhost/blkd:latest with podman (makes the
#                         base image localhost/debian:bookworm first if absent)
#   make container-test   build it, then run, connect, copy, health-check and
#                         stop it for real (tests/test-deploy-container.sh)
#   make deploy-deps      install podman, runc, debootstrap ... when missing
#   make install-systemd  install blkd.socket/.service, /etc/default/blkd
#                         (kept if present) and the README, for PREFIX/DESTDIR
#
# The manifest and unit checks (tests/test-deploy-*.sh) run in `make check`.

CONTAINER_IMAGE ?= localhost/blkd:latest
BASE            ?= localhost/debian:bookworm
# podman with deploy/containers.conf (runc, explicit ulimits) via CONTAINERS_CONF.
PODMAN           = deploy/podman.sh

# What the container targets need (Debian 12 names). python3-yaml is for
# tests/test-deploy-k8s.sh, which runs in `make check` (it is in DEPS too).
DEPLOY_DEPS = podman runc debootstrap uidmap conmon containernetworking-plugins \
              iptables libnbd-bin curl openssl python3-yaml

SYSTEMD_UNITDIR ?= /etc/systemd/system
DOCDIR          ?= $(PREFIX)/share/doc/blkd

.PHONY: deploy-deps container container-base container-test install-systemd

deploy-deps:
	@missing=$$(for p in $(DEPLOY_DEPS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "deploy-deps: installing$$(echo $$missing | tr '\n' ' ')"; \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi

container-base: deploy-deps
	deploy/make-base-image.sh $(BASE)

# --format docker: the OCI format has no HEALTHCHECK and podman would drop it.
# --pull=never: the base is local (made above); nothing is reachable anyway.
container: container-base
	$(PODMAN) build --format docker --pull=never --network=host \
	  --build-arg BASE=$(BASE) --ignorefile deploy/containerignore \
	  -f deploy/Containerfile -t $(CONTAINER_IMAGE) .

container-test: container
	BLKD_CONTAINER_TEST=1 CONTAINER_IMAGE=$(CONTAINER_IMAGE) \
	  tests/run.sh tests/test-deploy-container.sh

# The units name /usr/local; rewrite the paths for this PREFIX. An existing
# /etc/default/blkd holds the admin's options and is left alone.
install-systemd:
	install -d $(DESTDIR)$(SYSTEMD_UNITDIR) $(DESTDIR)/etc/default $(DESTDIR)$(DOCDIR)
	for u in blkd.socket blkd.service; do \
	  sed -e 's|/usr/local/bin/|$(BINDIR)/|g' -e 's|/usr/local/share/doc/blkd/|$(DOCDIR)/|g' \
	    deploy/systemd/$$u > $(DESTDIR)$(SYSTEMD_UNITDIR)/$$u.tmp && \
	  chmod 0644 $(DESTDIR)$(SYSTEMD_UNITDIR)/$$u.tmp && \
	  mv $(DESTDIR)$(SYSTEMD_UNITDIR)/$$u.tmp $(DESTDIR)$(SYSTEMD_UNITDIR)/$$u || exit 1; \
	done
	[ -e $(DESTDIR)/etc/default/blkd ] || install -m 0644 deploy/systemd/blkd.env $(DESTDIR)/etc/default/blkd
	install -m 0644 deploy/README.md $(DESTDIR)$(DOCDIR)/README.md
	@echo "then: systemctl daemon-reload && systemctl enable --now blkd.socket"
