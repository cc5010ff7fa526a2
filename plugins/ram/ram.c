/* ram plugin: a sparse RAM disk (two-level chunk table, lock-striped, no global data-path lock). */

/* Layout.  The disk is cut into RAM_CHUNK (64 KiB) chunks.  Chunk
 * pointers live in leaf tables of RAM_LEAF_SLOTS entries (one leaf
 * covers 512 MiB); the directory of leaf pointers is sized from size=
 * and allocated once in config_complete, so it never moves.  Leaves and
 * chunks are allocated on first write and installed with an atomic
 * compare-and-swap: two writers racing for the same empty slot both
 * allocate, one wins, the loser frees its copy and uses the winner's.
 *
 * Freeing (trim/zero of whole chunks) is the only operation that can
 * pull memory out from under a concurrent reader or writer, so every
 * access to chunk memory holds the read side of one of RAM_STRIPES
 * rwlocks picked by chunk index, and freeing takes the write side.
 * Readers and writers of different chunks never share a lock except by
 * stripe collision (chunk index mod 256), and readers of the same chunk
 * only share the lock's cache line, never wait on each other.
 *
 * Limits, admitted:
 * - A request that spans chunks takes and drops one stripe per chunk, so
 *   it is not atomic against a concurrent trim of the same range.  NBD
 *   gives no ordering between overlapping in-flight requests anyway.
 * - Leaves are never freed before unload (a leaf is 64 KiB of pointers
 *   per 512 MiB of disk touched), only chunks are.
 * - The rwlocks prefer writers so a trim cannot starve under a stream of
 *   reads; the price is that readers of a stripe wait while a free is
 *   queued on it.  A free holds the lock only to swap the pointer.
 * - No cap on memory beyond size=: a fully written disk costs size bytes
 *   plus the tables.
 *
 * Lending (blkd only, include/blkd-plugin.h).  Under blkd a READ reply
 * is sent straight from the chunks.  Each chunk carries a reference count
 * after its data: the table holds one, and every reply a chunk is lent to
 * holds one until blkd releases it.  Taking a reference happens under the
 * stripe's read lock, so it cannot race the free that swaps the pointer
 * out under the write lock; the free then only drops the table's
 * reference, and the memory is freed (or kept as a spare, never while
 * referenced) when the last unsent reply lets go.  So a trimmed, zeroed
 * or replaced chunk is never reused while a reply still points into it.
 * A write into a lent chunk lands in place (no copy-on-write): a reply
 * racing it carries, byte by byte, the old or the new data of this disk,
 * never anything else.  A whole-chunk aligned WRITE is received into
 * fresh chunks blkd fills from the socket and swapped in only once the
 * payload is complete.
 */

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "blkd-plugin.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

#define RAM_CHUNK_SHIFT 16
#define RAM_CHUNK       (UINT64_C(1) << RAM_CHUNK_SHIFT)
#define RAM_LEAF_SHIFT  13
#define RAM_LEAF_SLOTS  (UINT64_C(1) << RAM_LEAF_SHIFT)
#define RAM_STRIPES     256
/* 1 PiB: the directory is then 2M pointers (16 MiB of untouched,
 * lazily zeroed virtual memory).  Larger sizes would make the up-front
 * directory the dominant cost for no real use. */
#define RAM_MAX_SIZE    (UINT64_C(1) << 50)

struct ram_leaf {
  unsigned char *slot[RAM_LEAF_SLOTS];
};

/* One rwlock per cache line so stripes don't falsely share. */
struct ram_stripe {
  pthread_rwlock_t lock;
} __attribute__((aligned(64)));

static int64_t ram_size = -1;
static uint64_t ram_nleaves;
static struct ram_leaf **ram_dir;
static struct ram_stripe ram_stripes[RAM_STRIPES];
static bool ram_stripes_ready;

/* A chunk is RAM_CHUNK bytes of data followed by its reference count
 * (RAM_TAIL bytes keep the next allocation off its cache line). */
#define RAM_TAIL 64

/* Reads of a chunk never written are lent from here; nothing writes it. */
static unsigned char ram_zeros[RAM_CHUNK] __attribute__((aligned(4096)));

