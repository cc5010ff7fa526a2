/* The layer stack: one interface that every layer (each nbdkit filter,
 * blkd's block cache, the plugin) sits behind, the per-connection
 * contexts, and the backend_* calls made on the outermost context.
 *
 * As in nbdkit's server/backend.c, a `struct backend` is one loaded layer
 * and `b->next` the layer below it (NULL for the plugin); a `struct
 * context` is one open instance of a layer, and `c->c_next` the context
 * of the layer below that it opened.  A context starts with the
 * nbdkit_next call table, so the pointer filters receive as `nbdkit_next *`
 * is the context itself, and `nbdkit_backend *` is the layer below.
 *
 * Order, outermost first: --filter layers in command-line order, then the
 * cache (only with --cache), then the plugin. */
#ifndef BLKD_BACKEND_H
#define BLKD_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#define NBDKIT_INTERNAL             /* nbdkit_next is our struct context */
#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>
#include <nbdkit-plugin.h>

#include "internal.h"

/* Context state bits, as nbdkit's. */
#define CTX_OPEN       1u           /* .open succeeded */
#define CTX_PREPARED   2u           /* .prepare succeeded */
#define CTX_FAILED     4u           /* .finalize failed: nothing more on it */

struct backend;
struct blkd_lend;

struct context {
  struct nbdkit_next_ops next;      /* must be first: filters call through it */
  void *handle;                     /* the layer's handle for this context */
  struct backend *b;
  struct context *c_next;           /* the layer below's context, or NULL */
  struct backend_conn *conn;        /* the connection it serves; NULL: shared */
  unsigned state;                   /* CTX_* */
  /* What the layer answered, cached as nbdkit does (-1: not asked yet). */
  int64_t exportsize;
  int64_t block_min, block_pref, block_max;
  int can_write, can_flush, is_rotational, can_trim, can_zero, can_fast_zero;
  int can_extents, can_fua, can_multi_conn, can_cache;
};

/* One layer.  Lifecycle calls return -1 after printing why; the request
 * calls follow nbdkit's convention (-1 and *err) because filters call them
 * through nbdkit_next. */
struct backend {
  struct backend *next;             /* the layer below; NULL: the plugin */
  unsigned i;                       /* 0 for the plugin, counting outwards */
  const char *type;                 /* "plugin", "cache" or "filter" */
  char *name;                       /* the layer's .name */
  char *filename;                   /* the .so it came from; NULL: built in */
  bool inline_safe;                 /* never blocks: fine on the shard thread */

  int (*thread_model) (struct backend *b);
  const char *(*magic_config_key) (struct backend *b);
  int (*config) (struct backend *b, const char *key, const char *value);
  int (*config_complete) (struct backend *b);
  int (*get_ready) (struct backend *b);
  int (*after_fork) (struct backend *b);
  void (*cleanup) (struct backend *b);
  void (*unload) (struct backend *b);
  void (*dump) (struct backend *b);
  int (*preconnect) (struct backend *b, int readonly);
  int (*list_exports) (struct backend *b, int readonly, int is_tls,
                       struct nbdkit_exports *exports);
  const char *(*default_export) (struct backend *b, int readonly, int is_tls);

  void *(*open) (struct context *c, int readonly, const char *exportname, int is_tls);
  int (*prepare) (struct context *c, int readonly);
  int (*finalize) (struct context *c);
  void (*close) (struct context *c);

  int64_t (*get_size) (struct context *c);
  const char *(*export_description) (struct context *c);
  int (*block_size) (struct context *c, uint32_t *min, uint32_t *pref, uint32_t *max);
  int (*can_write) (struct context *c);
  int (*can_flush) (struct context *c);
  int (*is_rotational) (struct context *c);
  int (*can_trim) (struct context *c);
  int (*can_zero) (struct context *c);
  int (*can_fast_zero) (struct context *c);
  int (*can_extents) (struct context *c);
  int (*can_fua) (struct context *c);
  int (*can_multi_conn) (struct context *c);
  int (*can_cache) (struct context *c);

  int (*pread) (struct context *c, void *buf, uint32_t count, uint64_t offset,
                uint32_t flags, int *err);
  int (*pwrite) (struct context *c, const void *buf, uint32_t count, uint64_t offset,
                 uint32_t flags, int *err);
  int (*flush) (struct context *c, uint32_t flags, int *err);
  int (*trim) (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
               int *err);
  int (*zero) (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
               int *err);
  int (*extents) (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                  struct nbdkit_extents *extents, int *err);
  int (*cache) (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                int *err);

  /* blkd's zero-copy extension (include/blkd-plugin.h) as layer
   * operations, with the request calls' convention.  A layer either
   * passes one through to the layer below or leaves it NULL, and the
   * stack then answers ENOTSUP: the request takes the copy path through
   * pread/pwrite.  nbdkit filters leave them NULL (their ABI has no such
   * call to pass through), and so does the cache (it must see the data
   * it keeps).  lend_release gets the tokens of one pread_lend back, on
   * any thread, without the thread model's lock and maybe after the
   * context closed: so it is called on the layer, not the context. */
  int (*pread_lend) (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                     struct blkd_lend *lend, int *err);
  void (*lend_release) (struct backend *b, void *const *token, unsigned n, uint32_t bytes);
  int (*pread_fd) (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                   int *fd, uint64_t *file_offset, int *err);
  int (*pwrite_place) (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                       struct blkd_lend *dst, int *err);
  int (*pwrite_commit) (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                        struct blkd_lend *dst, bool ok, int *err);
};

