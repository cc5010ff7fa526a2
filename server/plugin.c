/* The plugin layer: loads an nbdkit-API plugin and puts it at the bottom
 * of the layer stack, with the defaults and emulations nbdkit 1.32's
 * plugins.c gives (can_* from the callbacks present, FUA by flush, zero
 * by writing zeros when the plugin says ENOTSUP). */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "blkd-plugin.h"

#ifndef NBDKIT_PLUGINDIR
#error "NBDKIT_PLUGINDIR comes from pkg-config (see the Makefile)"
#endif

/* One plugin per process, as in nbdkit: the layer's state is static. */
static struct nbdkit_plugin p;      /* our zero-padded copy of theirs */
static void *dl;
static int api_version;
static bool loaded;                 /* .load ran: .unload is due */
static struct backend layer;       /* defined at the end */
/* blkd's own extension (include/blkd-plugin.h), NULL for nbdkit's plugins. */
static const struct blkd_plugin_extension *ext;
static struct {
  atomic_ullong lent_bytes, lent_replies, sendfile_replies, placed_bytes, placed_writes;
} lend_stats;                       /* any thread */

/* Writes nobody sees the data of: zero emulation through pwrite. */
#define ZERO_BUF_SIZE (1024 * 1024)
static void *zero_buf;

/* Plugins whose every call completes from memory in microseconds: calling
 * them on the shard thread beats any hand-off.  A plugin not named here
 * might block (disk, network), so it goes to the workers unless the user
 * says --dispatch=inline. */
static const char *const inline_plugins[] = {
  "ram", "memory", "null", "zero", "pattern", "data", "sparse-random",
  "random", "full", "info", "partial", NULL
};

const char *plugin_name (void) { return p.name; }

static int
plugin_open_dl (const char *name)
{
  struct nbdkit_plugin *(*init) (void) = layer_load (LAYER_PLUGIN, name, &layer.filename, &dl);
  if (!init)
    return -1;
  const char *path = layer.filename;
  const struct nbdkit_plugin *theirs = init ();
  if (!theirs) {
    fprintf (stderr, "blkd: %s: plugin_init returned NULL\n", path);
    return -1;
  }
  api_version = theirs->_api_version;
  if (api_version < 0 || api_version > 2) {
    fprintf (stderr, "blkd: %s: unsupported plugin API version %d\n", path, api_version);
    return -1;
  }
  /* Older plugins have a shorter struct: copy what they have, zeros after. */
  memset (&p, 0, sizeof p);
  size_t n = theirs->_struct_size < sizeof p ? theirs->_struct_size : sizeof p;
  memcpy (&p, theirs, n);
  if (!layer_valid_name (p.name)) {
    fprintf (stderr, "blkd: %s: plugin name is missing or invalid\n", path);
    return -1;
  }
  if (debug_flags_apply (dl, p.name, path) == -1)
    return -1;
  bool has_pread = api_version == 1 ? p._pread_v1 != NULL : p.pread != NULL;
  if (!p.open || !p.get_size || !has_pread) {
    fprintf (stderr, "blkd: %s: plugin must define open, get_size and pread\n", path);
    return -1;
  }
  ext = dlsym (dl, "blkd_plugin_extension");
  if (ext && (ext->version != BLKD_PLUGIN_EXTENSION_VERSION
              || ext->size < offsetof (struct blkd_plugin_extension, lend_release)
                             + sizeof ext->lend_release)) {
    fprintf (stderr, "blkd: %s: blkd_plugin_extension version %u size %u not understood; "
             "copying instead\n", path, ext->version, ext->size);
    ext = NULL;
  }
  layer.name = strdup (p.name);
  return layer.name ? 0 : -1;
}

/* ---- lifecycle ------------------------------------------------------ */

static int
plugin_thread_model (struct backend *b)
{
  int model = p._thread_model;
  if (p.thread_model) {
    int m = p.thread_model ();
    if (m == -1) {
      fprintf (stderr, "blkd: %s: thread_model failed\n", p.name);
      return -1;
    }
    if (m < model)
      model = m;
  }
  return model;
}

