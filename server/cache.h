/* The block cache (--cache, seed 004): between the protocol and the plugin,
 * shared by every connection.  protocol.c calls the cache_* wrappers below
 * instead of plugin_*; with no cache (or an export the cache does not
 * hold) they are the plugin calls. */
#ifndef BLKD_CACHE_H
#define BLKD_CACHE_H

#include "internal.h"

struct blk_cache;
extern struct blk_cache *blk_cache;     /* NULL: --cache=0 */

/* Main thread, after plugin_after_fork: -1 + message on stderr. */
int cache_setup (void);
/* Main thread, after shard_stop_all and before plugin_unload: write back
 * dirty blocks (writeback), close the cache's plugin handle, free. */
void cache_stop (void);

struct cache_totals {
  uint64_t hits, misses, evictions, writebacks, dirty_bytes;
  uint64_t bytes, capacity_bytes;       /* allocated block memory, the bound */
  uint64_t entries, stripes, block;
};
void cache_totals (struct cache_totals *t);   /* any thread */

int cache_do_pread (struct plugin_conn *pc, void *buf, uint32_t count, uint64_t offset);
int cache_do_pwrite (struct plugin_conn *pc, const void *buf, uint32_t count,
                     uint64_t offset, bool fua);
int cache_do_flush (struct plugin_conn *pc);
int cache_do_trim (struct plugin_conn *pc, uint32_t count, uint64_t offset, bool fua);
int cache_do_zero (struct plugin_conn *pc, uint32_t count, uint64_t offset,
                   bool may_trim, bool fua, bool fast);
int cache_do_prefetch (struct plugin_conn *pc, uint32_t count, uint64_t offset);
int cache_do_extents (struct plugin_conn *pc, uint32_t count, uint64_t offset,
                      bool req_one, struct nbdkit_extents *e);

#define CACHE_WRAP(call, plugin_call) \
  (__builtin_expect (blk_cache != NULL, 0) ? (call) : (plugin_call))

static inline int
cache_pread (struct plugin_conn *pc, void *buf, uint32_t count, uint64_t offset)
{
  return CACHE_WRAP (cache_do_pread (pc, buf, count, offset),
                     plugin_pread (pc, buf, count, offset));
}

static inline int
cache_pwrite (struct plugin_conn *pc, const void *buf, uint32_t count,
              uint64_t offset, bool fua)
{
  return CACHE_WRAP (cache_do_pwrite (pc, buf, count, offset, fua),
                     plugin_pwrite (pc, buf, count, offset, fua));
}

static inline int
cache_flush (struct plugin_conn *pc)
{
  return CACHE_WRAP (cache_do_flush (pc), plugin_flush (pc));
}

static inline int
cache_trim (struct plugin_conn *pc, uint32_t count, uint64_t offset, bool fua)
{
  return CACHE_WRAP (cache_do_trim (pc, count, offset, fua),
                     plugin_trim (pc, count, offset, fua));
}

static inline int
cache_zero (struct plugin_conn *pc, uint32_t count, uint64_t offset,
            bool may_trim, bool fua, bool fast)
{
  return CACHE_WRAP (cache_do_zero (pc, count, offset, may_trim, fua, fast),
                     plugin_zero (pc, count, offset, may_trim, fua, fast));
}

/* NBD_CMD_CACHE: with a cache, load the blocks into it. */
static inline int
cache_cache (struct plugin_conn *pc, uint32_t count, uint64_t offset)
{
  return CACHE_WRAP (cache_do_prefetch (pc, count, offset),
                     plugin_cache (pc, count, offset));
}

static inline int
cache_extents (struct plugin_conn *pc, uint32_t count, uint64_t offset,
               bool req_one, struct nbdkit_extents *e)
{
  return CACHE_WRAP (cache_do_extents (pc, count, offset, req_one, e),
                     plugin_extents (pc, count, offset, req_one, e));
}

#endif
