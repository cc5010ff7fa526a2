/* Unit tests for the block cache's map of blocks (server/cache.c), through
 * the layer as the stack calls it, over the real in-tree ram plugin: which
 * requests are hits and misses (cache_totals), blocks split at the
 * request's edges and at the disk's end, the bound on entries and
 * eviction, writes and trims keeping cached blocks coherent with the
 * plugin, and writeback's dirty blocks reaching the plugin only when
 * flushed. */
#include <errno.h>

#include "../server/cache.h"
#include "unit.h"
#include "unitstack.h"

#define BS  (64 * KiB)                  /* --cache-block */

static int
load (const char *arg, uint64_t cache_bytes, enum cache_mode mode)
{
  cfg.cache_size = cache_bytes;
  cfg.cache_block = BS;
  cfg.cache_mode = mode;
  return stack_load_ram (NULL, 0, arg);
}

static void
unload (void)
{
  backend_stack_unload ();
  cfg.cache_size = 0;
  cfg.cache_mode = CACHE_WRITETHROUGH;
}

static struct cache_totals
totals (void)
{
  struct cache_totals t;
  cache_totals (&t);
  return t;
}

static void
fill (uint8_t *p, size_t n, unsigned seed)
{
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t) (i * 13 + seed + (i >> 11));
}

static void
test_hits_and_misses (void)
{
  int before = unit_begin ("hits, misses and block edges");
  static uint8_t buf[4 * BS], want[4 * BS];
  struct backend_conn bc;
  int err = 0;

  /* 8 MiB and 4 KiB: the last block is short. */
  CHECK_INT (load ("size=8196K", 4 * MiB, CACHE_WRITETHROUGH), 0);
  backend_conn_init (&bc, -1);
  CHECK_INT (backend_conn_open (&bc, "", false), 0);
  struct context *c = bc.top;
  struct cache_totals t = totals ();
  CHECK_INT (t.instances, 1);
  CHECK_INT (t.block, BS);
  CHECK_INT (t.hits + t.misses + t.entries, 0);

  /* Blocks never written: a miss, then a hit. */
  static uint8_t zeros[BS];
  uint64_t m0 = t.misses, h0 = t.hits;
  CHECK_INT (CALL (&bc, backend_pread (c, buf, BS, 16 * BS, 0, &err)), 0);
  CHECK (memcmp (buf, zeros, BS) == 0);
  t = totals ();
  CHECK_INT (t.misses - m0, 1);
  CHECK_INT (t.hits - h0, 0);
  CHECK_INT (CALL (&bc, backend_pread (c, buf, BS, 16 * BS, 0, &err)), 0);
  t = totals ();
  CHECK_INT (t.misses - m0, 1);
  CHECK_INT (t.hits - h0, 1);

  /* Straddling the edge of blocks 16 and 17: a hit and a miss. */
  CHECK_INT (CALL (&bc, backend_pread (c, buf, 8 * KiB, 17 * BS - 4 * KiB, 0, &err)), 0);
  t = totals ();
  CHECK_INT (t.misses - m0, 2);
  CHECK_INT (t.hits - h0, 2);
  CHECK (t.entries >= 2);

  /* Writing whole blocks through the cache fills them: reading them
   * back is all hits, and exact. */
  fill (want, sizeof want, 1);
  CHECK_INT (CALL (&bc, backend_pwrite (c, want, sizeof want, 0, 0, &err)), 0);
  t = totals ();
  m0 = t.misses;
  h0 = t.hits;
  CHECK_INT (CALL (&bc, backend_pread (c, buf, sizeof buf, 0, 0, &err)), 0);
  CHECK (memcmp (buf, want, sizeof buf) == 0);
  t = totals ();
  CHECK_INT (t.misses - m0, 0);
  CHECK_INT (t.hits - h0, 4);

  /* A write through the cache: the cached block must say the new bytes. */
  fill (want + 4 * KiB, 4 * KiB, 77);
  CHECK_INT (CALL (&bc, backend_pwrite (c, want + 4 * KiB, 4 * KiB, 4 * KiB, 0, &err)), 0);
  CHECK_INT (CALL (&bc, backend_pread (c, buf, 2 * BS, 0, 0, &err)), 0);
  CHECK (memcmp (buf, want, 2 * BS) == 0);

  /* A trim: the block reads as zeros, as the plugin now holds. */
  CHECK_INT (CALL (&bc, backend_trim (c, BS, 0, 0, &err)), 0);
  CHECK_INT (CALL (&bc, backend_pread (c, buf, BS, 0, 0, &err)), 0);
  memset (want, 0, BS);
  CHECK (memcmp (buf, want, BS) == 0);

  /* The short last block: 4 KiB past 8 MiB, cached and read back. */
  static uint8_t tail[4 * KiB], tail_back[4 * KiB];
  fill (tail, sizeof tail, 5);
  CHECK_INT (CALL (&bc, backend_pwrite (c, tail, sizeof tail, 8 * MiB, 0, &err)), 0);
  for (int i = 0; i < 2; i++) {
    memset (tail_back, 0, sizeof tail_back);
    CHECK_INT (CALL (&bc, backend_pread (c, tail_back, sizeof tail_back, 8 * MiB, 0, &err)), 0);
    CHECK (memcmp (tail, tail_back, sizeof tail) == 0);
  }
  /* Past the end is refused before the cache sees it. */
  CHECK_INT (CALL (&bc, backend_pread (c, buf, 8 * KiB, 8 * MiB, 0, &err)), -1);
  CHECK_INT (err, EINVAL);

  backend_conn_fini (&bc);
  unload ();
  unit_end (before);
}

