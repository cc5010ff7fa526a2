/* The block cache (--cache, seed 004): fixed-size blocks between the
 * protocol and the plugin, one cache shared by every connection and shard.
 *
 * Locking.  The cache is split into stripes (64, fewer only for a cache of
 * under 64 blocks), each with its own mutex, hash table, CLOCK ring, dirty
 * list, slabs and counters; a block's stripe is a hash of its number, so
 * neighbouring blocks land on different stripes.  The stripe lock guards
 * the metadata and is never held across a plugin call or a copy.  Each
 * entry also has an `io` mutex, held while its data is loaded, copied,
 * changed or written out; an entry is pinned (refs > 0) while anyone uses
 * it, and only unpinned entries are evicted.  Rules that keep this free of
 * deadlock: io locks are taken in ascending block order; nobody waits for
 * an entry to become free (GET_WAIT) while holding a pin; the stripe lock
 * is innermost except that an io lock may be held while taking it.
 *
 * Coherence.  A write, trim or zero that reaches the plugin first and the
 * cache afterwards marks as STALE any entry of its range that it does not
 * hold: a load that raced with it keeps its data for its own reply but
 * never publishes it, so after the reply the cache and the plugin agree.
 * Writethrough writes hold the io locks of the whole blocks they cover
 * across the plugin call, so two overlapping writes update the cache in
 * the order they reached the plugin.
 *
 * Writeback keeps written blocks dirty until a FLUSH, a FUA write, the
 * eviction of the block or shutdown writes them, through a plugin handle
 * the cache opens for itself: a block dirtied by a connection that has
 * gone away is still written.  That handle sees the writes of every
 * connection only if the plugin is multi-conn safe, so writeback is
 * refused for plugins that are not.
 *
 * Entries come from slabs of N entries plus their data blocks.  With
 * --cache-ctor=no (the default until measured otherwise) an entry is
 * initialised when it is allocated and torn down when freed; with
 * --cache-ctor=yes a constructor runs over every entry when its slab is
 * made and a freed entry is put back in its constructed state (the
 * "before" of seed 004). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "cache.h"

#define CACHE_STRIPES   64
#define SLAB_BYTES      (1024 * 1024)   /* data per slab, at least one block */
#define WT_BATCH        32              /* blocks held across one plugin write */

#define CE_REF     1u                   /* CLOCK: used since the hand passed */
#define CE_STALE   2u                   /* invalidated while pinned: never valid again */
#define CE_HASHED  4u                   /* in the hash table and the ring */

struct cslab;

struct centry {
  pthread_mutex_t io;                   /* held while the data is read or written */
  uint64_t blk;
  struct centry *hnext;                 /* hash chain */
  struct centry *cnext, *cprev;         /* CLOCK ring */
  struct centry *dnext, *dprev;         /* dirty list, oldest first */
  struct centry *fnext;                 /* slab free list */
  struct cslab *slab;
  void *data;
  uint64_t dirty_seq;
  uint32_t refs;                        /* pins: stripe lock */
  uint8_t flags;                        /* CE_*: stripe lock */
  uint8_t valid, dirty;                 /* changed holding io and the stripe lock */
};

struct cslab {
  struct cslab *next, *prev;            /* stripe's slabs: with free entries first */
  struct centry *free;
  unsigned n, nfree;
  void *data;                           /* n blocks, page aligned (O_DIRECT) */
  struct centry e[];
};

struct stripe {
  pthread_mutex_t lock;
  pthread_cond_t freed;                 /* an entry was unpinned or freed */
  unsigned waiters;
  struct centry **hash;
  uint32_t hmask;
  struct centry *hand;                  /* CLOCK hand; NULL: ring empty */
  struct centry *dirty_head, *dirty_tail;
  uint64_t seq;                         /* dirtying order */
  struct cslab *slabs;
  unsigned nempty;                      /* wholly free slabs (one is kept) */
  unsigned used, cap;                   /* entries allocated, the stripe's bound */
  /* Counters: written under the lock, read by the metrics thread. */
  uint64_t hits, misses, evictions, writebacks, dirty_bytes, slab_bytes;
} __attribute__ ((aligned (64)));

struct blk_cache {
  uint32_t bs, shift;
  unsigned nstripes, sbits, slab_n;
  uint64_t nblocks;
  bool writeback, ctor;
  char *export_name;
  struct plugin_conn pc;                /* the cache's own handle (writeback) */
  int64_t size;                         /* of the export, from that handle */
  struct stripe *stripes;
};

struct blk_cache *blk_cache;

#define CSTAT_ADD(f, v) __atomic_store_n (&(f), (f) + (v), __ATOMIC_RELAXED)

enum { GET_LOOKUP, GET_TRY, GET_WAIT };

