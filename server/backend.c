/* The layer stack's calls: every call on a layer or a context, with
 * nbdkit's rules (cached can_* answers, range checks, zero and cache
 * emulation) whatever layer answers it, and each connection's view of
 * the stack.  stack.c builds the stack. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "blkd-plugin.h"

_Static_assert (BACKEND_SERIALIZE_CONNECTIONS == NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS
                && BACKEND_SERIALIZE_ALL_REQUESTS == NBDKIT_THREAD_MODEL_SERIALIZE_ALL_REQUESTS
                && BACKEND_SERIALIZE_REQUESTS == NBDKIT_THREAD_MODEL_SERIALIZE_REQUESTS
                && BACKEND_PARALLEL == NBDKIT_THREAD_MODEL_PARALLEL,
                "internal.h's thread models are nbdkit's");

struct backend *backend_top;
int backend_model = NBDKIT_THREAD_MODEL_PARALLEL;
pthread_mutex_t backend_all_requests_lock = PTHREAD_MUTEX_INITIALIZER;
__thread struct context *backend_current_ctx;
bool backend_stack_inline;

/* Zeros for emulated WRITE_ZEROES, and a sink for emulated CACHE. */
#define EMUL_BUF_SIZE (1024 * 1024)
static void *zero_buf, *sink_buf;

int backend_thread_model (void) { return backend_model; }
bool backend_inline_safe (void) { return backend_stack_inline; }

int
backend_buffers_alloc (void)
{
  zero_buf = calloc (1, EMUL_BUF_SIZE);
  sink_buf = malloc (EMUL_BUF_SIZE);
  if (!zero_buf || !sink_buf) {
    backend_buffers_free ();
    errno = ENOMEM;
    return -1;
  }
  return 0;
}

void
backend_buffers_free (void)
{
  free (zero_buf);
  free (sink_buf);
  zero_buf = sink_buf = NULL;
}

/* ---- calls on a layer ---------------------------------------------- */

int
backend_config (struct backend *b, const char *key, const char *value)
{
  return b->config (b, key, value);
}

int
backend_config_complete (struct backend *b)
{
  return b->config_complete (b);
}

int
backend_preconnect (struct backend *b, int readonly)
{
  return b->preconnect (b, readonly);
}

/* As nbdkit: a list that asks for the default export gets its name here,
 * so a filter sees the layer below's list resolved. */
int
backend_list_exports (struct backend *b, int readonly, struct nbdkit_exports *exports)
{
  bool tls = public_current && public_current->is_tls;
  if (b->list_exports (b, readonly, tls, exports) == -1)
    return -1;
  if (exports->use_default) {
    const char *d = backend_default_export (b, readonly);
    if (public_exports_add_name (exports, d ? d : "") == -1)
      return -1;
  }
  return 0;
}

const char *
backend_default_export (struct backend *b, int readonly)
{
  bool tls = public_current && public_current->is_tls;
  const char *s = b->default_export (b, readonly, tls);
  if (s && strnlen (s, NBD_MAX_STRING + 1) > NBD_MAX_STRING)
    return NULL;                    /* over-long: ignored, as nbdkit does */
  return s;
}

static const struct nbdkit_next_ops next_ops = {
  .prepare = backend_prepare,
  .finalize = backend_finalize,
  .get_size = backend_get_size,
  .export_description = backend_export_description,
  .block_size = backend_block_size,
  .can_write = backend_can_write,
  .can_flush = backend_can_flush,
  .is_rotational = backend_is_rotational,
  .can_trim = backend_can_trim,
  .can_zero = backend_can_zero,
  .can_fast_zero = backend_can_fast_zero,
  .can_extents = backend_can_extents,
  .can_fua = backend_can_fua,
  .can_multi_conn = backend_can_multi_conn,
  .can_cache = backend_can_cache,
  .pread = backend_pread,
  .pwrite = backend_pwrite,
  .flush = backend_flush,
  .trim = backend_trim,
  .zero = backend_zero,
  .extents = backend_extents,
  .cache = backend_cache,
};

