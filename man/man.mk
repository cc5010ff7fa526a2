# Manual pages: blkd(1), blkperf(1) and one per installed plugin (as
# nbdkit ships nbdkit-NAME-plugin(1)), installed by `make install`;
# tests/test-docs-man.sh checks they render cleanly and that blkd's and
# blkperf's document every option their --help lists.
MAN_PAGES = man/blkd.1 man/blkperf.1 $(foreach p,$(PLUGIN_NAMES),man/nbdkit-$(p)-plugin.1)
