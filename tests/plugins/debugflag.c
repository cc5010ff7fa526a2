/* debugflag test plugin: its size shows the -D flags it was given, to prove blkd sets them as nbdkit does. */

/* -D debugflag.sectors=N makes the disk N sectors of 512 bytes (1 MiB
 * when 0); -D debugflag.extra.sectors=M (a dotted flag: nbdkit sets
 * debugflag_debug_extra_sectors) adds M more.  The flags are read in
 * get_ready, so a flag set after load would still be seen; flags set
 * after the size is computed would not. */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <stdint.h>
#include <string.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

NBDKIT_DLL_PUBLIC int debugflag_debug_sectors;
NBDKIT_DLL_PUBLIC int debugflag_debug_extra_sectors;

static int64_t debugflag_size;

static int
debugflag_get_ready (void)
{
  int64_t sectors = debugflag_debug_sectors ? debugflag_debug_sectors : 2048;
  debugflag_size = (sectors + debugflag_debug_extra_sectors) * 512;
  return 0;
}

static void *
debugflag_open (int readonly)
{
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static int64_t
debugflag_get_size (void *handle)
{
  return debugflag_size;
}

static int
debugflag_pread (void *handle, void *buf, uint32_t count, uint64_t offset, uint32_t flags)
{
  memset (buf, 0, count);
  return 0;
}

static struct nbdkit_plugin plugin = {
  .name = "debugflag",
  .longname = "blkd's -D test plugin",
  .description = "Its size is set by -D debugflag.sectors=N and -D debugflag.extra.sectors=M.",
  .get_ready = debugflag_get_ready,
  .open = debugflag_open,
  .get_size = debugflag_get_size,
  .pread = debugflag_pread,
};

NBDKIT_REGISTER_PLUGIN (plugin)
