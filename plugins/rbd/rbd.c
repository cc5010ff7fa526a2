/* rbd plugin: serves Ceph RBD images through librbd (one cluster connection, one open image per export). */

/* Shape.  The process holds ONE cluster connection (rados_t) and one I/O
 * context on pool/namespace, made in .after_fork: librbd starts about 16
 * threads per cluster handle, and a fork (blkd's or nbdkit's daemonizing)
 * would leave them behind in the parent.  Each export name is an image;
 * the image is opened on the first connection that asks for it and shared,
 * refcounted, by every later connection to it, so
 * - the image's exclusive lock is taken once by this process and never
 *   bounces between connections of one client (multi-conn);
 * - librbd's cache is one per image, so a flush on any connection flushes
 *   what every connection wrote: multi-conn is safe and advertised.
 * The image is closed when its last connection goes.
 *
 * Requests go through librbd's asynchronous calls.  The nbdkit callbacks
 * start one and wait for its completion (PARALLEL: librbd is thread-safe,
 * so as many requests are in flight as the server has threads).  Under
 * blkd the same requests can be started without a waiting thread and
 * completed from librbd's completion thread (include/blkd-plugin.h).
 * Who maps a request to object ops (librbd's "dispatch") is the
 * dispatch= parameter: librbd's own thread (librbd, the default and
 * Ceph's), so the loop does not wait in librbd for the cluster, or the
 * calling thread (caller: blkd's event loop, or a worker thread), cheaper
 * for reads; see rbdp_apply_ceph_opts for what keeps the loop from
 * waiting then.
 *
 * FUA is the write followed by a flush of the image, chained in the
 * completion: librbd's cache (rbd cache = true by default) may hold a
 * completed write, and only a flush says it is on the OSDs.  Waiting: a
 * request waits as long as librados does; timeout=SECONDS sets
 * rados_osd_op_timeout, after which a request stuck on an absent OSD fails
 * with ETIMEDOUT instead (so do an image's open and close).  connect-timeout bounds start-up (the mon
 * handshake and authentication) so a wrong address never hangs it.
 *
 * Names here start with rbdp_: librbd owns the rbd_ prefix.
 *
 * Limits, admitted: the export list is the pool's (namespace's) images at
 * the time of listing; an image resized while served keeps the size it
 * had when its first connection opened it until every connection closed.
 * Under blkd, .open and .list_exports run on the event-loop thread and
 * ask the cluster, so while the OSDs cannot answer they hold that shard
 * (closing does not: rbdp_closer).  An error logged from librbd's
 * completion thread names the image and range but not the connection.
 */

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "blkd-plugin.h"
#include "affinity.h"

#include <rados/librados.h>
#include <rbd/librbd.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

/* Parameters (config). */
static const char *rbdp_pool = "rbd";
static const char *rbdp_namespace;
static const char *rbdp_image;         /* the default export */
static const char *rbdp_snap;
static const char *rbdp_id;            /* the client name without "client." */
static const char *rbdp_conf;
static const char *rbdp_keyring;
static const char *rbdp_cluster_name = "ceph";
static unsigned rbdp_timeout;          /* 0: as long as the cluster waits */
static unsigned rbdp_connect_timeout = 20;
static bool rbdp_use_aio = true;      /* aio=false: blkd waits on workers */
static bool rbdp_dispatch_caller;      /* dispatch=caller, or librbd (default) */

/* Ceph options given as plugin parameters (rbd_cache=false, ...): applied
 * with rados_conf_set after the configuration file and CEPH_ARGS, so they
 * win over both, as qemu's rbd:pool/image:key=value options do. */
#define RBDP_MAX_CEPH_OPTS 32
static struct { const char *key, *value; } rbdp_ceph_opts[RBDP_MAX_CEPH_OPTS];
static unsigned rbdp_n_ceph_opts;

/* How much of librados' op throttle (objecter_inflight_ops,
 * objecter_inflight_op_bytes) the plugin's requests may hold before the
 * aio path declines, used with dispatch=caller:
 * librbd then submits on the calling thread, which is
 * blkd's event loop, and librados makes a submitter wait once the
 * throttle is full (an OSD away, many clients).  Past these caps, counted
 * over the aio path's requests and the workers' (rbdp_count), a request
 * goes to blkd's workers instead (ENOTSUP).  Usually librados' throttle
 * is then off and these are it; with limits given as parameters it stays,
 * and what librbd holds after answering (its cache's writes in flight)
 * can still fill it under the loop (rbdp_apply_ceph_opts). */
static uint64_t rbdp_cap_ops, rbdp_cap_bytes;
static atomic_uint_fast64_t rbdp_held_ops, rbdp_held_bytes;   /* rbdp_count */
static bool rbdp_own_throttle;         /* librados' throttle is off; the caps are it */

static rados_t rbdp_cluster;
static rados_ioctx_t rbdp_io;
static bool rbdp_connected;

/* One open image, shared by every connection to its export. */
struct rbdp_img {
  struct rbdp_img *next;
  char *name;
  bool readonly;
  bool opening;                       /* rbd_open under way, without the lock */
  unsigned refs;
  rbd_image_t image;
  uint64_t size;
  uint64_t obj_size;                  /* bytes per RADOS object */
  bool object_map;                    /* block status from rbd_diff_iterate2 */
  bool aio_declined;                  /* the image's own rbd config makes the
                                       * caller dispatch under librados'
                                       * throttle: its requests go to workers */
};

static pthread_mutex_t rbdp_imgs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rbdp_img *rbdp_imgs;
/* An open finished (rbdp_img_get): those waiting for the same image look again. */
static pthread_cond_t rbdp_opened_cond = PTHREAD_COND_INITIALIZER;
/* Images whose last connection went, for the closer thread (rbdp_closer). */
static struct rbdp_img *rbdp_close_queue;
static pthread_cond_t rbdp_close_cond = PTHREAD_COND_INITIALIZER;
static pthread_t rbdp_closer_thread;
static bool rbdp_closer_running, rbdp_closer_stop;

struct rbdp_handle {
  struct rbdp_img *img;
  bool readonly;
};

/* ---- configuration --------------------------------------------------- */

/* Ceph's option names read '-' and ' ' as '_' (rbd_non-blocking_aio is
 * rbd_non_blocking_aio): are a and b the same option?  (A parameter is
 * taken for a Ceph option only with an underscore in its name.) */
static bool
rbdp_ceph_key_is (const char *a, const char *b)
{
  for (;; a++, b++) {
    char x = *a == '-' || *a == ' ' ? '_' : *a;
    char y = *b == '-' || *b == ' ' ? '_' : *b;
    if (x != y)
      return false;
    if (x == '\0')
      return true;
  }
}

static int
rbdp_parse_seconds (const char *key, const char *value, unsigned *out)
{
  char *end;
  unsigned long v;

  errno = 0;
  v = strtoul (value, &end, 10);
  if (errno || end == value || *end || v > 86400) {
    nbdkit_error ("rbd: %s=%s: expected whole seconds, 0 to 86400", key, value);
    return -1;
  }
  *out = v;
  return 0;
}