static const char *
plugin_magic_config_key (struct backend *b)
{
  return p.magic_config_key;
}

static int
plugin_config (struct backend *b, const char *key, const char *value)
{
  if (!p.config) {
    fprintf (stderr, "blkd: %s: plugin takes no parameters, got '%s'\n", p.name, key);
    return -1;
  }
  if (p.config (key, value) == -1) {
    fprintf (stderr, "blkd: %s: bad parameter '%s'\n", p.name, key);
    return -1;
  }
  return 0;
}

static int
plugin_config_complete (struct backend *b)
{
  if (p.config_complete && p.config_complete () == -1) {
    fprintf (stderr, "blkd: %s: configuration incomplete (see --dump-plugin or the "
             "plugin's manual)\n", p.name);
    return -1;
  }
  return 0;
}

static int
plugin_get_ready (struct backend *b)
{
  if (p.get_ready && p.get_ready () == -1) {
    fprintf (stderr, "blkd: %s: get_ready failed\n", p.name);
    return -1;
  }
  return 0;
}

static int
plugin_after_fork (struct backend *b)
{
  if (p.after_fork && p.after_fork () == -1) {
    fprintf (stderr, "blkd: %s: after_fork failed\n", p.name);
    return -1;
  }
  return 0;
}

static void
plugin_cleanup (struct backend *b)
{
  if (p.cleanup)
    p.cleanup ();
}

static void
plugin_unload (struct backend *b)
{
  if (dl) {
    if (loaded && p.unload)
      p.unload ();
    loaded = false;
    /* dlclose is skipped under ASan so leak reports keep symbol names;
     * everywhere else the plugin is unloaded as nbdkit does. */
#ifndef __SANITIZE_ADDRESS__
    dlclose (dl);
#endif
    dl = NULL;
  }
  ext = NULL;
  free (layer.filename);
  free (layer.name);
  layer.filename = layer.name = NULL;
  free (zero_buf);
  zero_buf = NULL;
}

static void
plugin_dump (struct backend *b)
{
  printf ("path=%s\nname=%s\n", layer.filename, p.name);
  if (p.version)
    printf ("version=%s\n", p.version);
  printf ("api_version=%d\nstruct_size=%llu\n", api_version,
          (unsigned long long) p._struct_size);
  static const char *const models[] = { "serialize_connections",
    "serialize_all_requests", "serialize_requests", "parallel" };
  int stack_model = backend_thread_model ();
  printf ("max_thread_model=%s\n", p._thread_model >= NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS
          && p._thread_model <= NBDKIT_THREAD_MODEL_PARALLEL
          ? models[p._thread_model] : "unknown");
  printf ("thread_model=%s\n", stack_model >= NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS
          && stack_model <= NBDKIT_THREAD_MODEL_PARALLEL ? models[stack_model] : "unknown");
  printf ("errno_is_preserved=%d\n", p.errno_is_preserved);
  if (p.magic_config_key)
    printf ("magic_config_key=%s\n", p.magic_config_key);
#define HAS(f) printf ("has_%s=%d\n", #f, p.f != NULL)
  HAS (longname); HAS (description); HAS (load); HAS (unload); HAS (dump_plugin);
  HAS (config); HAS (config_complete); HAS (config_help); HAS (thread_model);
  HAS (get_ready); HAS (after_fork); HAS (cleanup); HAS (preconnect);
  HAS (list_exports); HAS (default_export); HAS (open); HAS (close);
  HAS (export_description); HAS (get_size); HAS (block_size); HAS (can_write);
  HAS (can_flush); HAS (is_rotational); HAS (can_trim); HAS (can_zero);
  HAS (can_fast_zero); HAS (can_extents); HAS (can_fua); HAS (can_multi_conn);
  HAS (can_cache); HAS (pread); HAS (pwrite); HAS (flush); HAS (trim);
  HAS (zero); HAS (extents); HAS (cache);
#undef HAS
  if (p.config_help)
    printf ("%s_config_help=%s\n", p.name, p.config_help);
  fflush (stdout);
  if (p.dump_plugin)
    p.dump_plugin ();
  fflush (stdout);
}

