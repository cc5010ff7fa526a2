/* Transmission phase: parse and validate requests, run them on the layer
 * stack (backend_* on the connection's outermost context), build simple or
 * structured replies, and map errno to NBD errors. */
#include <endian.h>
#include <stddef.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "blkd-plugin.h"
#include "delayacct.h"

/* Below this, a read is not worth an extents query to find holes in it. */
#define SPARSE_READ_MIN   (64 * 1024)
/* Block status answers fit one small pooled buffer: the spec lets us
 * describe less than was asked, and the client asks again for the rest. */
#define BLOCK_STATUS_BUF  (16 * 1024)
#define BLOCK_STATUS_MAX  ((BLOCK_STATUS_BUF - 4) / 8)
/* BLOCK_STATUS_EXT: a context id and a count, then 16-byte descriptors. */
#define BLOCK_STATUS_EXT_MAX ((BLOCK_STATUS_BUF - 8) / 16)
/* The plugin API's counts are 32 bits: a longer extended-header request
 * is run as calls of at most this.  A power of two, so every piece stays
 * aligned to any block size a plugin can ask for. */
#define PLUGIN_SPAN       (UINT32_C (1) << 31)
/* Extents calls one extended BLOCK_STATUS may make while the answer is
 * still one descriptor short of the request: bounds the work one request
 * buys; the client asks again for the rest. */
#define EXTENTS_CALLS_MAX 1024    /* 2 TiB at least */

/* The one place errno becomes an NBD error (nbdkit's mapping). */
uint32_t
protocol_nbd_error (int err, const struct request *r)
{
  switch (err) {
  case 0:
    return 0;
  case EROFS:
  case EPERM:
    return NBD_EPERM;
  case EIO:
    return NBD_EIO;
  case ENOMEM:
  case ENOBUFS:
    return NBD_ENOMEM;
  case EDQUOT:
  case EFBIG:
  case ENOSPC:
    return NBD_ENOSPC;
  case ESHUTDOWN:
    return NBD_ESHUTDOWN;
  case ENOTSUP:
#if ENOTSUP != EOPNOTSUPP
  case EOPNOTSUPP:
#endif
    return r->flags & NBD_CMD_FLAG_FAST_ZERO ? NBD_ENOTSUP : NBD_EINVAL;
  case EOVERFLOW:
    /* Extended headers: a READ over the payload limit (proto.md lets
     * the server refuse it "up front with NBD_EOVERFLOW"). */
    return r->flags & NBD_CMD_FLAG_DF || (r->conn && r->conn->extended)
           ? NBD_EOVERFLOW : NBD_EINVAL;
  default:
    return NBD_EINVAL;
  }
}

/* ---- validation ---------------------------------------------------- */

int
protocol_validate (struct conn *c, const struct request *r)
{
  const struct backend_caps *k = &c->pc.caps;
  uint64_t size = (uint64_t) k->size;
  bool writable = k->can_write && !cfg.readonly;
  uint16_t allowed = NBD_CMD_FLAG_FUA;

  switch (r->type) {
  case NBD_CMD_READ:
    if (c->structured)
      allowed |= NBD_CMD_FLAG_DF;
    break;
  case NBD_CMD_WRITE_ZEROES:
    allowed |= NBD_CMD_FLAG_NO_HOLE;
    /* Read-only: every write-like request gets EPERM, whatever its flags
     * (the stack reports no fast zero on a read-only context). */
    if (k->can_fast_zero || !writable)
      allowed |= NBD_CMD_FLAG_FAST_ZERO;
    break;
  case NBD_CMD_BLOCK_STATUS:
    allowed |= NBD_CMD_FLAG_REQ_ONE;
    break;
  case NBD_CMD_WRITE: case NBD_CMD_DISC: case NBD_CMD_FLUSH:
  case NBD_CMD_TRIM: case NBD_CMD_CACHE:
    break;
  default:
    log_debug ("unknown command %u", r->type);
    return EINVAL;
  }
  if (r->flags & ~allowed) {
    log_debug ("%s: flags 0x%x not allowed", nbd_cmd_name (r->type), r->flags);
    return EINVAL;
  }

  switch (r->type) {
  case NBD_CMD_DISC:
    return 0;
  case NBD_CMD_FLUSH:
    if (r->offset || r->count)
      return EINVAL;
    return k->can_flush ? 0 : EINVAL;
  case NBD_CMD_WRITE: case NBD_CMD_TRIM: case NBD_CMD_WRITE_ZEROES:
    if (!writable)
      return EPERM;
    if (r->type == NBD_CMD_TRIM && !k->can_trim)
      return EINVAL;
    break;
  case NBD_CMD_CACHE:
    if (k->can_cache == NBDKIT_CACHE_NONE)
      return EINVAL;
    break;
  case NBD_CMD_BLOCK_STATUS:
    if (!c->meta_base_allocation)
      return EINVAL;
    break;
  }

  if (r->count == 0)
    return EINVAL;
  /* The maximum we advertised: ours, or the plugin's if it is smaller. */
  uint32_t max = k->block_max ? MIN (k->block_max, cfg.max_request) : cfg.max_request;
  if ((r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE) && r->count > max)
    return c->extended && r->type == NBD_CMD_READ ? EOVERFLOW : EINVAL;
  if (r->offset > size || r->count > size - r->offset) {
    log_debug ("%s: offset %llu + count %llu is past the end (%llu)", nbd_cmd_name (r->type),
               (unsigned long long) r->offset, (unsigned long long) r->count,
               (unsigned long long) size);
    return r->type == NBD_CMD_WRITE || r->type == NBD_CMD_WRITE_ZEROES ? ENOSPC : EINVAL;
  }
  uint32_t min = k->block_min ? k->block_min : 1;
  if ((r->offset | r->count) & (min - 1)) {
    log_debug ("%s: not aligned to the minimum block size %u", nbd_cmd_name (r->type), min);
    return EINVAL;
  }
  return 0;
}

