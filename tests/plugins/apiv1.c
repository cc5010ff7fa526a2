/* apiv1 test plugin: a small RAM disk written to the old API version 1. */

/* Version 1 callbacks take no flags, zero has a may_trim argument, and
 * there is no can_fua: the host must emulate FUA with flush and reach the
 * v1 function pointers at their old offsets.  errno_is_preserved is 0, so
 * errors travel by nbdkit_set_error: writes at the last 4 KiB fail with
 * ENOSPC that way. */
#define NBDKIT_API_VERSION 1
#include <nbdkit-plugin.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_SERIALIZE_ALL_REQUESTS
#define APIV1_SIZE (16 * 1024 * 1024)

static unsigned char *apiv1_disk;
static int apiv1_flushes;

static int
apiv1_config_complete (void)
{
  apiv1_disk = calloc (1, APIV1_SIZE);
  if (!apiv1_disk) {
    nbdkit_error ("calloc: %m");
    return -1;
  }
  return 0;
}

static void
apiv1_unload (void)
{
  free (apiv1_disk);
}

static void *
apiv1_open (int readonly)
{
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static int64_t
apiv1_get_size (void *handle)
{
  return APIV1_SIZE;
}

static int
apiv1_pread (void *handle, void *buf, uint32_t count, uint64_t offset)
{
  memcpy (buf, apiv1_disk + offset, count);
  return 0;
}

static int
apiv1_pwrite (void *handle, const void *buf, uint32_t count, uint64_t offset)
{
  if (offset + count > APIV1_SIZE - 4096) {
    nbdkit_set_error (ENOSPC);
    errno = EBADF;                      /* must be ignored: not preserved */
    return -1;
  }
  memcpy (apiv1_disk + offset, buf, count);
  return 0;
}

static int
apiv1_flush (void *handle)
{
  apiv1_flushes++;
  return 0;
}

static int
apiv1_trim (void *handle, uint32_t count, uint64_t offset)
{
  memset (apiv1_disk + offset, 0, count);
  return 0;
}

static int
apiv1_zero (void *handle, uint32_t count, uint64_t offset, int may_trim)
{
  memset (apiv1_disk + offset, 0, count);
  return 0;
}

static struct nbdkit_plugin plugin = {
  .name = "apiv1",
  .config_complete = apiv1_config_complete,
  .unload = apiv1_unload,
  .open = apiv1_open,
  .get_size = apiv1_get_size,
  .pread = apiv1_pread,
  .pwrite = apiv1_pwrite,
  .flush = apiv1_flush,
  .trim = apiv1_trim,
  .zero = apiv1_zero,
  .errno_is_preserved = 0,
};

NBDKIT_REGISTER_PLUGIN (plugin)