static int
rbdp_config (const char *key, const char *value)
{
  if (strcmp (key, "pool") == 0)
    rbdp_pool = value;
  else if (strcmp (key, "namespace") == 0)
    rbdp_namespace = value;
  else if (strcmp (key, "image") == 0)
    rbdp_image = value;
  else if (strcmp (key, "snap") == 0)
    rbdp_snap = value;
  else if (strcmp (key, "id") == 0 || strcmp (key, "user") == 0)
    rbdp_id = value;
  else if (strcmp (key, "conf") == 0)
    rbdp_conf = value;
  else if (strcmp (key, "keyring") == 0)
    rbdp_keyring = value;
  else if (strcmp (key, "cluster") == 0)
    rbdp_cluster_name = value;
  else if (strcmp (key, "timeout") == 0)
    return rbdp_parse_seconds (key, value, &rbdp_timeout);
  else if (strcmp (key, "connect-timeout") == 0)
    return rbdp_parse_seconds (key, value, &rbdp_connect_timeout);
  else if (strcmp (key, "aio") == 0) {
    int b = nbdkit_parse_bool (value);
    if (b == -1)
      return -1;
    rbdp_use_aio = b;
    return 0;
  }
  else if (strcmp (key, "dispatch") == 0) {
    if (strcmp (value, "caller") != 0 && strcmp (value, "librbd") != 0) {
      nbdkit_error ("rbd: dispatch=%s: expected caller or librbd", value);
      return -1;
    }
    rbdp_dispatch_caller = strcmp (value, "caller") == 0;
    return 0;
  }
  else if (rbdp_ceph_key_is (key, "rbd_non_blocking_aio")) {
    /* The plugin sets it from dispatch= and sizes its throttle by it;
     * a second way to say the same thing could only disagree. */
    nbdkit_error ("rbd: rbd_non_blocking_aio=%s: say dispatch=caller (false) or "
                  "dispatch=librbd (true) instead", value);
    return -1;
  }
  else if (strchr (key, '_')) {
    /* A Ceph option (the plugin's own keys have no underscore); whether
     * Ceph knows it is checked when the cluster handle exists. */
    if (rbdp_n_ceph_opts == RBDP_MAX_CEPH_OPTS) {
      nbdkit_error ("rbd: more than %d Ceph options", RBDP_MAX_CEPH_OPTS);
      return -1;
    }
    rbdp_ceph_opts[rbdp_n_ceph_opts].key = key;
    rbdp_ceph_opts[rbdp_n_ceph_opts].value = value;
    rbdp_n_ceph_opts++;
    return 0;
  }
  else {
    nbdkit_error ("rbd: unknown parameter '%s'", key);
    return -1;
  }
  if (*value == '\0' && strcmp (key, "namespace") != 0) {
    nbdkit_error ("rbd: %s= must not be empty", key);
    return -1;
  }
  return 0;
}

static int
rbdp_config_complete (void)
{
  if (strncmp (rbdp_id ? rbdp_id : "", "client.", 7) == 0)
    rbdp_id += 7;                      /* id=client.foo means id=foo */
  if (rbdp_connect_timeout == 0) {
    nbdkit_error ("rbd: connect-timeout must be at least 1 second");
    return -1;
  }
  return 0;
}

/* Validation that needs no cluster: a conf or keyring named but absent is
 * reported before anything starts. */
static int
rbdp_get_ready (void)
{
  if (rbdp_conf && access (rbdp_conf, R_OK) == -1) {
    nbdkit_error ("rbd: conf=%s: %m", rbdp_conf);
    return -1;
  }
  if (rbdp_keyring && access (rbdp_keyring, R_OK) == -1) {
    nbdkit_error ("rbd: keyring=%s: %m", rbdp_keyring);
    return -1;
  }
  return 0;
}

static void
rbdp_disconnect (void)
{
  if (rbdp_io) {
    rados_ioctx_destroy (rbdp_io);
    rbdp_io = NULL;
  }
  if (rbdp_cluster) {
    rados_shutdown (rbdp_cluster);
    rbdp_cluster = NULL;
  }
  rbdp_connected = false;
}

static int
rbdp_set (const char *opt, const char *val)
{
  int r = rados_conf_set (rbdp_cluster, opt, val);
  if (r < 0) {
    nbdkit_error ("rbd: setting %s=%s: %s%s", opt, val, strerror (-r),
                  r == -ENOENT ? " (not a Ceph option)" : "");
    return -1;
  }
  return 0;
}

static uint64_t
rbdp_get_u64 (const char *opt)
{
  char buf[32];

  if (rados_conf_get (rbdp_cluster, opt, buf, sizeof buf) < 0)
    return 0;
  return strtoull (buf, NULL, 10);
}

/* Half of a throttle limit, at least 1; 0 turns librados' throttle off. */
static uint64_t
rbdp_half_limit (uint64_t limit)
{
  return limit ? (limit / 2 ?: 1) : UINT64_MAX;
}

/* A cap for the log: its number, or "no" for none (UINT64_MAX). */
static const char *
rbdp_limit_str (uint64_t v, char buf[24])
{
  if (v == UINT64_MAX)
    return "no";
  snprintf (buf, 24, "%" PRIu64, v);
  return buf;
}

/* Was key given as a plugin parameter (not from ceph.conf or CEPH_ARGS)? */
static bool
rbdp_ceph_opt_given (const char *key)
{
  for (unsigned i = 0; i < rbdp_n_ceph_opts; i++)
    if (rbdp_ceph_key_is (rbdp_ceph_opts[i].key, key))
      return true;
  return false;
}

/* librbd's io_context_pool threads (librados_thread_count) on a small
 * gateway.  On at most two CPUs Ceph's two threads cost more than they
 * give: they wake each other for every request and its completion, on
 * CPUs the shards (and, on a shared host, the OSDs) need.  Measured under
 * blkd on two CPUs (docs/RBD.md), one thread was faster or level in most
 * workloads at less CPU per request, and slower for 1 MiB writes in the
 * latest runs.  With more CPUs one thread doing all of librbd's work may
 * become the cap, which a two-CPU machine cannot show, so Ceph's default
 * stays there.  A count other than Ceph's 2 already set (ceph.conf,
 * CEPH_ARGS) is the user's and stays; a plugin parameter is applied after
 * this and wins.  Limits: a 2 set there reads as Ceph's default, and a
 * count in the monitors' config database, fetched while connecting, loses
 * to this (rados_conf_set ranks above it).  Under nbdkit the same holds
 * (not measured there). */
static int
rbdp_small_gateway_threads (void)
{
  long cpus = affinity_cpu_count ();

  if (cpus < 1 || cpus > 2 || rbdp_get_u64 ("librados_thread_count") != 2)
    return 0;
  if (rbdp_set ("librados_thread_count", "1") == -1)
    return -1;
  if (!rbdp_ceph_opt_given ("librados_thread_count"))
    nbdkit_debug ("rbd: %ld CPU%s to run on: one librbd io_context_pool thread "
                  "(give librados_thread_count=2 for Ceph's default)",
                  cpus, cpus == 1 ? "" : "s");
  return 0;
}

