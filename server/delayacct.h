/* Request accounting, per-connection records and compact delay accounting.
 *
 * Every request is counted by command (requests, bytes, errors) and, unless
 * --delayacct=off, timed in three phases: queued (parsed -> plugin call
 * starts), plugin (the call itself) and send (reply ready -> last byte
 * handed to the socket).
 *
 * --delayacct=compact (the default, the kernel change's "after"): the per-shard
 * block has no lock and no start/end timestamps.  Start and end times live
 * in locals where they are taken; only durations travel in the request, and
 * every counter is updated on the shard thread, its single writer, with
 * relaxed atomic stores (no read-modify-write atomics, no lock).  The one
 * flag -- "this phase has been used" -- rides in the top bit of the count.
 *
 * --delayacct=locked (the "before"): a mutex-guarded struct per
 * shard, command and phase that stores the start and end timestamps and a
 * separate flags word, updated where the time is taken (a worker thread for
 * the queued and plugin phases), so the shard thread and its workers share
 * the lock and the cache lines.
 *
 * --delayacct=off reads no clock on the request path; the counts are kept.
 * The others read it twice per request around the plugin call, and once
 * per read() and per send of many requests (delayacct_parsed, _done). */
#ifndef BLKD_DELAYACCT_H
#define BLKD_DELAYACCT_H

#include "internal.h"

#define DA_BUCKETS  32                  /* log2 ns: bucket b holds [2^(b-1), 2^b) */
#define DA_INUSE    (UINT64_C(1) << 63) /* flag in the MSB of da_phase.count */
#define DA_RAN      (UINT64_C(1) << 63) /* flag in the MSB of request.d_plugin */
#define DA_NCMD     (NBD_CMD_COUNT + 1) /* the last slot counts unknown commands */

enum { DA_QUEUED, DA_PLUGIN, DA_SEND, DA_PHASES };

/* The compact "after": 24 bytes of counters plus the histogram. */
struct da_phase {
  uint64_t count;                       /* MSB: DA_INUSE */
  uint64_t total_ns;
  uint64_t max_ns;
  uint64_t hist[DA_BUCKETS];
};

/* The locked "before": lock, start/end timestamps and a flags word. */
struct da_phase_locked {
  pthread_mutex_t lock;
  uint64_t start_ns, end_ns;            /* of the request counted last */
  unsigned flags;                       /* DA_F_* */
  uint64_t count;
  uint64_t total_ns;
  uint64_t max_ns;
  uint64_t hist[DA_BUCKETS];
};
#define DA_F_INUSE  1u
#define DA_F_ACTIVE 2u                  /* a request is between start and end */

struct da_cmd {
  uint64_t requests, bytes, errors;
  struct da_phase ph[DA_PHASES];
};

/* One per shard, written only by that shard's thread (compact counters). */
struct shard_stats {
  struct da_cmd cmd[DA_NCMD];
  uint64_t started, completed;          /* requests parsed / freed */
  struct iobuf_counters iobuf;          /* written by the shard's pool (iobuf.c) */
  struct da_phase_locked (*locked)[DA_PHASES];  /* [DA_NCMD], --delayacct=locked */
} __attribute__ ((aligned (64)));

/* Per connection, for /stats; written by the connection's shard thread. */
struct conn_stats {
  struct conn_stats *next, *prev;       /* registry (delayacct.c), under its lock */
  uint64_t id;
  int shard;
  char peer[64];
  char *export_name;                    /* set once, under the registry lock */
  uint64_t started, completed;
  uint64_t bytes_read, bytes_written;
};

/* The stat block of shard i; allocated for cfg.shards on first use. */
struct shard_stats *stats_shard (int i);
int stats_nshards (void);
void stats_free (void);
/* Shard thread: a connection appears (a record when --metrics is on) /
 * is about to be freed; its export name, once known. */
void stats_conn_new (struct conn *c);
void stats_conn_gone (struct conn *c);
void stats_set_export (struct conn *c);
/* Metrics thread: connections ever registered; each record, under the
 * registry lock (fn must not block). */
uint64_t stats_conns_total (void);
void stats_conns_each (void (*fn) (const struct conn_stats *cs, bool first, void *arg),
                       void *arg);

void da_locked_begin (struct request *r, uint64_t t0);
void da_locked_end (struct request *r, uint64_t t0, uint64_t t1);
/* Shard thread, as r is freed.  *sent_at (when not NULL) caches the time
 * its reply's last byte was handed to the socket: 0 to have it read, and
 * the replies one send completed share one clock read. */
void delayacct_done (struct conn *c, struct request *r, uint64_t *sent_at);

/* Snapshot of one phase, summed over shards (metrics.c). */
struct da_snap {
  uint64_t count, total_ns, max_ns;
  uint64_t hist[DA_BUCKETS];
  bool used;
};
void da_snapshot (int cmd, int phase, struct da_snap *out);
size_t da_phase_size (bool locked);

static inline void
stat_set (uint64_t *p, uint64_t v)
{
  __atomic_store_n (p, v, __ATOMIC_RELAXED);
}

/* Single writer: a plain read of our own counter, a relaxed store so a
 * reader on another thread never sees a torn value.  No RMW atomics. */
#define STAT_ADD(field, v) stat_set (&(field), (field) + (v))

static inline uint64_t
stat_get (const uint64_t *p)
{
  return __atomic_load_n (p, __ATOMIC_RELAXED);
}

/* Shard thread, as a request is parsed.  Its queued phase starts when
 * the read that brought its header returned (c->t_read), not when it is
 * parsed: the wait behind the requests read with it is queueing too, and
 * one clock read per read() rather than one per request.  Limit: a
 * header left unparsed in rbuf while the connection was paused counts
 * from the next read that brings more bytes, a little short. */
static inline void
delayacct_parsed (struct conn *c, struct request *r)
{
  struct shard_stats *st = c->shard->stats;
  if (st)
    STAT_ADD (st->started, 1);
  if (c->mstats) {
    STAT_ADD (c->mstats->started, 1);
    if (__builtin_expect (!c->mstats->export_name, 0))
      stats_set_export (c);
  }
  r->d_queued = r->d_plugin = 0;
  if (cfg.delayacct != DELAYACCT_OFF)
    r->t_queued = c->t_read;
}

/* Shard thread or worker, around the plugin call.  The start time stays in
 * the caller's local; the request carries durations only. */
static inline uint64_t
delayacct_plugin_begin (struct request *r)
{
  if (cfg.delayacct == DELAYACCT_OFF)
    return 0;
  uint64_t t0 = now_ns ();
  if (cfg.delayacct == DELAYACCT_LOCKED)
    da_locked_begin (r, t0);
  else
    r->d_queued = t0 - r->t_queued;
  return t0;
}

static inline void
delayacct_plugin_end (struct request *r, uint64_t t0)
{
  if (cfg.delayacct == DELAYACCT_OFF)
    return;
  uint64_t t1 = now_ns ();
  if (cfg.delayacct == DELAYACCT_LOCKED)
    da_locked_end (r, t0, t1);
  r->d_plugin = (t1 - t0) | DA_RAN;
  r->t_queued = t1;                     /* from here on: when the reply was ready */
}

#endif
