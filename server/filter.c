/* The filter layer: loads an nbdkit 1.32 filter (`--filter=NAME`) and puts
 * it in the stack, calling its callbacks with the layer below as `next`
 * and passing through every callback it leaves out, as nbdkit's
 * server/filters.c does. */
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "backend.h"

#ifndef NBDKIT_FILTERDIR
#error "NBDKIT_FILTERDIR comes from pkg-config (see the Makefile)"
#endif
#ifndef BLKD_FILTERDIR
#error "BLKD_FILTERDIR comes from the Makefile"
#endif

struct filter_layer {
  struct backend b;                 /* first: a struct backend * is one of us */
  struct nbdkit_filter f;           /* our copy of theirs */
  void *dl;
  bool loaded;                      /* .load ran: .unload is due */
};

#define F(b) (&((struct filter_layer *) (b))->f)

/* Filters that only compute (no sleeping, no I/O of their own): with a
 * plugin that is inline-safe, the stack stays fit for the shard thread.
 * Any other filter might block (rate, delay, retry, cow's overlay file),
 * so its stack goes to the workers unless the user says --dispatch=inline. */
static const char *const inline_filters[] = {
  "nofilter", "offset", "truncate", "partition", "noextents", "nozero", "fua",
  "nocache", "noparallel", "protect", "swab", "blocksize-policy", "checkwrite",
  "exportname", "ip", "limit", NULL
};

/* ---- lifecycle ------------------------------------------------------ */

static int
filter_thread_model (struct backend *b)
{
  int model = b->next->thread_model (b->next);
  if (model < 0)
    return -1;
  if (F (b)->thread_model) {
    int m = F (b)->thread_model ();
    if (m == -1) {
      fprintf (stderr, "blkd: filter %s: thread_model failed\n", b->name);
      return -1;
    }
    if (m < model)                  /* the stricter one wins */
      model = m;
  }
  return model;
}

static const char *
filter_magic_config_key (struct backend *b)
{
  return b->next->magic_config_key (b->next);
}

static int
filter_config (struct backend *b, const char *key, const char *value)
{
  if (!F (b)->config)
    return backend_config (b->next, key, value);
  if (F (b)->config (backend_config, b->next, key, value) == -1) {
    fprintf (stderr, "blkd: filter %s: parameter '%s' refused\n", b->name, key);
    return -1;
  }
  return 0;
}

static int
filter_config_complete (struct backend *b)
{
  if (!F (b)->config_complete)
    return backend_config_complete (b->next);
  if (F (b)->config_complete (backend_config_complete, b->next) == -1) {
    fprintf (stderr, "blkd: filter %s: configuration incomplete\n", b->name);
    return -1;
  }
  return 0;
}

static int
filter_get_ready (struct backend *b)
{
  if (b->next->get_ready (b->next) == -1)
    return -1;
  if (F (b)->get_ready && F (b)->get_ready (backend_thread_model ()) == -1) {
    fprintf (stderr, "blkd: filter %s: get_ready failed\n", b->name);
    return -1;
  }
  return 0;
}

static int
filter_after_fork (struct backend *b)
{
  if (b->next->after_fork (b->next) == -1)
    return -1;
  if (F (b)->after_fork && F (b)->after_fork (b->next) == -1) {
    fprintf (stderr, "blkd: filter %s: after_fork failed\n", b->name);
    return -1;
  }
  return 0;
}

static void
filter_cleanup (struct backend *b)
{
  if (F (b)->cleanup)
    F (b)->cleanup (b->next);
  b->next->cleanup (b->next);
}

static void
filter_unload (struct backend *b)
{
  struct filter_layer *fl = (struct filter_layer *) b;
  if (fl->loaded && fl->f.unload)
    fl->f.unload ();
  /* As for plugins: kept mapped under ASan so leak reports have names. */
#ifndef __SANITIZE_ADDRESS__
  if (fl->dl)
    dlclose (fl->dl);
#endif
  free (b->name);
  free (b->filename);
  free (fl);
}

static void
filter_dump (struct backend *b)
{
  const struct nbdkit_filter *f = F (b);
  printf ("filter=%s\n", b->name);
  printf ("filter_%s_path=%s\n", b->name, b->filename);
  printf ("filter_%s_version=%s\n", b->name, f->_version);
  if (f->longname)
    printf ("filter_%s_longname=%s\n", b->name, f->longname);
  if (f->config_help) {
    size_t n = strlen (f->config_help);
    printf ("filter_%s_config_help=%s%s", b->name, f->config_help,
            n && f->config_help[n - 1] == '\n' ? "" : "\n");
  }
}

