/* The block cache (--cache): the layer just above the plugin,
 * fixed-size blocks in front of it, shared only where that is safe.
 *
 * Isolation.  A cache instance holds one export's blocks.  Connections
 * share an instance only if the plugin says they see the same data
 * (can_multi_conn true for that export); the shared instances are keyed by
 * export name, so export a's blocks never answer a read of export b, and
 * exist only for names the plugin lists (an unlisted name is served
 * uncached: it may be one more spelling of a listed disk).  Writes that
 * reach the plugin drop the clean blocks of their range in the other
 * shared instances (others_invalidate).  Any other connection gets a
 * private instance, freed when it closes (tmpdisk and ondemand give each
 * connection its own disk).  All instances draw their slabs from one
 * budget of --cache bytes: once it is spent, an instance evicts its own
 * blocks, and one with none to evict reads and writes straight through to
 * the plugin until memory comes back.  Limit: a private
 * instance keeps its blocks until its connection closes, so an idle
 * connection can hold budget that a busy one would use better.
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
 * the instance opens for itself: a block dirtied by a connection that has
 * gone away is still written.  That handle sees the writes of every
 * connection only if the plugin is multi-conn safe, so writeback is
 * refused at start-up for plugins whose default export is not, and an
 * export that is not gets no cache in writeback mode.
 *
 * Entries come from slabs of N entries plus their data blocks.  With
 * --cache-ctor=no (the default: the A/B in docs/BENCHMARKS.md found no
 * gain from keeping entries constructed) an entry is
 * initialised when it is allocated and torn down when freed; with
 * --cache-ctor=yes a constructor runs over every entry when its slab is
 * made and a freed entry is put back in its constructed state (the
 * "before" of the buffer_head constructor removal, docs/BENCHMARKS.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backend.h"
#include "cache.h"
#include "vector.h"

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
  bool shared;                          /* keyed by export; else one connection's */
  char *key;                            /* the export name */
  unsigned users;                       /* contexts using it: registry lock */
  struct blk_cache *inext;              /* registry list */
  struct blk_cache *snext;              /* shared list: set once, before publishing */
  /* Writeback: the instance's own handle, the connection context its
   * plugin calls run under, and its lock for SERIALIZE_REQUESTS plugins
   * (requests of several connections may write out through it at once). */
  struct context *own;
  struct public_conn_ctx own_ctx;
  pthread_mutex_t own_lock;
  int64_t size;                         /* of the export, from that handle */
  struct stripe *stripes;
};

/* Every instance, for the totals and shutdown; the lock also guards
 * `users` and the lookup of shared instances. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct blk_cache *registry;
/* Slab bytes of all instances together, bounded by --cache. */
static _Atomic uint64_t budget_used;
/* Shared instances in the registry: while there is at most the writer's
 * own, a write needs no walk of the others (see others_invalidate). */
static _Atomic unsigned nshared;
/* The shared instances again, as a list that writes walk without the
 * registry lock: an instance is pushed (under the lock, after its snext
 * is set) and never leaves it before cache_cleanup, when no request
 * runs, so a walker that loaded the head sees a list that only grows at
 * the front.  A write that misses an instance pushed after its walk
 * began is safe: that instance is only used once pushed, after the
 * write reached the plugin, so it loads the new bytes. */