/* shared: not tied to the calling connection (a filter's background or
 * cross-connection context, the cache's own handle). */
struct context *
backend_open (struct backend *b, int readonly, const char *exportname, int shared)
{
  struct backend_conn *conn = shared ? NULL : (public_current ? public_current->owner : NULL);
  bool tls = conn ? conn->ctx.is_tls : false;
  struct context *c = malloc (sizeof *c);
  if (!c) {
    nbdkit_error ("malloc: %m");
    return NULL;
  }
  c->next = next_ops;
  c->handle = NULL;
  c->b = b;
  c->c_next = NULL;
  c->conn = conn;
  c->state = 0;
  c->exportsize = -1;
  c->block_min = c->block_pref = c->block_max = -1;
  c->can_write = readonly ? 0 : -1;
  c->can_flush = c->is_rotational = c->can_trim = c->can_zero = -1;
  c->can_fast_zero = c->can_extents = c->can_fua = c->can_multi_conn = -1;
  c->can_cache = -1;

  if (!*exportname && conn) {
    exportname = backend_default_export (b, readonly);
    if (!exportname) {
      nbdkit_error ("default export (\"\") not permitted");
      free (c);
      return NULL;
    }
  }
  struct context *saved = backend_current_ctx;
  backend_current_ctx = c;
  c->handle = b->open (c, readonly, exportname, tls);
  backend_current_ctx = saved;
  if (!c->handle) {
    if (c->c_next)
      backend_close (c->c_next);
    free (c);
    return NULL;
  }
  c->state = CTX_OPEN;
  return c;
}

int
backend_prepare (struct context *c)
{
  /* Inner first, like .open; a filter may not have opened a layer below. */
  if (c->c_next && !(c->c_next->state & CTX_PREPARED)
      && backend_prepare (c->c_next) == -1)
    return -1;
  if (c->b->prepare (c, c->can_write == 0) == -1)
    return -1;
  c->state |= CTX_PREPARED;
  return 0;
}

int
backend_finalize (struct context *c)
{
  /* Outer first, the reverse of .prepare; after a failure, nothing. */
  if (c->state & CTX_FAILED)
    return -1;
  if (c->state & CTX_PREPARED) {
    if (c->b->finalize (c) == -1) {
      c->state |= CTX_FAILED;
      return -1;
    }
    c->state &= ~CTX_PREPARED;
  }
  return c->c_next ? backend_finalize (c->c_next) : 0;
}

void
backend_close (struct context *c)
{
  while (c) {                       /* outer to inner, the reverse of .open */
    struct context *c_next = c->c_next;
    c->b->close (c);
    free (c);
    c = c_next;
  }
}

const char *
backend_export_description (struct context *c)
{
  const char *s = c->b->export_description (c);
  if (s && strnlen (s, NBD_MAX_STRING + 1) > NBD_MAX_STRING)
    return NULL;
  return s;
}

int64_t
backend_get_size (struct context *c)
{
  if (c->exportsize == -1)
    c->exportsize = c->b->get_size (c);
  return c->exportsize;
}

int
backend_block_size (struct context *c, uint32_t *min, uint32_t *pref, uint32_t *max)
{
  if (c->block_min == -1) {
    if (c->b->block_size (c, min, pref, max) == -1)
      return -1;
    c->block_min = *min;
    c->block_pref = *pref;
    c->block_max = *max;
  }
  *min = c->block_min;
  *pref = c->block_pref;
  *max = c->block_max;
  return 0;
}

/* The can_* answers, asked of the layer once per context and cached, as
 * nbdkit does.  Those that need writing are 0 on a read-only context
 * without asking (`needs` is backend_can_write's answer); a failure (-1)
 * is not cached, so the next call asks again. */