/* ---- placement ----------------------------------------------------- */

static inline uint64_t
mix (uint64_t blk)
{
  return blk * UINT64_C (0x9E3779B97F4A7C15);
}

static inline struct stripe *
stripe_of (struct blk_cache *C, uint64_t blk)
{
  return C->sbits ? &C->stripes[mix (blk) >> (64 - C->sbits)] : &C->stripes[0];
}

static inline struct centry **
bucket_of (struct stripe *s, uint64_t blk)
{
  return &s->hash[(mix (blk) >> 16) & s->hmask];
}

static inline uint32_t
blk_len (int64_t size, uint64_t boff, uint32_t bs)
{
  uint64_t left = (uint64_t) size - boff;
  return left < bs ? (uint32_t) left : bs;
}

static inline bool
serves (struct blk_cache *C, const struct plugin_conn *pc)
{
  const char *name = pc->ctx.export_name;
  return name && strcmp (name, C->export_name) == 0 && pc->caps.block_min <= C->bs;
}

/* ---- slabs and entries (stripe lock held) --------------------------- */

static void
construct (struct blk_cache *C, struct cslab *sl, struct centry *e)
{
  memset (e, 0, sizeof *e);
  pthread_mutex_init (&e->io, NULL);
  e->slab = sl;
  e->data = (char *) sl->data + (size_t) (e - sl->e) * C->bs;
}

static void
slab_unlink (struct stripe *s, struct cslab *sl)
{
  if (sl->prev)
    sl->prev->next = sl->next;
  else
    s->slabs = sl->next;
  if (sl->next)
    sl->next->prev = sl->prev;
  sl->next = sl->prev = NULL;
}

static void
slab_push_front (struct stripe *s, struct cslab *sl)
{
  sl->prev = NULL;
  sl->next = s->slabs;
  if (s->slabs)
    s->slabs->prev = sl;
  s->slabs = sl;
}

static void
slab_push_back (struct stripe *s, struct cslab *sl)
{
  struct cslab **pp = &s->slabs, *prev = NULL;
  while (*pp) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  sl->prev = prev;
  sl->next = NULL;
  *pp = sl;
}

static struct cslab *
slab_new (struct blk_cache *C, struct stripe *s)
{
  unsigned n = C->slab_n;
  struct cslab *sl = malloc (sizeof *sl + n * sizeof (struct centry));
  if (!sl)
    return NULL;
  if (posix_memalign (&sl->data, 4096, (size_t) n * C->bs) != 0) {
    free (sl);
    return NULL;
  }
  sl->n = sl->nfree = n;
  sl->free = NULL;
  for (unsigned i = n; i-- > 0;) {
    struct centry *e = &sl->e[i];
    if (C->ctor)
      construct (C, sl, e);            /* the constructor: every entry, now */
    e->fnext = sl->free;
    sl->free = e;
  }
  slab_push_front (s, sl);
  s->nempty++;
  CSTAT_ADD (s->slab_bytes, (uint64_t) n * C->bs);
  return sl;
}

static void
slab_destroy (struct blk_cache *C, struct stripe *s, struct cslab *sl)
{
  slab_unlink (s, sl);
  if (C->ctor)
    for (unsigned i = 0; i < sl->n; i++)
      pthread_mutex_destroy (&sl->e[i].io);
  s->nempty--;
  CSTAT_ADD (s->slab_bytes, -(uint64_t) sl->n * C->bs);
  free (sl->data);
  free (sl);
}

static struct centry *
entry_alloc (struct blk_cache *C, struct stripe *s)
{
  if (s->used >= s->cap)
    return NULL;
  struct cslab *sl = s->slabs;
  if (!sl || !sl->nfree) {
    sl = slab_new (C, s);
    if (!sl)
      return NULL;
  }
  struct centry *e = sl->free;
  sl->free = e->fnext;
  if (sl->nfree-- == sl->n)
    s->nempty--;
  if (!sl->nfree) {                   /* full: behind the ones with room */
    slab_unlink (s, sl);
    slab_push_back (s, sl);
  }
  if (!C->ctor)
    construct (C, sl, e);             /* initialised when allocated */
  s->used++;
  return e;
}

static void
entry_free (struct blk_cache *C, struct stripe *s, struct centry *e, bool keep_slab)
{
  struct cslab *sl = e->slab;
  if (C->ctor) {
    /* Back to the constructed state: the lock stays initialised. */
    e->blk = 0;
    e->hnext = e->cnext = e->cprev = e->dnext = e->dprev = NULL;
    e->dirty_seq = 0;
    e->refs = 0;
    e->flags = e->valid = e->dirty = 0;
  }
  else
    pthread_mutex_destroy (&e->io);
  e->fnext = sl->free;
  sl->free = e;
  if (sl->nfree++ == 0) {
    slab_unlink (s, sl);
    slab_push_front (s, sl);
  }
  s->used--;
  if (sl->nfree == sl->n) {
    s->nempty++;
    /* One wholly free slab is kept so a stripe that fills and empties
     * over and over does not make and destroy a slab each time. */
    if (!keep_slab && s->nempty > 1)
      slab_destroy (C, s, sl);
  }
  if (s->waiters)
    pthread_cond_broadcast (&s->freed);
}