/* ---- replies ------------------------------------------------------- */

static size_t put_chunk (struct request *r, size_t at, uint16_t flags, uint16_t type,
                         uint32_t length, const void *extra, size_t extra_len);

/* A chunk header h (hlen bytes) and `extra` bytes after it at byte `at`
 * of hdr, as one iovec; returns where the next header may start. */
static size_t
put_hdr (struct request *r, size_t at, const void *h, size_t hlen, const void *extra,
         size_t extra_len)
{
  memcpy (r->hdr + at, h, hlen);
  if (extra_len)
    memcpy (r->hdr + at + hlen, extra, extra_len);
  r->iov[r->niov++] = (struct iovec) { r->hdr + at, hlen + extra_len };
  return at + hlen + extra_len;
}

/* Extended headers: one 32-byte chunk header for every reply, the
 * request's offset echoed in it (proto.md: "MUST match the request"). */
static size_t
put_ext_chunk (struct request *r, size_t at, uint16_t flags, uint16_t type,
               uint32_t length, const void *extra, size_t extra_len)
{
  struct nbd_extended_reply h = {
    .magic = htobe32 (NBD_EXTENDED_REPLY_MAGIC), .flags = htobe16 (flags),
    .type = htobe16 (type), .cookie = r->cookie, .offset = htobe64 (r->offset),
    .length = htobe64 (length),
  };
  return put_hdr (r, at, &h, sizeof h, extra, extra_len);
}

/* The whole reply: one ERROR chunk (no message). */
static void
put_error_chunk (struct request *r, uint32_t nbd_err)
{
  uint8_t e[6];
  uint32_t be = htobe32 (nbd_err);
  memcpy (e, &be, 4);
  memset (e + 4, 0, 2);             /* no message */
  r->niov = 0;
  put_chunk (r, 0, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, sizeof e, e, sizeof e);
}

/* Extended headers have no simple reply: success is a NONE chunk and a
 * failure an ERROR chunk, whatever the command. */
static void
put_ext_done (struct request *r, uint32_t error)
{
  r->niov = 0;
  if (error == 0)
    put_chunk (r, 0, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0, NULL, 0);
  else
    put_error_chunk (r, error);
}

static void
put_simple (struct request *r, uint32_t error)
{
  if (r->conn->extended) {
    put_ext_done (r, error);
    return;
  }
  struct nbd_simple_reply h = {
    .magic = htobe32 (NBD_SIMPLE_REPLY_MAGIC), .error = htobe32 (error),
    .cookie = r->cookie,            /* opaque: echoed in wire order */
  };
  memcpy (r->hdr, &h, sizeof h);
  r->iov[0] = (struct iovec) { r->hdr, sizeof h };
  r->niov = 1;
}

/* Append a structured chunk header (plus `extra` bytes that follow it in
 * hdr) at byte `at` of hdr; returns where the next header may start. */
static size_t
put_chunk (struct request *r, size_t at, uint16_t flags, uint16_t type,
           uint32_t length, const void *extra, size_t extra_len)
{
  if (r->conn->extended)
    return put_ext_chunk (r, at, flags, type, length, extra, extra_len);
  struct nbd_structured_reply h = {
    .magic = htobe32 (NBD_STRUCTURED_REPLY_MAGIC), .flags = htobe16 (flags),
    .type = htobe16 (type), .cookie = r->cookie, .length = htobe32 (length),
  };
  return put_hdr (r, at, &h, sizeof h, extra, extra_len);
}

static void
put_error (struct request *r)
{
  uint32_t nbd_err = protocol_nbd_error (r->error, r);
  r->niov = 0;
  if (r->conn->structured && (r->type == NBD_CMD_READ || r->type == NBD_CMD_BLOCK_STATUS))
    put_error_chunk (r, nbd_err);
  else
    put_simple (r, nbd_err);
}

/* A piece of a read reply: data from the buffer, or a hole. */
struct read_piece {
  uint64_t offset;
  uint32_t length;
  bool hole;
};