static inline int
ask_if (struct context *c, int needs, int (*ask) (struct context *))
{
  if (needs == 1)
    return ask (c);
  return needs == -1 ? -1 : 0;
}

int
backend_can_write (struct context *c)
{
  if (c->can_write == -1)
    c->can_write = c->b->can_write (c);
  return c->can_write;
}

int
backend_can_flush (struct context *c)
{
  if (c->can_flush == -1)
    c->can_flush = c->b->can_flush (c);
  return c->can_flush;
}

int
backend_is_rotational (struct context *c)
{
  if (c->is_rotational == -1)
    c->is_rotational = c->b->is_rotational (c);
  return c->is_rotational;
}

int
backend_can_trim (struct context *c)
{
  if (c->can_trim == -1)
    c->can_trim = ask_if (c, backend_can_write (c), c->b->can_trim);
  return c->can_trim;
}

int
backend_can_zero (struct context *c)
{
  if (c->can_zero == -1)
    c->can_zero = ask_if (c, backend_can_write (c), c->b->can_zero);
  return c->can_zero;
}

/* Fast zero needs zeroing at all (native or emulated). */
int
backend_can_fast_zero (struct context *c)
{
  if (c->can_fast_zero == -1) {
    int zero = backend_can_zero (c);
    int needs = zero < 0 ? -1 : zero >= NBDKIT_ZERO_EMULATE;
    c->can_fast_zero = ask_if (c, needs, c->b->can_fast_zero);
  }
  return c->can_fast_zero;
}

int
backend_can_extents (struct context *c)
{
  if (c->can_extents == -1)
    c->can_extents = c->b->can_extents (c);
  return c->can_extents;
}

int
backend_can_fua (struct context *c)
{
  if (c->can_fua == -1)
    c->can_fua = ask_if (c, backend_can_write (c), c->b->can_fua);
  return c->can_fua;
}

int
backend_can_multi_conn (struct context *c)
{
  if (c->can_multi_conn == -1)
    c->can_multi_conn = c->b->can_multi_conn (c);
  return c->can_multi_conn;
}

int
backend_can_cache (struct context *c)
{
  if (c->can_cache == -1)
    c->can_cache = c->b->can_cache (c);
  return c->can_cache;
}

/* ---- the request path ----------------------------------------------- */

/* nbdkit asserts these; a filter handing a bad request down gets EINVAL
 * here instead, so no plugin sees a range outside its disk. */
static inline bool
valid_range (struct context *c, uint64_t offset, uint32_t count)
{
  int64_t size = c->exportsize != -1 ? c->exportsize : backend_get_size (c);
  return size >= 0 && count > 0 && offset <= (uint64_t) size
         && count <= (uint64_t) size - offset;
}

static inline int
refuse (int *err, int e)
{
  *err = e;
  return -1;
}

/* The layer's own failure without an errno is EIO, never 0. */
static inline int
checked (int r, int *err)
{
  if (r == -1 && *err <= 0)
    *err = EIO;
  return r;
}

int
backend_pread (struct context *c, void *buf, uint32_t count, uint64_t offset,
               uint32_t flags, int *err)
{
  if (__builtin_expect (!valid_range (c, offset, count) || flags, 0))
    return refuse (err, EINVAL);
  return checked (c->b->pread (c, buf, count, offset, flags, err), err);
}

static inline bool
fua_ok (struct context *c, uint32_t flags)
{
  return !(flags & NBDKIT_FLAG_FUA) || backend_can_fua (c) > NBDKIT_FUA_NONE;
}

int
backend_pwrite (struct context *c, const void *buf, uint32_t count, uint64_t offset,
                uint32_t flags, int *err)
{
  if (backend_can_write (c) != 1)
    return refuse (err, EROFS);
  if (!valid_range (c, offset, count) || (flags & ~NBDKIT_FLAG_FUA) || !fua_ok (c, flags))
    return refuse (err, EINVAL);
  return checked (c->b->pwrite (c, buf, count, offset, flags, err), err);
}

