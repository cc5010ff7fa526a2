#!/usr/bin/env bash
# The rbd data checks with dispatch=caller: blkd's event loop (or a worker) maps each request to
# object ops, one librbd thread runs the completions, and librados' throttle is off with the
# plugin's count in its place.
RBD_EXTRA="dispatch=caller" exec "$(dirname "$0")/test-rbd-data.sh"