static int
plugin_preconnect (struct backend *b, int readonly)
{
  return p.preconnect ? p.preconnect (readonly) : 0;
}

static int
plugin_list_exports (struct backend *b, int readonly, int is_tls,
                     struct nbdkit_exports *e)
{
  if (!p.list_exports)
    return nbdkit_use_default_export (e);
  return p.list_exports (readonly, is_tls, e);
}

static const char *
plugin_default_export (struct backend *b, int readonly, int is_tls)
{
  if (p.default_export)
    return p.default_export (readonly, is_tls);
  return cfg.export_name ? cfg.export_name : "";
}

/* ---- per context ----------------------------------------------------- */

/* The errno a failed callback meant: nbdkit_set_error first, then errno if
 * the plugin promises to preserve it, else EIO.  Never 0. */
static int
callback_error (int saved_errno)
{
  int err = public_take_error ();
  if (!err && p.errno_is_preserved)
    err = saved_errno;
  return err > 0 ? err : EIO;
}

static inline int
fail (int *err, int saved_errno)
{
  *err = callback_error (saved_errno);
  return -1;
}

static void *
plugin_open (struct context *c, int readonly, const char *exportname, int is_tls)
{
  /* nbdkit_export_name answers with the name this layer was opened with,
   * which a filter may have changed. */
  if (c->conn) {
    const char *n = nbdkit_strdup_intern (exportname);
    if (!n)
      return NULL;
    c->conn->ctx.export_name = n;
  }
  return p.open (readonly);
}

static void
plugin_close (struct context *c)
{
  if (p.close)
    p.close (c->handle);
}

/* Plugins have no .prepare or .finalize, as in nbdkit. */
static int plugin_prepare (struct context *c, int readonly) { return 0; }
static int plugin_finalize (struct context *c) { return 0; }

static const char *
plugin_export_description (struct context *c)
{
  return p.export_description ? p.export_description (c->handle) : NULL;
}

static int64_t
plugin_get_size (struct context *c)
{
  return p.get_size (c->handle);
}

static int
plugin_block_size (struct context *c, uint32_t *min, uint32_t *pref, uint32_t *max)
{
  *min = *pref = *max = 0;
  return p.block_size ? p.block_size (c->handle, min, pref, max) : 0;
}

/* A boolean can_* callback (normalised to 0/1), or the default. */
static inline int
can (int (*cb) (void *), struct context *c, int dflt)
{
  if (!cb)
    return dflt;
  int r = cb (c->handle);
  return r < 0 ? -1 : r > 0;
}

static int
plugin_can_write (struct context *c)
{
  return can (p.can_write, c, api_version == 1 ? p._pwrite_v1 != NULL : p.pwrite != NULL);
}

static int
plugin_can_flush (struct context *c)
{
  return can (p.can_flush, c, api_version == 1 ? p._flush_v1 != NULL : p.flush != NULL);
}

static int
plugin_is_rotational (struct context *c)
{
  return can (p.is_rotational, c, 0);
}

static int
plugin_can_trim (struct context *c)
{
  return can (p.can_trim, c, api_version == 1 ? p._trim_v1 != NULL : p.trim != NULL);
}

static bool
has_zero (void)
{
  return api_version == 1 ? p._zero_v1 != NULL : p.zero != NULL;
}

static int
plugin_can_zero (struct context *c)
{
  /* A plugin without .zero is still offered WRITE_ZEROES: by pwrite. */
  int r = can (p.can_zero, c, has_zero ());
  if (r < 0)
    return -1;
  return r && has_zero () ? NBDKIT_ZERO_NATIVE : NBDKIT_ZERO_EMULATE;
}

static int
plugin_can_fast_zero (struct context *c)
{
  if (p.can_fast_zero)
    return can (p.can_fast_zero, c, 0);
  /* With no native zero we can fail fast instead of writing zeros. */
  return backend_can_zero (c) == NBDKIT_ZERO_EMULATE;
}