/* ---- hash, ring, dirty list (stripe lock held) ---------------------- */

static struct centry *
hash_find (struct stripe *s, uint64_t blk)
{
  for (struct centry *e = *bucket_of (s, blk); e; e = e->hnext)
    if (e->blk == blk)
      return e;
  return NULL;
}

static void
publish (struct stripe *s, struct centry *e)
{
  struct centry **b = bucket_of (s, e->blk);
  e->hnext = *b;
  *b = e;
  if (s->hand) {                      /* just behind the hand: swept last */
    e->cnext = s->hand;
    e->cprev = s->hand->cprev;
    e->cprev->cnext = e;
    s->hand->cprev = e;
  }
  else {
    e->cnext = e->cprev = e;
    s->hand = e;
  }
  e->flags |= CE_HASHED;
}

static void
forget (struct stripe *s, struct centry *e)
{
  if (!(e->flags & CE_HASHED))
    return;
  for (struct centry **pp = bucket_of (s, e->blk); *pp; pp = &(*pp)->hnext)
    if (*pp == e) {
      *pp = e->hnext;
      break;
    }
  if (e->cnext == e)
    s->hand = NULL;
  else {
    if (s->hand == e)
      s->hand = e->cnext;
    e->cprev->cnext = e->cnext;
    e->cnext->cprev = e->cprev;
  }
  e->hnext = e->cnext = e->cprev = NULL;
  e->flags &= ~CE_HASHED;
}

static void
dirty_add (struct stripe *s, struct centry *e, uint32_t len)
{
  e->dirty = 1;
  e->dirty_seq = ++s->seq;
  e->dnext = NULL;
  e->dprev = s->dirty_tail;
  if (s->dirty_tail)
    s->dirty_tail->dnext = e;
  else
    s->dirty_head = e;
  s->dirty_tail = e;
  CSTAT_ADD (s->dirty_bytes, len);
}

static void
dirty_del (struct stripe *s, struct centry *e, uint32_t len)
{
  e->dirty = 0;
  if (e->dprev)
    e->dprev->dnext = e->dnext;
  else
    s->dirty_head = e->dnext;
  if (e->dnext)
    e->dnext->dprev = e->dprev;
  else
    s->dirty_tail = e->dprev;
  e->dnext = e->dprev = NULL;
  CSTAT_ADD (s->dirty_bytes, -(uint64_t) len);
}

/* Invalidate: gone from lookups now, freed when the last pin goes. */
static void
make_stale (struct blk_cache *C, struct stripe *s, struct centry *e)
{
  forget (s, e);
  e->flags |= CE_STALE;
  if (e->refs == 0)
    entry_free (C, s, e, false);
}

static void
unpin (struct blk_cache *C, struct stripe *s, struct centry *e)
{
  if (--e->refs)
    return;
  if ((e->flags & CE_STALE) || !e->valid) {
    forget (s, e);                    /* a failed or outdated load */
    entry_free (C, s, e, false);
  }
  else if (s->waiters)
    pthread_cond_broadcast (&s->freed);
}

static void
unpin_unlocked (struct blk_cache *C, struct centry *e)
{
  struct stripe *s = stripe_of (C, e->blk);
  pthread_mutex_lock (&s->lock);
  unpin (C, s, e);
  pthread_mutex_unlock (&s->lock);
}

/* ---- write-out ------------------------------------------------------ */

/* Write a dirty block through the cache's own handle.  The caller holds
 * the entry's io lock and a pin, so `dirty` cannot change under us. */
static int
write_out (struct blk_cache *C, struct centry *e, bool fua)
{
  if (!e->dirty)
    return 0;
  uint64_t boff = e->blk << C->shift;
  uint32_t len = blk_len (C->size, boff, C->bs);
  int err = plugin_pwrite (&C->pc, e->data, len, boff, fua);
  if (err) {
    log_error ("cache: writing back block at %llu failed: %s",
               (unsigned long long) boff, strerror (err));
    return err;
  }
  struct stripe *s = stripe_of (C, e->blk);
  pthread_mutex_lock (&s->lock);
  dirty_del (s, e, len);
  CSTAT_ADD (s->writebacks, 1);
  pthread_mutex_unlock (&s->lock);
  return 0;
}

/* ---- getting an entry ---------------------------------------------- */

