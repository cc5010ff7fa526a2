/* The metrics endpoint: /metrics (Prometheus text), /stats (JSON) and
 * /healthz, served by evhttp on a thread of its own (see metrics.c). */
#ifndef BLKD_METRICS_H
#define BLKD_METRICS_H

#include "internal.h"

/* Start serving cfg.metrics_addr (after listen_start); -1 + message. */
int metrics_start (void);
/* Stop serving and join the thread (after shard_stop_all). */
void metrics_stop (void);

#endif