static void
put_read_reply (struct request *r, const struct read_piece *pc, unsigned n)
{
  r->niov = 0;
  if (!r->conn->structured) {
    put_simple (r, 0);
    r->iov[r->niov++] = (struct iovec) { r->buf->data, r->count };
    return;
  }
  size_t at = 0;
  for (unsigned i = 0; i < n; i++) {
    uint16_t flags = i == n - 1 ? NBD_REPLY_FLAG_DONE : 0;
    uint64_t off = htobe64 (pc[i].offset);
    if (pc[i].hole) {
      uint8_t e[12];
      uint32_t len = htobe32 (pc[i].length);
      memcpy (e, &off, 8);
      memcpy (e + 8, &len, 4);
      at = put_chunk (r, at, flags, NBD_REPLY_TYPE_OFFSET_HOLE, sizeof e, e, sizeof e);
    }
    else {
      at = put_chunk (r, at, flags, NBD_REPLY_TYPE_OFFSET_DATA, 8 + pc[i].length, &off, 8);
      r->iov[r->niov++] = (struct iovec) {
        (char *) r->buf->data + (pc[i].offset - r->offset), pc[i].length };
    }
  }
}

/* ---- execution (shard thread or worker) ---------------------------- */

/* The stack's calls as errno results (0: done).  r->flags were validated
 * against what the top context advertised, so they pass straight down.
 * (`call == -1 ? err : 0`: the ?: orders the call before err is read.) */
static inline int
top_pread (struct conn *c, void *buf, uint32_t count, uint64_t offset)
{
  int err = 0;
  return backend_pread (c->pc.top, buf, count, offset, 0, &err) == -1 ? err : 0;
}

/* The extents of [offset, offset+count) from the top of the stack, in a
 * list whose window runs to `window_end`: 0 and *out, or an errno. */
static int
top_extents (struct conn *c, uint32_t count, uint64_t offset, uint64_t window_end,
             bool req_one, struct nbdkit_extents **out)
{
  int err = 0;
  struct nbdkit_extents *e = public_extents_new (offset, window_end);
  if (!e)
    return ENOMEM;
  if (backend_extents (c->pc.top, count, offset, req_one ? NBDKIT_FLAG_REQ_ONE : 0,
                       e, &err) == -1) {
    public_extents_free (e);
    return err;
  }
  *out = e;
  return 0;
}

/* Walks the extents from index *i on: the next one that reaches past
 * pos, clipped to end, as its end (*xend) and type.  False when none is
 * left before end. */
static bool
next_extent (const struct nbdkit_extents *e, size_t *i, uint64_t pos, uint64_t end,
             uint64_t *xend, uint32_t *type)
{
  for (; *i < e->len && pos < end; (*i)++) {
    const struct public_extent *x = &e->v[*i];
    uint64_t xe = MIN (x->offset + x->length, end);
    if (xe > pos) {
      *xend = xe;
      *type = x->type;
      (*i)++;
      return true;
    }
  }
  return false;
}

/* Split a structured read into data and hole pieces using the plugin's
 * extents, so holes go out as 12-byte OFFSET_HOLE chunks instead of
 * zeros, and the plugin is not asked to read them.  Returns the number of
 * pieces, or 0 to read the whole range as data. */
static unsigned
plan_sparse_read (struct request *r, struct read_piece *pc)
{
  struct conn *c = r->conn;
  uint64_t end = r->offset + r->count;
  unsigned n = 0;

  struct nbdkit_extents *e = NULL;
  if (top_extents (c, r->count, r->offset, end, false, &e) != 0)
    return 0;                       /* only an optimisation: read it all */
  uint64_t pos = r->offset, xend;
  uint32_t type;
  size_t i = 0;
  while (next_extent (e, &i, pos, end, &xend, &type)) {
    bool hole = type & NBDKIT_EXTENT_ZERO;
    if (n > 0 && pc[n - 1].hole == hole)
      pc[n - 1].length += xend - pos;
    else if (n == REQ_MAX_CHUNKS) {
      /* Out of room: the rest is read as data. */
      pc[n - 1].hole = false;
      pc[n - 1].length += end - pos;
      pos = end;
      break;
    }
    else
      pc[n++] = (struct read_piece) { pos, xend - pos, hole };
    pos = xend;
  }
  public_extents_free (e);
  if (pos < end) {                   /* extents stopped short: data */
    if (n > 0 && !pc[n - 1].hole)
      pc[n - 1].length += end - pos;
    else if (n < REQ_MAX_CHUNKS)
      pc[n++] = (struct read_piece) { pos, end - pos, false };
    else
      return 0;
  }
  if (n == 1 && !pc[0].hole)
    return 0;
  return n;
}

/* FUA on an export that did not advertise it is ignored, as before. */
static inline uint32_t
request_fua (const struct conn *c, const struct request *r)
{
  return (r->flags & NBD_CMD_FLAG_FUA) && c->pc.caps.can_fua != NBDKIT_FUA_NONE
         ? NBDKIT_FLAG_FUA : 0;
}

/* Reply without copying: the kernel sends from the plugin's file
 * (clear text only: TLS must see the bytes to seal them), or the reply
 * points into memory the plugin lends until the request is freed.
 * ENOTSUP: copy instead. */