/* With the stripe lock held: an entry for a new block.  0: got one (the
 * lock was held throughout); 1: the lock was dropped, look again; -1: none
 * (GET_TRY and nothing evictable, or out of memory: *err). */
static int
alloc_or_evict (struct blk_cache *C, struct stripe *s, bool may_wait,
                struct centry **out, int *err)
{
  struct centry *e = entry_alloc (C, s);
  if (e) {
    *out = e;
    return 0;
  }
  /* CLOCK: pass over referenced entries once, clearing the bit. */
  for (unsigned n = 2 * s->used + 1; n > 0 && s->hand; n--) {
    struct centry *v = s->hand;
    s->hand = v->cnext;
    if (v->refs)
      continue;
    if (v->flags & CE_REF) {
      v->flags &= ~CE_REF;
      continue;
    }
    if (v->dirty) {
      if (!may_wait)
        continue;
      /* Memory pressure: write the block first, then it may go. */
      v->refs++;
      pthread_mutex_unlock (&s->lock);
      pthread_mutex_lock (&v->io);
      int werr = write_out (C, v, false);
      pthread_mutex_unlock (&v->io);
      pthread_mutex_lock (&s->lock);
      unpin (C, s, v);
      if (werr) {
        *err = werr;
        return -1;
      }
      return 1;
    }
    forget (s, v);
    CSTAT_ADD (s->evictions, 1);
    entry_free (C, s, v, true);
    e = entry_alloc (C, s);
    if (e) {
      *out = e;
      return 0;
    }
    *err = ENOMEM;
    return -1;
  }
  if (s->used < s->cap || !may_wait) {
    *err = ENOMEM;                    /* a slab could not be allocated */
    return -1;
  }
  s->waiters++;                       /* every entry is pinned: wait for one */
  pthread_cond_wait (&s->freed, &s->lock);
  s->waiters--;
  return 1;
}

/* A pinned entry for blk, or NULL (GET_LOOKUP: not cached; otherwise *err). */
static struct centry *
get_entry (struct blk_cache *C, uint64_t blk, int mode, int *err)
{
  struct stripe *s = stripe_of (C, blk);
  struct centry *e = NULL;

  *err = 0;
  pthread_mutex_lock (&s->lock);
  for (;;) {
    e = hash_find (s, blk);
    if (e) {
      e->refs++;
      e->flags |= CE_REF;
      break;
    }
    if (mode == GET_LOOKUP)
      break;
    int r = alloc_or_evict (C, s, mode == GET_WAIT, &e, err);
    if (r == 0) {
      e->blk = blk;
      e->refs = 1;
      e->valid = 0;
      publish (s, e);
      break;
    }
    if (r < 0) {
      e = NULL;
      break;
    }
  }
  pthread_mutex_unlock (&s->lock);
  return e;
}

/* ---- reads --------------------------------------------------------- */

/* Copy len bytes at inoff of block blk to dst (NULL: just load it). */
static int
read_block (struct blk_cache *C, struct plugin_conn *pc, uint64_t blk,
            void *dst, uint32_t inoff, uint32_t len)
{
  uint64_t boff = blk << C->shift;
  int err;
  struct centry *e = get_entry (C, blk, GET_WAIT, &err);
  if (!e)                             /* not cached and no room: the plugin has it */
    return dst ? plugin_pread (pc, dst, len, boff + inoff) : 0;

  pthread_mutex_lock (&e->io);
  bool hit = e->valid;
  err = 0;
  if (!hit) {
    err = plugin_pread (pc, e->data, blk_len (pc->caps.size, boff, C->bs), boff);
    if (!err) {
      struct stripe *s = stripe_of (C, blk);
      pthread_mutex_lock (&s->lock);
      if (!(e->flags & CE_STALE))
        e->valid = 1;
      pthread_mutex_unlock (&s->lock);
    }
  }
  if (!err && dst)
    memcpy (dst, (char *) e->data + inoff, len);
  pthread_mutex_unlock (&e->io);

  struct stripe *s = stripe_of (C, blk);
  pthread_mutex_lock (&s->lock);
  if (hit)
    CSTAT_ADD (s->hits, 1);
  else
    CSTAT_ADD (s->misses, 1);
  unpin (C, s, e);
  pthread_mutex_unlock (&s->lock);
  return err;
}

/* Bytes from pos to the end of its block or to end, whichever is first. */
static inline uint64_t
seg_len (const struct blk_cache *C, int64_t size, uint64_t pos, uint64_t end)
{
  uint64_t boff = pos & ~(uint64_t) (C->bs - 1);
  uint64_t bend = boff + blk_len (size, boff, C->bs);
  return (end < bend ? end : bend) - pos;
}