/* Who dispatches: librbd maps each aio call to object ops either on its
 * own io_context_pool thread (rbd_non_blocking_aio=true, Ceph's default
 * and the plugin's: dispatch=librbd) or on the calling thread (false:
 * dispatch=caller).  With the caller dispatching and librados_thread_count
 * at 1, the one librbd thread left only runs completions: 4 KiB reads
 * take less CPU per request, but 4 KiB writes at depth take more
 * (docs/RBD.md), so it is a choice, not the default.  The plugin sets
 * rbd_non_blocking_aio from dispatch= (and librados_thread_count=1 for
 * caller, or on at most two CPUs: rbdp_small_gateway_threads), over
 * ceph.conf and CEPH_ARGS;
 * librados_thread_count given as a parameter wins, and
 * rbd_non_blocking_aio as a parameter is refused (rbdp_config).
 *
 * What the caller then risks: under blkd the caller is the event loop,
 * and librados makes a submitter wait while its op throttle
 * (objecter_inflight_ops, _op_bytes: one per cluster handle) is full.
 * librbd's cache, writearound by default, acknowledges writes whose
 * object ops are still in flight, up to rbd_cache_max_dirty per image,
 * many times the throttle's 1024 ops in 4 KiB writes, so an OSD away
 * under a writing client fills it and the loop's next submission would
 * wait there, with every connection of its shard
 * (tests/rbd/test-rbd-loop-dispatch-osd.sh).  Nor only while an OSD is
 * away: under a client writing 4 KiB at depth, acknowledged early, the
 * submitter waited in the throttle about 10,000 times in 8 s (librados'
 * perf counters, docs/RBD.md), and with dispatch=caller the submitter
 * is the loop.
 * So with dispatch=caller the
 * plugin turns librados' throttle off and its own count (rbdp_count)
 * takes the throttle's limits over (ceph.conf's or CEPH_ARGS', else
 * Ceph's): an aio request starts only within them, the workers' requests
 * count, and the cache's writes in flight are bounded by
 * rbd_cache_max_dirty per image.  Only limits given as plugin parameters
 * keep librados' throttle, with the caps at half of them (and the loop
 * can wait in it again).  Limits from the monitors' config database,
 * which rados_connect reads later, are not seen (the plugin's 0 wins over
 * them).  An image's own `rbd config` (pool or image) can still turn its
 * dispatch around; rbdp_img_check_config looks after it opens.
 *
 * The user's Ceph options (plugin parameters), applied after the plugin's
 * own settings (rbdp_after_fork) so that they win: client_mount_timeout=60
 * beats connect-timeout's default, rados_osd_op_timeout= beats timeout=.
 * (rados_conf_set sets them above the monitors' config database too.) */
static int
rbdp_apply_ceph_opts (void)
{
  unsigned i;

  if (rbdp_set ("rbd_non_blocking_aio", rbdp_dispatch_caller ? "false" : "true") == -1)
    return -1;
  if (rbdp_dispatch_caller && rbdp_set ("librados_thread_count", "1") == -1)
    return -1;
  if (!rbdp_dispatch_caller && rbdp_small_gateway_threads () == -1)
    return -1;
  for (i = 0; i < rbdp_n_ceph_opts; i++)
    if (rbdp_set (rbdp_ceph_opts[i].key, rbdp_ceph_opts[i].value) == -1)
      return -1;
  uint64_t ops = rbdp_get_u64 ("objecter_inflight_ops");
  uint64_t bytes = rbdp_get_u64 ("objecter_inflight_op_bytes");
  if (rbdp_dispatch_caller && !rbdp_ceph_opt_given ("objecter_inflight_ops")
      && !rbdp_ceph_opt_given ("objecter_inflight_op_bytes")) {
    if (rbdp_set ("objecter_inflight_ops", "0") == -1
        || rbdp_set ("objecter_inflight_op_bytes", "0") == -1)
      return -1;
    rbdp_own_throttle = true;
    rbdp_cap_ops = ops ? ops : UINT64_MAX;      /* 0: no limit, as librados' */
    rbdp_cap_bytes = bytes ? bytes : UINT64_MAX;
  }
  else {
    rbdp_cap_ops = rbdp_half_limit (ops);
    rbdp_cap_bytes = rbdp_half_limit (bytes);
  }
  return 0;
}

/* What a user can do about a failed rados_connect, in buf. */
static const char *
rbdp_connect_hint (int err, char *buf, size_t len)
{
  char secs[32];

  switch (err) {
  case ENOENT: return " (no keyring found: set keyring= or put one where ceph.conf says)";
  case EACCES:
  case EPERM: return " (authentication failed: check the key in the keyring and the id=)";
  case ETIMEDOUT:
    if (rados_conf_get (rbdp_cluster, "client_mount_timeout", secs, sizeof secs) < 0)
      snprintf (secs, sizeof secs, "?");
    snprintf (buf, len, " (no monitor answered within client_mount_timeout=%s s: "
              "check 'mon host' in the configuration)", secs);
    return buf;
  case EINVAL: return " (bad configuration: check the conf= file)";
  default: return "";
  }
}

static void *rbdp_closer (void *arg);

