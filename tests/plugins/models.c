/* models test plugin: reports the concurrency it saw, to prove blkd enforces each thread model. */

/* model=0..3 picks the thread model (through .thread_model, which can only
 * lower the compiled-in PARALLEL).  Every pread sleeps 2 ms so overlapping
 * calls really overlap, and fills the first 12 bytes of the buffer with the
 * highest concurrency seen so far, big-endian: calls in flight in the whole
 * plugin, calls in flight on one handle, handles open at once.  The rest
 * of the buffer is zeros. */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <endian.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static int models_model = NBDKIT_THREAD_MODEL_PARALLEL;
static atomic_int models_active, models_max_active;
static atomic_int models_nopen, models_max_open, models_max_handle;

struct models_handle {
  atomic_int active;
};

static void
models_raise (atomic_int *max, int v)
{
  int m = atomic_load (max);
  while (v > m && !atomic_compare_exchange_weak (max, &m, v))
    ;
}

static int
models_config (const char *key, const char *value)
{
  if (strcmp (key, "model") != 0) {
    nbdkit_error ("unknown parameter '%s'", key);
    return -1;
  }
  if (nbdkit_parse_int ("model", value, &models_model) == -1)
    return -1;
  if (models_model < 0 || models_model > 3) {
    nbdkit_error ("model must be 0..3");
    return -1;
  }
  return 0;
}

static int
models_thread_model (void)
{
  return models_model;
}

static void *
models_open (int readonly)
{
  struct models_handle *h = calloc (1, sizeof *h);
  if (!h) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  models_raise (&models_max_open, atomic_fetch_add (&models_nopen, 1) + 1);
  return h;
}

static void
models_close (void *handle)
{
  atomic_fetch_sub (&models_nopen, 1);
  free (handle);
}

static int64_t
models_get_size (void *handle)
{
  return 1024 * 1024;
}

static int
models_pread (void *handle, void *buf, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct models_handle *h = handle;
  models_raise (&models_max_active, atomic_fetch_add (&models_active, 1) + 1);
  models_raise (&models_max_handle, atomic_fetch_add (&h->active, 1) + 1);
  struct timespec ts = { 0, 2 * 1000 * 1000 };
  nanosleep (&ts, NULL);
  atomic_fetch_sub (&h->active, 1);
  atomic_fetch_sub (&models_active, 1);

  uint32_t v[3] = { htobe32 (atomic_load (&models_max_active)),
                    htobe32 (atomic_load (&models_max_handle)),
                    htobe32 (atomic_load (&models_max_open)) };
  memset (buf, 0, count);
  memcpy (buf, v, count < sizeof v ? count : sizeof v);
  return 0;
}

/* Advertises a 1 MiB maximum request, so the host's enforcement of a
 * plugin maximum smaller than its own can be tested. */
static int
models_block_size (void *handle, uint32_t *min, uint32_t *pref, uint32_t *max)
{
  *min = 1;
  *pref = 4096;
  *max = 1024 * 1024;
  return 0;
}

static struct nbdkit_plugin plugin = {
  .name = "models",
  .block_size = models_block_size,
  .config = models_config,
  .magic_config_key = "model",
  .thread_model = models_thread_model,
  .open = models_open,
  .close = models_close,
  .get_size = models_get_size,
  .pread = models_pread,
  .errno_is_preserved = 1,
};

NBDKIT_REGISTER_PLUGIN (plugin)
