/* The nbdkit plugin API as blkd implements it: per-thread context and the
 * extents/exports containers the core hands to plugins. */
#ifndef BLKD_PUBLIC_H
#define BLKD_PUBLIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* On every function of nbdkit's API blkd defines (public.c, extents.c,
 * exports.c, filter.c): the server is built with hidden visibility, and
 * these are what server/blkd.syms exports to plugins and filters. */
#define PUBLIC_API __attribute__((visibility ("default")))

/* What nbdkit_export_name/is_tls/peer_* answer.  The core points
 * public_current at the connection's context around every plugin call
 * (shard thread or worker); NULL outside a connection. */
struct public_intern;                 /* list of strings made by *_intern */
struct backend_conn;                  /* internal.h */
struct public_conn_ctx {
  const char *export_name;            /* NULL before the client named one */
  bool is_tls;
  int peer_fd;                        /* socket, for getpeername/SO_PEERCRED */
  struct public_intern *interns;      /* freed by public_conn_ctx_release */
  struct backend_conn *owner;         /* the connection; NULL: none (a shared context) */
};
extern __thread struct public_conn_ctx *public_current;

/* Frees the strings interned during the connection. */
void public_conn_ctx_release (struct public_conn_ctx *ctx);
/* Frees strings interned outside any connection (at exit). */
void public_release_global (void);

/* Set by the core: plugin configuration phase over (for nbdkit_stdio_safe),
 * and the callback nbdkit_shutdown calls to stop the server. */
extern bool public_config_done;
extern void (*public_shutdown_hook) (void);

/* Extents: the container for one BLOCK_STATUS (or sparse-read) query.
 * Holds [start, end) and the merged, clipped list of extents the plugin
 * added, with nbdkit's rules (ascending, contiguous, ERANGE otherwise). */
struct public_extent {
  uint64_t offset;
  uint64_t length;
  uint32_t type;                      /* NBDKIT_EXTENT_HOLE | _ZERO bits */
};
struct nbdkit_extents {
  uint64_t start, end;
  struct public_extent *v;
  size_t len, cap;
  uint64_t next;                      /* where the next extent must start */
};
struct nbdkit_extents *public_extents_new (uint64_t start, uint64_t end);
void public_extents_free (struct nbdkit_extents *e);

/* Exports: what .list_exports fills. */
struct public_export {
  char *name;
  char *description;                  /* may be NULL */
};
struct nbdkit_exports {
  struct public_export *v;
  size_t len, cap;
  bool use_default;                   /* nbdkit_use_default_export called */
};
struct nbdkit_exports *public_exports_new (void);
void public_exports_free (struct nbdkit_exports *e);
/* Resolves nbdkit_use_default_export: appends the export `name` (no
 * description, same checks as nbdkit_add_export) and clears use_default,
 * as nbdkit's exports_resolve_default does.  -1 with nbdkit_error. */
int public_exports_add_name (struct nbdkit_exports *e, const char *name);

/* nbdkit_set_error's value for this thread (0 = none).  The core reads it
 * with public_take_error after a failing callback, which also clears it so
 * a stale value from a succeeding callback cannot leak into a later one;
 * call it (discarding the result) before a callback to be sure. */
extern __thread int public_last_error;
int public_take_error (void);

/* Shutdown: nbdkit_shutdown sets a flag, wakes nbdkit_nanosleep sleepers
 * and calls public_shutdown_hook (every call; the hook must be idempotent).
 * public_begin_shutdown does the same minus the hook, and is
 * async-signal-safe, so the core's signal handler can wake sleeping plugin
 * threads.  public_shutdown_requested says whether either happened, e.g.
 * a plugin called nbdkit_shutdown during config before the hook was set. */
void public_begin_shutdown (void);
bool public_shutdown_requested (void);

/* nbdkit asserts on an index past a container's count; a filter that
 * does it is broken, and carrying on would hand it memory past the array:
 * log and abort. */
void public_index_abort (const char *fn, size_t i, size_t len)
  __attribute__((noreturn));

/* Exported to plugins, but declared only in nbdkit-filter.h: plugins'
 * statically-linked cleanup code calls them.  Same as public_*_free. */
void nbdkit_extents_free (struct nbdkit_extents *e);
void nbdkit_exports_free (struct nbdkit_exports *e);

#endif