static unsigned int *
ram_refs(unsigned char *p)
{
  return (unsigned int *)(p + RAM_CHUNK);
}

/* Chunks whose last reference went, kept for the next allocation.  A
 * stream of whole-chunk WRITEs allocates a chunk for every 64 KiB it
 * receives (pwrite_place) and lets go of the one each replaces: through
 * malloc that is a split and a merge of free blocks per chunk, and now
 * and then fresh pages to fault in.  A spare goes only to a caller that
 * fills all of it before anyone can read it (the placed payload, or a
 * new chunk's piece and its zeroed margins), so its old bytes never
 * reach a client.  Bounded: past RAM_SPARE_MAX a chunk goes back to
 * malloc, so trimming a disk still gives its memory back.  Limit: a
 * spare is as cold as the chunk it was; this saves the allocator's
 * work, not the cost of writing into memory out of cache. */
#define RAM_SPARE_MAX 64
static pthread_mutex_t ram_spare_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *ram_spare[RAM_SPARE_MAX];
static unsigned ram_nspare;

/* A chunk with one reference (its caller's), contents undefined. */
static unsigned char *
ram_chunk_new(void)
{
  unsigned char *p;

  pthread_mutex_lock(&ram_spare_lock);
  p = ram_nspare ? ram_spare[--ram_nspare] : NULL;
  pthread_mutex_unlock(&ram_spare_lock);
  if (!p && posix_memalign((void **)&p, 4096, RAM_CHUNK + RAM_TAIL) != 0)
    return NULL;
  __atomic_store_n(ram_refs(p), 1, __ATOMIC_RELAXED);
  return p;
}

/* The last reference went: keep the chunk as a spare, or free it. */
static void
ram_chunk_drop(unsigned char *p)
{
  pthread_mutex_lock(&ram_spare_lock);
  if (ram_nspare < RAM_SPARE_MAX) {
    ram_spare[ram_nspare++] = p;
    p = NULL;
  }
  pthread_mutex_unlock(&ram_spare_lock);
  free(p);
}

static void
ram_chunk_get(unsigned char *p)
{
  __atomic_fetch_add(ram_refs(p), 1, __ATOMIC_RELAXED);
}

static void
ram_chunk_put(unsigned char *p)
{
  if (p && __atomic_sub_fetch(ram_refs(p), 1, __ATOMIC_ACQ_REL) == 0)
    ram_chunk_drop(p);
}

static void
ram_unload(void)
{
  uint64_t i, j;

  if (ram_dir) {
    for (i = 0; i < ram_nleaves; i++) {
      if (!ram_dir[i])
        continue;
      for (j = 0; j < RAM_LEAF_SLOTS; j++)
        ram_chunk_put(ram_dir[i]->slot[j]);
      free(ram_dir[i]);
    }
    free(ram_dir);
    ram_dir = NULL;
  }
  while (ram_nspare > 0)              /* the spares the puts above made */
    free(ram_spare[--ram_nspare]);
  if (ram_stripes_ready) {
    for (i = 0; i < RAM_STRIPES; i++)
      pthread_rwlock_destroy(&ram_stripes[i].lock);
    ram_stripes_ready = false;
  }
}

static int
ram_config(const char *key, const char *value)
{
  if (strcmp(key, "size") == 0) {
    ram_size = nbdkit_parse_size(value);
    if (ram_size == -1)
      return -1;
    return 0;
  }
  nbdkit_error("ram: unknown parameter '%s'", key);
  return -1;
}

