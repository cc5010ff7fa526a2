#!/usr/bin/env bash
# The rbd data checks under blkd with the plugin's aio calls off (aio=false):
# every request takes the synchronous calls on blkd's workers.
RBD_EXTRA=aio=false exec "$(dirname "$0")/test-rbd-data.sh"