/* ---- the stack (built by stack.c, main thread) ---------------------- */

/* The outermost layer; NULL before backend_stack_load (stack.c, declared
 * in internal.h: main.c calls it), which also sets backend_model
 * (internal.h) and backend_stack_inline (every layer inline-safe). */
extern struct backend *backend_top;
extern bool backend_stack_inline;
/* The buffers zero and cache emulation use (backend.c): -1 with errno. */
int backend_buffers_alloc (void);
void backend_buffers_free (void);

/* Finding a layer's .so (layerpath.c): a name with a '/' or ending in .so
 * is a path; otherwise nbdkit-NAME-KIND.so in tree_dir/NAME/ next to the
 * running binary, then blkd_dir, then nbdkit_dir.  NULL if none is
 * readable.  layer_valid_name: nbdkit's rule for plugin and filter names. */
char *layer_find_so (const char *name, const char *kind, const char *tree_dir,
                     const char *blkd_dir, const char *nbdkit_dir);
bool layer_valid_name (const char *name);
/* Finds a plugin's or filter's .so and loads it: its plugin_init or
 * filter_init (for the caller to call through its own type), or NULL
 * after printing why.  *filename (malloc'd) and *dl are set as far as it
 * got, also on failure, for the caller to free and unload. */
enum layer_kind { LAYER_PLUGIN, LAYER_FILTER };
void *layer_load (enum layer_kind kind, const char *name, char **filename, void **dl);

/* The layer constructors (stack.c calls them): each returns the new layer
 * on top of `next`. */
struct backend *plugin_layer_load (const char *name);             /* plugin.c */
struct backend *cache_layer_new (struct backend *next);           /* cache.c */
struct backend *filter_layer_load (struct backend *next, const char *name); /* filter.c */

/* ---- calls on one layer, nbdkit's semantics (backend.c) -------------- */

int backend_config (struct backend *b, const char *key, const char *value);
int backend_config_complete (struct backend *b);
int backend_preconnect (struct backend *b, int readonly);
int backend_list_exports (struct backend *b, int readonly, struct nbdkit_exports *exports);
const char *backend_default_export (struct backend *b, int readonly);

struct context *backend_open (struct backend *b, int readonly, const char *exportname,
                              int shared);
int backend_prepare (struct context *c);
int backend_finalize (struct context *c);
void backend_close (struct context *c);

const char *backend_export_description (struct context *c);
int64_t backend_get_size (struct context *c);
int backend_block_size (struct context *c, uint32_t *min, uint32_t *pref, uint32_t *max);
int backend_can_write (struct context *c);
int backend_can_flush (struct context *c);
int backend_is_rotational (struct context *c);
int backend_can_trim (struct context *c);
int backend_can_zero (struct context *c);
int backend_can_fast_zero (struct context *c);
int backend_can_extents (struct context *c);
int backend_can_fua (struct context *c);
int backend_can_multi_conn (struct context *c);
int backend_can_cache (struct context *c);

int backend_pread (struct context *c, void *buf, uint32_t count, uint64_t offset,
                   uint32_t flags, int *err);
int backend_pwrite (struct context *c, const void *buf, uint32_t count, uint64_t offset,
                    uint32_t flags, int *err);
int backend_flush (struct context *c, uint32_t flags, int *err);
int backend_trim (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                  int *err);
int backend_zero (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                  int *err);
int backend_extents (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                     struct nbdkit_extents *extents, int *err);
int backend_cache (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                   int *err);

/* Zero copy (blkd's extension) on the stack: -1 and *err as above, with
 * *err ENOTSUP (or E2BIG) when no layer can do it this time: copy
 * instead.  The stack checks what comes back: lent or placed pieces that
 * do not cover the range exactly are given back, and the call fails
 * (EIO for a lend, ENOTSUP for a place, so the write is copied).
 * pwrite_place and pwrite_commit run under the thread model's lock
 * (backend_lock_request) like every request call; lend_release does not,
 * and starts at the layer the lend was asked of (backend_top). */
int backend_pread_lend (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                        struct blkd_lend *lend, int *err);
void backend_lend_release (struct backend *b, void *const *token, unsigned n,
                           uint32_t bytes);
int backend_pread_fd (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                      int *fd, uint64_t *file_offset, int *err);
int backend_pwrite_place (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                          struct blkd_lend *dst, int *err);
int backend_pwrite_commit (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                           struct blkd_lend *dst, bool ok, int *err);

/* The thread-local context that nbdkit_next_context_open (filter.c)
 * checks against, set around each layer's .open as nbdkit does. */
extern __thread struct context *backend_current_ctx;

#endif