/* The one cluster connection.  Runs after the server has daemonized. */
static int
rbdp_after_fork (void)
{
  char user[256], secs[16], hint[160];
  int r;

  snprintf (user, sizeof user, "client.%s", rbdp_id ? rbdp_id : "admin");
  r = rados_create2 (&rbdp_cluster, rbdp_cluster_name, user, 0);
  if (r < 0) {
    nbdkit_error ("rbd: rados_create2 (%s as %s): %s", rbdp_cluster_name, user,
                  strerror (-r));
    rbdp_cluster = NULL;
    return -1;
  }
  /* CEPH_ARGS, which outranks the file as it does for the ceph tools;
   * then the file: conf=, else CEPH_CONF or Ceph's default places. */
  rados_conf_parse_env (rbdp_cluster, NULL);
  r = rados_conf_read_file (rbdp_cluster, rbdp_conf);
  if (r < 0) {
    if (rbdp_conf)
      nbdkit_error ("rbd: reading conf=%s: %s", rbdp_conf, strerror (-r));
    else
      nbdkit_error ("rbd: no Ceph configuration found (set conf= or CEPH_CONF, "
                    "or install /etc/ceph/%s.conf): %s", rbdp_cluster_name,
                    strerror (-r));
    goto fail;
  }
  /* The plugin's own settings, then the user's Ceph options over them. */
  if (rbdp_keyring && rbdp_set ("keyring", rbdp_keyring) == -1)
    goto fail;
  snprintf (secs, sizeof secs, "%u", rbdp_connect_timeout);
  if (rbdp_set ("client_mount_timeout", secs) == -1)
    goto fail;
  if (rbdp_timeout) {
    snprintf (secs, sizeof secs, "%u", rbdp_timeout);
    if (rbdp_set ("rados_osd_op_timeout", secs) == -1)
      goto fail;
  }
  if (rbdp_apply_ceph_opts () == -1)
    goto fail;
  r = rados_connect (rbdp_cluster);
  if (r < 0) {
    nbdkit_error ("rbd: connecting to cluster '%s' as %s%s%s: %s%s",
                  rbdp_cluster_name, user, rbdp_conf ? " with conf=" : "",
                  rbdp_conf ? rbdp_conf : "", strerror (-r),
                  rbdp_connect_hint (-r, hint, sizeof hint));
    goto fail;
  }
  r = rados_ioctx_create (rbdp_cluster, rbdp_pool, &rbdp_io);
  if (r < 0) {
    nbdkit_error ("rbd: pool '%s': %s%s", rbdp_pool, strerror (-r),
                  r == -ENOENT ? " (no such pool)" : "");
    rbdp_io = NULL;
    goto fail;
  }
  if (rbdp_namespace)
    rados_ioctx_set_namespace (rbdp_io, rbdp_namespace);
  r = pthread_create (&rbdp_closer_thread, NULL, rbdp_closer, NULL);
  if (r != 0) {
    nbdkit_error ("rbd: starting the image closer thread: %s", strerror (r));
    goto fail;
  }
  rbdp_closer_running = true;
  rbdp_connected = true;
  char caps[128] = "librados' throttle alone", ops[24], bytes[24];
  if (rbdp_dispatch_caller)
    snprintf (caps, sizeof caps, "aio path caps %s ops, %s bytes (%s)",
              rbdp_limit_str (rbdp_cap_ops, ops), rbdp_limit_str (rbdp_cap_bytes, bytes),
              rbdp_own_throttle ? "librados' throttle off" : "librados' throttle as given");
  nbdkit_debug ("rbd: connected to cluster '%s' as %s, pool '%s'%s%s; "
                "dispatch=%s, librados_thread_count=%" PRIu64 ", %s", rbdp_cluster_name,
                user, rbdp_pool, rbdp_namespace ? " namespace " : "",
                rbdp_namespace ? rbdp_namespace : "", rbdp_dispatch_caller ? "caller" : "librbd",
                rbdp_get_u64 ("librados_thread_count"), caps);
  return 0;

fail:
  rbdp_disconnect ();
  return -1;
}

/* ---- images, shared per export --------------------------------------- */

static const char *
rbdp_where (void)
{
  return rbdp_namespace && *rbdp_namespace ? rbdp_namespace : "";
}

static void
rbdp_img_free (struct rbdp_img *im)
{
  if (im->image)
    rbd_close (im->image);
  free (im->name);
  free (im);
}

static const char *
rbdp_config_source (rbd_config_source_t src)
{
  switch (src) {
  case RBD_CONFIG_SOURCE_POOL: return "the pool's rbd config";
  case RBD_CONFIG_SOURCE_IMAGE: return "the image's rbd config";
  default: return "the client's configuration";
  }
}

/* Ceph's reading of a boolean option's text (its Option::parse_value):
 * true or false in any case, or an integer; -1 for anything else. */
static int
rbdp_ceph_bool (const char *v)
{
  char *end;
  long n;

  if (strcasecmp (v, "true") == 0)
    return 1;
  if (strcasecmp (v, "false") == 0)
    return 0;
  errno = 0;
  n = strtol (v, &end, 10);
  if (errno || end == v || *end)
    return -1;
  return n != 0;
}

/* The image's own settings, which `rbd config pool|image set` can give
 * and which librbd applies over the cluster handle's at open: whether it
 * dispatches on the caller, and its cache's bound on writes acknowledged
 * but in flight.  An image that dispatches on the caller while librados'
 * throttle counts alone (dispatch=librbd) could hold the event loop in
 * that throttle, so its requests go to worker threads (blkd's, through
 * the synchronous calls; under nbdkit they always do).  So does an image
 * whose settings cannot be read, or whose value Ceph would not parse.
 * The other way round (dispatch=caller, the image says librbd) is only
 * slower: the plugin's count still bounds it.  Read once, at open (a
 * read of the pool's and of the image's metadata, twice if the first
 * guess of the option count is short): a setting changed while the image
 * is served takes effect in librbd at its next refresh without the
 * plugin seeing it. */
static void
rbdp_img_check_config (struct rbdp_img *im)
{
  int n = 256, r;
  rbd_config_option_t *opts = calloc (n, sizeof *opts);
  const char *nba = NULL, *cache = "?", *policy = "?", *dirty = "?";
  rbd_config_source_t nba_src = RBD_CONFIG_SOURCE_CONFIG;

  r = opts ? rbd_config_image_list (im->image, opts, &n) : -ENOMEM;
  if (r == -ERANGE) {                 /* n now says how many there are */
    free (opts);
    opts = calloc (n, sizeof *opts);
    r = opts ? rbd_config_image_list (im->image, opts, &n) : -ENOMEM;
  }
  if (r < 0) {
    n = 0;
    im->aio_declined = !rbdp_dispatch_caller;
    nbdkit_error ("rbd: image '%s': reading its rbd config: %s; %s", im->name,
                  strerror (-r), rbdp_dispatch_caller ? "dispatch=caller stands"
                  : "its requests go to worker threads in case it makes the caller dispatch");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (strcmp (opts[i].name, "rbd_non_blocking_aio") == 0) {
      nba = opts[i].value;
      nba_src = opts[i].source;
    }
    else if (strcmp (opts[i].name, "rbd_cache") == 0)
      cache = opts[i].value;
    else if (strcmp (opts[i].name, "rbd_cache_policy") == 0)
      policy = opts[i].value;
    else if (strcmp (opts[i].name, "rbd_cache_max_dirty") == 0)
      dirty = opts[i].value;
  }
  int nonblocking = nba ? rbdp_ceph_bool (nba) : !rbdp_dispatch_caller;
  if (nonblocking != 1 && !rbdp_dispatch_caller) {
    im->aio_declined = true;
    nbdkit_debug ("rbd: image '%s': rbd_non_blocking_aio=%s from %s makes the "
                  "caller dispatch while librados' throttle counts alone: its "
                  "requests go to worker threads", im->name, nba ? nba : "?",
                  rbdp_config_source (nba_src));
  }
  else if (nonblocking == 1 && rbdp_dispatch_caller)
    nbdkit_debug ("rbd: image '%s': rbd_non_blocking_aio=%s from %s: librbd's "
                  "thread dispatches this image", im->name, nba ? nba : "?",
                  rbdp_config_source (nba_src));
  nbdkit_debug ("rbd: image '%s': rbd_cache=%s, rbd_cache_policy=%s, "
                "rbd_cache_max_dirty=%s (writes acknowledged before the OSDs have them, "
                "at most)", im->name, cache, policy, dirty);
out:
  rbd_config_image_list_cleanup (opts, n);
  free (opts);
}