static int
filter_preconnect (struct backend *b, int readonly)
{
  if (F (b)->preconnect)
    return F (b)->preconnect (backend_preconnect, b->next, readonly);
  return backend_preconnect (b->next, readonly);
}

static int
filter_list_exports (struct backend *b, int readonly, int is_tls,
                     struct nbdkit_exports *exports)
{
  if (F (b)->list_exports)
    return F (b)->list_exports (backend_list_exports, b->next, readonly, is_tls, exports);
  return backend_list_exports (b->next, readonly, exports);
}

static const char *
filter_default_export (struct backend *b, int readonly, int is_tls)
{
  if (F (b)->default_export)
    return F (b)->default_export (backend_default_export, b->next, readonly, is_tls);
  return backend_default_export (b->next, readonly);
}

/* ---- per context ---------------------------------------------------- */

/* While a filter callback runs, the calling context is the filter's, as
 * nbdkit's threadlocal context is: nbdkit_next_context_open from inside
 * it (retry's reopen) then opens a context tied to the connection. */
#define AS_CALLER(c, call)                                              \
  ({                                                                    \
    struct context *saved_ = backend_current_ctx;                       \
    backend_current_ctx = (c);                                          \
    __typeof__ (call) r_ = (call);                                      \
    backend_current_ctx = saved_;                                       \
    r_;                                                                 \
  })

/* ---- contexts, for filters (nbdkit's API: nbdkit-filter.h) ---------- */

/* A context of the layer below the one being opened or running.  Not
 * prepared: the filter calls next->prepare, as with nbdkit.  Tied to the
 * calling context's connection unless shared (a background or
 * cross-connection context, as nbdkit's). */
PUBLIC_API nbdkit_next *
nbdkit_next_context_open (nbdkit_backend *b, int readonly, const char *exportname,
                          int shared)
{
  struct context *cur = backend_current_ctx;
  if (!b) {
    nbdkit_error ("nbdkit_next_context_open: no backend");
    return NULL;
  }
  if (cur && b != cur->b->next) {
    nbdkit_error ("nbdkit_next_context_open: not the layer below the caller");
    return NULL;
  }
  return backend_open (b, readonly, exportname, shared || !cur || !cur->conn);
}

PUBLIC_API void
nbdkit_next_context_close (nbdkit_next *next)
{
  if (next)
    backend_close (next);
}

PUBLIC_API nbdkit_backend *
nbdkit_context_get_backend (nbdkit_context *c)
{
  return c ? c->b->next : NULL;
}

PUBLIC_API nbdkit_next *
nbdkit_context_set_next (nbdkit_context *c, nbdkit_next *next)
{
  if (!c || (next && next->b != c->b->next))
    return NULL;
  struct context *old = c->c_next;
  c->c_next = next;
  return old;
}

/* What a filter's .open calls as `next`: open the layer below, tied to
 * this context's connection, and make it this context's next. */
static int
next_open (struct context *c, int readonly, const char *exportname)
{
  struct context *n = nbdkit_next_context_open (c->b->next, readonly, exportname, 0);
  if (!n)
    return -1;
  nbdkit_context_set_next (c, n);
  return 0;
}

static void *
filter_open (struct context *c, int readonly, const char *exportname, int is_tls)
{
  if (F (c->b)->open)
    return F (c->b)->open (next_open, c, readonly, exportname, is_tls);
  return next_open (c, readonly, exportname) == -1 ? NULL : NBDKIT_HANDLE_NOT_NEEDED;
}

static void
filter_close (struct context *c)
{
  if (F (c->b)->close)
    F (c->b)->close (c->handle);
}

static int
filter_prepare (struct context *c, int readonly)
{
  if (F (c->b)->prepare)
    return AS_CALLER (c, F (c->b)->prepare (c->c_next, c->handle, readonly));
  return 0;
}

static int
filter_finalize (struct context *c)
{
  if (F (c->b)->finalize)
    return AS_CALLER (c, F (c->b)->finalize (c->c_next, c->handle));
  return 0;
}

