/* The extents container nbdkit's API hands plugins and filters (one
 * BLOCK_STATUS or sparse-read query), with nbdkit's rules, and the
 * filter helpers nbdkit_extents_full and nbdkit_extents_aligned. */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <nbdkit-filter.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "public.h"
#include "vector.h"

/* nbdkit's cap (server/extents.c): it bounds the reply size and the memory
 * a misbehaving plugin can make us hold. */
#define MAX_EXTENTS (1024 * 1024)

/* e->next holds offset+length of the previous call.  nbdkit keeps it in an
 * int64_t with -1 meaning "no call yet", so any value above INT64_MAX
 * skips the contiguity check; UINT64_MAX as "no call yet" and the same
 * test reproduce that exactly. */
#define EXTENTS_NO_CALL_YET UINT64_MAX

struct nbdkit_extents *
public_extents_new (uint64_t start, uint64_t end)
{
  struct nbdkit_extents *e;

  if (start > INT64_MAX || end > INT64_MAX) {
    nbdkit_error ("nbdkit_extents_new: start (%" PRIu64 ") or end (%" PRIu64
                  ") > INT64_MAX", start, end);
    errno = ERANGE;
    return NULL;
  }
  if (start > end) {            /* start == end is a valid empty window */
    nbdkit_error ("nbdkit_extents_new: start (%" PRIu64 ") >= end (%" PRIu64
                  ")", start, end);
    errno = ERANGE;
    return NULL;
  }
  e = calloc (1, sizeof *e);
  if (e == NULL) {
    nbdkit_error ("nbdkit_extents_new: malloc: %m");
    return NULL;
  }
  e->start = start;
  e->end = end;
  e->next = EXTENTS_NO_CALL_YET;
  return e;
}

void
public_extents_free (struct nbdkit_extents *e)
{
  if (e) {
    free (e->v);
    free (e);
  }
}

PUBLIC_API void
nbdkit_extents_free (struct nbdkit_extents *e)
{
  public_extents_free (e);
}

PUBLIC_API int
nbdkit_add_extent (struct nbdkit_extents *e,
                   uint64_t offset, uint64_t length, uint32_t type)
{
  /* The order of these checks is nbdkit's, and it is observable: e.g. a
   * non-contiguous zero-length extent is an error, and the first extent
   * starting after `start` is only an error if it is inside the window. */
  if (e->next <= INT64_MAX && e->next != offset) {
    nbdkit_error ("nbdkit_add_extent: "
                  "extents must be added in ascending order and "
                  "must be contiguous");
    errno = ERANGE;
    return -1;
  }
  e->next = offset + length;

  if (length == 0)
    return 0;
  /* Past the window, or full: dropped silently; the client just gets a
   * shorter answer and asks again. */
  if (offset >= e->end || e->len >= MAX_EXTENTS)
    return 0;
  if (offset + length > e->end)
    length = e->end - offset;

  if (e->len == 0) {
    if (offset + length <= e->start)
      return 0;
    if (offset > e->start) {
      nbdkit_error ("nbdkit_add_extent: first extent must not be > start (%"
                    PRIu64 ")", e->start);
      errno = ERANGE;
      return -1;
    }
    length -= e->start - offset;
    offset = e->start;
  }

  if (e->len > 0 && e->v[e->len - 1].type == type) {
    e->v[e->len - 1].length += length;
    return 0;
  }
  struct public_extent *nv = vec_grow (e->v, &e->cap, e->len + 1, sizeof *nv, 16);
  if (nv == NULL) {
    nbdkit_error ("nbdkit_add_extent: realloc: %m");
    return -1;
  }
  e->v = nv;
  e->v[e->len].offset = offset;
  e->v[e->len].length = length;
  e->v[e->len].type = type;
  e->len++;
  return 0;
}

PUBLIC_API struct nbdkit_extents *
nbdkit_extents_new (uint64_t start, uint64_t end)
{
  return public_extents_new (start, end);
}

PUBLIC_API size_t
nbdkit_extents_count (const struct nbdkit_extents *e)
{
  return e->len;
}

PUBLIC_API struct nbdkit_extent
nbdkit_get_extent (const struct nbdkit_extents *e, size_t i)
{
  if (i >= e->len)
    public_index_abort ("nbdkit_get_extent", i, e->len);
  return (struct nbdkit_extent) {
    .offset = e->v[i].offset, .length = e->v[i].length, .type = e->v[i].type,
  };
}

/* Asks `next` for one extents list, failing with EIO when it answered
 * nothing: the caller would otherwise loop without progress (nbdkit
 * asserts there instead). */