/* Open im->name (read-only when im->readonly or at a snapshot), with
 * messages a user can act on; 0 or -1.  Called without rbdp_imgs_lock:
 * it waits for the cluster. */
static int
rbdp_img_open (struct rbdp_img *im)
{
  const char *name = im->name;
  bool readonly = im->readonly;
  uint64_t features = 0, flags = 0;
  int r;

  /* Opened without the snapshot first, so a missing image and a missing
   * snapshot give different messages (both are ENOENT from rbd_open). */
  if (readonly)
    r = rbd_open_read_only (rbdp_io, name, &im->image, NULL);
  else
    r = rbd_open (rbdp_io, name, &im->image, NULL);
  if (r < 0) {
    im->image = NULL;
    if (r == -ENOENT)
      nbdkit_error ("rbd: no image '%s' in pool '%s'%s%s", name, rbdp_pool,
                    *rbdp_where () ? " namespace " : "", rbdp_where ());
    else
      nbdkit_error ("rbd: opening image '%s': %s", name, strerror (-r));
    goto fail;
  }
  if (rbdp_snap) {
    r = rbd_snap_set (im->image, rbdp_snap);
    if (r < 0) {
      if (r == -ENOENT)
        nbdkit_error ("rbd: image '%s' has no snapshot '%s'", name, rbdp_snap);
      else
        nbdkit_error ("rbd: image '%s' snapshot '%s': %s", name, rbdp_snap,
                      strerror (-r));
      goto fail;
    }
  }
  rbd_image_info_t info;
  r = rbd_stat (im->image, &info, sizeof info);
  if (r == 0) {
    im->size = info.size;
    im->obj_size = info.obj_size ? info.obj_size : 1;
    r = rbd_get_features (im->image, &features);
  }
  if (r == 0)
    r = rbd_get_flags (im->image, &flags);
  if (r < 0) {
    nbdkit_error ("rbd: image '%s': %s", name, strerror (-r));
    goto fail;
  }
  /* Without the object map, diff_iterate asks the OSD about every object;
   * a block-status request must not cost a scan of the image. */
  im->object_map = (features & RBD_FEATURE_OBJECT_MAP) &&
                   !(flags & RBD_FLAG_OBJECT_MAP_INVALID);
  nbdkit_debug ("rbd: opened image '%s'%s%s, %" PRIu64 " bytes, features "
                "0x%" PRIx64 "%s", name, rbdp_snap ? "@" : "",
                rbdp_snap ? rbdp_snap : "", im->size, features,
                readonly ? ", read-only" : "");
  rbdp_img_check_config (im);
  return 0;

fail:
  if (im->image)
    rbd_close (im->image);
  im->image = NULL;
  return -1;
}

/* The shared image for name: found, or opened by this call.  rbd_open
 * runs without rbdp_imgs_lock, as a listed entry marked opening: while
 * the cluster keeps one open waiting, other images still open and close
 * (blkd closes on its event loop, which must not wait behind an open),
 * and only those who want the same image wait for its result. */
static struct rbdp_img *
rbdp_img_get (const char *name, bool readonly)
{
  struct rbdp_img *im;

  pthread_mutex_lock (&rbdp_imgs_lock);
  for (;;) {
    for (im = rbdp_imgs; im; im = im->next)
      if (im->readonly == readonly && strcmp (im->name, name) == 0)
        break;
    if (!im || !im->opening)
      break;
    pthread_cond_wait (&rbdp_opened_cond, &rbdp_imgs_lock);
  }
  if (im) {
    im->refs++;
    pthread_mutex_unlock (&rbdp_imgs_lock);
    return im;
  }
  im = calloc (1, sizeof *im);
  if (!im || !(im->name = strdup (name))) {
    pthread_mutex_unlock (&rbdp_imgs_lock);
    nbdkit_error ("rbd: %m");
    free (im);
    return NULL;
  }
  im->readonly = readonly;
  im->opening = true;
  im->refs = 1;
  im->next = rbdp_imgs;
  rbdp_imgs = im;
  pthread_mutex_unlock (&rbdp_imgs_lock);

  int r = rbdp_img_open (im);

  pthread_mutex_lock (&rbdp_imgs_lock);
  im->opening = false;
  if (r == -1) {
    struct rbdp_img **pp;
    for (pp = &rbdp_imgs; *pp != im; pp = &(*pp)->next)
      ;
    *pp = im->next;
  }
  pthread_cond_broadcast (&rbdp_opened_cond);   /* a failure: they try themselves */
  pthread_mutex_unlock (&rbdp_imgs_lock);
  if (r == -1) {
    rbdp_img_free (im);
    return NULL;
  }
  return im;
}

/* The closer: one thread that closes images whose last connection went.
 * rbd_close releases the exclusive lock and the watch, which waits for
 * the OSDs: while one is away it waits as long as the cluster does, and
 * blkd closes handles on its event-loop thread, which must not wait. */
static void *
rbdp_closer (void *arg)
{
  struct rbdp_img *im;

  pthread_mutex_lock (&rbdp_imgs_lock);
  for (;;) {
    while (!rbdp_close_queue && !rbdp_closer_stop)
      pthread_cond_wait (&rbdp_close_cond, &rbdp_imgs_lock);
    im = rbdp_close_queue;
    if (!im)
      break;                          /* stopping, and nothing left */
    rbdp_close_queue = im->next;
    pthread_mutex_unlock (&rbdp_imgs_lock);
    rbdp_img_free (im);
    pthread_mutex_lock (&rbdp_imgs_lock);
  }
  pthread_mutex_unlock (&rbdp_imgs_lock);
  return NULL;
}

static void
rbdp_img_put (struct rbdp_img *im)
{
  struct rbdp_img **pp;
  bool queued = false;

  pthread_mutex_lock (&rbdp_imgs_lock);
  if (--im->refs > 0) {
    pthread_mutex_unlock (&rbdp_imgs_lock);
    return;
  }
  for (pp = &rbdp_imgs; *pp != im; pp = &(*pp)->next)
    ;
  *pp = im->next;
  if (rbdp_closer_running) {
    im->next = rbdp_close_queue;
    rbdp_close_queue = im;
    pthread_cond_signal (&rbdp_close_cond);
    queued = true;
  }
  pthread_mutex_unlock (&rbdp_imgs_lock);
  if (!queued)
    rbdp_img_free (im);
}

static void
rbdp_cleanup (void)
{
  /* Every handle is closed by now; the closer finishes its queue. */
  if (rbdp_closer_running) {
    pthread_mutex_lock (&rbdp_imgs_lock);
    rbdp_closer_stop = true;
    pthread_cond_signal (&rbdp_close_cond);
    pthread_mutex_unlock (&rbdp_imgs_lock);
    pthread_join (rbdp_closer_thread, NULL);
    rbdp_closer_running = false;
  }
  /* Anything left is a server bug; closing it keeps librbd from writing
   * to a freed context. */
  while (rbdp_imgs) {
    struct rbdp_img *im = rbdp_imgs;
    rbdp_imgs = im->next;
    rbdp_img_free (im);
  }
  rbdp_disconnect ();
}

