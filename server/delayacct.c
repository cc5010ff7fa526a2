/* Request accounting, per-connection records and compact delay
 * accounting: see delayacct.h for the three modes.  The per-shard blocks outlive the shards
 * (they are freed after the metrics server stops), so the metrics thread
 * never touches a struct shard. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "delayacct.h"

static struct shard_stats *blocks;
static int nblocks;

struct shard_stats *
stats_shard (int i)
{
  if (!blocks) {
    /* First call: shard_start_all, on the main thread, before any shard
     * thread runs. */
    int n = cfg.shards > 0 ? cfg.shards : 1;
    if (posix_memalign ((void **) &blocks, 64, n * sizeof *blocks) != 0) {
      blocks = NULL;
      return NULL;
    }
    memset (blocks, 0, n * sizeof *blocks);
    nblocks = n;
    if (cfg.delayacct == DELAYACCT_LOCKED)
      for (int s = 0; s < n; s++) {
        blocks[s].locked = calloc (DA_NCMD, sizeof *blocks[s].locked);
        if (!blocks[s].locked)
          return NULL;
        for (int c = 0; c < DA_NCMD; c++)
          for (int p = 0; p < DA_PHASES; p++)
            pthread_mutex_init (&blocks[s].locked[c][p].lock, NULL);
      }
  }
  return i >= 0 && i < nblocks ? &blocks[i] : NULL;
}

int
stats_nshards (void)
{
  return nblocks;
}

void
stats_free (void)
{
  for (int s = 0; s < nblocks; s++)
    if (blocks[s].locked) {
      for (int c = 0; c < DA_NCMD; c++)
        for (int p = 0; p < DA_PHASES; p++)
          pthread_mutex_destroy (&blocks[s].locked[c][p].lock);
      free (blocks[s].locked);
    }
  free (blocks);
  blocks = NULL;
  nblocks = 0;
}

/* ---- per-connection records, for /stats (shard threads write) ------- */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct conn_stats *reg_head;
static uint64_t reg_total;            /* connections ever registered */

void
stats_conn_new (struct conn *c)
{
  if (!cfg.metrics_addr)
    return;
  struct conn_stats *cs = calloc (1, sizeof *cs);
  if (!cs)
    return;                           /* only /stats misses it */
  cs->id = c->id;
  cs->shard = c->shard->index;
  snprintf (cs->peer, sizeof cs->peer, "%s", c->peer);
  pthread_mutex_lock (&reg_lock);
  cs->next = reg_head;
  if (reg_head)
    reg_head->prev = cs;
  reg_head = cs;
  reg_total++;
  pthread_mutex_unlock (&reg_lock);
  c->mstats = cs;
}

void
stats_conn_gone (struct conn *c)
{
  struct conn_stats *cs = c->mstats;
  if (!cs)
    return;
  pthread_mutex_lock (&reg_lock);
  if (cs->prev)
    cs->prev->next = cs->next;
  else
    reg_head = cs->next;
  if (cs->next)
    cs->next->prev = cs->prev;
  pthread_mutex_unlock (&reg_lock);
  free (cs->export_name);
  free (cs);
  c->mstats = NULL;
}

void
stats_set_export (struct conn *c)
{
  char *name = strdup (c->export_name ? c->export_name : "");
  if (!name)
    return;
  pthread_mutex_lock (&reg_lock);
  c->mstats->export_name = name;
  pthread_mutex_unlock (&reg_lock);
}

uint64_t
stats_conns_total (void)
{
  pthread_mutex_lock (&reg_lock);
  uint64_t total = reg_total;
  pthread_mutex_unlock (&reg_lock);
  return total;
}

void
stats_conns_each (void (*fn) (const struct conn_stats *cs, bool first, void *arg), void *arg)
{
  pthread_mutex_lock (&reg_lock);
  for (struct conn_stats *cs = reg_head; cs; cs = cs->next)
    fn (cs, cs == reg_head, arg);
  pthread_mutex_unlock (&reg_lock);
}

size_t
da_phase_size (bool locked)
{
  return locked ? sizeof (struct da_phase_locked) : sizeof (struct da_phase);
}

static inline unsigned
bucket (uint64_t ns)
{
  unsigned b = ns ? 64 - __builtin_clzll (ns) : 0;
  return b < DA_BUCKETS ? b : DA_BUCKETS - 1;
}

static inline int
cmd_slot (uint16_t type)
{
  return type < NBD_CMD_COUNT ? type : NBD_CMD_COUNT;
}

/* ---- compact: shard thread only ------------------------------------ */

static inline void
record (struct da_phase *p, uint64_t ns)
{
  stat_set (&p->count, (p->count + 1) | DA_INUSE);
  STAT_ADD (p->total_ns, ns);
  if (ns > p->max_ns)
    stat_set (&p->max_ns, ns);
  unsigned b = bucket (ns);
  STAT_ADD (p->hist[b], 1);
}