static int
read_lent (struct request *r)
{
  struct conn *c = r->conn;
  struct read_piece whole = { r->offset, r->count, false };

  if (!c->tls) {
    int fd;
    uint64_t foff;
    int err = 0;
    backend_pread_fd (c->pc.top, r->count, r->offset, 0, &fd, &foff, &err);
    if (err != ENOTSUP && err != E2BIG) {
      if (err)
        return err;
      put_read_reply (r, &whole, 1);
      r->niov--;                    /* the data iovec: sendfile sends it */
      r->send_fd = fd;
      r->send_off = foff;
      r->send_len = r->count;
      return 0;
    }
  }

  struct blkd_lend l = { .iov = r->iov + 1, .token = r->lent_token, .max = REQ_LEND_MAX };
  int err = 0;
  if (backend_pread_lend (c->pc.top, r->count, r->offset, 0, &l, &err) == -1)
    return err == E2BIG ? ENOTSUP : err;
  r->nlent = l.n;                   /* the stack checked: 1..REQ_LEND_MAX */
  r->lent_bytes = r->count;
  /* The header goes in iov[0], before the pieces the plugin filled. */
  r->niov = 0;
  if (!c->structured)
    put_simple (r, 0);
  else {
    uint64_t off = htobe64 (r->offset);
    put_chunk (r, 0, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_DATA, 8 + r->count, &off, 8);
  }
  r->niov = 1 + r->nlent;
  return 0;
}

void
protocol_release (struct request *r)
{
  struct conn *c = r->conn;
  if (r->placed) {
    struct blkd_lend dst = { .iov = r->iov, .token = r->lent_token, .max = REQ_LEND_MAX,
                             .n = r->nlent };
    r->placed = false;
    r->nlent = 0;
    log_debug ("WRITE offset %llu count %llu: payload incomplete, discarded",
               (unsigned long long) r->offset, (unsigned long long) r->count);
    int err;
    backend_lock_request (&c->pc);  /* outside protocol_execute */
    backend_pwrite_commit (c->pc.top, r->count, r->offset, 0, &dst, false, &err);
    backend_unlock_request (&c->pc);
  }
  else if (r->nlent) {
    backend_lend_release (backend_top, r->lent_token, r->nlent, r->lent_bytes);
    r->nlent = 0;
  }
}

/* Asking for extents costs a plugin call: on tmpfs, SEEK_HOLE walks
 * every page up to the next hole, which made large reads of a full file
 * many times slower (docs/lab/).  "auto" asks only in-memory plugins. */
static bool
read_wants_extents (const struct request *r)
{
  const struct conn *c = r->conn;
  bool sparse = cfg.sparse_reads == SPARSE_READS_YES
    || (cfg.sparse_reads == SPARSE_READS_AUTO && backend_inline_safe ());
  return c->structured && sparse && !(r->flags & NBD_CMD_FLAG_DF)
         && c->pc.caps.can_extents && r->count >= SPARSE_READ_MIN;
}

static int
do_read (struct request *r)
{
  struct conn *c = r->conn;
  struct read_piece pc[REQ_MAX_CHUNKS];
  unsigned n = 0;

  if (read_wants_extents (r))
    n = plan_sparse_read (r, pc);
  if (n == 0) {
    int err = read_lent (r);
    if (err != ENOTSUP)
      return err;
    err = top_pread (c, r->buf->data, r->count, r->offset);
    if (!err) {
      struct read_piece whole = { r->offset, r->count, false };
      put_read_reply (r, &whole, 1);
    }
    return err;
  }
  for (unsigned i = 0; i < n; i++) {
    if (pc[i].hole)
      continue;
    int err = top_pread (c, (char *) r->buf->data + (pc[i].offset - r->offset),
                         pc[i].length, pc[i].offset);
    if (err)
      return err;
  }
  put_read_reply (r, pc, n);
  return 0;
}

/* Extended headers: 64-bit descriptors, so the plugin's extents are
 * merged across its calls (and its 32-bit windows): a 100 GiB hole is
 * one descriptor.  Stops at the request's end, at the descriptor limit,
 * when the plugin makes no progress, or after EXTENTS_CALLS_MAX calls;
 * a later call's failure just ends the answer early. */
static int
do_block_status_ext (struct request *r)
{
  struct conn *c = r->conn;
  bool req_one = r->flags & NBD_CMD_FLAG_REQ_ONE;
  uint64_t end = r->offset + r->count, pos = r->offset;
  uint8_t *out = r->buf->data;
  uint32_t n = 0, cur_type = 0;
  uint64_t cur_len = 0;             /* the descriptor being grown */
  bool full = false;

  for (unsigned call = 0; call < EXTENTS_CALLS_MAX && pos < end && !full; call++) {
    struct nbdkit_extents *e = NULL;
    uint32_t hint = end - pos < PLUGIN_SPAN ? (uint32_t) (end - pos) : PLUGIN_SPAN;
    int err = top_extents (c, hint, pos, (uint64_t) c->pc.caps.size, req_one, &e);
    if (err) {
      if (cur_len == 0)
        return err;
      break;
    }
    uint64_t before = pos, xend;
    uint32_t type;
    size_t i = 0;
    while (next_extent (e, &i, pos, end, &xend, &type)) {
      type &= NBD_STATE_HOLE | NBD_STATE_ZERO;
      if (cur_len && type != cur_type) {
        /* The one being grown takes the last slot at the end. */
        if (req_one || n + 1 >= BLOCK_STATUS_EXT_MAX) {
          full = true;
          break;
        }
        uint64_t d[2] = { htobe64 (cur_len), htobe64 (cur_type) };
        memcpy (out + 8 + 16 * n++, d, 16);
        cur_len = 0;
      }
      cur_type = type;
      cur_len += xend - pos;
      pos = xend;
    }
    public_extents_free (e);
    if (pos == before)
      break;                        /* the plugin said nothing new */
  }
  if (cur_len == 0)
    return EINVAL;
  uint64_t d[2] = { htobe64 (cur_len), htobe64 (cur_type) };
  memcpy (out + 8 + 16 * n++, d, 16);

  uint32_t hd[2] = { htobe32 (1), htobe32 (n) };
  memcpy (out, hd, 8);
  size_t len = 8 + 16 * (size_t) n;
  r->niov = 0;
  put_chunk (r, 0, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS_EXT, len, NULL, 0);
  r->iov[r->niov++] = (struct iovec) { out, len };
  return 0;
}

