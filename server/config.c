/* The server's configuration: one global, its defaults, read everywhere. */
#include "internal.h"

struct blkd_config cfg = {
  .max_request = 32 * 1024 * 1024,
  .max_inflight = 512,
  .reply_batch = 8,               /* docs/BENCHMARKS.md, "Switches" */
  .poll_us = 50,                  /* docs/BENCHMARKS.md, "Switches" */
  .workers = 16,
  .iobuf = IOBUF_POOL,
  .queue = QUEUE_SPLIT,
  .dispatch = DISPATCH_AUTO,
  .sparse_reads = SPARSE_READS_AUTO,
  .handshake_timeout = 10,
  .restart_timeout = 10,          /* as the SIGTERM drain waits */
  .tls = TLS_OFF,
  .delayacct = DELAYACCT_COMPACT,
  .cache_block = 64 * 1024,
  .cache_mode = CACHE_WRITETHROUGH,
  .cache_ctor = false,
};

/* Set once, by a signal, nbdkit_shutdown() or the end of --run. */
atomic_bool server_stopping;