/* ---- locked: wherever the time is taken ---------------------------- */

static void
record_locked (struct da_phase_locked *p, uint64_t start, uint64_t end)
{
  pthread_mutex_lock (&p->lock);
  p->start_ns = start;
  p->end_ns = end;
  uint64_t ns = p->end_ns - p->start_ns;
  p->flags = (p->flags & ~DA_F_ACTIVE) | DA_F_INUSE;
  p->count++;
  p->total_ns += ns;
  if (ns > p->max_ns)
    p->max_ns = ns;
  p->hist[bucket (ns)]++;
  pthread_mutex_unlock (&p->lock);
}

static struct da_phase_locked *
locked_of (struct request *r, int phase)
{
  struct shard_stats *st = r->conn->shard->stats;
  return st && st->locked ? &st->locked[cmd_slot (r->type)][phase] : NULL;
}

void
da_locked_begin (struct request *r, uint64_t t0)
{
  struct da_phase_locked *q = locked_of (r, DA_QUEUED), *p = locked_of (r, DA_PLUGIN);
  if (!q)
    return;
  record_locked (q, r->t_queued, t0);
  /* The old struct kept the start of the current wait in itself. */
  pthread_mutex_lock (&p->lock);
  p->start_ns = t0;
  p->flags |= DA_F_ACTIVE;
  pthread_mutex_unlock (&p->lock);
}

void
da_locked_end (struct request *r, uint64_t t0, uint64_t t1)
{
  struct da_phase_locked *p = locked_of (r, DA_PLUGIN);
  if (p)
    record_locked (p, t0, t1);
}

/* ---- completion: shard thread, as the request is freed -------------- */

void
delayacct_done (struct conn *c, struct request *r, uint64_t *sent_at)
{
  struct shard_stats *st = c->shard->stats;
  int slot = cmd_slot (r->type);
  /* Fully sent: every iovec, and a sendfile reply's file data too. */
  bool sent = r->niov > 0 && r->iov_sent == r->niov && r->send_len == 0;
  uint32_t bytes = 0;

  if (!r->error && (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE))
    bytes = r->count;
  if (c->mstats) {
    STAT_ADD (c->mstats->completed, 1);
    if (r->type == NBD_CMD_READ)
      STAT_ADD (c->mstats->bytes_read, bytes);
    else if (r->type == NBD_CMD_WRITE)
      STAT_ADD (c->mstats->bytes_written, bytes);
  }
  if (!st)
    return;
  struct da_cmd *k = &st->cmd[slot];
  STAT_ADD (st->completed, 1);
  STAT_ADD (k->requests, 1);
  STAT_ADD (k->bytes, bytes);
  if (r->error || !sent)
    STAT_ADD (k->errors, 1);

  if (cfg.delayacct == DELAYACCT_OFF || !sent)
    return;
  uint64_t now = sent_at && *sent_at ? *sent_at : now_ns ();
  if (sent_at)
    *sent_at = now;
  if (cfg.delayacct == DELAYACCT_LOCKED) {
    if (st->locked)
      record_locked (&st->locked[slot][DA_SEND], r->t_queued, now);
    return;
  }
  if (r->d_plugin & DA_RAN) {
    record (&k->ph[DA_QUEUED], r->d_queued);
    record (&k->ph[DA_PLUGIN], r->d_plugin & ~DA_RAN);
  }
  record (&k->ph[DA_SEND], now - r->t_queued);
}

/* ---- readers (metrics thread) --------------------------------------- */

void
da_snapshot (int cmd, int phase, struct da_snap *out)
{
  memset (out, 0, sizeof *out);
  for (int s = 0; s < nblocks; s++) {
    struct shard_stats *st = &blocks[s];
    if (st->locked) {
      struct da_phase_locked *p = &st->locked[cmd][phase];
      pthread_mutex_lock (&p->lock);
      if (p->flags & DA_F_INUSE) {
        out->used = true;
        out->count += p->count;
        out->total_ns += p->total_ns;
        if (p->max_ns > out->max_ns)
          out->max_ns = p->max_ns;
        for (int b = 0; b < DA_BUCKETS; b++)
          out->hist[b] += p->hist[b];
      }
      pthread_mutex_unlock (&p->lock);
      continue;
    }
    struct da_phase *p = &st->cmd[cmd].ph[phase];
    uint64_t count = stat_get (&p->count);
    if (!(count & DA_INUSE))
      continue;                       /* never used: nothing else to read */
    out->used = true;
    out->count += count & ~DA_INUSE;
    out->total_ns += stat_get (&p->total_ns);
    uint64_t max = stat_get (&p->max_ns);
    if (max > out->max_ns)
      out->max_ns = max;
    for (int b = 0; b < DA_BUCKETS; b++)
      out->hist[b] += stat_get (&p->hist[b]);
  }
}