/* TRIM, WRITE_ZEROES and CACHE over a range the plugin API's 32-bit count
 * cannot hold (extended headers) run as several calls; the first failure
 * ends the request with its error.  Up to 4 GiB - 1 it is one call, as
 * before. */
static int
top_span (struct conn *c, uint16_t type, uint64_t count, uint64_t offset, uint32_t flags)
{
  while (count > 0) {
    uint32_t n = count <= UINT32_MAX ? (uint32_t) count : PLUGIN_SPAN;
    int err = 0, rc;
    switch (type) {
    case NBD_CMD_TRIM:
      rc = backend_trim (c->pc.top, n, offset, flags, &err);
      break;
    case NBD_CMD_WRITE_ZEROES:
      rc = backend_zero (c->pc.top, n, offset, flags, &err);
      break;
    default:
      rc = backend_cache (c->pc.top, n, offset, flags, &err);
      break;
    }
    if (rc == -1)
      return err ? err : EIO;
    count -= n;
    offset += n;
  }
  return 0;
}

static int
do_block_status (struct request *r)
{
  struct conn *c = r->conn;
  if (c->extended)
    return do_block_status_ext (r);
  bool req_one = r->flags & NBD_CMD_FLAG_REQ_ONE;
  /* nbdkit's window runs to the end of the disk, not of the request;
   * plugins are written for that, so do the same and clip afterwards. */
  struct nbdkit_extents *e = NULL;
  int err = top_extents (c, r->count, r->offset, (uint64_t) c->pc.caps.size, req_one, &e);
  if (err)
    return err;

  uint8_t *out = r->buf->data;
  uint32_t id = htobe32 (1), n = 0, type;
  uint64_t end = r->offset + r->count, pos = r->offset, xend;
  size_t i = 0;
  memcpy (out, &id, 4);
  while (n < BLOCK_STATUS_MAX && next_extent (e, &i, pos, end, &xend, &type)) {
    uint32_t d[2] = { htobe32 ((uint32_t) (xend - pos)), htobe32 (type & 3) };
    memcpy (out + 4 + 8 * n, d, 8);
    n++;
    pos = xend;
    if (req_one)
      break;
  }
  public_extents_free (e);
  if (n == 0)
    return EINVAL;

  r->niov = 0;
  size_t len = 4 + 8 * (size_t) n;
  put_chunk (r, 0, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS, len, NULL, 0);
  r->iov[r->niov++] = (struct iovec) { out, len };
  return 0;
}

/* The request's result into its reply (a READ's data reply, when it
 * succeeded, is already built). */
static void
finish_request (struct request *r, int err)
{
  r->error = err;
  if (err) {
    if (err != ENOTSUP || !(r->flags & NBD_CMD_FLAG_FAST_ZERO))
      log_debug ("%s offset %llu count %llu failed: %s", nbd_cmd_name (r->type),
                 (unsigned long long) r->offset, (unsigned long long) r->count,
                 strerror (err));
    put_error (r);
  }
  else if (r->type != NBD_CMD_READ && r->type != NBD_CMD_BLOCK_STATUS)
    put_simple (r, 0);
}

void
protocol_execute (struct request *r)
{
  struct conn *c = r->conn;
  struct context *top = c->pc.top;
  uint32_t fua = request_fua (c, r);
  int err = 0;

  log_current = &c->log;
  uint64_t t0 = delayacct_plugin_begin (r);
  backend_lock_request (&c->pc);    /* the whole request, every layer */
  switch (r->type) {
  case NBD_CMD_READ:
    err = do_read (r);
    break;
  case NBD_CMD_WRITE:
    if (r->placed) {
      struct blkd_lend dst = { .iov = r->iov, .token = r->lent_token, .max = REQ_LEND_MAX,
                               .n = r->nlent };
      r->placed = false;            /* the plugin owns the pieces again */
      r->nlent = 0;
      err = backend_pwrite_commit (top, r->count, r->offset, fua, &dst, true, &err) == -1
            ? err : 0;
    }
    else
      err = backend_pwrite (top, r->payload ? r->payload : r->buf->data, r->count, r->offset,
                            fua, &err) == -1 ? err : 0;
    break;
  case NBD_CMD_FLUSH:
    err = backend_flush (top, 0, &err) == -1 ? err : 0;
    break;
  case NBD_CMD_TRIM:
    err = top_span (c, r->type, r->count, r->offset, fua);
    break;
  case NBD_CMD_CACHE:
    err = top_span (c, r->type, r->count, r->offset, 0);
    break;
  case NBD_CMD_WRITE_ZEROES: {
    uint32_t f = fua | (r->flags & NBD_CMD_FLAG_NO_HOLE ? 0 : NBDKIT_FLAG_MAY_TRIM)
                 | (r->flags & NBD_CMD_FLAG_FAST_ZERO ? NBDKIT_FLAG_FAST_ZERO : 0);
    err = top_span (c, r->type, r->count, r->offset, f);
    break;
  }
  case NBD_CMD_BLOCK_STATUS:
    err = do_block_status (r);
    break;
  default:
    err = EINVAL;
  }
  backend_unlock_request (&c->pc);
  delayacct_plugin_end (r, t0);
  finish_request (r, err);
}