static int
plugin_can_fua (struct context *c)
{
  int r;
  if (p.can_fua) {
    if ((r = p.can_fua (c->handle)) < 0)
      return -1;
  }
  else
    r = NBDKIT_FUA_EMULATE;
  if (api_version == 1 && r > NBDKIT_FUA_EMULATE)
    r = NBDKIT_FUA_EMULATE;
  if (r == NBDKIT_FUA_EMULATE) {
    int f = backend_can_flush (c);
    if (f < 0)
      return -1;
    if (!f)
      r = NBDKIT_FUA_NONE;
  }
  return r;
}

static int
plugin_can_multi_conn (struct context *c)
{
  return can (p.can_multi_conn, c, 0);
}

static int
plugin_can_cache (struct context *c)
{
  if (p.can_cache)
    return p.can_cache (c->handle);
  return p.cache ? NBDKIT_CACHE_NATIVE : NBDKIT_CACHE_NONE;
}

static int
plugin_can_extents (struct context *c)
{
  return p.extents ? can (p.can_extents, c, 1) : 0;
}

/* ---- the request path: one plugin call each, no lock here (the stack's
 * caller holds what the thread model asks for). ----------------------- */

static int
plugin_pread (struct context *c, void *buf, uint32_t count, uint64_t offset,
              uint32_t flags, int *err)
{
  int r = api_version == 1 ? p._pread_v1 (c->handle, buf, count, offset)
                           : p.pread (c->handle, buf, count, offset, 0);
  return r == -1 ? fail (err, errno) : 0;
}

static int
call_flush (struct context *c, int *err)
{
  int r;
  if (api_version == 1)
    r = p._flush_v1 ? p._flush_v1 (c->handle) : 0;
  else
    r = p.flush ? p.flush (c->handle, 0) : 0;
  return r == -1 ? fail (err, errno) : 0;
}

static int
plugin_flush (struct context *c, uint32_t flags, int *err)
{
  return call_flush (c, err);
}

/* FUA the plugin cannot do natively becomes a flush after the write. */
static inline bool
fua_native (struct context *c, uint32_t flags)
{
  return (flags & NBDKIT_FLAG_FUA) && c->can_fua == NBDKIT_FUA_NATIVE;
}

static inline int
finish_fua (struct context *c, int r, uint32_t flags, int *err)
{
  if (r == -1 || !(flags & NBDKIT_FLAG_FUA) || c->can_fua != NBDKIT_FUA_EMULATE)
    return r;
  return call_flush (c, err);
}

static int
plugin_pwrite (struct context *c, const void *buf, uint32_t count, uint64_t offset,
               uint32_t flags, int *err)
{
  int r = api_version == 1
    ? p._pwrite_v1 (c->handle, buf, count, offset)
    : p.pwrite (c->handle, buf, count, offset, fua_native (c, flags) ? NBDKIT_FLAG_FUA : 0);
  if (r == -1)
    return fail (err, errno);
  return finish_fua (c, 0, flags, err);
}

static int
plugin_trim (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  int r = api_version == 1
    ? p._trim_v1 (c->handle, count, offset)
    : p.trim (c->handle, count, offset, fua_native (c, flags) ? NBDKIT_FLAG_FUA : 0);
  if (r == -1)
    return fail (err, errno);
  return finish_fua (c, 0, flags, err);
}

static int
plugin_zero (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  bool fast = flags & NBDKIT_FLAG_FAST_ZERO;
  int r;
  errno = 0;
  if (api_version == 2)
    r = p.zero (c->handle, count, offset,
                (flags & (NBDKIT_FLAG_MAY_TRIM | NBDKIT_FLAG_FAST_ZERO))
                | (fua_native (c, flags) ? NBDKIT_FLAG_FUA : 0));
  else
    r = p._zero_v1 (c->handle, count, offset, !!(flags & NBDKIT_FLAG_MAY_TRIM));
  if (r == 0)
    return finish_fua (c, 0, flags, err);
  *err = callback_error (errno);
  /* ENOTSUP means "do it the slow way", unless the client asked for fast. */
  if (*err != ENOTSUP && *err != EOPNOTSUPP)
    return -1;
  if (fast) {
    *err = ENOTSUP;
    return -1;
  }
  while (count > 0) {
    uint32_t n = count < ZERO_BUF_SIZE ? count : ZERO_BUF_SIZE;
    uint32_t wflags = (flags & NBDKIT_FLAG_FUA) && n == count ? NBDKIT_FLAG_FUA : 0;
    if (plugin_pwrite (c, zero_buf, n, offset, wflags, err) == -1)
      return -1;
    count -= n;
    offset += n;
  }
  return 0;
}

