#!/usr/bin/env bash
# The rbd data checks with dispatch=caller (blkd's event loop dispatches) and
# librados' op throttle made tiny (Ceph options as plugin parameters, so
# librados keeps its throttle and the plugin's caps are half of it): past
# them, requests leave the event loop for blkd's workers (the aio calls
# answer ENOTSUP), and the data stays right on both paths.
RBD_EXTRA="dispatch=caller objecter_inflight_ops=4 objecter_inflight_op_bytes=65536" \
  RBD_SOME_ON_WORKERS=1 exec "$(dirname "$0")/test-rbd-data.sh"