static int
extents_ask (nbdkit_next *next, uint32_t count, uint64_t offset,
             uint32_t flags, struct nbdkit_extents *e, int *err)
{
  if (next->extents (next, count, offset, flags, e, err) == -1)
    return -1;
  if (e->len == 0) {
    nbdkit_error ("extents: the layer below returned no extent at offset %"
                  PRIu64, offset);
    *err = EIO;
    return -1;
  }
  return 0;
}

/* Every extent of [offset, offset+count), asking `next` as many times as
 * it takes (a plugin may answer only a prefix).  REQ_ONE is cleared so the
 * layer below answers as much as it is willing to per call. */
PUBLIC_API struct nbdkit_extents *
nbdkit_extents_full (nbdkit_next *next, uint32_t count, uint64_t offset,
                     uint32_t flags, int *err)
{
  struct nbdkit_extents *ret, *t = NULL;

  flags &= ~NBDKIT_FLAG_REQ_ONE;
  ret = public_extents_new (offset, offset + count);
  if (ret == NULL)
    goto err_errno;
  while (count > 0) {
    t = public_extents_new (offset, offset + count);
    if (t == NULL)
      goto err_errno;
    if (extents_ask (next, count, offset, flags, t, err) == -1)
      goto err;
    /* t is clipped to [offset, offset+count), so each extent fits. */
    for (size_t i = 0; i < t->len; i++) {
      if (nbdkit_add_extent (ret, t->v[i].offset, t->v[i].length,
                             t->v[i].type) == -1)
        goto err_errno;
      offset += t->v[i].length;
      count -= t->v[i].length;
    }
    public_extents_free (t);
    t = NULL;
  }
  return ret;

 err_errno:
  *err = errno;
 err:
  public_extents_free (t);
  public_extents_free (ret);
  return NULL;
}

/* Fills `e` for [offset, offset+count) with extents whose lengths are all
 * multiples of `align`, for a filter whose own granularity is `align`
 * (blocksize, cacheextents...).  nbdkit's rule: an unaligned extent past
 * the first block is rounded down and the list ends there; an unaligned
 * first block is merged with what follows until it covers `align` bytes,
 * its type being the AND of the merged types (a block is a hole or zero
 * only if all of it is), asking `next` again if the list runs out. */
PUBLIC_API int
nbdkit_extents_aligned (nbdkit_next *next, uint32_t count, uint64_t offset,
                        uint32_t flags, uint32_t align,
                        struct nbdkit_extents *e, int *err)
{
  /* nbdkit asserts these; a bad filter gets EINVAL here instead. */
  if (align == 0 || (align & (align - 1)) != 0 ||
      ((count | offset) & (align - 1)) != 0) {
    nbdkit_error ("nbdkit_extents_aligned: count %" PRIu32 " offset %"
                  PRIu64 " not aligned to %" PRIu32 " (or not a power of 2)",
                  count, offset, align);
    *err = EINVAL;
    return -1;
  }
  if (next->extents (next, count, offset, flags, e, err) == -1)
    return -1;

  for (size_t i = 0; i < e->len; i++) {
    struct public_extent *x = &e->v[i];

    if ((x->length & (align - 1)) == 0)
      continue;
    if (x->offset + x->length > offset + align) {
      /* Keep the aligned part; the client asks again for the rest. */
      x->length &= ~(uint64_t) (align - 1);
      e->len = i + (x->length != 0);
      e->next = x->offset + x->length;
      return 0;
    }
    /* Only the first extent can end inside the first block: every later
     * one starts at or past offset + align. */
    while (x->length < align) {
      if (e->len > 1) {
        x->length += e->v[1].length;
        x->type &= e->v[1].type;
        memmove (&e->v[1], &e->v[2], (e->len - 2) * sizeof e->v[0]);
        e->len--;
      }
      else {
        /* The layer below needs a fresh container; its answer becomes
         * ours, with our partial first extent folded into its first. */
        struct nbdkit_extents *t;
        struct public_extent *tv;
        size_t tlen, tcap;

        t = public_extents_new (x->offset + x->length, offset + align);
        if (t == NULL) {
          *err = errno;
          return -1;
        }
        if (extents_ask (next, align - x->length, x->offset + x->length,
                         flags & ~NBDKIT_FLAG_REQ_ONE, t, err) == -1) {
          public_extents_free (t);
          return -1;
        }
        t->v[0].offset = x->offset;
        t->v[0].length += x->length;
        t->v[0].type &= x->type;
        tv = t->v, tlen = t->len, tcap = t->cap;
        t->v = e->v, t->len = e->len, t->cap = e->cap;
        e->v = tv, e->len = tlen, e->cap = tcap;
        public_extents_free (t);
        x = &e->v[0];
      }
    }
    x->length = align;
    e->len = 1;
    e->next = x->offset + x->length;
    return 0;
  }
  return 0;
}