static int
ram_config_complete(void)
{
  pthread_rwlockattr_t attr;
  uint64_t nchunks;
  int i, err;

  if (ram_size == -1) {
    nbdkit_error("ram: size=SIZE is required (e.g. 'ram 1G')");
    return -1;
  }
  if ((uint64_t)ram_size > RAM_MAX_SIZE) {
    nbdkit_error("ram: size %" PRIi64 " is larger than the 1 PiB limit",
                 ram_size);
    return -1;
  }

  nchunks = ((uint64_t)ram_size + RAM_CHUNK - 1) >> RAM_CHUNK_SHIFT;
  ram_nleaves = (nchunks + RAM_LEAF_SLOTS - 1) >> RAM_LEAF_SHIFT;
  if (ram_nleaves == 0)
    ram_nleaves = 1;
  ram_dir = calloc(ram_nleaves, sizeof *ram_dir);
  if (!ram_dir) {
    nbdkit_error("ram: allocating the chunk directory: %m");
    return -1;
  }

  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr,
                                PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  for (i = 0; i < RAM_STRIPES; i++) {
    err = pthread_rwlock_init(&ram_stripes[i].lock, &attr);
    if (err) {
      errno = err;
      nbdkit_error("ram: pthread_rwlock_init: %m");
      while (--i >= 0)
        pthread_rwlock_destroy(&ram_stripes[i].lock);
      pthread_rwlockattr_destroy(&attr);
      return -1;
    }
  }
  pthread_rwlockattr_destroy(&attr);
  ram_stripes_ready = true;
  return 0;
}

static void
ram_dump_plugin(void)
{
  printf("ram_chunk_size=%" PRIu64 "\n", RAM_CHUNK);
  printf("ram_lock_stripes=%d\n", RAM_STRIPES);
  printf("ram_max_size=%" PRIu64 "\n", RAM_MAX_SIZE);
}

