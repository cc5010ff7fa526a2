#!/usr/bin/env bash
# The partial plugin hosted by blkd: the nbdkit test's checks, against blkd.
PLUGIN_HOST=blkd exec "$(dirname "$0")/test-plugin-partial-nbdkit.sh"