static int
plugin_cache (struct context *c, uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  if (p.cache && p.cache (c->handle, count, offset, 0) == -1)
    return fail (err, errno);
  return 0;
}

static int
plugin_extents (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                struct nbdkit_extents *e, int *err)
{
  size_t before = e->len;
  if (p.extents (c->handle, count, offset, flags & NBDKIT_FLAG_REQ_ONE, e) == -1)
    return fail (err, errno);
  /* A plugin that added nothing broke the contract; nbdkit says EINVAL. */
  if (e->len == before) {
    nbdkit_error ("extents: plugin must return at least one extent");
    *err = EINVAL;
    return -1;
  }
  return 0;
}

/* ---- zero copy (blkd's extension), as layer operations --------------- */

/* An extension call the plugin's struct is long enough to hold. */
#define EXT_HAS(field) \
  (ext && ext->size >= offsetof (struct blkd_plugin_extension, field) + sizeof ext->field \
   && ext->field)

/* The plugin's failure as the stack's: ENOTSUP (or E2BIG) means copy. */
static inline int
ext_fail (int *err, int saved_errno)
{
  *err = callback_error (saved_errno);
  if (*err == EOPNOTSUPP)
    *err = ENOTSUP;
  return -1;
}

static int
plugin_pread_lend (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                   struct blkd_lend *l, int *err)
{
  if (!EXT_HAS (lend_pread) || !EXT_HAS (lend_release)) {
    *err = ENOTSUP;
    return -1;
  }
  public_last_error = 0;
  if (ext->lend_pread (c->handle, count, offset, 0, l) == -1)
    return ext_fail (err, errno);
  atomic_fetch_add (&lend_stats.lent_bytes, count);
  atomic_fetch_add (&lend_stats.lent_replies, 1);
  return 0;
}

/* n is 0 only when a lend that covered nothing is taken back: the plugin
 * holds no token for it, but the bytes were counted. */
static void
plugin_lend_release (struct backend *b, void *const *token, unsigned n, uint32_t bytes)
{
  if (n)
    ext->lend_release (token, n);
  atomic_fetch_sub (&lend_stats.lent_bytes, bytes);
}

static int
plugin_pread_fd (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                 int *fd, uint64_t *file_offset, int *err)
{
  if (!EXT_HAS (pread_fd)) {
    *err = ENOTSUP;
    return -1;
  }
  public_last_error = 0;
  if (ext->pread_fd (c->handle, count, offset, 0, fd, file_offset) == -1)
    return ext_fail (err, errno);
  atomic_fetch_add (&lend_stats.sendfile_replies, 1);
  return 0;
}

static int
plugin_pwrite_place (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                     struct blkd_lend *dst, int *err)
{
  if (!EXT_HAS (pwrite_place) || !EXT_HAS (pwrite_commit)) {
    *err = ENOTSUP;
    return -1;
  }
  public_last_error = 0;
  if (ext->pwrite_place (c->handle, count, offset,
                         fua_native (c, flags) ? NBDKIT_FLAG_FUA : 0, dst) == -1)
    return ext_fail (err, errno);
  atomic_fetch_add (&lend_stats.placed_bytes, count);
  return 0;
}

/* FUA as pwrite does it: natively, or a flush after the commit. */
static int
plugin_pwrite_commit (struct context *c, uint32_t count, uint64_t offset, uint32_t flags,
                      struct blkd_lend *dst, bool ok, int *err)
{
  public_last_error = 0;
  int r = ext->pwrite_commit (c->handle, count, offset,
                              fua_native (c, flags) ? NBDKIT_FLAG_FUA : 0, dst, ok);
  if (r == -1)
    fail (err, errno);
  else
    r = finish_fua (c, 0, flags, err);
  atomic_fetch_sub (&lend_stats.placed_bytes, count);
  if (ok && r == 0)
    atomic_fetch_add (&lend_stats.placed_writes, 1);
  return r;
}

