/* partial plugin: TEST ONLY (built, never installed) -- fails reads after filling half the buffer. */

/* blkd's buffer-safety tests use this to check that no stale bytes reach
 * a client from an error path or a hole:
 *
 * - [0, size/4) is a hole: block status says HOLE|ZERO and pread fills
 *   zeros there;
 * - the rest reads as the byte 0x5A;
 * - a read whose offset lies in the second half, [size/2, size), fills
 *   only the first half of the request (0x5A) and then fails with EIO,
 *   leaving the second half of the buffer exactly as the server handed it
 *   over -- that is the point: a server that replies from a recycled
 *   buffer without clearing it would leak the previous request's bytes;
 * - writes succeed and are discarded (so reads never change).
 *
 * Everything is computed from the offset, so there is no state and no
 * lock: THREAD_MODEL PARALLEL and multi-conn are trivially safe.
 */

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

#define PARTIAL_PATTERN 0x5A

static int64_t partial_size = -1;

static int
partial_config(const char *key, const char *value)
{
  if (strcmp(key, "size") == 0) {
    partial_size = nbdkit_parse_size(value);
    return partial_size == -1 ? -1 : 0;
  }
  nbdkit_error("partial: unknown parameter '%s'", key);
  return -1;
}

static int
partial_config_complete(void)
{
  if (partial_size == -1) {
    nbdkit_error("partial: size=SIZE is required");
    return -1;
  }
  return 0;
}

static void *
partial_open(int readonly)
{
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static int64_t
partial_get_size(void *handle)
{
  return partial_size;
}

static int
partial_can_true(void *handle)
{
  return 1;
}

/* Fill [offset, offset+count) as it reads: zeros in the hole, the
 * pattern elsewhere. */
static void
partial_fill(unsigned char *buf, uint32_t count, uint64_t offset)
{
  uint64_t hole_end = (uint64_t)partial_size / 4;
  uint32_t zeros = 0;

  if (offset < hole_end)
    zeros = hole_end - offset < count ? hole_end - offset : count;
  memset(buf, 0, zeros);
  memset(buf + zeros, PARTIAL_PATTERN, count - zeros);
}

static int
partial_pread(void *handle, void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  if (offset >= (uint64_t)partial_size / 2) {
    /* Half the data, then an error: the rest of buf is deliberately
     * left untouched. */
    partial_fill(buf, count / 2, offset);
    nbdkit_error("partial: read at %" PRIu64 " fails after %" PRIu32
                 " of %" PRIu32 " bytes (by design)", offset, count / 2, count);
    errno = EIO;
    return -1;
  }
  partial_fill(buf, count, offset);
  return 0;
}

static int
partial_pwrite(void *handle, const void *buf, uint32_t count, uint64_t offset,
               uint32_t flags)
{
  return 0;
}

static int
partial_extents(void *handle, uint32_t count, uint64_t offset, uint32_t flags,
                struct nbdkit_extents *extents)
{
  uint64_t hole_end = (uint64_t)partial_size / 4;

  /* The server clips extents to the request, so the whole map can be
   * added every time. */
  if (nbdkit_add_extent(extents, 0, hole_end,
                        NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO) == -1)
    return -1;
  return nbdkit_add_extent(extents, hole_end, partial_size - hole_end, 0);
}

static struct nbdkit_plugin plugin = {
  .name              = "partial",
  .longname          = "blkd test plugin: partial reads then errors",
  .version           = "0.1.0",
  .description       = "Test plugin (not installed): hole, pattern, "
                       "half-filled failing reads",
  .config            = partial_config,
  .config_complete   = partial_config_complete,
  .config_help       = "size=<SIZE>   (required) Size of the test disk.",
  .magic_config_key  = "size",
  .open              = partial_open,
  .get_size          = partial_get_size,
  .can_multi_conn    = partial_can_true,
  .can_extents       = partial_can_true,
  .pread             = partial_pread,
  .pwrite            = partial_pwrite,
  .extents           = partial_extents,
  .errno_is_preserved = 1,
};

NBDKIT_REGISTER_PLUGIN(plugin)