int
backend_flush (struct context *c, uint32_t flags, int *err)
{
  if (backend_can_flush (c) != 1 || flags)
    return refuse (err, EINVAL);
  return checked (c->b->flush (c, flags, err), err);
}

int
backend_trim (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  if (backend_can_write (c) != 1)
    return refuse (err, EROFS);
  if (backend_can_trim (c) != 1 || !valid_range (c, offset, count)
      || (flags & ~NBDKIT_FLAG_FUA) || !fua_ok (c, flags))
    return refuse (err, EINVAL);
  return checked (c->b->trim (c, count, offset, flags, err), err);
}

int
backend_zero (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  bool fast = flags & NBDKIT_FLAG_FAST_ZERO;
  if (backend_can_write (c) != 1)
    return refuse (err, EROFS);
  int zero = backend_can_zero (c);
  if (zero <= NBDKIT_ZERO_NONE || !valid_range (c, offset, count)
      || (flags & ~(NBDKIT_FLAG_MAY_TRIM | NBDKIT_FLAG_FUA | NBDKIT_FLAG_FAST_ZERO))
      || !fua_ok (c, flags) || (fast && backend_can_fast_zero (c) != 1))
    return refuse (err, EINVAL);

  if (zero == NBDKIT_ZERO_NATIVE) {
    int r = checked (c->b->zero (c, count, offset, flags, err), err);
    /* ENOTSUP without FAST_ZERO would let a client see "not supported"
     * for a command we advertised; nbdkit's layers never return it. */
    if (r == -1 && !fast && (*err == ENOTSUP || *err == EOPNOTSUPP))
      *err = EIO;
    return r;
  }
  /* NBDKIT_ZERO_EMULATE: write zeros, FUA on the last piece only. */
  if (fast)
    return refuse (err, ENOTSUP);
  uint32_t wflags = 0;
  bool fua_last = flags & NBDKIT_FLAG_FUA;
  while (count) {
    uint32_t n = count < EMUL_BUF_SIZE ? count : EMUL_BUF_SIZE;
    if (fua_last && n == count)
      wflags = NBDKIT_FLAG_FUA;
    if (backend_pwrite (c, zero_buf, n, offset, wflags, err) == -1)
      return -1;
    count -= n;
    offset += n;
  }
  return 0;
}

int
backend_extents (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                 struct nbdkit_extents *extents, int *err)
{
  int can = backend_can_extents (c);
  if (can < 0 || !valid_range (c, offset, count) || (flags & ~NBDKIT_FLAG_REQ_ONE))
    return refuse (err, EINVAL);
  if (can == 0) {                   /* no extents: all of it is data */
    if (nbdkit_add_extent (extents, offset, count, 0) == -1)
      return refuse (err, errno ? errno : ENOMEM);
    return 0;
  }
  return checked (c->b->extents (c, count, offset, flags, extents, err), err);
}

int
backend_cache (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  int can = backend_can_cache (c);
  if (can <= NBDKIT_CACHE_NONE || !valid_range (c, offset, count) || flags)
    return refuse (err, EINVAL);
  if (can == NBDKIT_CACHE_EMULATE) {  /* read and drop the data */
    while (count) {
      uint32_t n = count < EMUL_BUF_SIZE ? count : EMUL_BUF_SIZE;
      if (backend_pread (c, sink_buf, n, offset, 0, err) == -1)
        return -1;
      count -= n;
      offset += n;
    }
    return 0;
  }
  return checked (c->b->cache (c, count, offset, flags, err), err);
}

/* ---- zero copy (blkd's extension) ------------------------------------ */

/* The pieces a layer lent or placed must cover the range exactly: any
 * other answer would desynchronise the stream. */