/* ---- asynchronous requests (blkd's extension) ------------------------ */

/* The plugin's completion, on its own thread (through the function the
 * shard gave protocol_start_aio): the reply is built here, as a worker
 * builds it, and the caller hands r back to its shard the way a worker's
 * request goes.  r->conn stays allocated meanwhile: r counts in its
 * inflight, so a hangup waits for this. */
struct request *
protocol_aio_finish (struct blkd_aio *a, int err)
{
  struct request *r = (struct request *) ((char *) a - offsetof (struct request, aio));

  delayacct_plugin_end (r, r->aio_t0);
  log_current = &r->conn->log;
  if (!err && r->type == NBD_CMD_READ) {
    struct read_piece whole = { r->offset, r->count, false };
    put_read_reply (r, &whole, 1);
  }
  finish_request (r, err);
  log_current = NULL;
  return r;
}

/* Reads that would be split by extents or lent, and placed writes, keep
 * their synchronous paths: the aio calls move whole buffers only. */
enum protocol_aio
protocol_start_aio (struct request *r, void (*complete) (struct blkd_aio *, int))
{
  struct conn *c = r->conn;
  struct context *top = c->pc.top;
  uint32_t flags = request_fua (c, r);
  enum backend_aio_op op;
  void *buf = NULL;

  if (!backend_aio_ready (top))
    return PROTOCOL_AIO_DECLINED;
  /* The aio calls take the plugin API's 32-bit count: a longer TRIM or
   * WRITE_ZEROES (extended headers) is split by the synchronous path. */
  if (r->count > UINT32_MAX)
    return PROTOCOL_AIO_DECLINED;
  switch (r->type) {
  case NBD_CMD_READ:
    if (read_wants_extents (r))
      return PROTOCOL_AIO_DECLINED;
    op = BACKEND_AIO_PREAD;
    buf = r->buf->data;
    flags = 0;
    break;
  case NBD_CMD_WRITE:
    if (r->placed)
      return PROTOCOL_AIO_DECLINED;
    op = BACKEND_AIO_PWRITE;
    buf = r->buf->data;
    break;
  case NBD_CMD_FLUSH:
    op = BACKEND_AIO_FLUSH;
    flags = 0;
    break;
  case NBD_CMD_TRIM:
    op = BACKEND_AIO_TRIM;
    break;
  case NBD_CMD_WRITE_ZEROES:
    op = BACKEND_AIO_ZERO;
    flags |= (r->flags & NBD_CMD_FLAG_NO_HOLE ? 0 : NBDKIT_FLAG_MAY_TRIM)
             | (r->flags & NBD_CMD_FLAG_FAST_ZERO ? NBDKIT_FLAG_FAST_ZERO : 0);
    break;
  default:
    return PROTOCOL_AIO_DECLINED;
  }

  log_current = &c->log;
  r->aio.complete = complete;
  /* Limit, admitted: when the plugin declines this one request (ENOTSUP)
   * the synchronous path times it again, and --delayacct=locked then
   * counts its queued time twice. */
  r->aio_t0 = delayacct_plugin_begin (r);
  int err = 0;
  backend_lock_request (&c->pc);
  int rc = backend_aio (top, op, buf, r->count, r->offset, flags, &r->aio, &err);
  backend_unlock_request (&c->pc);
  if (rc == 0)
    return PROTOCOL_AIO_STARTED;    /* r belongs to the plugin until complete */
  if (err == ENOTSUP)
    return PROTOCOL_AIO_DECLINED;
  delayacct_plugin_end (r, r->aio_t0);
  finish_request (r, err);
  return PROTOCOL_AIO_ANSWERED;
}

/* ---- input --------------------------------------------------------- */

ssize_t
protocol_parse_header (bool extended, const uint8_t *in, size_t avail,
                       struct protocol_header *h)
{
  /* The two forms share their first 24 bytes; only the length differs
   * (32 bits at byte 24, or 64). */
  struct nbd_extended_request x;
  size_t len = extended ? sizeof x : sizeof (struct nbd_request);
  if (avail < len)
    return 0;
  memcpy (&x, in, len);
  if (be32toh (x.magic) != (extended ? NBD_EXTENDED_REQUEST_MAGIC : NBD_REQUEST_MAGIC))
    return -1;
  uint32_t count32;
  memcpy (&count32, in + 24, 4);
  *h = (struct protocol_header) {
    .flags = be16toh (x.flags), .type = be16toh (x.type), .cookie = x.cookie,
    .offset = be64toh (x.offset),
    .length = extended ? be64toh (x.length) : be32toh (count32),
  };
  return len;
}