static int
rbdp_list_exports (int readonly, int is_tls, struct nbdkit_exports *exports)
{
  rbd_image_spec_t *specs = NULL;
  size_t n = 16, i;
  int r;

  if (!rbdp_connected) {
    nbdkit_error ("rbd: not connected to the cluster");
    return -1;
  }
  for (;;) {
    specs = calloc (n, sizeof *specs);
    if (!specs) {
      nbdkit_error ("rbd: %m");
      return -1;
    }
    r = rbd_list2 (rbdp_io, specs, &n);
    if (r != -ERANGE)
      break;
    free (specs);                     /* n now says how many there are */
  }
  if (r < 0) {
    free (specs);
    nbdkit_error ("rbd: listing images in pool '%s': %s", rbdp_pool, strerror (-r));
    return -1;
  }
  for (i = 0; i < n && r >= 0; i++)
    r = nbdkit_add_export (exports, specs[i].name, NULL);
  rbd_image_spec_list_cleanup (specs, n);
  free (specs);
  return r < 0 ? -1 : 0;
}

static const char *
rbdp_default_export (int readonly, int is_tls)
{
  return rbdp_image ? rbdp_image : "";
}

static void *
rbdp_open_handle (int readonly)
{
  const char *name = nbdkit_export_name ();
  struct rbdp_handle *h;

  if (!name || !*name)
    name = rbdp_image;
  if (!name) {
    nbdkit_error ("rbd: the client asked for no export name and image= is not "
                  "set: name an image");
    return NULL;
  }
  if (!rbdp_connected) {
    nbdkit_error ("rbd: not connected to the cluster");
    return NULL;
  }
  h = calloc (1, sizeof *h);
  if (!h) {
    nbdkit_error ("rbd: %m");
    return NULL;
  }
  h->readonly = readonly || rbdp_snap;
  h->img = rbdp_img_get (name, h->readonly);
  if (!h->img) {
    free (h);
    return NULL;
  }
  return h;
}

static void
rbdp_close_handle (void *handle)
{
  struct rbdp_handle *h = handle;

  rbdp_img_put (h->img);
  free (h);
}

static int64_t
rbdp_get_size (void *handle)
{
  struct rbdp_handle *h = handle;
  return h->img->size;
}

static int
rbdp_can_write (void *handle)
{
  struct rbdp_handle *h = handle;
  return !h->readonly;
}

static int
rbdp_can_true (void *handle)
{
  return 1;
}

static int
rbdp_can_fua (void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

static int
rbdp_can_extents (void *handle)
{
  struct rbdp_handle *h = handle;
  return h->img->object_map;
}

/* ---- requests ---------------------------------------------------------- */

enum rbdp_op { RBDP_READ, RBDP_WRITE, RBDP_FLUSH, RBDP_TRIM, RBDP_ZERO };

/* One request on its way through librbd: started by rbdp_req_start, and
 * finished, exactly once, through done (from librbd's completion thread,
 * or from the starting thread when librbd refused to start it). */
struct rbdp_req {
  struct rbdp_img *img;
  enum rbdp_op op;
  void *buf;
  uint32_t count;
  uint64_t offset;
  uint32_t flags;
  bool then_flush;                    /* FUA: a flush follows the write */
  uint64_t ops, bytes;                /* its share of rbdp_held_ops/_bytes */
  void (*done) (struct rbdp_req *, int err);
};

/* While the calling thread submits (dispatch=caller), every
 * request of the plugin's counts in rbdp_held_ops/_bytes: its object ops
 * (one per object its range touches, a flush one, FUA's flush one more)
 * and payload bytes.  A synchronous request always counts (capped=false:
 * its thread may wait in the throttle); an aio request only while the
 * total stays within the caps (false: no room, the caller declines).  So
 * the workers' requests, which may fill the throttle while an OSD is
 * away, keep the event loop from submitting into it. */
static bool
rbdp_count (struct rbdp_req *req, bool capped)
{
  uint64_t os = req->img->obj_size, ops = 1, bytes = 0;

  req->ops = req->bytes = 0;
  if (!rbdp_dispatch_caller)
    return true;                      /* librbd's own thread waits, not ours */
  if (req->count)
    ops = (req->offset + req->count - 1) / os - req->offset / os + 1;
  if ((req->flags & NBDKIT_FLAG_FUA) && req->op != RBDP_READ && req->op != RBDP_FLUSH)
    ops++;                            /* the flush that follows */
  if (req->op == RBDP_READ || req->op == RBDP_WRITE)
    bytes = req->count;
  if (atomic_fetch_add (&rbdp_held_ops, ops) + ops > rbdp_cap_ops && capped) {
    atomic_fetch_sub (&rbdp_held_ops, ops);
    return false;
  }
  if (atomic_fetch_add (&rbdp_held_bytes, bytes) + bytes > rbdp_cap_bytes && capped) {
    atomic_fetch_sub (&rbdp_held_bytes, bytes);
    atomic_fetch_sub (&rbdp_held_ops, ops);
    return false;
  }
  req->ops = ops;
  req->bytes = bytes;
  return true;
}

static void
rbdp_uncount (struct rbdp_req *req)
{
  atomic_fetch_sub (&rbdp_held_ops, req->ops);
  atomic_fetch_sub (&rbdp_held_bytes, req->bytes);
  req->ops = req->bytes = 0;
}

static void rbdp_req_cb (rbd_completion_t c, void *arg);

/* Start one librbd call for req; 0 or a negative errno from librbd. */
static int
rbdp_req_issue (struct rbdp_req *req, enum rbdp_op op)
{
  rbd_image_t im = req->img->image;
  rbd_completion_t c;
  int r, zflags;

  r = rbd_aio_create_completion (req, rbdp_req_cb, &c);
  if (r < 0)
    return r;
  req->op = op;
  switch (op) {
  case RBDP_READ:
    r = rbd_aio_read2 (im, req->offset, req->count, req->buf, c, 0);
    break;
  case RBDP_WRITE:
    r = rbd_aio_write2 (im, req->offset, req->count, req->buf, c,
                        req->then_flush ? LIBRADOS_OP_FLAG_FADVISE_FUA : 0);
    break;
  case RBDP_FLUSH:
    r = rbd_aio_flush (im, c);
    break;
  case RBDP_TRIM:
    r = rbd_aio_discard (im, req->offset, req->count, c);
    break;
  case RBDP_ZERO:
    /* Plain write_zeroes deallocates whole objects and zeroes the rest
     * (it never skips a partial object, unlike discard with rbd skip
     * partial discard); without may-trim the zeros must be allocated. */
    zflags = req->flags & NBDKIT_FLAG_MAY_TRIM
             ? 0 : RBD_WRITE_ZEROES_FLAG_THICK_PROVISION;
    r = rbd_aio_write_zeroes (im, req->offset, req->count, c, zflags, 0);
    break;
  default:
    r = -EINVAL;
  }
  if (r < 0)
    rbd_aio_release (c);
  return r;
}

static void
rbdp_req_cb (rbd_completion_t c, void *arg)
{
  struct rbdp_req *req = arg;
  ssize_t r = rbd_aio_get_return_value (c);

  rbd_aio_release (c);
  /* librbd reads the whole range of an image (holes read as zeros), but
   * should it ever come back short, the rest must not be whatever the
   * server's recycled buffer held. */
  if (req->op == RBDP_READ && r >= 0 && (size_t) r < req->count)
    memset ((char *) req->buf + r, 0, req->count - r);
  if (r >= 0 && req->then_flush && req->op != RBDP_FLUSH) {
    r = rbdp_req_issue (req, RBDP_FLUSH);
    if (r == 0)
      return;                         /* the flush's completion finishes */
  }
  req->done (req, r < 0 ? (int) -r : 0);
}

/* Start req; its done runs exactly once, here on failure to start. */
static void
rbdp_req_start (struct rbdp_req *req)
{
  int r;

  req->then_flush = (req->flags & NBDKIT_FLAG_FUA) && req->op != RBDP_READ &&
                    req->op != RBDP_FLUSH;
  r = rbdp_req_issue (req, req->op);
  if (r < 0)
    req->done (req, -r);
}

static const char *
rbdp_op_name (enum rbdp_op op)
{
  switch (op) {
  case RBDP_READ: return "read";
  case RBDP_WRITE: return "write";
  case RBDP_FLUSH: return "flush";
  case RBDP_TRIM: return "trim";
  default: return "zero";
  }
}

/* NBD carries only a few errors; the rest become EINVAL on the wire,
 * which for a request that timed out or a client that was blocklisted
 * says the wrong thing. */
static int
rbdp_nbd_errno (int err)
{
  switch (err) {
  case ETIMEDOUT:
  case ESHUTDOWN:                     /* librados: this client was blocklisted */
  case ENOTCONN:
  case ECONNRESET:
    return EIO;
  case EDQUOT:
    return ENOSPC;
  default:
    return err;
  }
}

/* The synchronous path: start and wait. */
struct rbdp_sync {
  struct rbdp_req req;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool finished;
  int err;
};

static void
rbdp_sync_done (struct rbdp_req *req, int err)
{
  struct rbdp_sync *s = (struct rbdp_sync *) req;

  pthread_mutex_lock (&s->lock);
  s->err = err;
  s->finished = true;
  pthread_cond_signal (&s->cond);
  pthread_mutex_unlock (&s->lock);
}

static int
rbdp_sync (void *handle, enum rbdp_op op, void *buf, uint32_t count,
          uint64_t offset, uint32_t flags)
{
  struct rbdp_handle *h = handle;
  struct rbdp_sync s = {
    .req = { .img = h->img, .op = op, .buf = buf, .count = count,
             .offset = offset, .flags = flags, .done = rbdp_sync_done },
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .cond = PTHREAD_COND_INITIALIZER,
  };

  rbdp_count (&s.req, false);
  rbdp_req_start (&s.req);
  pthread_mutex_lock (&s.lock);
  while (!s.finished)
    pthread_cond_wait (&s.cond, &s.lock);
  pthread_mutex_unlock (&s.lock);
  rbdp_uncount (&s.req);
  /* The signal is the completion's last touch of s: it is safe to go. */
  pthread_cond_destroy (&s.cond);
  pthread_mutex_destroy (&s.lock);
  if (s.err) {
    nbdkit_error ("rbd: %s of %" PRIu32 " bytes at %" PRIu64 " in '%s': %s",
                  rbdp_op_name (op), count, offset, h->img->name, strerror (s.err));
    nbdkit_set_error (rbdp_nbd_errno (s.err));
    return -1;
  }
  return 0;
}

static int
rbdp_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
           uint32_t flags)
{
  return rbdp_sync (handle, RBDP_READ, buf, count, offset, flags);
}