static bool
lend_covers (const struct blkd_lend *l, uint32_t count)
{
  uint64_t sum = 0;
  if (l->n == 0 || l->n > l->max)
    return false;
  for (unsigned i = 0; i < l->n; i++)
    sum += l->iov[i].iov_len;
  return sum == count;
}

int
backend_pread_lend (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                    struct blkd_lend *lend, int *err)
{
  if (!c->b->pread_lend || !c->b->lend_release)
    return refuse (err, ENOTSUP);
  if (!valid_range (c, offset, count) || flags)
    return refuse (err, EINVAL);
  lend->n = 0;
  if (checked (c->b->pread_lend (c, count, offset, flags, lend, err), err) == -1)
    return -1;
  if (!lend_covers (lend, count)) {
    nbdkit_error ("%s %s lent %u pieces that do not cover %u bytes", c->b->type,
                  c->b->name, lend->n, count);
    backend_lend_release (c->b, lend->token, lend->n < lend->max ? lend->n : lend->max,
                          count);
    lend->n = 0;
    return refuse (err, EIO);
  }
  return 0;
}

void
backend_lend_release (struct backend *b, void *const *token, unsigned n, uint32_t bytes)
{
  b->lend_release (b, token, n, bytes);
}

int
backend_pread_fd (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                  int *fd, uint64_t *file_offset, int *err)
{
  if (!c->b->pread_fd)
    return refuse (err, ENOTSUP);
  if (!valid_range (c, offset, count) || flags)
    return refuse (err, EINVAL);
  return checked (c->b->pread_fd (c, count, offset, flags, fd, file_offset, err), err);
}

int
backend_pwrite_place (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                      struct blkd_lend *dst, int *err)
{
  if (!c->b->pwrite_place || !c->b->pwrite_commit)
    return refuse (err, ENOTSUP);
  if (backend_can_write (c) != 1)
    return refuse (err, EROFS);
  if (!valid_range (c, offset, count) || (flags & ~NBDKIT_FLAG_FUA) || !fua_ok (c, flags))
    return refuse (err, EINVAL);
  dst->n = 0;
  if (checked (c->b->pwrite_place (c, count, offset, flags, dst, err), err) == -1)
    return -1;
  if (!lend_covers (dst, count)) {
    nbdkit_error ("%s %s placed %u pieces that do not cover %u bytes; copying",
                  c->b->type, c->b->name, dst->n, count);
    int ignored;
    if (dst->n > dst->max)
      dst->n = dst->max;
    backend_pwrite_commit (c, count, offset, 0, dst, false, &ignored);
    dst->n = 0;
    return refuse (err, ENOTSUP);
  }
  return 0;
}

/* ok=false discards the payload: the disk keeps its old bytes. */
int
backend_pwrite_commit (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                       struct blkd_lend *dst, bool ok, int *err)
{
  return checked (c->b->pwrite_commit (c, count, offset, ok ? flags : 0, dst, ok, err), err);
}

/* ---- the connection's view of the stack ----------------------------- */

void
backend_conn_init (struct backend_conn *bc, int fd)
{
  memset (bc, 0, sizeof *bc);
  pthread_mutex_init (&bc->request_lock, NULL);
  bc->ctx.peer_fd = fd;
  bc->ctx.owner = bc;
}

void
backend_conn_fini (struct backend_conn *bc)
{
  backend_conn_close (bc);
  public_conn_ctx_release (&bc->ctx);
  pthread_mutex_destroy (&bc->request_lock);
}

int
backend_conn_preconnect (struct backend_conn *bc, bool readonly)
{
  public_current = &bc->ctx;
  int r = backend_preconnect (backend_top, readonly);
  public_current = NULL;
  return r;
}

/* Unresolved at the top: the handshake puts -e's name or the default in. */
struct nbdkit_exports *
backend_conn_list_exports (struct backend_conn *bc, bool readonly)
{
  struct nbdkit_exports *e = public_exports_new ();
  if (!e)
    return NULL;
  public_current = &bc->ctx;
  int r = backend_top->list_exports (backend_top, readonly, bc->ctx.is_tls, e);
  public_current = NULL;
  if (r == -1) {
    public_exports_free (e);
    return NULL;
  }
  return e;
}