/* The most payload an extended request may announce before we stop
 * trusting the stream: what we advertised, but never under 32 MiB, which
 * proto.md says no one should take for an attack. */
static uint64_t
ext_payload_ceiling (const struct conn *c)
{
  const struct backend_caps *k = &c->pc.caps;
  uint64_t max = k->block_max ? MIN (k->block_max, cfg.max_request) : cfg.max_request;
  return max > (UINT64_C (1) << 25) ? max : UINT64_C (1) << 25;
}

enum ext_payload
protocol_ext_payload (const struct conn *c, struct request *r, uint64_t *payload)
{
  *payload = 0;
  if (!(r->flags & NBD_CMD_FLAG_PAYLOAD_LEN)) {
    if (r->type != NBD_CMD_WRITE)
      return EXT_PAYLOAD_NONE;
    /* proto.md says WRITE MUST set the flag, but qemu's client (10.0)
     * does not, and a WRITE's length can only be its payload: take it
     * as one, as qemu-nbd does.  The ceiling below still applies. */
  }
  if (r->count > ext_payload_ceiling (c)) {
    log_error ("%s: payload of %llu bytes is over the limit; closing",
               nbd_cmd_name (r->type), (unsigned long long) r->count);
    return EXT_PAYLOAD_CLOSE;
  }
  *payload = r->count;
  if (r->type == NBD_CMD_WRITE) {
    r->flags &= ~NBD_CMD_FLAG_PAYLOAD_LEN;   /* said what WRITE always means */
    return EXT_PAYLOAD_NONE;
  }
  /* No other command takes a payload here (we do not offer
   * NBD_FLAG_BLOCK_STATUS_PAYLOAD): read past it, then EINVAL. */
  log_debug ("%s: unexpected payload of %llu bytes", nbd_cmd_name (r->type),
             (unsigned long long) r->count);
  return EXT_PAYLOAD_REFUSE;
}

unsigned
protocol_payload_iov (struct request *r, uint32_t have, struct iovec *v, unsigned max)
{
  if (!r->placed) {
    if (max == 0 || have >= r->count)
      return 0;
    v[0] = (struct iovec) { (char *) r->buf->data + have, r->count - have };
    return 1;
  }
  unsigned n = 0;
  for (unsigned i = 0; i < r->nlent && n < max; i++) {
    size_t len = r->iov[i].iov_len;
    if (have >= len) {
      have -= len;
      continue;
    }
    v[n++] = (struct iovec) { (char *) r->iov[i].iov_base + have, len - have };
    have = 0;
  }
  return n;
}

/* Ask the plugin for the WRITE payload's final place, so the socket
 * writes it there and the plugin never copies it.  False: the payload
 * goes through a pool buffer and pwrite. */
static bool
place_payload (struct conn *c, struct request *r)
{
  /* Placed payloads count against the connection's share of buffer
   * memory like pooled ones, so a client cannot make the plugin hold
   * more fresh memory for it than the pool would: over its share, the
   * write takes the pool path and waits there. */
  if (c->buf_bytes && c->buf_bytes + r->count > cfg.iobuf_conn_cap)
    return false;
  struct blkd_lend dst = { .iov = r->iov, .token = r->lent_token, .max = REQ_LEND_MAX };
  int err = 0;
  /* Parsing runs outside protocol_execute: take the request's lock here. */
  backend_lock_request (&c->pc);
  int rc = backend_pwrite_place (c->pc.top, r->count, r->offset, request_fua (c, r), &dst,
                                 &err);
  backend_unlock_request (&c->pc);
  if (rc == -1) {
    if (err != ENOTSUP && err != E2BIG)
      log_debug ("WRITE offset %llu count %llu: no place for the payload (%s); copying",
                 (unsigned long long) r->offset, (unsigned long long) r->count,
                 strerror (err));
    return false;
  }
  r->placed = true;
  r->nlent = dst.n;                 /* the stack checked: 1..REQ_LEND_MAX */
  r->held = r->count;
  c->buf_bytes += r->held;          /* request_free gives it back */
  return true;
}

/* Give a request its data buffer; false (and the connection waits) when
 * the pool is at its bound. */
static bool
attach_buffer (struct conn *c, struct request *r)
{
  size_t need = 0;
  if (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE)
    need = r->count;
  else if (r->type == NBD_CMD_BLOCK_STATUS)
    need = BLOCK_STATUS_BUF;
  if (!need)
    return true;
  if (c->buf_bytes && c->buf_bytes + need > cfg.iobuf_conn_cap) {
    errno = ENOBUFS;                /* its own replies will free some */
    return false;
  }
  r->buf = iobuf_get (c->shard->pool, need);
  if (!r->buf)
    return false;
  c->buf_bytes += r->buf->cap;
  return true;
}

/* The request has everything it needs but a WRITE's payload: the caller
 * runs it (*out), or reads the payload into it first (c->recv_req). */