static int
rbdp_pwrite (void *handle, const void *buf, uint32_t count, uint64_t offset,
            uint32_t flags)
{
  return rbdp_sync (handle, RBDP_WRITE, (void *) buf, count, offset, flags);
}

static int
rbdp_flush (void *handle, uint32_t flags)
{
  return rbdp_sync (handle, RBDP_FLUSH, NULL, 0, 0, 0);
}

static int
rbdp_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return rbdp_sync (handle, RBDP_TRIM, NULL, count, offset, flags);
}

/* Fast only when librbd may deallocate (may-trim): thick zeros are
 * written as data. */
static int
rbdp_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  if ((flags & NBDKIT_FLAG_FAST_ZERO) && !(flags & NBDKIT_FLAG_MAY_TRIM)) {
    nbdkit_set_error (ENOTSUP);
    return -1;
  }
  return rbdp_sync (handle, RBDP_ZERO, NULL, count, offset, flags);
}

/* ---- blkd's aio calls (include/blkd-plugin.h) ------------------------ */

/* Under blkd the request starts on the event loop's thread and librbd's
 * completion thread hands it back: no thread waits per request, so the
 * cluster sees as many requests in flight as clients send. */
struct rbdp_aio {
  struct rbdp_req req;
  struct blkd_aio *done;
};

static void
rbdp_aio_done (struct rbdp_req *req, int err)
{
  struct rbdp_aio *a = (struct rbdp_aio *) req;
  struct blkd_aio *done = a->done;

  if (err)
    nbdkit_error ("rbd: %s of %" PRIu32 " bytes at %" PRIu64 " in '%s': %s",
                  rbdp_op_name (req->op), req->count, req->offset,
                  req->img->name, strerror (err));
  rbdp_uncount (req);
  free (a);
  done->complete (done, err ? rbdp_nbd_errno (err) : 0);
}

static int
rbdp_aio_start (void *handle, enum rbdp_op op, void *buf, uint32_t count,
                uint64_t offset, uint32_t flags, struct blkd_aio *done)
{
  struct rbdp_handle *h = handle;
  struct rbdp_aio *a;

  if (!rbdp_use_aio || h->img->aio_declined) {
    errno = ENOTSUP;
    return -1;
  }
  a = malloc (sizeof *a);
  if (!a) {
    errno = ENOTSUP;                  /* the synchronous path may still work */
    return -1;
  }
  a->req = (struct rbdp_req) { .img = h->img, .op = op, .buf = buf, .count = count,
                               .offset = offset, .flags = flags,
                               .done = rbdp_aio_done };
  a->done = done;
  if (!rbdp_count (&a->req, true)) {
    free (a);
    errno = ENOTSUP;                  /* a worker may wait for room; we may not */
    return -1;
  }
  rbdp_req_start (&a->req);           /* done runs exactly once from here on */
  return 0;
}