/* A cache of 1 MiB, 16 blocks, read across 64: entries stay within the
 * bound, blocks are evicted, and every read is still exact. */
static void
test_eviction (void)
{
  int before = unit_begin ("bounded: eviction");
  static uint8_t buf[BS], want[BS];
  struct backend_conn bc;
  int err = 0;

  CHECK_INT (load ("size=4M", 1 * MiB, CACHE_WRITETHROUGH), 0);
  backend_conn_init (&bc, -1);
  CHECK_INT (backend_conn_open (&bc, "", false), 0);
  struct context *c = bc.top;
  for (unsigned blk = 0; blk < 64; blk++) {
    fill (want, BS, blk);
    CHECK_INT (CALL (&bc, backend_pwrite (c, want, BS, (uint64_t) blk * BS, 0, &err)), 0);
  }
  for (int round = 0; round < 2; round++)
    for (unsigned blk = 0; blk < 64; blk++) {
      fill (want, BS, blk);
      CHECK_INT (CALL (&bc, backend_pread (c, buf, BS, (uint64_t) blk * BS, 0, &err)), 0);
      if (memcmp (buf, want, BS) != 0) {
        CHECK (!"a block read back differs");
        break;
      }
    }
  struct cache_totals t = totals ();
  CHECK (t.evictions > 0);
  CHECK (t.entries <= MiB / BS);
  CHECK (t.bytes <= t.capacity_bytes);
  CHECK_INT (t.capacity_bytes, MiB);
  backend_conn_fini (&bc);
  unload ();
  unit_end (before);
}

/* Writeback: a write stays in the cache (dirty) until a flush writes it
 * to the plugin, which a context on the plugin alone shows. */
static void
test_writeback (void)
{
  int before = unit_begin ("writeback: dirty until flushed");
  static uint8_t buf[BS], want[BS], zeros[BS];
  struct backend_conn bc;
  int err = 0;

  CHECK_INT (load ("size=1M", 1 * MiB, CACHE_WRITEBACK), 0);
  backend_conn_init (&bc, -1);
  CHECK_INT (backend_conn_open (&bc, "", false), 0);
  struct context *c = bc.top;
  struct context *plugin = CALL (&bc, backend_open (backend_top->next, 0, "", 1));
  CHECK (plugin != NULL);
  if (!plugin) {
    backend_conn_fini (&bc);
    unload ();
    unit_end (before);
    return;
  }
  CHECK_INT (CALL (&bc, backend_prepare (plugin)), 0);

  fill (want, BS, 42);
  CHECK_INT (CALL (&bc, backend_pwrite (c, want, BS, 2 * BS, 0, &err)), 0);
  struct cache_totals t = totals ();
  CHECK_INT (t.dirty_bytes, BS);
  CHECK_INT (CALL (&bc, backend_pread (plugin, buf, BS, 2 * BS, 0, &err)), 0);
  CHECK (memcmp (buf, zeros, BS) == 0);       /* not written out yet */
  CHECK_INT (CALL (&bc, backend_pread (c, buf, BS, 2 * BS, 0, &err)), 0);
  CHECK (memcmp (buf, want, BS) == 0);        /* the cache answers */

  CHECK_INT (CALL (&bc, backend_flush (c, 0, &err)), 0);
  t = totals ();
  CHECK_INT (t.dirty_bytes, 0);
  CHECK (t.writebacks >= 1);
  CHECK_INT (CALL (&bc, backend_pread (plugin, buf, BS, 2 * BS, 0, &err)), 0);
  CHECK (memcmp (buf, want, BS) == 0);

  /* A FUA write goes out at once. */
  fill (want, BS, 43);
  CHECK_INT (CALL (&bc, backend_pwrite (c, want, BS, 3 * BS, NBDKIT_FLAG_FUA, &err)), 0);
  CHECK_INT (totals ().dirty_bytes, 0);
  CHECK_INT (CALL (&bc, backend_pread (plugin, buf, BS, 3 * BS, 0, &err)), 0);
  CHECK (memcmp (buf, want, BS) == 0);

  backend_lock_request (&bc);
  backend_finalize (plugin);
  backend_close (plugin);
  backend_unlock_request (&bc);
  backend_conn_fini (&bc);
  unload ();
  unit_end (before);
}

int
main (void)
{
  stack_need_ram ();
  test_hits_and_misses ();
  test_eviction ();
  test_writeback ();
  stack_args_free ();
  return unit_exit ("unit-cache");
}