/* Walk [offset, offset+count) block by block: blk, and seg bytes at pos. */
#define FOR_BLOCKS(C, size, offset, count, blk, pos, seg)                 \
  for (uint64_t pos = (offset), end_ = (offset) + (count), blk, seg;    \
       pos < end_ && (blk = pos >> (C)->shift,                          \
                      seg = seg_len ((C), (size), pos, end_), 1);       \
       pos += seg)

int
cache_do_pread (struct plugin_conn *pc, void *buf, uint32_t count, uint64_t offset)
{
  struct blk_cache *C = blk_cache;
  if (!serves (C, pc))
    return plugin_pread (pc, buf, count, offset);
  FOR_BLOCKS (C, pc->caps.size, offset, count, blk, pos, seg) {
    int err = read_block (C, pc, blk, (char *) buf + (pos - offset),
                          pos - (blk << C->shift), seg);
    if (err)
      return err;
  }
  return 0;
}

int
cache_do_prefetch (struct plugin_conn *pc, uint32_t count, uint64_t offset)
{
  struct blk_cache *C = blk_cache;
  if (!serves (C, pc))
    return plugin_cache (pc, count, offset);
  FOR_BLOCKS (C, pc->caps.size, offset, count, blk, pos, seg) {
    int err = read_block (C, pc, blk, NULL, 0, 0);
    if (err)
      return err;
  }
  return 0;
}

/* ---- invalidation and write-back of ranges --------------------------- */

/* Blocks of [offset, offset+count) that are cached, for ranges too large
 * to look up block by block: one pass over the rings instead. */
static uint64_t *
cached_blocks_in (struct blk_cache *C, uint64_t first, uint64_t last, size_t *n)
{
  size_t cap = 64, len = 0;
  uint64_t *v = malloc (cap * sizeof *v);
  if (!v)
    return NULL;
  for (unsigned i = 0; i < C->nstripes; i++) {
    struct stripe *s = &C->stripes[i];
    pthread_mutex_lock (&s->lock);
    struct centry *e = s->hand;
    if (e)
      do {
        if (e->blk >= first && e->blk <= last) {
          if (len == cap) {
            uint64_t *nv = realloc (v, 2 * cap * sizeof *v);
            if (!nv) {
              pthread_mutex_unlock (&s->lock);
              free (v);
              return NULL;
            }
            v = nv;
            cap *= 2;
          }
          v[len++] = e->blk;
        }
        e = e->cnext;
      } while (e != s->hand);
    pthread_mutex_unlock (&s->lock);
  }
  *n = len;
  return v;
}

enum range_op { RANGE_WRITEBACK, RANGE_INVALIDATE, RANGE_ZERO_DIRTY };

/* RANGE_WRITEBACK: write dirty blocks out.  RANGE_INVALIDATE: drop clean
 * blocks, leave dirty ones.  RANGE_ZERO_DIRTY: drop clean blocks and zero
 * [lo, hi) in dirty ones (they were dirtied by a write racing with a
 * trim/zero that has now reached the plugin: the write is ordered first). */
static int
range_block (struct blk_cache *C, uint64_t blk, uint64_t lo, uint64_t hi, enum range_op op)
{
  struct stripe *s = stripe_of (C, blk);
  pthread_mutex_lock (&s->lock);
  struct centry *e = hash_find (s, blk);
  if (!e) {
    pthread_mutex_unlock (&s->lock);
    return 0;
  }
  if (!e->dirty && op != RANGE_WRITEBACK) {
    make_stale (C, s, e);
    pthread_mutex_unlock (&s->lock);
    return 0;
  }
  if (!e->dirty || op == RANGE_INVALIDATE) {
    pthread_mutex_unlock (&s->lock);
    return 0;
  }
  e->refs++;
  pthread_mutex_unlock (&s->lock);

  int err = 0;
  pthread_mutex_lock (&e->io);
  if (op == RANGE_WRITEBACK)
    err = write_out (C, e, false);
  else if (e->dirty) {
    uint64_t boff = blk << C->shift;
    uint64_t a = lo > boff ? lo : boff, b = hi < boff + C->bs ? hi : boff + C->bs;
    memset ((char *) e->data + (a - boff), 0, b - a);
  }
  else {                              /* written out meanwhile: now just drop it */
    pthread_mutex_lock (&s->lock);
    make_stale (C, s, e);
    pthread_mutex_unlock (&s->lock);
  }
  pthread_mutex_unlock (&e->io);
  unpin_unlocked (C, e);
  return err;
}

