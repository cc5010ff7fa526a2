#!/usr/bin/env bash
# The rbd data checks with rbd_non_blocking_aio=false (librbd dispatches on
# blkd's event loop) and librados' op throttle made tiny (Ceph options as plugin
# parameters): past the plugin's share of the throttle, requests leave the event
# loop for blkd's workers (the aio calls answer ENOTSUP), and the data stays
# right on both paths.
RBD_EXTRA="rbd_non_blocking_aio=false objecter_inflight_ops=4 objecter_inflight_op_bytes=65536" \
  RBD_SOME_ON_WORKERS=1 exec "$(dirname "$0")/test-rbd-data.sh"