/* Every other callback: the filter's if it has one (called as the
 * filter's context, with the layer below as `next`), else the same call
 * straight on the layer below. */

static const char *
filter_export_description (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->export_description)
    return AS_CALLER (c, f->export_description (c->c_next, c->handle));
  return backend_export_description (c->c_next);
}

static int64_t
filter_get_size (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->get_size)
    return AS_CALLER (c, f->get_size (c->c_next, c->handle));
  return backend_get_size (c->c_next);
}

static int
filter_block_size (struct context *c, uint32_t *min, uint32_t *pref, uint32_t *max)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->block_size)
    return AS_CALLER (c, f->block_size (c->c_next, c->handle, min, pref, max));
  return backend_block_size (c->c_next, min, pref, max);
}

static int
filter_can_write (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->can_write)
    return AS_CALLER (c, f->can_write (c->c_next, c->handle));
  return backend_can_write (c->c_next);
}

static int
filter_can_flush (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->can_flush)
    return AS_CALLER (c, f->can_flush (c->c_next, c->handle));
  return backend_can_flush (c->c_next);
}

static int
filter_is_rotational (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->is_rotational)
    return AS_CALLER (c, f->is_rotational (c->c_next, c->handle));
  return backend_is_rotational (c->c_next);
}

static int
filter_can_trim (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->can_trim)
    return AS_CALLER (c, f->can_trim (c->c_next, c->handle));
  return backend_can_trim (c->c_next);
}

static int
filter_can_zero (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->can_zero)
    return AS_CALLER (c, f->can_zero (c->c_next, c->handle));
  return backend_can_zero (c->c_next);
}

static int
filter_can_fast_zero (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->can_fast_zero)
    return AS_CALLER (c, f->can_fast_zero (c->c_next, c->handle));
  return backend_can_fast_zero (c->c_next);
}

static int
filter_can_extents (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->can_extents)
    return AS_CALLER (c, f->can_extents (c->c_next, c->handle));
  return backend_can_extents (c->c_next);
}

static int
filter_can_fua (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->can_fua)
    return AS_CALLER (c, f->can_fua (c->c_next, c->handle));
  return backend_can_fua (c->c_next);
}

static int
filter_can_multi_conn (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->can_multi_conn)
    return AS_CALLER (c, f->can_multi_conn (c->c_next, c->handle));
  return backend_can_multi_conn (c->c_next);
}

static int
filter_can_cache (struct context *c)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->can_cache)
    return AS_CALLER (c, f->can_cache (c->c_next, c->handle));
  return backend_can_cache (c->c_next);
}

static int
filter_pread (struct context *c, void *buf, uint32_t count, uint64_t offset, uint32_t flags,
              int *err)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->pread)
    return AS_CALLER (c, f->pread (c->c_next, c->handle, buf, count, offset, flags, err));
  return backend_pread (c->c_next, buf, count, offset, flags, err);
}

static int
filter_pwrite (struct context *c, const void *buf, uint32_t count, uint64_t offset,
               uint32_t flags, int *err)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->pwrite)
    return AS_CALLER (c, f->pwrite (c->c_next, c->handle, buf, count, offset, flags, err));
  return backend_pwrite (c->c_next, buf, count, offset, flags, err);
}

static int
filter_flush (struct context *c, uint32_t flags, int *err)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->flush)
    return AS_CALLER (c, f->flush (c->c_next, c->handle, flags, err));
  return backend_flush (c->c_next, flags, err);
}

static int
filter_trim (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->trim)
    return AS_CALLER (c, f->trim (c->c_next, c->handle, count, offset, flags, err));
  return backend_trim (c->c_next, count, offset, flags, err);
}

static int
filter_zero (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->zero)
    return AS_CALLER (c, f->zero (c->c_next, c->handle, count, offset, flags, err));
  return backend_zero (c->c_next, count, offset, flags, err);
}

static int
filter_extents (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                struct nbdkit_extents *e, int *err)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->extents)
    return AS_CALLER (c, f->extents (c->c_next, c->handle, count, offset, flags, e, err));
  return backend_extents (c->c_next, count, offset, flags, e, err);
}

static int
filter_cache (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  const struct nbdkit_filter *f = F (c->b);
  if (f->cache)
    return AS_CALLER (c, f->cache (c->c_next, c->handle, count, offset, flags, err));
  return backend_cache (c->c_next, count, offset, flags, err);
}