static int
range_op (struct blk_cache *C, uint64_t offset, uint64_t count, enum range_op op)
{
  if (count == 0)
    return 0;
  uint64_t first = offset >> C->shift, last = (offset + count - 1) >> C->shift;
  int err = 0;
  if (last - first + 1 > C->nblocks) {
    size_t n;
    uint64_t *v = cached_blocks_in (C, first, last, &n);
    if (v) {
      for (size_t i = 0; i < n && !err; i++)
        err = range_block (C, v[i], offset, offset + count, op);
      free (v);
      return err;
    }
    /* Out of memory for the list: go block by block. */
  }
  for (uint64_t blk = first; blk <= last && !err; blk++)
    err = range_block (C, blk, offset, offset + count, op);
  return err;
}

/* ---- writes -------------------------------------------------------- */

struct wt_seg {
  struct centry *e;
  uint64_t blk, pos;
  uint32_t len;
  bool full;
};

static int
write_through (struct blk_cache *C, struct plugin_conn *pc, const void *buf,
               uint32_t count, uint64_t offset, bool fua)
{
  int64_t size = pc->caps.size;
  uint64_t end = offset + count, pos = offset;

  while (pos < end) {
    struct wt_seg b[WT_BATCH];
    unsigned n = 0;
    uint64_t start = pos;
    /* Hold every whole block of the batch (ascending order) across the
     * plugin call, so overlapping writes update the cache in the order
     * they reached the plugin.  Partial blocks are updated only if cached. */
    while (pos < end && n < WT_BATCH) {
      uint64_t blk = pos >> C->shift, boff = blk << C->shift;
      uint64_t bend = boff + blk_len (size, boff, C->bs);
      uint64_t seg_end = end < bend ? end : bend;
      int err;
      struct wt_seg *g = &b[n++];
      g->blk = blk;
      g->pos = pos;
      g->len = seg_end - pos;
      g->full = pos == boff && seg_end == bend;
      g->e = get_entry (C, blk, g->full ? GET_TRY : GET_LOOKUP, &err);
      if (g->e)
        pthread_mutex_lock (&g->e->io);
      pos = seg_end;
    }

    int err = plugin_pwrite (pc, (const char *) buf + (start - offset), pos - start,
                             start, fua);

    for (unsigned i = 0; i < n; i++) {
      struct wt_seg *g = &b[i];
      struct centry *e = g->e;
      if (!e) {
        range_block (C, g->blk, 0, 0, RANGE_INVALIDATE);
        continue;
      }
      struct stripe *s = stripe_of (C, g->blk);
      if (!err && (g->full || e->valid)) {
        memcpy ((char *) e->data + (g->pos - (g->blk << C->shift)),
                (const char *) buf + (g->pos - offset), g->len);
        pthread_mutex_lock (&s->lock);
        if (!(e->flags & CE_STALE))
          e->valid = 1;
        pthread_mutex_unlock (&s->lock);
      }
      else if (err) {                 /* what the plugin holds now is unknown */
        pthread_mutex_lock (&s->lock);
        make_stale (C, s, e);
        pthread_mutex_unlock (&s->lock);
      }
      pthread_mutex_unlock (&e->io);
      unpin_unlocked (C, e);
    }
    if (err)
      return err;
  }
  return 0;
}

static int
write_back (struct blk_cache *C, struct plugin_conn *pc, const void *buf,
            uint32_t count, uint64_t offset, bool fua)
{
  FOR_BLOCKS (C, C->size, offset, count, blk, pos, seg) {
    uint64_t boff = blk << C->shift;
    uint32_t blen = blk_len (C->size, boff, C->bs);
    bool full = pos == boff && seg == blen;
    struct stripe *s = stripe_of (C, blk);
    int err;
    for (;;) {
      struct centry *e = get_entry (C, blk, GET_WAIT, &err);
      if (!e)
        return err ? err : ENOMEM;
      pthread_mutex_lock (&e->io);
      if (!e->valid && !full) {       /* read-modify-write */
        err = plugin_pread (pc, e->data, blen, boff);
        if (err) {
          pthread_mutex_unlock (&e->io);
          unpin_unlocked (C, e);
          return err;
        }
      }
      memcpy ((char *) e->data + (pos - boff), (const char *) buf + (pos - offset), seg);
      pthread_mutex_lock (&s->lock);
      if (e->flags & CE_STALE) {
        /* A trim or zero dropped the block while we filled it: it is
         * ordered before this write, so start again on a fresh entry. */
        pthread_mutex_unlock (&s->lock);
        pthread_mutex_unlock (&e->io);
        unpin_unlocked (C, e);
        continue;
      }
      e->valid = 1;
      if (!e->dirty)
        dirty_add (s, e, blen);
      pthread_mutex_unlock (&s->lock);
      if (fua)
        err = write_out (C, e, true);
      pthread_mutex_unlock (&e->io);
      unpin_unlocked (C, e);
      if (err)
        return err;
      break;
    }
  }
  return 0;
}

