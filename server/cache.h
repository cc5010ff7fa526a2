/* The block cache (--cache): one layer of the stack, just above
 * the plugin and below the filters, present only with --cache (cache.c).
 * The layer itself is built by cache_layer_new (backend.h); this header
 * is what the rest of the server reads: the counters. */
#ifndef BLKD_CACHE_H
#define BLKD_CACHE_H

#include "internal.h"

struct cache_totals {
  uint64_t hits, misses, evictions, writebacks, dirty_bytes;
  uint64_t bytes, capacity_bytes;       /* slab memory of all instances, the bound */
  uint64_t entries, stripes, block;
  uint64_t instances;                   /* shared (per export) plus private ones */
};
void cache_totals (struct cache_totals *t);   /* any thread */

#endif