const char *
backend_conn_default_export (struct backend_conn *bc, bool readonly)
{
  public_current = &bc->ctx;
  const char *d = backend_default_export (backend_top, readonly);
  public_current = NULL;
  return d;
}

/* What the protocol and handshake read on every request, from the top. */
static int
fetch_caps (struct backend_conn *bc)
{
  struct context *c = bc->top;
  struct backend_caps *k = &bc->caps;
  int r;

  memset (k, 0, sizeof *k);
  if ((k->size = backend_get_size (c)) < 0)
    return -1;
  if ((r = backend_can_write (c)) < 0)
    return -1;
  k->can_write = r;
  if ((r = backend_can_flush (c)) < 0)
    return -1;
  k->can_flush = r;
  if ((r = backend_is_rotational (c)) < 0)
    return -1;
  k->is_rotational = r;
  if ((r = backend_can_trim (c)) < 0)
    return -1;
  k->can_trim = r;
  if ((r = backend_can_zero (c)) < 0)
    return -1;
  k->can_zero = r;
  if ((r = backend_can_fast_zero (c)) < 0)
    return -1;
  k->can_fast_zero = r;
  if ((r = backend_can_fua (c)) < 0)
    return -1;
  k->can_fua = r;
  if ((r = backend_can_multi_conn (c)) < 0)
    return -1;
  k->can_multi_conn = r && backend_model != NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS;
  if ((r = backend_can_cache (c)) < 0)
    return -1;
  k->can_cache = r;
  if ((r = backend_can_extents (c)) < 0)
    return -1;
  k->can_extents = r;

  uint32_t min, pref, max;
  if (backend_block_size (c, &min, &pref, &max) == -1)
    return -1;
  if (min || pref || max) {
    bool pow2_min = min && !(min & (min - 1)), pow2_pref = pref && !(pref & (pref - 1));
    if (!(pow2_min && min <= 65536 && pow2_pref && pref >= 512 && pref <= 32 * 1024 * 1024
          && (max == 0xffffffff || max % min == 0) && min <= pref && pref <= max)) {
      nbdkit_error ("invalid block size constraints %u/%u/%u", min, pref, max);
      return -1;
    }
    k->block_min = min;
    k->block_pref = pref;
    k->block_max = max;
  }
  return 0;
}

int
backend_conn_open (struct backend_conn *bc, const char *export_name, bool readonly)
{
  bc->ctx.export_name = export_name;
  backend_lock_request (bc);
  bc->top = backend_open (backend_top, readonly, export_name, 0);
  if (!bc->top) {
    backend_unlock_request (bc);
    log_error ("%s %s: open failed for export \"%s\"", backend_top->type,
               backend_top->name, export_name);
    return -1;
  }
  int r = backend_prepare (bc->top);
  if (r == 0)
    r = fetch_caps (bc);
  backend_unlock_request (bc);
  if (r == -1) {
    log_error ("%s %s: preparing export \"%s\" failed", backend_top->type,
               backend_top->name, export_name);
    backend_conn_close (bc);
    return -1;
  }
  return 0;
}

void
backend_conn_close (struct backend_conn *bc)
{
  if (!bc->top)
    return;
  backend_lock_request (bc);
  if (backend_finalize (bc->top) == -1)
    log_error ("%s %s: finalize failed", backend_top->type, backend_top->name);
  backend_close (bc->top);
  backend_unlock_request (bc);
  bc->top = NULL;
}

const char *
backend_conn_export_description (struct backend_conn *bc)
{
  backend_lock_request (bc);
  const char *d = backend_export_description (bc->top);
  backend_unlock_request (bc);
  return d;
}