int
cache_do_pwrite (struct plugin_conn *pc, const void *buf, uint32_t count,
                 uint64_t offset, bool fua)
{
  struct blk_cache *C = blk_cache;
  if (!serves (C, pc))
    return plugin_pwrite (pc, buf, count, offset, fua);
  if (!pc->caps.can_write)
    return EROFS;
  return C->writeback ? write_back (C, pc, buf, count, offset, fua)
                      : write_through (C, pc, buf, count, offset, fua);
}

/* ---- flush, trim, zero, extents ------------------------------------- */

/* Write out every block that was dirty when we started. */
static int
write_back_all (struct blk_cache *C)
{
  int err = 0;
  for (unsigned i = 0; i < C->nstripes && !err; i++) {
    struct stripe *s = &C->stripes[i];
    pthread_mutex_lock (&s->lock);
    uint64_t upto = s->seq;
    struct centry *e;
    while (!err && (e = s->dirty_head) && e->dirty_seq <= upto) {
      e->refs++;
      pthread_mutex_unlock (&s->lock);
      pthread_mutex_lock (&e->io);
      err = write_out (C, e, false);
      pthread_mutex_unlock (&e->io);
      pthread_mutex_lock (&s->lock);
      unpin (C, s, e);
    }
    pthread_mutex_unlock (&s->lock);
  }
  return err;
}

int
cache_do_flush (struct plugin_conn *pc)
{
  struct blk_cache *C = blk_cache;
  if (C->writeback && serves (C, pc)) {
    int err = write_back_all (C);
    if (err)
      return err;
  }
  /* Multi-conn: a flush through any handle covers the cache's writes. */
  return plugin_flush (pc);
}

int
cache_do_trim (struct plugin_conn *pc, uint32_t count, uint64_t offset, bool fua)
{
  struct blk_cache *C = blk_cache;
  if (!serves (C, pc))
    return plugin_trim (pc, count, offset, fua);
  int err = 0;
  if (C->writeback)
    err = range_op (C, offset, count, RANGE_WRITEBACK);
  if (!err)
    err = plugin_trim (pc, count, offset, fua);
  range_op (C, offset, count, C->writeback && !err ? RANGE_ZERO_DIRTY : RANGE_INVALIDATE);
  return err;
}

int
cache_do_zero (struct plugin_conn *pc, uint32_t count, uint64_t offset,
               bool may_trim, bool fua, bool fast)
{
  struct blk_cache *C = blk_cache;
  if (!serves (C, pc))
    return plugin_zero (pc, count, offset, may_trim, fua, fast);
  int err = 0;
  if (C->writeback)
    err = range_op (C, offset, count, RANGE_WRITEBACK);
  if (!err)
    err = plugin_zero (pc, count, offset, may_trim, fua, fast);
  range_op (C, offset, count, C->writeback && !err ? RANGE_ZERO_DIRTY : RANGE_INVALIDATE);
  return err;
}

/* The plugin answers for allocation; with writeback it must first see
 * the dirty blocks, or it would call them holes. */
int
cache_do_extents (struct plugin_conn *pc, uint32_t count, uint64_t offset,
                  bool req_one, struct nbdkit_extents *e)
{
  struct blk_cache *C = blk_cache;
  if (C->writeback && serves (C, pc)) {
    int err = range_op (C, offset, count, RANGE_WRITEBACK);
    if (err)
      return err;
  }
  return plugin_extents (pc, count, offset, req_one, e);
}

/* ---- set-up, totals, shutdown --------------------------------------- */