static void *
ram_open(int readonly)
{
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static int64_t
ram_get_size(void *handle)
{
  return ram_size;
}

static int
ram_can_true(void *handle)
{
  return 1;
}

static int
ram_can_fua(void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

static int
ram_can_cache(void *handle)
{
  return NBDKIT_CACHE_NATIVE;
}

static pthread_rwlock_t *
ram_stripe_of(uint64_t chunk)
{
  return &ram_stripes[chunk % RAM_STRIPES].lock;
}

/* The slot holding chunk's pointer, or NULL if its leaf doesn't exist
 * and create is false.  Leaves are installed with CAS and never freed
 * while serving, so the returned slot stays valid without any lock. */
static unsigned char **
ram_slot(uint64_t chunk, bool create)
{
  struct ram_leaf **dirp = &ram_dir[chunk >> RAM_LEAF_SHIFT];
  struct ram_leaf *leaf, *fresh, *expected;

  leaf = __atomic_load_n(dirp, __ATOMIC_ACQUIRE);
  if (!leaf) {
    if (!create)
      return NULL;
    fresh = calloc(1, sizeof *fresh);
    if (!fresh)
      return NULL;
    expected = NULL;
    if (__atomic_compare_exchange_n(dirp, &expected, fresh, false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      leaf = fresh;
    else {
      free(fresh);
      leaf = expected;
    }
  }
  return &leaf->slot[chunk & (RAM_LEAF_SLOTS - 1)];
}

static unsigned char *
ram_load(unsigned char **slot)
{
  return slot ? __atomic_load_n(slot, __ATOMIC_ACQUIRE) : NULL;
}

static bool
ram_is_zero(const unsigned char *p, size_t n)
{
  /* Checking the first byte then comparing the buffer with itself shifted
   * by one is a branch-light whole-buffer test that stops early on data. */
  return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* The piece of [offset, offset+count) inside one chunk: its bytes, with
 * the chunk index and the offset inside it. */
static uint32_t
ram_piece(uint64_t offset, uint32_t count, uint64_t *chunk, uint32_t *in)
{
  *chunk = offset >> RAM_CHUNK_SHIFT;
  *in = offset & (RAM_CHUNK - 1);
  return RAM_CHUNK - *in < count ? RAM_CHUNK - *in : count;
}

static int
ram_pread(void *handle, void *buf, uint32_t count, uint64_t offset,
          uint32_t flags)
{
  unsigned char *out = buf;

  while (count > 0) {
    uint64_t chunk;
    uint32_t in, n = ram_piece(offset, count, &chunk, &in);
    pthread_rwlock_t *lock = ram_stripe_of(chunk);
    unsigned char *p;

    pthread_rwlock_rdlock(lock);
    p = ram_load(ram_slot(chunk, false));
    if (p)
      memcpy(out, p + in, n);
    else
      memset(out, 0, n);
    pthread_rwlock_unlock(lock);

    out += n;
    offset += n;
    count -= n;
  }
  return 0;
}

/* Write one piece within a chunk, allocating the chunk if needed.  A new
 * chunk is filled completely (the piece plus zeroed margins) before it is
 * published, so no reader can ever see uninitialised heap bytes. */
static int
ram_write_piece(uint64_t chunk, uint32_t in, const unsigned char *src,
                uint32_t n)
{
  pthread_rwlock_t *lock = ram_stripe_of(chunk);
  unsigned char **slot;
  unsigned char *p, *fresh;

  pthread_rwlock_rdlock(lock);
  slot = ram_slot(chunk, true);
  if (!slot) {
    pthread_rwlock_unlock(lock);
    nbdkit_error("ram: allocating a chunk table: %m");
    errno = ENOMEM;
    return -1;
  }
  p = ram_load(slot);
  if (p) {
    memcpy(p + in, src, n);
    pthread_rwlock_unlock(lock);
    return 0;
  }

  fresh = ram_chunk_new();
  if (!fresh) {
    pthread_rwlock_unlock(lock);
    nbdkit_error("ram: allocating a %" PRIu64 " byte chunk: %m", RAM_CHUNK);
    errno = ENOMEM;
    return -1;
  }
  memset(fresh, 0, in);
  memcpy(fresh + in, src, n);
  memset(fresh + in + n, 0, RAM_CHUNK - in - n);

  p = NULL;
  if (!__atomic_compare_exchange_n(slot, &p, fresh, false,
                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    /* Lost the race: another writer installed a chunk first. */
    ram_chunk_put(fresh);
    memcpy(p + in, src, n);
  }
  pthread_rwlock_unlock(lock);
  return 0;
}

static int
ram_pwrite(void *handle, const void *buf, uint32_t count, uint64_t offset,
           uint32_t flags)
{
  const unsigned char *src = buf;

  /* FUA needs nothing: the data is in memory once memcpy returns. */
  while (count > 0) {
    uint32_t in = offset & (RAM_CHUNK - 1);
    uint32_t n = RAM_CHUNK - in < count ? RAM_CHUNK - in : count;

    if (ram_write_piece(offset >> RAM_CHUNK_SHIFT, in, src, n) == -1)
      return -1;
    src += n;
    offset += n;
    count -= n;
  }
  return 0;
}

/* Free a chunk: the only writer-side lock use on the data path. */
static void
ram_free_chunk(uint64_t chunk, bool only_if_zero)
{
  pthread_rwlock_t *lock = ram_stripe_of(chunk);
  unsigned char **slot = ram_slot(chunk, false);
  unsigned char *p;

  if (!slot)
    return;
  pthread_rwlock_wrlock(lock);
  p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  /* Re-check under the exclusive lock: a writer may have put data back
   * between the caller's unlocked test and here. */
  if (p && (!only_if_zero || ram_is_zero(p, RAM_CHUNK)))
    __atomic_store_n(slot, NULL, __ATOMIC_RELEASE);
  else
    p = NULL;
  pthread_rwlock_unlock(lock);
  ram_chunk_put(p);                  /* freed now unless a reply holds it */
}

/* Trim and zero share this: whole chunks are freed, partial chunks get
 * their bytes zeroed, and a partial chunk left all-zero is freed too so
 * that zeroing a chunk piecewise still gives the memory back. */
static int
ram_clear(uint32_t count, uint64_t offset)
{
  while (count > 0) {
    uint64_t chunk;
    uint32_t in, n = ram_piece(offset, count, &chunk, &in);

    if (n == RAM_CHUNK)
      ram_free_chunk(chunk, false);
    else {
      pthread_rwlock_t *lock = ram_stripe_of(chunk);
      unsigned char *p;
      bool empty = false;

      pthread_rwlock_rdlock(lock);
      p = ram_load(ram_slot(chunk, false));
      if (p) {
        memset(p + in, 0, n);
        empty = ram_is_zero(p, RAM_CHUNK);
      }
      pthread_rwlock_unlock(lock);
      if (empty)
        ram_free_chunk(chunk, true);
    }
    offset += n;
    count -= n;
  }
  return 0;
}

static int
ram_trim(void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return ram_clear(count, offset);
}

/* Always fast (it only frees or memsets), so FAST_ZERO is honoured, and
 * NO_HOLE (no MAY_TRIM) is ignored: a freed chunk is indistinguishable
 * from an allocated zero one except in block status, which is allowed. */
static int
ram_zero(void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return ram_clear(count, offset);
}

static int
ram_flush(void *handle, uint32_t flags)
{
  return 0;
}

static int
ram_cache(void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return 0;
}

/* Block status reads chunk pointers without the stripe locks: the answer
 * is a snapshot that may be stale by the time it reaches the client, which
 * is all block status ever promises.  Only [offset, offset+count) is
 * walked (rounded out to chunks), and a missing leaf skips 512 MiB. */
static int
ram_extents(void *handle, uint32_t count, uint64_t offset, uint32_t flags,
            struct nbdkit_extents *extents)
{
  uint64_t end = offset + count;
  uint64_t chunk = offset >> RAM_CHUNK_SHIFT;
  uint64_t pos = offset;
  bool req_one = flags & NBDKIT_FLAG_REQ_ONE;
  uint32_t first = UINT32_MAX;

  while (pos < end) {
    uint64_t leaf = chunk >> RAM_LEAF_SHIFT;
    uint64_t next;
    uint32_t type;

    if (!__atomic_load_n(&ram_dir[leaf], __ATOMIC_ACQUIRE)) {
      next = (leaf + 1) << (RAM_LEAF_SHIFT + RAM_CHUNK_SHIFT);
      type = NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO;
      chunk = (leaf + 1) << RAM_LEAF_SHIFT;
    }
    else {
      next = (chunk + 1) << RAM_CHUNK_SHIFT;
      type = ram_load(ram_slot(chunk, false))
        ? 0 : NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO;
      chunk++;
    }
    if (next > (uint64_t)ram_size)
      next = ram_size;
    /* With REQ_ONE the server keeps only the first run, so stop walking
     * at the first change of type. */
    if (req_one && first != UINT32_MAX && type != first)
      break;
    first = type;
    /* nbdkit_add_extent merges same-type neighbours, so adding one
     * extent per chunk still yields one descriptor per run. */
    if (nbdkit_add_extent(extents, pos, next - pos, type) == -1)
      return -1;
    pos = next;
  }
  return 0;
}

/* ---- blkd's extension ------------------------------------------------ */

static void
ram_lend_release(void *const *token, unsigned n)
{
  unsigned i;

  for (i = 0; i < n; i++)
    ram_chunk_put(token[i]);
}

/* One piece per chunk touched, each holding a reference to its chunk (a
 * hole is lent from ram_zeros, token NULL). */
static int
ram_lend_pread(void *handle, uint32_t count, uint64_t offset, uint32_t flags,
               struct blkd_lend *lend)
{
  lend->n = 0;
  while (count > 0) {
    uint64_t chunk;
    uint32_t in, n = ram_piece(offset, count, &chunk, &in);
    pthread_rwlock_t *lock = ram_stripe_of(chunk);
    unsigned char *p;

    if (lend->n == lend->max) {
      ram_lend_release(lend->token, lend->n);
      lend->n = 0;
      errno = E2BIG;
      return -1;
    }
    pthread_rwlock_rdlock(lock);
    p = ram_load(ram_slot(chunk, false));
    if (p)
      ram_chunk_get(p);
    pthread_rwlock_unlock(lock);

    lend->iov[lend->n].iov_base = (p ? p : ram_zeros) + in;
    lend->iov[lend->n].iov_len = n;
    lend->token[lend->n] = p;
    lend->n++;
    offset += n;
    count -= n;
  }
  return 0;
}

/* Only whole, aligned chunks are received in place: a partial chunk
 * would need its old bytes copied around the payload anyway. */
static int
ram_pwrite_place(void *handle, uint32_t count, uint64_t offset, uint32_t flags,
                 struct blkd_lend *dst)
{
  uint32_t i, n = count >> RAM_CHUNK_SHIFT;

  dst->n = 0;
  if ((offset | count) & (RAM_CHUNK - 1) || n == 0) {
    errno = ENOTSUP;
    return -1;
  }
  if (n > dst->max) {
    errno = E2BIG;
    return -1;
  }
  for (i = 0; i < n; i++) {
    unsigned char *p = ram_chunk_new();
    if (!p) {
      ram_lend_release(dst->token, dst->n);
      dst->n = 0;
      nbdkit_error("ram: allocating a %" PRIu64 " byte chunk: %m", RAM_CHUNK);
      errno = ENOMEM;
      return -1;
    }
    dst->iov[i].iov_base = p;
    dst->iov[i].iov_len = RAM_CHUNK;
    dst->token[i] = p;
    dst->n++;
  }
  return 0;
}

/* Swap the filled chunks in, one stripe write lock each (as a free does):
 * readers see the old chunk or the new one, never half of each.  The old
 * chunk is put, so it lives on while a reply still holds it. */
static int
ram_pwrite_commit(void *handle, uint32_t count, uint64_t offset, uint32_t flags,
                  struct blkd_lend *dst, int ok)
{
  uint64_t chunk = offset >> RAM_CHUNK_SHIFT;
  unsigned i;

  if (!ok) {
    ram_lend_release(dst->token, dst->n);
    return 0;
  }
  for (i = 0; i < dst->n; i++, chunk++) {
    pthread_rwlock_t *lock = ram_stripe_of(chunk);
    unsigned char **slot = ram_slot(chunk, true);
    unsigned char *old;

    if (!slot) {
      ram_lend_release(dst->token + i, dst->n - i);
      nbdkit_error("ram: allocating a chunk table: %m");
      errno = ENOMEM;
      return -1;
    }
    pthread_rwlock_wrlock(lock);
    old = __atomic_exchange_n(slot, (unsigned char *)dst->token[i],
                              __ATOMIC_ACQ_REL);
    pthread_rwlock_unlock(lock);
    ram_chunk_put(old);
  }
  return 0;
}

/* Found by blkd with dlsym; nbdkit never looks for it. */
const struct blkd_plugin_extension blkd_plugin_extension = {
  .version       = BLKD_PLUGIN_EXTENSION_VERSION,
  .size          = sizeof (struct blkd_plugin_extension),
  .lend_pread    = ram_lend_pread,
  .lend_release  = ram_lend_release,
  .pwrite_place  = ram_pwrite_place,
  .pwrite_commit = ram_pwrite_commit,
};

static struct nbdkit_plugin plugin = {
  .name              = "ram",
  .longname          = "blkd sparse RAM disk",
  .version           = "0.1.0",
  .description       = "Sparse RAM disk with lock-striped chunk table",
  .unload            = ram_unload,
  .config            = ram_config,
  .config_complete   = ram_config_complete,
  .config_help       = "size=<SIZE>   (required) Size of the RAM disk "
                       "(magic key: 'ram 1G').",
  .magic_config_key  = "size",
  .dump_plugin       = ram_dump_plugin,
  .open              = ram_open,
  .get_size          = ram_get_size,
  .can_write         = ram_can_true,
  .can_flush         = ram_can_true,
  .can_trim          = ram_can_true,
  .can_zero          = ram_can_true,
  .can_fast_zero     = ram_can_true,
  .can_extents       = ram_can_true,
  .can_multi_conn    = ram_can_true,
  .can_fua           = ram_can_fua,
  .can_cache         = ram_can_cache,
  .pread             = ram_pread,
  .pwrite            = ram_pwrite,
  .flush             = ram_flush,
  .trim              = ram_trim,
  .zero              = ram_zero,
  .cache             = ram_cache,
  .extents           = ram_extents,
  .errno_is_preserved = 1,
};

NBDKIT_REGISTER_PLUGIN(plugin)
