/* Plugin host: loads an nbdkit-API plugin and runs its lifecycle, locking
 * and emulations the way nbdkit 1.32 does. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "blkd-plugin.h"
#include "internal.h"

/* nbdkit's plugin directory comes from the build (pkg-config nbdkit):
 * it differs per architecture and distribution. */
#ifndef NBDKIT_PLUGINDIR
#error "NBDKIT_PLUGINDIR must be defined (pkg-config --variable=plugindir nbdkit)"
#endif

static struct nbdkit_plugin p;      /* our zero-padded copy of theirs */
static void *dl;
static char *plugin_path;
static int api_version;
static int thread_model;
static bool inline_safe;
static pthread_mutex_t all_requests_lock = PTHREAD_MUTEX_INITIALIZER;
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
int plugin_thread_model (void) { return thread_model; }
bool plugin_inline_safe (void) { return inline_safe; }

static bool
valid_plugin_name (const char *name)
{
  if (!name || !((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z')
                 || (name[0] >= '0' && name[0] <= '9')))
    return false;
  for (const char *s = name; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')
          || (*s >= '0' && *s <= '9') || *s == '-'))
      return false;
  return true;
}

/* Directory of the running executable, so an uninstalled ./blkd finds the
 * in-tree plugins next to it. */
char *
plugin_exe_dir (void)
{
  char buf[PATH_MAX];
  ssize_t n = readlink ("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    return NULL;
  buf[n] = '\0';
  char *slash = strrchr (buf, '/');
  if (slash)
    *slash = '\0';
  return strdup (buf);
}

/* A name with a '/' or ending in .so is a path; otherwise look in the
 * in-tree directory, blkd's plugin directory, then nbdkit's. */
static char *
find_plugin (const char *name)
{
  char *path = NULL;
  size_t len = strlen (name);

  if (strchr (name, '/') || (len > 3 && strcmp (name + len - 3, ".so") == 0))
  {
    char *resolved = realpath (name, NULL);
    return resolved ? resolved : strdup (name);
  }

  char *dir = plugin_exe_dir ();
  const char *dirs_fmt[3] = { "%s/plugins/%s/nbdkit-%s-plugin.so",
                              BLKD_PLUGINDIR "/nbdkit-%s-plugin.so",
                              NBDKIT_PLUGINDIR "/nbdkit-%s-plugin.so" };
  for (int i = 0; i < 3; i++) {
    int r = i == 0 ? (dir ? asprintf (&path, dirs_fmt[0], dir, name, name) : -1)
                   : asprintf (&path, dirs_fmt[i], name);
    if (r < 0) {
      path = NULL;
      continue;
    }
    if (access (path, R_OK) == 0)
      break;
    free (path);
    path = NULL;
  }
  free (dir);
  return path;
}

static int
plugin_open_dl (const char *name)
{
  plugin_path = find_plugin (name);
  if (!plugin_path) {
    fprintf (stderr, "blkd: plugin '%s' not found (looked in the tree, %s and %s)\n",
             name, BLKD_PLUGINDIR, NBDKIT_PLUGINDIR);
    return -1;
  }
  /* RTLD_NOW: a plugin importing a function we lack must fail here, not
   * crash on its first call (the imports are lazy JUMP_SLOTs). */
  dl = dlopen (plugin_path, RTLD_NOW | RTLD_GLOBAL);
  if (!dl) {
    fprintf (stderr, "blkd: cannot load plugin %s: %s\n", plugin_path, dlerror ());
    return -1;
  }
  struct nbdkit_plugin *(*init) (void) = (struct nbdkit_plugin *(*) (void)) dlsym (dl, "plugin_init");
  if (!init) {
    fprintf (stderr, "blkd: %s is not an nbdkit plugin (no plugin_init)\n", plugin_path);
    return -1;
  }
  struct nbdkit_plugin *theirs = init ();
  if (!theirs) {
    fprintf (stderr, "blkd: %s: plugin_init returned NULL\n", plugin_path);
    return -1;
  }
  api_version = theirs->_api_version;
  if (api_version < 0 || api_version > 2) {
    fprintf (stderr, "blkd: %s: unsupported plugin API version %d\n", plugin_path, api_version);
    return -1;
  }
  /* Older plugins have a shorter struct: copy what they have, zeros after. */
  memset (&p, 0, sizeof p);
  size_t n = theirs->_struct_size < sizeof p ? theirs->_struct_size : sizeof p;
  memcpy (&p, theirs, n);
  if (!valid_plugin_name (p.name)) {
    fprintf (stderr, "blkd: %s: plugin name is missing or invalid\n", plugin_path);
    return -1;
  }
  if (debug_flags_apply (dl, p.name, plugin_path) == -1)
    return -1;
  bool has_pread = api_version == 1 ? p._pread_v1 != NULL : p.pread != NULL;
  if (!p.open || !p.get_size || !has_pread) {
    fprintf (stderr, "blkd: %s: plugin must define open, get_size and pread\n", plugin_path);
    return -1;
  }
  thread_model = p._thread_model;
  ext = dlsym (dl, "blkd_plugin_extension");
  if (ext && (ext->version != BLKD_PLUGIN_EXTENSION_VERSION
              || ext->size < offsetof (struct blkd_plugin_extension, lend_release)
                             + sizeof ext->lend_release)) {
    fprintf (stderr, "blkd: %s: blkd_plugin_extension version %u size %u not understood; "
             "copying instead\n", plugin_path, ext->version, ext->size);
    ext = NULL;
  }
  return 0;
}

int
plugin_load (const char *name, int argc, char **argv)
{
  if (plugin_open_dl (name) == -1)
    return -1;
  if (p.load)
    p.load ();

  /* key=value arguments go to .config; a bare one goes to magic_config_key,
   * as nbdkit does ("memory 1G" means "memory size=1G"). */
  for (int i = 0; i < argc; i++) {
    char *eq = strchr (argv[i], '=');
    const char *key, *value;
    /* Split in place, as nbdkit does: plugins keep the key and value
     * pointers (the eval plugin does), so they must live for ever. */
    if (eq && eq != argv[i]) {
      *eq = '\0';
      key = argv[i];
      value = eq + 1;
    }
    else {
      if (!p.magic_config_key) {
        fprintf (stderr, "blkd: %s: argument '%s' is not key=value and the plugin "
                 "has no magic config key\n", p.name, argv[i]);
        return -1;
      }
      key = p.magic_config_key;
      value = argv[i];
    }
    if (!p.config) {
      fprintf (stderr, "blkd: %s: plugin takes no parameters, got '%s'\n", p.name, key);
      return -1;
    }
    int r = p.config (key, value);
    if (r == -1) {
      fprintf (stderr, "blkd: %s: bad parameter '%s'\n", p.name, key);
      return -1;
    }
  }
  if (p.config_complete && p.config_complete () == -1) {
    fprintf (stderr, "blkd: %s: configuration incomplete (see --dump-plugin or the "
             "plugin's manual)\n", p.name);
    return -1;
  }
  if (p.thread_model) {
    int m = p.thread_model ();
    if (m == -1) {
      fprintf (stderr, "blkd: %s: thread_model failed\n", p.name);
      return -1;
    }
    if (m < thread_model)
      thread_model = m;
  }
  if (p.get_ready && p.get_ready () == -1) {
    fprintf (stderr, "blkd: %s: get_ready failed\n", p.name);
    return -1;
  }
  public_config_done = true;

  inline_safe = false;
  for (int i = 0; inline_plugins[i]; i++)
    if (strcmp (p.name, inline_plugins[i]) == 0)
      inline_safe = true;

  zero_buf = calloc (1, ZERO_BUF_SIZE);
  if (!zero_buf) {
    fprintf (stderr, "blkd: out of memory\n");
    return -1;
  }
  return 0;
}

int
plugin_after_fork (void)
{
  if (p.after_fork && p.after_fork () == -1) {
    fprintf (stderr, "blkd: %s: after_fork failed\n", p.name);
    return -1;
  }
  return 0;
}

void
plugin_unload (void)
{
  if (!dl)
    return;
  if (p.cleanup)
    p.cleanup ();
  if (p.unload)
    p.unload ();
  /* dlclose is skipped under ASan so leak reports keep symbol names;
   * everywhere else the plugin is unloaded as nbdkit does. */
#ifndef __SANITIZE_ADDRESS__
  dlclose (dl);
#endif
  dl = NULL;
  ext = NULL;
  free (plugin_path);
  plugin_path = NULL;
  free (zero_buf);
  zero_buf = NULL;
  public_release_global ();
}

/* nbdkit's plugin usage, printed after the server's for PLUGIN --help:
 * name (longname), path, description, config_help. */
int
plugin_help (const char *name)
{
  if (plugin_open_dl (name) == -1)
    return -1;
  if (p.load)
    p.load ();
  printf ("plugin: %s", p.name);
  if (p.longname)
    printf (" (%s)", p.longname);
  printf ("\n(%s)\n", plugin_path);
  const char *const texts[] = { p.description, p.config_help };
  for (size_t i = 0; i < 2; i++) {
    size_t n = texts[i] ? strlen (texts[i]) : 0;
    if (n)
      printf ("%s%s", texts[i], texts[i][n - 1] == '\n' ? "" : "\n");
  }
  fflush (stdout);
  plugin_unload ();
  return 0;
}

int
plugin_dump (const char *name)
{
  if (plugin_open_dl (name) == -1)
    return -1;
  if (p.load)
    p.load ();
  printf ("path=%s\nname=%s\n", plugin_path, p.name);
  if (p.version)
    printf ("version=%s\n", p.version);
  printf ("api_version=%d\nstruct_size=%llu\n", api_version,
          (unsigned long long) p._struct_size);
  static const char *const models[] = { "serialize_connections",
    "serialize_all_requests", "serialize_requests", "parallel" };
  printf ("thread_model=%s\n", thread_model >= 0 && thread_model <= 3
          ? models[thread_model] : "unknown");
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
  plugin_unload ();
  return 0;
}

int
plugin_preconnect (bool readonly)
{
  if (p.preconnect && p.preconnect (readonly) == -1)
    return -1;
  return 0;
}

struct nbdkit_exports *
plugin_list_exports (bool readonly, bool is_tls)
{
  struct nbdkit_exports *e = public_exports_new ();
  if (!e)
    return NULL;
  if (p.list_exports) {
    if (p.list_exports (readonly, is_tls, e) == -1) {
      public_exports_free (e);
      return NULL;
    }
  }
  else
    e->use_default = true;
  return e;
}

const char *
plugin_default_export (bool readonly, bool is_tls)
{
  if (p.default_export)
    return p.default_export (readonly, is_tls);
  return cfg.export_name ? cfg.export_name : "";
}

/* ---- per connection ------------------------------------------------ */

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

/* The narrowest lock the thread model allows.  SERIALIZE_CONNECTIONS is
 * enforced at accept time (one connection at a time), so needs nothing here. */
static inline void
lock_request (struct plugin_conn *pc)
{
  if (thread_model == NBDKIT_THREAD_MODEL_SERIALIZE_ALL_REQUESTS)
    pthread_mutex_lock (&all_requests_lock);
  else if (thread_model == NBDKIT_THREAD_MODEL_SERIALIZE_REQUESTS)
    pthread_mutex_lock (&pc->request_lock);
  public_current = &pc->ctx;
  public_last_error = 0;            /* only this call's nbdkit_set_error counts */
}

static inline void
unlock_request (struct plugin_conn *pc)
{
  public_current = NULL;
  if (thread_model == NBDKIT_THREAD_MODEL_SERIALIZE_ALL_REQUESTS)
    pthread_mutex_unlock (&all_requests_lock);
  else if (thread_model == NBDKIT_THREAD_MODEL_SERIALIZE_REQUESTS)
    pthread_mutex_unlock (&pc->request_lock);
}

void
plugin_conn_init (struct plugin_conn *pc, int fd)
{
  memset (pc, 0, sizeof *pc);
  pthread_mutex_init (&pc->request_lock, NULL);
  pc->ctx.peer_fd = fd;
}

void
plugin_conn_fini (struct plugin_conn *pc)
{
  plugin_close (pc);
  public_conn_ctx_release (&pc->ctx);
  pthread_mutex_destroy (&pc->request_lock);
}

/* Calls a boolean can_* callback, or gives the default. */
#define CAN(cb, dflt) \
  (p.cb ? p.cb (pc->handle) : (dflt))

static bool
valid_block_size (uint32_t min, uint32_t pref, uint32_t max)
{
  bool pow2_min = min && !(min & (min - 1));
  bool pow2_pref = pref && !(pref & (pref - 1));
  return pow2_min && min <= 65536 && pow2_pref && pref >= 512 && pref <= 32 * 1024 * 1024
         && (max == 0xffffffff || max % min == 0) && min <= pref && pref <= max;
}

static int
fetch_caps (struct plugin_conn *pc, bool readonly)
{
  struct plugin_caps *c = &pc->caps;
  int r;

  memset (c, 0, sizeof *c);
  c->size = p.get_size (pc->handle);
  if (c->size < 0)
    return -1;

  if ((r = CAN (can_write, api_version == 1 ? p._pwrite_v1 != NULL : p.pwrite != NULL)) < 0)
    return -1;
  c->can_write = r && !readonly;
  if ((r = CAN (can_flush, api_version == 1 ? p._flush_v1 != NULL : p.flush != NULL)) < 0)
    return -1;
  c->can_flush = r;
  if ((r = CAN (is_rotational, 0)) < 0)
    return -1;
  c->is_rotational = r;
  if ((r = CAN (can_trim, api_version == 1 ? p._trim_v1 != NULL : p.trim != NULL)) < 0)
    return -1;
  c->can_trim = r && c->can_write;

  bool has_zero = api_version == 1 ? p._zero_v1 != NULL : p.zero != NULL;
  if (p.can_zero) {
    if ((r = p.can_zero (pc->handle)) < 0)
      return -1;
    c->can_zero = r ? 2 : 1;
  }
  else
    c->can_zero = has_zero ? 2 : 1;
  if (p.can_fast_zero) {
    if ((r = p.can_fast_zero (pc->handle)) < 0)
      return -1;
    c->can_fast_zero = r;
  }
  else
    /* With no native zero we can fail fast instead of writing zeros. */
    c->can_fast_zero = !has_zero || c->can_zero == 1;

  if (p.can_fua) {
    if ((r = p.can_fua (pc->handle)) < 0)
      return -1;
    c->can_fua = r;
  }
  else
    c->can_fua = c->can_flush ? NBDKIT_FUA_EMULATE : NBDKIT_FUA_NONE;
  if (api_version == 1 && c->can_fua > NBDKIT_FUA_EMULATE)
    c->can_fua = NBDKIT_FUA_EMULATE;
  if (c->can_fua == NBDKIT_FUA_EMULATE && !c->can_flush)
    c->can_fua = NBDKIT_FUA_NONE;

  if ((r = CAN (can_multi_conn, 0)) < 0)
    return -1;
  c->can_multi_conn = r && thread_model != NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS;
  if (p.can_cache) {
    if ((r = p.can_cache (pc->handle)) < 0)
      return -1;
    c->can_cache = r;
  }
  else
    c->can_cache = p.cache ? NBDKIT_CACHE_NATIVE : NBDKIT_CACHE_NONE;
  if ((r = CAN (can_extents, p.extents != NULL)) < 0)
    return -1;
  c->can_extents = r && p.extents;

  if (p.block_size) {
    uint32_t min, pref, max;
    if (p.block_size (pc->handle, &min, &pref, &max) == -1)
      return -1;
    if (min || pref || max) {
      if (!valid_block_size (min, pref, max)) {
        nbdkit_error ("plugin returned invalid block size constraints %u/%u/%u",
                      min, pref, max);
        errno = EINVAL;
        return -1;
      }
      c->block_min = min;
      c->block_pref = pref;
      c->block_max = max;
    }
  }
  return 0;
}

int
plugin_open (struct plugin_conn *pc, const char *export_name, bool readonly)
{
  pc->ctx.export_name = export_name;
  lock_request (pc);
  pc->handle = p.open (readonly);
  if (!pc->handle) {
    unlock_request (pc);
    log_error ("plugin %s: open failed for export \"%s\"", p.name, export_name);
    return -1;
  }
  int r = fetch_caps (pc, readonly);
  unlock_request (pc);
  if (r == -1) {
    log_error ("plugin %s: querying the export failed", p.name);
    plugin_close (pc);
    return -1;
  }
  return 0;
}

void
plugin_close (struct plugin_conn *pc)
{
  if (!pc->handle)
    return;
  lock_request (pc);
  if (p.close)
    p.close (pc->handle);
  unlock_request (pc);
  pc->handle = NULL;
}

const char *
plugin_export_description (struct plugin_conn *pc)
{
  if (!p.export_description)
    return NULL;
  lock_request (pc);
  const char *d = p.export_description (pc->handle);
  unlock_request (pc);
  return d;
}

/* ---- the request path ---------------------------------------------- */

static int
call_pread (struct plugin_conn *pc, void *buf, uint32_t count, uint64_t offset)
{
  int r = api_version == 1 ? p._pread_v1 (pc->handle, buf, count, offset)
                           : p.pread (pc->handle, buf, count, offset, 0);
  return r == -1 ? callback_error (errno) : 0;
}

static int
call_flush (struct plugin_conn *pc)
{
  int r;
  if (api_version == 1)
    r = p._flush_v1 ? p._flush_v1 (pc->handle) : 0;
  else
    r = p.flush ? p.flush (pc->handle, 0) : 0;
  return r == -1 ? callback_error (errno) : 0;
}

/* FUA the plugin cannot do natively becomes a flush after the write. */
static int
finish_fua (struct plugin_conn *pc, int err, bool fua)
{
  if (err || !fua || pc->caps.can_fua != NBDKIT_FUA_EMULATE)
    return err;
  return call_flush (pc);
}

static uint32_t
fua_flag (struct plugin_conn *pc, bool fua)
{
  return fua && pc->caps.can_fua == NBDKIT_FUA_NATIVE ? NBDKIT_FLAG_FUA : 0;
}

int
plugin_pread (struct plugin_conn *pc, void *buf, uint32_t count, uint64_t offset)
{
  lock_request (pc);
  int err = call_pread (pc, buf, count, offset);
  unlock_request (pc);
  return err;
}

static int
call_pwrite (struct plugin_conn *pc, const void *buf, uint32_t count,
             uint64_t offset, bool fua)
{
  int r = api_version == 1 ? p._pwrite_v1 (pc->handle, buf, count, offset)
                           : p.pwrite (pc->handle, buf, count, offset, fua_flag (pc, fua));
  return finish_fua (pc, r == -1 ? callback_error (errno) : 0, fua);
}

int
plugin_pwrite (struct plugin_conn *pc, const void *buf, uint32_t count,
               uint64_t offset, bool fua)
{
  if (!pc->caps.can_write)
    return EROFS;
  lock_request (pc);
  int err = call_pwrite (pc, buf, count, offset, fua);
  unlock_request (pc);
  return err;
}

int
plugin_flush (struct plugin_conn *pc)
{
  if (!pc->caps.can_flush)
    return EINVAL;
  lock_request (pc);
  int err = call_flush (pc);
  unlock_request (pc);
  return err;
}

int
plugin_trim (struct plugin_conn *pc, uint32_t count, uint64_t offset, bool fua)
{
  if (!pc->caps.can_trim)
    return EINVAL;
  lock_request (pc);
  int r = api_version == 1 ? p._trim_v1 (pc->handle, count, offset)
                           : p.trim (pc->handle, count, offset, fua_flag (pc, fua));
  int err = finish_fua (pc, r == -1 ? callback_error (errno) : 0, fua);
  unlock_request (pc);
  return err;
}

int
plugin_zero (struct plugin_conn *pc, uint32_t count, uint64_t offset,
             bool may_trim, bool fua, bool fast)
{
  int err;

  if (!pc->caps.can_write)
    return EROFS;
  if (fast && !pc->caps.can_fast_zero)
    return EINVAL;
  lock_request (pc);
  if (pc->caps.can_zero == 2) {
    bool has_v2 = api_version == 2 && p.zero;
    int r;
    errno = 0;
    if (has_v2)
      r = p.zero (pc->handle, count, offset,
                  (may_trim ? NBDKIT_FLAG_MAY_TRIM : 0) | fua_flag (pc, fua)
                  | (fast ? NBDKIT_FLAG_FAST_ZERO : 0));
    else
      r = p._zero_v1 (pc->handle, count, offset, may_trim);
    if (r == 0) {
      err = finish_fua (pc, 0, fua);
      goto out;
    }
    err = callback_error (errno);
    /* ENOTSUP means "do it the slow way", unless the client asked for fast. */
    if ((err != ENOTSUP && err != EOPNOTSUPP) || fast) {
      if (fast && (err == EOPNOTSUPP))
        err = ENOTSUP;
      goto out;
    }
  }
  else if (fast) {
    err = ENOTSUP;
    goto out;
  }
  /* Emulate with pwrite from a shared zero buffer. */
  err = 0;
  while (count > 0 && !err) {
    uint32_t n = count < ZERO_BUF_SIZE ? count : ZERO_BUF_SIZE;
    err = call_pwrite (pc, zero_buf, n, offset, fua && n == count);
    count -= n;
    offset += n;
  }
out:
  unlock_request (pc);
  return err;
}

int
plugin_cache (struct plugin_conn *pc, uint32_t count, uint64_t offset)
{
  int err = 0;

  if (pc->caps.can_cache == NBDKIT_CACHE_NONE)
    return EINVAL;
  lock_request (pc);
  if (pc->caps.can_cache == NBDKIT_CACHE_NATIVE) {
    if (p.cache && p.cache (pc->handle, count, offset, 0) == -1)
      err = callback_error (errno);
  }
  else {
    /* Emulate by reading into a scratch buffer and dropping the data. */
    void *scratch = malloc (count < ZERO_BUF_SIZE ? count : ZERO_BUF_SIZE);
    if (!scratch)
      err = ENOMEM;
    while (!err && count > 0) {
      uint32_t n = count < ZERO_BUF_SIZE ? count : ZERO_BUF_SIZE;
      err = call_pread (pc, scratch, n, offset);
      count -= n;
      offset += n;
    }
    free (scratch);
  }
  unlock_request (pc);
  return err;
}

int
plugin_extents (struct plugin_conn *pc, uint32_t count, uint64_t offset,
                bool req_one, struct nbdkit_extents *e)
{
  if (!pc->caps.can_extents) {
    /* No extents support: everything is data. */
    return nbdkit_add_extent (e, offset, count, 0) == -1 ? errno : 0;
  }
  lock_request (pc);
  int r = p.extents (pc->handle, count, offset, req_one ? NBDKIT_FLAG_REQ_ONE : 0, e);
  int err = r == -1 ? callback_error (errno) : 0;
  unlock_request (pc);
  /* A plugin that added nothing broke the contract; nbdkit says EINVAL. */
  if (!err && e->len == 0)
    err = EINVAL;
  return err;
}

/* ---- lending (blkd's extension) ------------------------------------ */

/* An extension call the plugin's struct is long enough to hold. */
#define EXT_HAS(field) \
  (ext && ext->size >= offsetof (struct blkd_plugin_extension, field) + sizeof ext->field \
   && ext->field)

/* Lending hands the plugin's memory straight to the socket, so only a
 * plugin right below the protocol may lend: a cache in between must see
 * (and keep) the data, so it copies. */
static bool
lend_direct (void)
{
  return cfg.cache_size == 0;
}

bool
plugin_can_lend (void)
{
  return lend_direct () && EXT_HAS (lend_pread) && EXT_HAS (lend_release);
}

int
plugin_pread_lend (struct plugin_conn *pc, uint32_t count, uint64_t offset,
                   struct blkd_lend *l)
{
  if (!plugin_can_lend ())
    return ENOTSUP;
  l->n = 0;
  lock_request (pc);
  int r = ext->lend_pread (pc->handle, count, offset, 0, l);
  int err = r == -1 ? callback_error (errno) : 0;
  unlock_request (pc);
  if (err)
    return err == EOPNOTSUPP ? ENOTSUP : err;
  atomic_fetch_add (&lend_stats.lent_bytes, count);
  atomic_fetch_add (&lend_stats.lent_replies, 1);
  return 0;
}

void
plugin_lend_release (void *const *token, unsigned n, uint32_t bytes)
{
  ext->lend_release (token, n);
  atomic_fetch_sub (&lend_stats.lent_bytes, bytes);
}

int
plugin_pread_fd (struct plugin_conn *pc, uint32_t count, uint64_t offset, int *fd,
                 uint64_t *file_offset)
{
  if (!lend_direct () || !EXT_HAS (pread_fd))
    return ENOTSUP;
  lock_request (pc);
  int r = ext->pread_fd (pc->handle, count, offset, 0, fd, file_offset);
  int err = r == -1 ? callback_error (errno) : 0;
  unlock_request (pc);
  if (!err)
    atomic_fetch_add (&lend_stats.sendfile_replies, 1);
  return err == EOPNOTSUPP ? ENOTSUP : err;
}

int
plugin_pwrite_place (struct plugin_conn *pc, uint32_t count, uint64_t offset, bool fua,
                     struct blkd_lend *dst)
{
  if (!lend_direct () || !EXT_HAS (pwrite_place) || !EXT_HAS (pwrite_commit))
    return ENOTSUP;
  if (!pc->caps.can_write)
    return EROFS;
  dst->n = 0;
  lock_request (pc);
  int r = ext->pwrite_place (pc->handle, count, offset, fua_flag (pc, fua), dst);
  int err = r == -1 ? callback_error (errno) : 0;
  unlock_request (pc);
  if (!err)
    atomic_fetch_add (&lend_stats.placed_bytes, count);
  return err == EOPNOTSUPP ? ENOTSUP : err;
}

int
plugin_pwrite_commit (struct plugin_conn *pc, uint32_t count, uint64_t offset, bool fua,
                      struct blkd_lend *dst, bool ok)
{
  lock_request (pc);
  int r = ext->pwrite_commit (pc->handle, count, offset, fua_flag (pc, fua), dst, ok);
  int err = finish_fua (pc, r == -1 ? callback_error (errno) : 0, fua && ok);
  unlock_request (pc);
  atomic_fetch_sub (&lend_stats.placed_bytes, count);
  if (ok && !err)
    atomic_fetch_add (&lend_stats.placed_writes, 1);
  return err;
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