int
cache_setup (void)
{
  if (!cfg.cache_size)
    return 0;
  uint32_t bs = cfg.cache_block;
  if (cfg.cache_size < bs) {
    fprintf (stderr, "blkd: --cache %llu is smaller than one --cache-block (%u)\n",
             (unsigned long long) cfg.cache_size, bs);
    return -1;
  }
  struct blk_cache *C = calloc (1, sizeof *C);
  if (!C)
    goto oom;
  C->bs = bs;
  C->shift = __builtin_ctz (bs);
  C->nblocks = cfg.cache_size / bs;
  C->writeback = cfg.cache_mode == CACHE_WRITEBACK;
  C->ctor = cfg.cache_ctor;
  C->size = -1;
  C->nstripes = CACHE_STRIPES;
  while (C->nstripes > C->nblocks)
    C->nstripes /= 2;                 /* a tiny cache: at least a block a stripe */
  C->sbits = __builtin_ctz (C->nstripes);
  unsigned cap = (C->nblocks + C->nstripes - 1) / C->nstripes;
  C->slab_n = SLAB_BYTES / bs ? SLAB_BYTES / bs : 1;
  if (C->slab_n > cap)
    C->slab_n = cap;

  /* The export the cache holds: the one "" resolves to. */
  plugin_conn_init (&C->pc, -1);
  public_current = &C->pc.ctx;
  const char *d = plugin_default_export (cfg.readonly, false);
  public_current = NULL;
  C->export_name = strdup (d ? d : "");
  if (!C->export_name)
    goto oom;

  if (C->writeback) {
    if (plugin_open (&C->pc, C->export_name, cfg.readonly) == -1) {
      fprintf (stderr, "blkd: cache: cannot open export \"%s\" for write-back\n",
               C->export_name);
      goto fail;
    }
    if (!C->pc.caps.can_multi_conn) {
      fprintf (stderr, "blkd: --cache-mode=writeback needs a plugin that is safe with "
               "several connections (can_multi_conn); %s is not: its handles may not "
               "see each other's writes.  Use --cache-mode=writethrough.\n", plugin_name ());
      goto fail;
    }
    if (C->pc.caps.block_min > bs) {
      fprintf (stderr, "blkd: --cache-block %u is below the plugin's minimum block "
               "size %u\n", bs, C->pc.caps.block_min);
      goto fail;
    }
    C->size = C->pc.caps.size;
  }

  if (posix_memalign ((void **) &C->stripes, 64, C->nstripes * sizeof *C->stripes) != 0) {
    C->stripes = NULL;
    goto oom;
  }
  memset (C->stripes, 0, C->nstripes * sizeof *C->stripes);
  uint32_t hsize = 1;
  while (hsize < cap)
    hsize *= 2;
  for (unsigned i = 0; i < C->nstripes; i++) {
    struct stripe *s = &C->stripes[i];
    pthread_mutex_init (&s->lock, NULL);
    pthread_cond_init (&s->freed, NULL);
    s->cap = cap;
    s->hmask = hsize - 1;
    s->hash = calloc (hsize, sizeof *s->hash);
    if (!s->hash)
      goto oom;
  }
  blk_cache = C;
  log_debug ("cache: %s, %u stripes of %u blocks of %u bytes, slabs of %u, ctor %s",
             C->writeback ? "writeback" : "writethrough", C->nstripes, cap, bs,
             C->slab_n, C->ctor ? "yes" : "no");
  return 0;

oom:
  fprintf (stderr, "blkd: cache: out of memory\n");
fail:
  if (C) {
    blk_cache = C;
    cache_stop ();
  }
  return -1;
}

void
cache_totals (struct cache_totals *t)
{
  struct blk_cache *C = blk_cache;
  memset (t, 0, sizeof *t);
  if (!C)
    return;
  t->stripes = C->nstripes;
  t->block = C->bs;
  for (unsigned i = 0; i < C->nstripes; i++) {
    struct stripe *s = &C->stripes[i];
    t->hits += __atomic_load_n (&s->hits, __ATOMIC_RELAXED);
    t->misses += __atomic_load_n (&s->misses, __ATOMIC_RELAXED);
    t->evictions += __atomic_load_n (&s->evictions, __ATOMIC_RELAXED);
    t->writebacks += __atomic_load_n (&s->writebacks, __ATOMIC_RELAXED);
    t->dirty_bytes += __atomic_load_n (&s->dirty_bytes, __ATOMIC_RELAXED);
    t->bytes += __atomic_load_n (&s->slab_bytes, __ATOMIC_RELAXED);
    t->entries += __atomic_load_n (&s->used, __ATOMIC_RELAXED);
    t->capacity_bytes += (uint64_t) s->cap * C->bs;
  }
}

void
cache_stop (void)
{
  struct blk_cache *C = blk_cache;
  if (!C)
    return;
  if (C->writeback && C->pc.handle && C->stripes) {
    struct cache_totals t;
    cache_totals (&t);
    int err = write_back_all (C);
    if (!err && C->pc.caps.can_flush)
      err = plugin_flush (&C->pc);
    if (err)
      log_error ("cache: dirty blocks could not all be written at shutdown: %s",
                 strerror (err));
    else if (t.dirty_bytes)
      log_info ("cache: wrote %llu dirty bytes back at shutdown",
                (unsigned long long) t.dirty_bytes);
  }
  plugin_conn_fini (&C->pc);
  blk_cache = NULL;
  if (C->stripes) {
    for (unsigned i = 0; i < C->nstripes; i++) {
      struct stripe *s = &C->stripes[i];
      while (s->hand) {
        struct centry *e = s->hand;
        if (e->dirty)
          dirty_del (s, e, 0);
        forget (s, e);
        entry_free (C, s, e, true);
      }
      while (s->slabs)
        slab_destroy (C, s, s->slabs);
      free (s->hash);
      pthread_mutex_destroy (&s->lock);
      pthread_cond_destroy (&s->freed);
    }
    free (C->stripes);
  }
  free (C->export_name);
  free (C);
}
