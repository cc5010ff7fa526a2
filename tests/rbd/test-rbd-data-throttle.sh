#!/usr/bin/env bash
# The rbd data checks with librados' op throttle made tiny (Ceph options as plugin
# parameters): past the plugin's share of it, requests leave blkd's event loop for
# its workers (the aio calls answer ENOTSUP) instead of waiting there, and the
# data stays right on both paths.
RBD_EXTRA="objecter_inflight_ops=4 objecter_inflight_op_bytes=65536" RBD_SOME_ON_WORKERS=1 \
  exec "$(dirname "$0")/test-rbd-data.sh"