static int
rbdp_aio_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
                uint32_t flags, struct blkd_aio *done)
{
  return rbdp_aio_start (handle, RBDP_READ, buf, count, offset, flags, done);
}

static int
rbdp_aio_pwrite (void *handle, const void *buf, uint32_t count, uint64_t offset,
                 uint32_t flags, struct blkd_aio *done)
{
  return rbdp_aio_start (handle, RBDP_WRITE, (void *) buf, count, offset, flags, done);
}

static int
rbdp_aio_flush (void *handle, uint32_t flags, struct blkd_aio *done)
{
  return rbdp_aio_start (handle, RBDP_FLUSH, NULL, 0, 0, 0, done);
}

static int
rbdp_aio_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags,
               struct blkd_aio *done)
{
  return rbdp_aio_start (handle, RBDP_TRIM, NULL, count, offset, flags, done);
}

/* A fast zero that must allocate is refused by the synchronous call. */
static int
rbdp_aio_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags,
               struct blkd_aio *done)
{
  if ((flags & NBDKIT_FLAG_FAST_ZERO) && !(flags & NBDKIT_FLAG_MAY_TRIM)) {
    errno = ENOTSUP;
    return -1;
  }
  return rbdp_aio_start (handle, RBDP_ZERO, NULL, count, offset, flags, done);
}

/* Found by blkd with dlsym; nbdkit never looks for it. */
const struct blkd_plugin_extension blkd_plugin_extension = {
  .version    = BLKD_PLUGIN_EXTENSION_VERSION,
  .size       = sizeof (struct blkd_plugin_extension),
  .aio_pread  = rbdp_aio_pread,
  .aio_pwrite = rbdp_aio_pwrite,
  .aio_flush  = rbdp_aio_flush,
  .aio_trim   = rbdp_aio_trim,
  .aio_zero   = rbdp_aio_zero,
};

/* ---- block status ------------------------------------------------------ */

struct rbdp_span {
  uint64_t off, len;
};

struct rbdp_spans {
  struct rbdp_span *v;
  size_t n, cap;
};

static int
rbdp_diff_cb (uint64_t off, size_t len, int exists, void *arg)
{
  struct rbdp_spans *s = arg;

  if (!exists)
    return 0;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    struct rbdp_span *v = realloc (s->v, cap * sizeof *v);
    if (!v)
      return -ENOMEM;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n].off = off;
  s->v[s->n].len = len;
  s->n++;
  return 0;
}

static int
rbdp_span_cmp (const void *a, const void *b)
{
  const struct rbdp_span *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* Allocated objects are data; the rest reads as zeros (a clone's parent
 * included).  whole_object=1 keeps it to the object map's answer; the
 * callbacks may come out of order, so they are sorted, then clipped to
 * the request and the gaps filled with holes. */
static int
rbdp_extents (void *handle, uint32_t count, uint64_t offset, uint32_t flags,
             struct nbdkit_extents *extents)
{
  struct rbdp_handle *h = handle;
  struct rbdp_spans s = { 0 };
  uint64_t pos = offset, end = offset + count;
  size_t i;
  int r;

  r = rbd_diff_iterate2 (h->img->image, NULL, offset, count, 1, 1,
                         rbdp_diff_cb, &s);
  if (r < 0) {
    free (s.v);
    nbdkit_error ("rbd: block status of '%s': %s", h->img->name, strerror (-r));
    nbdkit_set_error (-r);
    return -1;
  }
  qsort (s.v, s.n, sizeof *s.v, rbdp_span_cmp);
  for (i = 0; i < s.n && pos < end && r == 0; i++) {
    uint64_t a = s.v[i].off, b = s.v[i].off + s.v[i].len;
    if (b <= pos)
      continue;
    if (a > end)
      a = end;
    if (a > pos)
      r = nbdkit_add_extent (extents, pos, a - pos,
                             NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO);
    if (a < pos)
      a = pos;
    if (b > end)
      b = end;
    if (r == 0 && b > a)
      r = nbdkit_add_extent (extents, a, b - a, 0);
    if (b > pos)
      pos = b;
  }
  if (r == 0 && pos < end)
    r = nbdkit_add_extent (extents, pos, end - pos,
                           NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO);
  free (s.v);
  return r;
}

static void
rbdp_dump_plugin (void)
{
  int major, minor, extra;

  rbd_version (&major, &minor, &extra);
  printf ("rbdp_librbd_version=%d.%d.%d\n", major, minor, extra);
}

static struct nbdkit_plugin plugin = {
  .name              = "rbd",
  .longname          = "blkd Ceph RBD plugin",
  .version           = "0.1.0",
  .description       = "Serve Ceph RBD images through librbd",
  .config            = rbdp_config,
  .config_complete   = rbdp_config_complete,
  .config_help       =
    "image=<NAME>        Default export (magic key: 'rbd NAME').\n"
    "pool=<POOL>         Pool (default rbd).\n"
    "namespace=<NS>      RBD namespace in the pool.\n"
    "snap=<SNAP>         Serve this snapshot, read-only.\n"
    "id=<ID>             Ceph user without 'client.' (default admin); user= too.\n"
    "conf=<FILE>         ceph.conf (default: CEPH_CONF, /etc/ceph/CLUSTER.conf).\n"
    "keyring=<FILE>      Keyring (default: as the configuration says).\n"
    "cluster=<NAME>      Cluster name (default ceph).\n"
    "timeout=<SECS>      Fail a request after SECS (default 0: wait).\n"
    "connect-timeout=<SECS> Bound on connecting at start-up (default 20).\n"
    "aio=false           Under blkd: no aio calls (compare with the thread path).\n"
    "dispatch=librbd|caller Who maps requests to object ops (default librbd).\n"
    "<ceph_option>=<VAL> Any Ceph option (rbd_cache=false, rbd_cache_policy=...).",
  .magic_config_key  = "image",
  .get_ready         = rbdp_get_ready,
  .after_fork        = rbdp_after_fork,
  .cleanup           = rbdp_cleanup,
  .dump_plugin       = rbdp_dump_plugin,
  .list_exports      = rbdp_list_exports,
  .default_export    = rbdp_default_export,
  .open              = rbdp_open_handle,
  .close             = rbdp_close_handle,
  .get_size          = rbdp_get_size,
  .can_write         = rbdp_can_write,
  .can_flush         = rbdp_can_true,
  .can_trim          = rbdp_can_true,
  .can_zero          = rbdp_can_true,
  .can_fast_zero     = rbdp_can_true,
  .can_extents       = rbdp_can_extents,
  .can_multi_conn    = rbdp_can_true,
  .can_fua           = rbdp_can_fua,
  .pread             = rbdp_pread,
  .pwrite            = rbdp_pwrite,
  .flush             = rbdp_flush,
  .trim              = rbdp_trim,
  .zero              = rbdp_zero,
  .extents           = rbdp_extents,
  .errno_is_preserved = 0,
};

NBDKIT_REGISTER_PLUGIN (plugin)