static enum protocol_next
start_request (struct conn *c, struct request *r, struct request **out)
{
  if (r->type == NBD_CMD_WRITE) {
    c->recv_req = r;
    c->recv_have = 0;
    return PROTOCOL_PAYLOAD;
  }
  *out = r;
  return PROTOCOL_RUN;
}

/* The error reply for r, for the caller to queue. */
static enum protocol_next
answer_error (struct request *r, int err, struct request **out)
{
  r->error = err;
  put_error (r);
  *out = r;
  return PROTOCOL_ANSWER;
}

/* A request that fails while its payload is still on the way is answered
 * only once that payload is skipped: a client matches a reply only to a
 * request it has finished sending (libnbd calls any other a server bug
 * and gives up on the connection).  True when it is answered now (no
 * payload): its reply is built. */
static bool
fail_after_payload (struct conn *c, struct request *r, int err, uint64_t payload)
{
  r->error = err;
  if (payload == 0) {
    put_error (r);
    return true;
  }
  c->discard_left = payload;
  c->discard_req = r;
  return false;
}

enum protocol_next
protocol_retry_stalled (struct conn *c, struct request **out)
{
  struct request *r = c->stalled_req;
  if (!r)
    return PROTOCOL_WAIT;
  if (!attach_buffer (c, r)) {
    if (errno == ENOBUFS)
      return PROTOCOL_STALLED;
    c->stalled_req = NULL;
    if (fail_after_payload (c, r, ENOMEM, r->type == NBD_CMD_WRITE ? r->count : 0)) {
      *out = r;
      return PROTOCOL_ANSWER;
    }
    return PROTOCOL_WAIT;
  }
  c->stalled_req = NULL;
  return start_request (c, r, out);
}

enum protocol_next
protocol_consume (struct conn *c, struct request **out)
{
  for (;;) {
    if (c->stalled_req || c->phase != CONN_TRANSMISSION
        || (c->read_block & (CONN_READ_CLOSING | CONN_READ_SEND_FULL)))
      return PROTOCOL_WAIT;
    uint8_t *in = c->rbuf + c->roff;
    size_t avail = c->rlen - c->roff;

    if (c->discard_left) {
      size_t k = avail < c->discard_left ? avail : c->discard_left;
      c->roff += k;
      c->discard_left -= k;
      if (c->discard_left)
        return PROTOCOL_WAIT;
      if (c->discard_req) {
        struct request *failed = c->discard_req;
        c->discard_req = NULL;
        return answer_error (failed, failed->error, out);
      }
      continue;
    }
    if (c->recv_req)
      return PROTOCOL_PAYLOAD;
    if (c->inflight >= cfg.max_inflight)
      return PROTOCOL_WAIT;
    struct protocol_header h;
    ssize_t hlen = protocol_parse_header (c->extended, in, avail, &h);
    if (hlen == 0)
      return PROTOCOL_WAIT;
    if (hlen < 0) {
      uint32_t magic;
      memcpy (&magic, in, 4);
      log_error ("bad request magic 0x%08x (%s headers negotiated); closing",
                 be32toh (magic), c->extended ? "extended" : "compact");
      return PROTOCOL_CLOSE;
    }
    c->roff += hlen;
    struct request *r = request_get (c->shard->pool);
    if (!r) {
      log_error ("out of memory for a request; closing");
      return PROTOCOL_CLOSE;
    }
    r->conn = c;
    r->cookie = h.cookie;
    r->offset = h.offset;
    r->count = h.length;
    r->flags = h.flags;
    r->type = h.type;
    c->inflight++;

    if (r->type == NBD_CMD_DISC) {
      log_debug ("client sent DISC");
      request_put (c->shard->pool, r);
      c->inflight--;
      c->read_block |= CONN_READ_CLOSING;
      return PROTOCOL_WAIT;
    }
    uint64_t payload = 0;
    enum ext_payload ep = c->extended ? protocol_ext_payload (c, r, &payload)
                                      : EXT_PAYLOAD_NONE;
    if (ep == EXT_PAYLOAD_CLOSE) {
      request_put (c->shard->pool, r);
      c->inflight--;
      return PROTOCOL_CLOSE;
    }
    delayacct_parsed (c, r);
    int err = ep == EXT_PAYLOAD_REFUSE ? EINVAL : protocol_validate (c, r);
    if (err) {
      /* Keep in step with the stream: skip a WRITE's payload, or with
       * extended headers a payload no command takes. */
      if (fail_after_payload (c, r, err, r->type == NBD_CMD_WRITE ? r->count : payload)) {
        *out = r;
        return PROTOCOL_ANSWER;
      }
      continue;
    }
    if (r->type == NBD_CMD_WRITE && place_payload (c, r))
      return start_request (c, r, out);
    if (!attach_buffer (c, r)) {
      if (errno == ENOBUFS) {
        log_debug ("buffer pool at its bound: reading paused until buffers return");
        c->stalled_req = r;
        return PROTOCOL_STALLED;
      }
      if (fail_after_payload (c, r, ENOMEM, r->type == NBD_CMD_WRITE ? r->count : 0)) {
        *out = r;
        return PROTOCOL_ANSWER;
      }
      continue;
    }
    return start_request (c, r, out);
  }
}