static const struct backend filter_ops = {
  .type = "filter",
  .thread_model = filter_thread_model,
  .magic_config_key = filter_magic_config_key,
  .config = filter_config,
  .config_complete = filter_config_complete,
  .get_ready = filter_get_ready,
  .after_fork = filter_after_fork,
  .cleanup = filter_cleanup,
  .unload = filter_unload,
  .dump = filter_dump,
  .preconnect = filter_preconnect,
  .list_exports = filter_list_exports,
  .default_export = filter_default_export,
  .open = filter_open,
  .prepare = filter_prepare,
  .finalize = filter_finalize,
  .close = filter_close,
  .export_description = filter_export_description,
  .get_size = filter_get_size,
  .block_size = filter_block_size,
  .can_write = filter_can_write,
  .can_flush = filter_can_flush,
  .is_rotational = filter_is_rotational,
  .can_trim = filter_can_trim,
  .can_zero = filter_can_zero,
  .can_fast_zero = filter_can_fast_zero,
  .can_extents = filter_can_extents,
  .can_fua = filter_can_fua,
  .can_multi_conn = filter_can_multi_conn,
  .can_cache = filter_can_cache,
  .pread = filter_pread,
  .pwrite = filter_pwrite,
  .flush = filter_flush,
  .trim = filter_trim,
  .zero = filter_zero,
  .extents = filter_extents,
  .cache = filter_cache,
  /* Zero copy cannot pass through an nbdkit filter: its ABI has no lend
   * or place call, so the filter would never see the data.  NULL: the
   * stack answers ENOTSUP and the request is copied through pread. */
  .pread_lend = NULL,
  .lend_release = NULL,
  .pread_fd = NULL,
  .pwrite_place = NULL,
  .pwrite_commit = NULL,
};

/* ---- loading -------------------------------------------------------- */

struct backend *
filter_layer_load (struct backend *next, const char *name)
{
  struct filter_layer *fl = calloc (1, sizeof *fl);
  if (!fl) {
    fprintf (stderr, "blkd: out of memory\n");
    return NULL;
  }
  fl->b = filter_ops;
  struct backend *b = &fl->b;
  b->next = next;
  b->i = next->i + 1;
  const struct nbdkit_filter *(*init) (void) = layer_load (LAYER_FILTER, name, &b->filename,
                                                          &fl->dl);
  if (!init)
    goto fail;
  const struct nbdkit_filter *theirs = init ();
  if (!theirs) {
    fprintf (stderr, "blkd: %s: filter_init returned NULL\n", b->filename);
    goto fail;
  }
  /* nbdkit guarantees only these two fields across versions: the rest of
   * the struct is laid out as in the nbdkit the filter was built for. */
  if (theirs->_api_version != NBDKIT_FILTER_API_VERSION) {
    fprintf (stderr, "blkd: %s: filter is incompatible with this blkd (built for nbdkit "
             "filter API %d, need %d)\n", b->filename, theirs->_api_version,
             NBDKIT_FILTER_API_VERSION);
    goto fail;
  }
  if (!theirs->_version || strcmp (theirs->_version, NBDKIT_VERSION_STRING) != 0) {
    fprintf (stderr, "blkd: %s: filter is incompatible with this blkd (built for nbdkit "
             "%s, need %s)\n", b->filename, theirs->_version ? theirs->_version : "<null>",
             NBDKIT_VERSION_STRING);
    goto fail;
  }
  fl->f = *theirs;
  if (!layer_valid_name (fl->f.name)) {
    fprintf (stderr, "blkd: %s: filter name is missing or invalid\n", b->filename);
    goto fail;
  }
  if (!(b->name = strdup (fl->f.name))) {
    fprintf (stderr, "blkd: out of memory\n");
    goto fail;
  }
  if (debug_flags_apply (fl->dl, b->name, b->filename) == -1)   /* -D NAME.FLAG=N */
    goto fail;
  for (int i = 0; inline_filters[i]; i++)
    if (strcmp (b->name, inline_filters[i]) == 0)
      b->inline_safe = true;
  if (fl->f.load)
    fl->f.load ();
  fl->loaded = true;
  return b;

fail:
  filter_unload (b);
  return NULL;
}
