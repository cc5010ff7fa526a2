# Manual pages: blkd(1) and blkperf(1), installed by `make install`;
# tests/test-docs-man.sh checks they render cleanly and document every
# option the programs' --help lists.
MAN_PAGES = man/blkd.1 man/blkperf.1