/* ---- the layer ------------------------------------------------------ */

static struct backend layer = {
  .type = "plugin",
  .thread_model = plugin_thread_model,
  .magic_config_key = plugin_magic_config_key,
  .config = plugin_config,
  .config_complete = plugin_config_complete,
  .get_ready = plugin_get_ready,
  .after_fork = plugin_after_fork,
  .cleanup = plugin_cleanup,
  .unload = plugin_unload,
  .dump = plugin_dump,
  .preconnect = plugin_preconnect,
  .list_exports = plugin_list_exports,
  .default_export = plugin_default_export,
  .open = plugin_open,
  .prepare = plugin_prepare,
  .finalize = plugin_finalize,
  .close = plugin_close,
  .get_size = plugin_get_size,
  .export_description = plugin_export_description,
  .block_size = plugin_block_size,
  .can_write = plugin_can_write,
  .can_flush = plugin_can_flush,
  .is_rotational = plugin_is_rotational,
  .can_trim = plugin_can_trim,
  .can_zero = plugin_can_zero,
  .can_fast_zero = plugin_can_fast_zero,
  .can_extents = plugin_can_extents,
  .can_fua = plugin_can_fua,
  .can_multi_conn = plugin_can_multi_conn,
  .can_cache = plugin_can_cache,
  .pread = plugin_pread,
  .pwrite = plugin_pwrite,
  .flush = plugin_flush,
  .trim = plugin_trim,
  .zero = plugin_zero,
  .extents = plugin_extents,
  .cache = plugin_cache,
  .pread_lend = plugin_pread_lend,
  .lend_release = plugin_lend_release,
  .pread_fd = plugin_pread_fd,
  .pwrite_place = plugin_pwrite_place,
  .pwrite_commit = plugin_pwrite_commit,
};

struct backend *
plugin_layer_load (const char *name)
{
  if (plugin_open_dl (name) == -1) {
    plugin_unload (&layer);
    return NULL;
  }
  if (p.load)
    p.load ();
  loaded = true;
  layer.next = NULL;
  layer.i = 0;
  layer.inline_safe = false;
  for (int i = 0; inline_plugins[i]; i++)
    if (strcmp (p.name, inline_plugins[i]) == 0)
      layer.inline_safe = true;
  zero_buf = calloc (1, ZERO_BUF_SIZE);
  if (!zero_buf) {
    fprintf (stderr, "blkd: out of memory\n");
    plugin_unload (&layer);
    return NULL;
  }
  return &layer;
}

/* nbdkit's plugin usage, printed after the server's for PLUGIN --help:
 * name (longname), path, description, config_help. */
int
plugin_help (const char *name)
{
  if (!plugin_layer_load (name)) {
    plugin_unload (&layer);
    return -1;
  }
  printf ("plugin: %s", p.name);
  if (p.longname)
    printf (" (%s)", p.longname);
  printf ("\n(%s)\n", layer.filename);
  const char *const texts[] = { p.description, p.config_help };
  for (size_t i = 0; i < 2; i++) {
    size_t n = texts[i] ? strlen (texts[i]) : 0;
    if (n)
      printf ("%s%s", texts[i], texts[i][n - 1] == '\n' ? "" : "\n");
  }
  fflush (stdout);
  plugin_unload (&layer);
  public_release_global ();
  return 0;
}

void
plugin_lend_stats (struct plugin_lend_stats *out)
{
  out->lent_bytes = atomic_load (&lend_stats.lent_bytes);
  out->lent_replies = atomic_load (&lend_stats.lent_replies);
  out->sendfile_replies = atomic_load (&lend_stats.sendfile_replies);
  out->placed_bytes = atomic_load (&lend_stats.placed_bytes);
  out->placed_writes = atomic_load (&lend_stats.placed_writes);
}
