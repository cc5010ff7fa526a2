/* perconn test plugin: every connection sees its own disk, filled with a byte of its own, to prove a cache never hands one connection another's data. */

/* Each open makes a private in-memory disk of size= bytes (default 4 MiB)
 * whose every byte is the connection's number (1, 2, ... in open order,
 * modulo 255, never 0).  Writes change only that connection's disk.  The
 * plugin says so honestly: can_multi_conn is false unless multi_conn=true
 * is given, which lets a test check what a lying plugin would get. */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static int64_t perconn_size = 4 << 20;
static int perconn_multi_conn;
static atomic_uint perconn_opens;

struct perconn_handle {
  uint8_t *disk;
};

static int
perconn_config (const char *key, const char *value)
{
  if (strcmp (key, "size") == 0) {
    perconn_size = nbdkit_parse_size (value);
    return perconn_size < 0 ? -1 : 0;
  }
  if (strcmp (key, "multi_conn") == 0) {
    perconn_multi_conn = nbdkit_parse_bool (value);
    return perconn_multi_conn < 0 ? -1 : 0;
  }
  nbdkit_error ("unknown parameter '%s'", key);
  return -1;
}

static void *
perconn_open (int readonly)
{
  struct perconn_handle *h = malloc (sizeof *h);
  if (!h)
    return NULL;
  h->disk = malloc (perconn_size);
  if (!h->disk) {
    free (h);
    return NULL;
  }
  unsigned n = atomic_fetch_add (&perconn_opens, 1) + 1;
  memset (h->disk, (int) (n % 255 ? n % 255 : 255), perconn_size);
  return h;
}

static void
perconn_close (void *handle)
{
  struct perconn_handle *h = handle;
  free (h->disk);
  free (h);
}

static int64_t
perconn_get_size (void *handle)
{
  return perconn_size;
}

static int
perconn_can_multi_conn (void *handle)
{
  return perconn_multi_conn;
}

static int
perconn_pread (void *handle, void *buf, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct perconn_handle *h = handle;
  memcpy (buf, h->disk + offset, count);
  return 0;
}

static int
perconn_pwrite (void *handle, const void *buf, uint32_t count, uint64_t offset,
                uint32_t flags)
{
  struct perconn_handle *h = handle;
  memcpy (h->disk + offset, buf, count);
  return 0;
}

static int
perconn_flush (void *handle, uint32_t flags)
{
  return 0;
}

static struct nbdkit_plugin plugin = {
  .name = "perconn",
  .version = "1.0",
  .config = perconn_config,
  .magic_config_key = "size",
  .open = perconn_open,
  .close = perconn_close,
  .get_size = perconn_get_size,
  .can_multi_conn = perconn_can_multi_conn,
  .pread = perconn_pread,
  .pwrite = perconn_pwrite,
  .flush = perconn_flush,
};

NBDKIT_REGISTER_PLUGIN (plugin)
