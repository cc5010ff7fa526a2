/* Raw-I/O buffers: a per-shard pool of page-aligned data buffers and of
 * the request code's descriptors, both recycled without a blind memset. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Size classes are powers of two from 4 KiB: one page is the smallest
 * O_DIRECT-friendly unit, and doubling wastes at most half a buffer. */
#define IOBUF_MIN_SHIFT 12
#define IOBUF_CLASSES   20            /* 4 KiB .. 2 GiB */

/* A cached descriptor: its first bytes hold the free list link; what the
 * rest held is the owner's business (it resets what it reads). */
struct iobuf_desc {
  struct iobuf_desc *next;
};

struct iobuf_pool {
  struct iobuf *free[IOBUF_CLASSES];  /* cached buffers, by class */
  struct iobuf_desc *free_descs;
  size_t limit;                       /* bound on bytes of data buffers */
  size_t bytes;                       /* allocated: in use + cached */
  struct iobuf_counters *ctr;         /* published copy of the above */
};

static void
pool_add_bytes (struct iobuf_pool *p, size_t add, size_t sub)
{
  p->bytes = p->bytes + add - sub;
  if (p->ctr)
    __atomic_store_n (&p->ctr->bytes, p->bytes, __ATOMIC_RELAXED);
}

struct iobuf_pool *
iobuf_pool_new (size_t limit_bytes, struct iobuf_counters *ctr)
{
  struct iobuf_pool *p = calloc (1, sizeof *p);
  if (!p)
    return NULL;
  p->limit = limit_bytes;
  p->ctr = ctr;
  return p;
}

static void
buf_destroy (struct iobuf_pool *p, struct iobuf *b)
{
  pool_add_bytes (p, 0, b->cap);
  free (b->data);
  free (b);
}

void
iobuf_pool_free (struct iobuf_pool *p)
{
  if (!p)
    return;
  for (int i = 0; i < IOBUF_CLASSES; i++)
    while (p->free[i]) {
      struct iobuf *b = p->free[i];
      p->free[i] = b->next;
      buf_destroy (p, b);
    }
  while (p->free_descs) {
    struct iobuf_desc *d = p->free_descs;
    p->free_descs = d->next;
    free (d);
  }
  free (p);
}

static int
size_class (size_t size)
{
  int c = 0;
  while (((size_t) 1 << (IOBUF_MIN_SHIFT + c)) < size)
    c++;
  return c;
}

/* Give back cached buffers, biggest first, until `need` more bytes fit. */
static bool
make_room (struct iobuf_pool *p, size_t need)
{
  for (int i = IOBUF_CLASSES - 1; i >= 0 && p->bytes + need > p->limit; i--)
    while (p->free[i] && p->bytes + need > p->limit) {
      struct iobuf *b = p->free[i];
      p->free[i] = b->next;
      buf_destroy (p, b);
    }
  return p->bytes + need <= p->limit;
}

struct iobuf *
iobuf_get (struct iobuf_pool *p, size_t size)
{
  int c = size_class (size ? size : 1);
  if (c >= IOBUF_CLASSES) {
    errno = EINVAL;
    return NULL;
  }
  size_t cap = (size_t) 1 << (IOBUF_MIN_SHIFT + c);

  if (cfg.iobuf == IOBUF_POOL && p->free[c]) {
    /* The point of the pool: no memset.  The bytes are stale and every
     * reader of this buffer fills what it sends (see protocol.c). */
    struct iobuf *b = p->free[c];
    p->free[c] = b->next;
    return b;
  }
  if (!make_room (p, cap)) {
    errno = ENOBUFS;
    return NULL;
  }
  struct iobuf *b = malloc (sizeof *b);
  if (!b)
    return NULL;
  if (posix_memalign (&b->data, 4096, cap) != 0) {
    free (b);
    errno = ENOMEM;
    return NULL;
  }
  if (cfg.iobuf == IOBUF_CALLOC)
    memset (b->data, 0, cap);       /* the "before": zero every request */
  b->cap = cap;
  b->cls = c;
  pool_add_bytes (p, cap, 0);
  return b;
}

void
iobuf_put (struct iobuf_pool *p, struct iobuf *b)
{
  if (!b)
    return;
  if (cfg.iobuf == IOBUF_CALLOC) {
    buf_destroy (p, b);
    return;
  }
  b->next = p->free[b->cls];
  p->free[b->cls] = b;
}

void *
iobuf_desc_get (struct iobuf_pool *p)
{
  struct iobuf_desc *d = p->free_descs;
  if (d)
    p->free_descs = d->next;
  return d;
}

void
iobuf_desc_put (struct iobuf_pool *p, void *desc)
{
  struct iobuf_desc *d = desc;
  d->next = p->free_descs;
  p->free_descs = d;
}