static struct blk_cache *_Atomic shared_head;

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
  uint64_t bytes = (uint64_t) n * C->bs;
  if (atomic_fetch_add (&budget_used, bytes) + bytes > cfg.cache_size) {
    atomic_fetch_sub (&budget_used, bytes);   /* the budget is spent */
    return NULL;
  }
  struct cslab *sl = malloc (sizeof *sl + n * sizeof (struct centry));
  if (!sl) {
    atomic_fetch_sub (&budget_used, bytes);
    return NULL;
  }
  if (posix_memalign (&sl->data, 4096, (size_t) n * C->bs) != 0) {
    atomic_fetch_sub (&budget_used, bytes);
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
  atomic_fetch_sub (&budget_used, (uint64_t) sl->n * C->bs);
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

/* ---- calls on the layer below -------------------------------------- */

/* The request path of the layer below, as errno results. */
static int
below_pread (struct context *n, void *buf, uint32_t count, uint64_t offset)
{
  int err = 0;
  return backend_pread (n, buf, count, offset, 0, &err) == -1 ? err : 0;
}

static int
below_pwrite (struct context *n, const void *buf, uint32_t count, uint64_t offset,
              bool fua)
{
  int err = 0;
  return backend_pwrite (n, buf, count, offset, fua ? NBDKIT_FLAG_FUA : 0, &err) == -1
         ? err : 0;
}

/* The instance's own handle runs outside any connection's lock: the
 * plugin still gets one call at a time if its thread model asks. */
static int
own_pwrite (struct blk_cache *C, const void *buf, uint32_t count, uint64_t offset,
            bool fua)
{
  bool lock = backend_thread_model () == NBDKIT_THREAD_MODEL_SERIALIZE_REQUESTS;
  struct public_conn_ctx *saved = public_current;
  if (lock)
    pthread_mutex_lock (&C->own_lock);
  public_current = &C->own_ctx;
  int err = below_pwrite (C->own, buf, count, offset, fua);
  public_current = saved;
  if (lock)
    pthread_mutex_unlock (&C->own_lock);
  return err;
}

static void others_invalidate (struct blk_cache *self, uint64_t offset, uint64_t count);

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
  int err = own_pwrite (C, e->data, len, boff, fua);
  others_invalidate (C, boff, len);
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
read_block (struct blk_cache *C, struct context *n, uint64_t blk,
            void *dst, uint32_t inoff, uint32_t len)
{
  uint64_t boff = blk << C->shift;
  int err;
  struct centry *e = get_entry (C, blk, GET_WAIT, &err);
  if (!e)                             /* not cached and no room: the plugin has it */
    return dst ? below_pread (n, dst, len, boff + inoff) : 0;

  pthread_mutex_lock (&e->io);
  bool hit = e->valid;
  err = 0;
  if (!hit) {
    err = below_pread (n, e->data, blk_len (C->size, boff, C->bs), boff);
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

static int
cache_do_pread (struct blk_cache *C, struct context *n, void *buf, uint32_t count,
                uint64_t offset)
{
  FOR_BLOCKS (C, C->size, offset, count, blk, pos, seg) {
    int err = read_block (C, n, blk, (char *) buf + (pos - offset),
                          pos - (blk << C->shift), seg);
    if (err)
      return err;
  }
  return 0;
}

static int
cache_do_prefetch (struct blk_cache *C, struct context *n, uint32_t count, uint64_t offset)
{
  FOR_BLOCKS (C, C->size, offset, count, blk, pos, seg) {
    int err = read_block (C, n, blk, NULL, 0, 0);
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
  size_t cap = 0, len = 0;
  uint64_t *v = vec_grow (NULL, &cap, 1, sizeof *v, 64);
  if (!v)
    return NULL;
  for (unsigned i = 0; i < C->nstripes; i++) {
    struct stripe *s = &C->stripes[i];
    pthread_mutex_lock (&s->lock);
    struct centry *e = s->hand;
    if (e)
      do {
        if (e->blk >= first && e->blk <= last) {
          uint64_t *nv = vec_grow (v, &cap, len + 1, sizeof *v, 64);
          if (!nv) {
            pthread_mutex_unlock (&s->lock);
            free (v);
            return NULL;
          }
          v = nv;
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
write_through (struct blk_cache *C, struct context *below, const void *buf,
               uint32_t count, uint64_t offset, bool fua)
{
  int64_t size = C->size;
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

    int err = below_pwrite (below, (const char *) buf + (start - offset), pos - start,
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
write_back (struct blk_cache *C, struct context *n, const void *buf,
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
      if (!e && err == ENOMEM) {
        /* No room in this stripe: the budget went to other stripes or
         * instances and nothing here can be evicted.  The block is not
         * cached, so it goes to the plugin like a write-through miss, and
         * a load of it racing with this is marked stale.  Failing the
         * write instead would make an odd --cache size (or a busy
         * neighbour export) an I/O error. */
        err = below_pwrite (n, (const char *) buf + (pos - offset), seg, pos, fua);
        range_block (C, blk, 0, 0, RANGE_INVALIDATE);
        others_invalidate (C, pos, seg);
        if (err)
          return err;
        break;
      }
      if (!e)
        return err ? err : ENOMEM;
      pthread_mutex_lock (&e->io);
      if (!e->valid && !full) {       /* read-modify-write */
        err = below_pread (n, e->data, blen, boff);
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

static int
cache_do_pwrite (struct blk_cache *C, struct context *n, const void *buf, uint32_t count,
                 uint64_t offset, bool fua)
{
  return C->writeback ? write_back (C, n, buf, count, offset, fua)
                      : write_through (C, n, buf, count, offset, fua);
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


/* ---- instances ------------------------------------------------------- */

static void instance_free (struct blk_cache *C);

/* A new, empty instance for the export `key` of `size` bytes; NULL after
 * logging why (out of memory, or writeback's own handle would not open). */
static struct blk_cache *
instance_new (struct backend *below, const char *key, int64_t size, bool shared)
{
  uint32_t bs = cfg.cache_block;
  struct blk_cache *C = calloc (1, sizeof *C);
  if (!C)
    goto oom;
  pthread_mutex_init (&C->own_lock, NULL);
  C->own_ctx.peer_fd = -1;
  C->bs = bs;
  C->shift = __builtin_ctz (bs);
  C->nblocks = cfg.cache_size / bs;
  C->writeback = cfg.cache_mode == CACHE_WRITEBACK;
  C->ctor = cfg.cache_ctor;
  C->shared = shared;
  C->size = size;
  C->nstripes = CACHE_STRIPES;
  while (C->nstripes > C->nblocks)
    C->nstripes /= 2;                 /* a tiny cache: at least a block a stripe */
  C->sbits = __builtin_ctz (C->nstripes);
  unsigned cap = (C->nblocks + C->nstripes - 1) / C->nstripes;
  C->slab_n = SLAB_BYTES / bs ? SLAB_BYTES / bs : 1;
  if (C->slab_n > cap)
    C->slab_n = cap;
  if (!(C->key = strdup (key)))
    goto oom;

  if (C->writeback) {
    /* Its own handle, outside any connection: dirty blocks outlive the
     * connection that wrote them. */
    struct public_conn_ctx *saved = public_current;
    C->own_ctx.export_name = C->key;
    public_current = &C->own_ctx;
    C->own = backend_open (below, cfg.readonly, C->key, 1);
    int r = C->own ? backend_prepare (C->own) : -1;
    if (r == 0 && backend_get_size (C->own) != size)
      r = -1;
    public_current = saved;
    if (r == -1) {
      log_error ("cache: cannot open export \"%s\" for write-back", key);
      goto fail;
    }
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
  log_debug ("cache: %s %s instance for export \"%s\": %u stripes of %u blocks of %u "
             "bytes, slabs of %u, ctor %s", shared ? "shared" : "private",
             C->writeback ? "writeback" : "writethrough", key, C->nstripes, cap, bs,
             C->slab_n, C->ctor ? "yes" : "no");
  return C;

oom:
  log_error ("cache: out of memory for an instance");
fail:
  if (C)
    instance_free (C);
  return NULL;
}

/* Write back what is dirty, close the own handle, free everything. */
static void
instance_free (struct blk_cache *C)
{
  if (C->writeback && C->own && C->stripes) {
    struct cache_totals t = { 0 };
    for (unsigned i = 0; i < C->nstripes; i++)
      t.dirty_bytes += C->stripes[i].dirty_bytes;
    int err = write_back_all (C);
    if (!err && backend_can_flush (C->own) == 1) {
      int ferr = 0;
      struct public_conn_ctx *saved = public_current;
      public_current = &C->own_ctx;
      if (backend_flush (C->own, 0, &ferr) == -1)
        err = ferr;
      public_current = saved;
    }
    if (err)
      log_error ("cache: dirty blocks of export \"%s\" could not all be written: %s",
                 C->key, strerror (err));
    else if (t.dirty_bytes)
      log_info ("cache: export \"%s\": wrote %llu dirty bytes back at shutdown",
                C->key, (unsigned long long) t.dirty_bytes);
  }
  if (C->own) {
    struct public_conn_ctx *saved = public_current;
    public_current = &C->own_ctx;
    backend_finalize (C->own);
    backend_close (C->own);
    public_current = saved;
  }
  public_conn_ctx_release (&C->own_ctx);
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
  pthread_mutex_destroy (&C->own_lock);
  free (C->key);
  free (C);
}

/* Whether connections to n's export see the same data: the plugin says
 * multi-conn, and may have several handles open at once (the shared
 * instance's own handle is one more, and nbdkit advertises no multi-conn
 * for SERIALIZE_CONNECTIONS either).  -1 on error. */
static int
shareable (struct context *n)
{
  int mc = backend_can_multi_conn (n);
  if (mc == 1 && backend_thread_model () == NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS)
    mc = 0;
  return mc;
}

/* Whether the plugin lists `key` among its exports.  A name it does not
 * list may be one more spelling of a listed disk (memory, file=... and
 * null ignore the name): a shared instance for it would cache blocks that
 * writes under the other spelling never invalidate, and a client could
 * make the server keep one instance per name it invents. */
static bool
listed (struct backend *below, int readonly, const char *key)
{
  struct nbdkit_exports *x = public_exports_new ();
  bool found = false;
  if (x && backend_list_exports (below, readonly, x) == 0)
    for (size_t i = 0; i < x->len && !found; i++)
      found = strcmp (x->v[i].name, key) == 0;
  public_exports_free (x);
  return found;
}

/* The instance a newly prepared context uses, or NULL for none (the
 * layer then passes every call through). */
static struct blk_cache *
instance_get (struct backend *below, struct context *n, int readonly, const char *key)
{
  uint32_t min, pref, max;
  int64_t size = backend_get_size (n);
  int mc = shareable (n);
  if (size < 0 || mc < 0 || backend_block_size (n, &min, &pref, &max) == -1)
    return NULL;
  if (mc && !listed (below, readonly, key)) {
    log_debug ("cache: export \"%s\" is not one the plugin lists: not cached", key);
    return NULL;
  }
  if (min > cfg.cache_block) {
    log_debug ("cache: export \"%s\" needs blocks of %u: not cached", key, min);
    return NULL;
  }
  if (!mc && cfg.cache_mode == CACHE_WRITEBACK) {
    log_warn ("cache: export \"%s\" is not multi-conn safe: no writeback cache for it", key);
    return NULL;
  }

  pthread_mutex_lock (&registry_lock);
  struct blk_cache *C = NULL;
  if (mc)
    for (C = registry; C; C = C->inext)
      if (C->shared && strcmp (C->key, key) == 0)
        break;
  if (C && C->size != size) {
    log_warn ("cache: export \"%s\" changed size: this connection is not cached", key);
    C = NULL;
  }
  else if (!C) {
    C = instance_new (below, key, size, mc);
    if (C) {
      C->inext = registry;
      registry = C;
      if (C->shared) {
        C->snext = shared_head;
        atomic_store (&shared_head, C);   /* publishes snext with it */
        nshared++;
      }
    }
  }
  if (C)
    C->users++;
  pthread_mutex_unlock (&registry_lock);
  return C;
}

/* A write, trim or zero through `self` (NULL: an uncached context) has
 * reached the plugin: drop the clean copies of its range that the other
 * shared instances hold.  Two export names may be one disk (a plugin that
 * ignores the name, an unlisted spelling served uncached), and a
 * multi-conn client must see the write after a flush whatever name it
 * used.  A load racing with this is marked stale and never published.
 * The walk takes no global lock (shared_head says why that is safe):
 * with several shared instances, writes on different shards used to
 * queue on the registry lock; now they meet only on the other instance's
 * stripe locks, one per block of the range.  Limit: distinct exports lose
 * clean blocks at the same offsets. */
static void
others_invalidate (struct blk_cache *self, uint64_t offset, uint64_t count)
{
  if (nshared <= (self && self->shared ? 1u : 0u))
    return;
  for (struct blk_cache *C = atomic_load (&shared_head); C; C = C->snext)
    if (C != self)
      range_op (C, offset, count, RANGE_INVALIDATE);
}

/* Writeback, for a context the cache does not serve (an unlisted name,
 * a changed size): the dirty blocks that the shared instances hold of
 * [offset, offset+count) (all of them if `all`) reach the plugin before
 * this context reads, writes or flushes it, so a multi-conn client sees
 * another connection's acknowledged write after its own flush, as it
 * would without --cache.  The shared list is walked without the registry
 * lock (see shared_head), so write_out may take io locks on the way.
 * Limit: two listed names that are one disk still keep their dirty
 * blocks apart until each one's flush. */
static int
others_write_back (uint64_t offset, uint64_t count, bool all)
{
  if (cfg.cache_mode != CACHE_WRITEBACK || nshared == 0)
    return 0;
  int err = 0;
  for (struct blk_cache *C = atomic_load (&shared_head); C && !err; C = C->snext)
    err = all ? write_back_all (C) : range_op (C, offset, count, RANGE_WRITEBACK);
  return err;
}

/* A private instance goes with its last user; shared ones stay for the
 * next connection and go at cleanup. */
static void
instance_put (struct blk_cache *C)
{
  pthread_mutex_lock (&registry_lock);
  bool drop = --C->users == 0 && !C->shared;
  if (drop)
    for (struct blk_cache **pp = &registry; *pp; pp = &(*pp)->inext)
      if (*pp == C) {
        *pp = C->inext;
        break;
      }
  pthread_mutex_unlock (&registry_lock);
  if (drop)
    instance_free (C);
}

void
cache_totals (struct cache_totals *t)
{
  memset (t, 0, sizeof *t);
  pthread_mutex_lock (&registry_lock);
  for (struct blk_cache *C = registry; C; C = C->inext) {
    t->stripes += C->nstripes;
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
    }
    t->instances++;
  }
  pthread_mutex_unlock (&registry_lock);
  t->capacity_bytes = cfg.cache_size;
  if (!t->block)
    t->block = cfg.cache_block;
}

/* ---- the layer -------------------------------------------------------- */

/* The context's handle: its instance (NULL: pass everything through). */
struct cache_handle {
  struct blk_cache *C;
  char *key;
};

#define H(c) ((struct cache_handle *) (c)->handle)

static int
cache_thread_model (struct backend *b)
{
  return b->next->thread_model (b->next);   /* the cache is parallel-safe */
}

static const char *
cache_magic_config_key (struct backend *b)
{
  return b->next->magic_config_key (b->next);
}

static int
cache_config (struct backend *b, const char *key, const char *value)
{
  return backend_config (b->next, key, value);
}

static int
cache_config_complete (struct backend *b)
{
  return backend_config_complete (b->next);
}

static int
cache_get_ready (struct backend *b)
{
  return b->next->get_ready (b->next);
}

/* Writeback needs a multi-conn plugin: ask its default export now, so a
 * wrong set-up is a start-up error rather than an uncached server. */
static int
cache_after_fork (struct backend *b)
{
  if (b->next->after_fork (b->next) == -1)
    return -1;
  if (cfg.cache_mode != CACHE_WRITEBACK)
    return 0;
  struct public_conn_ctx probe = { .peer_fd = -1 };
  public_current = &probe;
  const char *d = backend_default_export (b->next, cfg.readonly);
  probe.export_name = d ? d : "";
  struct context *n = backend_open (b->next, cfg.readonly, probe.export_name, 1);
  int r = n ? backend_prepare (n) : -1;
  int mc = r == 0 ? shareable (n) : -1;
  uint32_t min = 0, pref, max;
  if (r == 0 && backend_block_size (n, &min, &pref, &max) == -1)
    r = -1;
  if (n) {
    backend_finalize (n);
    backend_close (n);
  }
  public_current = NULL;
  public_conn_ctx_release (&probe);
  if (r == -1 || mc == -1) {
    fprintf (stderr, "blkd: cache: cannot open export \"%s\" for write-back\n",
             probe.export_name);
    return -1;
  }
  if (!mc) {
    fprintf (stderr, "blkd: --cache-mode=writeback needs a plugin that is safe with "
             "several connections (can_multi_conn); %s is not: its handles may not "
             "see each other's writes.  Use --cache-mode=writethrough.\n", plugin_name ());
    return -1;
  }
  if (min > cfg.cache_block) {
    fprintf (stderr, "blkd: --cache-block %u is below the plugin's minimum block "
             "size %u\n", cfg.cache_block, min);
    return -1;
  }
  return 0;
}

/* Shutdown: every shared instance writes back and goes. */
static void
cache_cleanup (struct backend *b)
{
  pthread_mutex_lock (&registry_lock);
  struct blk_cache *list = registry;
  registry = NULL;
  atomic_store (&shared_head, NULL);
  nshared = 0;
  pthread_mutex_unlock (&registry_lock);
  while (list) {
    struct blk_cache *C = list;
    list = C->inext;
    instance_free (C);
  }
  b->next->cleanup (b->next);
}

static void
cache_unload (struct backend *b)
{
  free (b);
}

static void
cache_dump (struct backend *b)
{
}

static int
cache_preconnect (struct backend *b, int readonly)
{
  return backend_preconnect (b->next, readonly);
}

static int
cache_list_exports (struct backend *b, int readonly, int is_tls, struct nbdkit_exports *e)
{
  return b->next->list_exports (b->next, readonly, is_tls, e);
}

static const char *
cache_default_export (struct backend *b, int readonly, int is_tls)
{
  return b->next->default_export (b->next, readonly, is_tls);
}

static void *
cache_open (struct context *c, int readonly, const char *exportname, int is_tls)
{
  struct cache_handle *h = calloc (1, sizeof *h);
  if (!h || !(h->key = strdup (exportname))) {
    free (h);
    nbdkit_error ("cache: out of memory");
    return NULL;
  }
  struct context *n = backend_open (c->b->next, readonly, exportname, c->conn == NULL);
  if (!n) {
    free (h->key);
    free (h);
    return NULL;
  }
  c->c_next = n;
  return h;
}

/* The layer below is prepared: now its answers say which instance. */
static int
cache_prepare (struct context *c, int readonly)
{
  H (c)->C = instance_get (c->b->next, c->c_next, readonly, H (c)->key);
  return 0;
}

static int
cache_finalize (struct context *c)
{
  return 0;
}

static void
cache_close (struct context *c)
{
  struct cache_handle *h = H (c);
  if (h->C)
    instance_put (h->C);
  free (h->key);
  free (h);
}

/* What the cache does not change: the layer below answers. */

static const char *
cache_export_description (struct context *c)
{
  return backend_export_description (c->c_next);
}

static int64_t
cache_get_size (struct context *c)
{
  return backend_get_size (c->c_next);
}

static int
cache_can_write (struct context *c)
{
  return backend_can_write (c->c_next);
}

static int
cache_can_flush (struct context *c)
{
  return backend_can_flush (c->c_next);
}

static int
cache_is_rotational (struct context *c)
{
  return backend_is_rotational (c->c_next);
}

static int
cache_can_trim (struct context *c)
{
  return backend_can_trim (c->c_next);
}

static int
cache_can_zero (struct context *c)
{
  return backend_can_zero (c->c_next);
}

static int
cache_can_fast_zero (struct context *c)
{
  return backend_can_fast_zero (c->c_next);
}

static int
cache_can_extents (struct context *c)
{
  return backend_can_extents (c->c_next);
}

static int
cache_can_fua (struct context *c)
{
  return backend_can_fua (c->c_next);
}

static int
cache_can_multi_conn (struct context *c)
{
  return backend_can_multi_conn (c->c_next);
}

static int
cache_can_cache (struct context *c)
{
  return backend_can_cache (c->c_next);
}

static int
cache_block_size (struct context *c, uint32_t *min, uint32_t *pref, uint32_t *max)
{
  return backend_block_size (c->c_next, min, pref, max);
}

static inline int
result (int err, int *errp)
{
  if (!err)
    return 0;
  *errp = err;
  return -1;
}

static int
cache_pread (struct context *c, void *buf, uint32_t count, uint64_t offset,
             uint32_t flags, int *err)
{
  struct blk_cache *C = H (c)->C;
  if (!C) {
    int e = others_write_back (offset, count, false);
    return e ? result (e, err) : backend_pread (c->c_next, buf, count, offset, flags, err);
  }
  return result (cache_do_pread (C, c->c_next, buf, count, offset), err);
}

static int
cache_pwrite (struct context *c, const void *buf, uint32_t count, uint64_t offset,
              uint32_t flags, int *err)
{
  struct blk_cache *C = H (c)->C;
  int r;
  if (!C && (r = others_write_back (offset, count, false)))
    return result (r, err);
  if (!C)
    r = backend_pwrite (c->c_next, buf, count, offset, flags, err);
  else
    r = result (cache_do_pwrite (C, c->c_next, buf, count, offset,
                                 flags & NBDKIT_FLAG_FUA), err);
  if (!C || !C->writeback)            /* writeback: at write-out instead */
    others_invalidate (C, offset, count);
  return r;
}

static int
cache_flush (struct context *c, uint32_t flags, int *err)
{
  struct blk_cache *C = H (c)->C;
  int e = C ? (C->writeback ? write_back_all (C) : 0) : others_write_back (0, 0, true);
  if (e)
    return result (e, err);
  /* Multi-conn: a flush through any handle covers the own handle's writes. */
  return backend_flush (c->c_next, flags, err);
}

/* Trim and zero reach the plugin, then drop (or, for writeback, zero) the
 * cached copies of their range. */
static int
cache_trim_or_zero (struct context *c, bool zero, uint32_t count, uint64_t offset,
                    uint32_t flags, int *err)
{
  struct blk_cache *C = H (c)->C;
  int r, e = 0;
  if (C && C->writeback)
    e = range_op (C, offset, count, RANGE_WRITEBACK);
  else if (!C)
    e = others_write_back (offset, count, false);
  if (e)
    return result (e, err);
  r = zero ? backend_zero (c->c_next, count, offset, flags, err)
           : backend_trim (c->c_next, count, offset, flags, err);
  others_invalidate (C, offset, count);
  if (C)
    range_op (C, offset, count, C->writeback && r == 0 ? RANGE_ZERO_DIRTY : RANGE_INVALIDATE);
  return r;
}

static int
cache_trim (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  return cache_trim_or_zero (c, false, count, offset, flags, err);
}

static int
cache_zero (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  return cache_trim_or_zero (c, true, count, offset, flags, err);
}

/* The plugin answers for allocation; with writeback it must first see
 * the dirty blocks, or it would call them holes. */
static int
cache_extents (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
               struct nbdkit_extents *e, int *err)
{
  struct blk_cache *C = H (c)->C;
  int x = C ? (C->writeback ? range_op (C, offset, count, RANGE_WRITEBACK) : 0)
            : others_write_back (offset, count, false);
  if (x)
    return result (x, err);
  return backend_extents (c->c_next, count, offset, flags, e, err);
}

/* NBD_CMD_CACHE: with an instance, load the blocks into it. */
static int
cache_cache (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct blk_cache *C = H (c)->C;
  int x = C ? 0 : others_write_back (offset, count, false);
  if (x)
    return result (x, err);
  if (!C)
    return backend_cache (c->c_next, count, offset, flags, err);
  return result (cache_do_prefetch (C, c->c_next, count, offset), err);
}

static const struct backend cache_ops = {
  .type = "cache",
  .thread_model = cache_thread_model,
  .magic_config_key = cache_magic_config_key,
  .config = cache_config,
  .config_complete = cache_config_complete,
  .get_ready = cache_get_ready,
  .after_fork = cache_after_fork,
  .cleanup = cache_cleanup,
  .unload = cache_unload,
  .dump = cache_dump,
  .preconnect = cache_preconnect,
  .list_exports = cache_list_exports,
  .default_export = cache_default_export,
  .open = cache_open,
  .prepare = cache_prepare,
  .finalize = cache_finalize,
  .close = cache_close,
  .export_description = cache_export_description,
  .get_size = cache_get_size,
  .block_size = cache_block_size,
  .can_write = cache_can_write,
  .can_flush = cache_can_flush,
  .is_rotational = cache_is_rotational,
  .can_trim = cache_can_trim,
  .can_zero = cache_can_zero,
  .can_fast_zero = cache_can_fast_zero,
  .can_extents = cache_can_extents,
  .can_fua = cache_can_fua,
  .can_multi_conn = cache_can_multi_conn,
  .can_cache = cache_can_cache,
  .pread = cache_pread,
  .pwrite = cache_pwrite,
  .flush = cache_flush,
  .trim = cache_trim,
  .zero = cache_zero,
  .extents = cache_extents,
  .cache = cache_cache,
  /* Lending from the cache's blocks would need a pin per lent block held
   * until lend_release; until then the cache copies, and the stack
   * answers ENOTSUP for these (the plugin below must not lend past the
   * cache either: the cache must see what is read and written). */
  .pread_lend = NULL,
  .lend_release = NULL,
  .pread_fd = NULL,
  .pwrite_place = NULL,
  .pwrite_commit = NULL,
};

struct backend *
cache_layer_new (struct backend *next)
{
  if (cfg.cache_size < cfg.cache_block) {
    fprintf (stderr, "blkd: --cache %llu is smaller than one --cache-block (%u)\n",
             (unsigned long long) cfg.cache_size, cfg.cache_block);
    return NULL;
  }
  struct backend *b = malloc (sizeof *b);
  if (!b) {
    fprintf (stderr, "blkd: cache: out of memory\n");
    return NULL;
  }
  *b = cache_ops;
  b->next = next;
  b->i = next->i + 1;
  b->name = (char *) "cache";
  b->filename = NULL;
  b->inline_safe = next->inline_safe;   /* it only adds memory copies */
  return b;
}
