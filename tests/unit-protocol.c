/* Unit tests for protocol_validate(): which request headers are answered
 * with which error before anything reaches the plugin. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "../server/internal.h"
#include "unit.h"

#define MiB (1024 * 1024)

/* A connection to a writable 1 MiB export that can do everything, with
 * structured replies and base:allocation negotiated. */
static struct conn *
full_conn (void)
{
  static struct conn c;
  memset (&c, 0, sizeof c);
  c.pc.caps = (struct backend_caps) {
    .size = MiB, .can_write = true, .can_flush = true, .can_trim = true,
    .can_extents = true, .can_fast_zero = true, .can_zero = 2,
    .can_fua = NBDKIT_FUA_NATIVE, .can_cache = NBDKIT_CACHE_NATIVE,
  };
  c.structured = true;
  c.meta_base_allocation = true;
  cfg.readonly = false;
  cfg.max_request = 32 * MiB;
  return &c;
}

static int
validate (struct conn *c, uint16_t type, uint16_t flags, uint64_t offset, uint32_t count)
{
  struct request r = { .type = type, .flags = flags, .offset = offset, .count = count };
  return protocol_validate (c, &r);
}

static void
test_valid_requests (void)
{
  int before = unit_begin ("every command, well formed");
  struct conn *c = full_conn ();
  CHECK_INT (validate (c, NBD_CMD_READ, 0, 0, 4096), 0);
  CHECK_INT (validate (c, NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 4096), 0);
  CHECK_INT (validate (c, NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 4096, 4096), 0);
  CHECK_INT (validate (c, NBD_CMD_DISC, 0, 0, 0), 0);
  CHECK_INT (validate (c, NBD_CMD_FLUSH, 0, 0, 0), 0);
  CHECK_INT (validate (c, NBD_CMD_TRIM, 0, 0, MiB), 0);
  CHECK_INT (validate (c, NBD_CMD_CACHE, 0, 0, 512), 0);
  CHECK_INT (validate (c, NBD_CMD_WRITE_ZEROES,
                       NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO, 0, 8192), 0);
  CHECK_INT (validate (c, NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_REQ_ONE, 0, MiB), 0);
  /* The last byte, exactly. */
  CHECK_INT (validate (c, NBD_CMD_READ, 0, MiB - 1, 1), 0);
  unit_end (before);
}

static void
test_commands_and_flags (void)
{
  int before = unit_begin ("unknown commands and flags");
  struct conn *c = full_conn ();
  CHECK_INT (validate (c, NBD_CMD_COUNT, 0, 0, 512), EINVAL);
  CHECK_INT (validate (c, 0xffff, 0, 0, 512), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_READ, 1u << 15, 0, 512), EINVAL);
  /* Each flag only where the protocol allows it. */
  CHECK_INT (validate (c, NBD_CMD_WRITE, NBD_CMD_FLAG_DF, 0, 512), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_READ, NBD_CMD_FLAG_REQ_ONE, 0, 512), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_WRITE, NBD_CMD_FLAG_NO_HOLE, 0, 512), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_TRIM, NBD_CMD_FLAG_FAST_ZERO, 0, 512), EINVAL);
  /* DF only once structured replies are negotiated. */
  c->structured = false;
  CHECK_INT (validate (c, NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 512), EINVAL);
  /* FAST_ZERO only when the plugin can. */
  c = full_conn ();
  c->pc.caps.can_fast_zero = false;
  CHECK_INT (validate (c, NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FAST_ZERO, 0, 512), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_WRITE_ZEROES, 0, 0, 512), 0);
  unit_end (before);
}

static void
test_capabilities (void)
{
  int before = unit_begin ("what the plugin or the options forbid");
  struct conn *c = full_conn ();
  c->pc.caps.can_write = false;
  CHECK_INT (validate (c, NBD_CMD_WRITE, 0, 0, 512), EPERM);
  CHECK_INT (validate (c, NBD_CMD_TRIM, 0, 0, 512), EPERM);
  CHECK_INT (validate (c, NBD_CMD_WRITE_ZEROES, 0, 0, 512), EPERM);
  CHECK_INT (validate (c, NBD_CMD_READ, 0, 0, 512), 0);
  /* Read-only: a write-like request is EPERM whatever its flags. */
  c->pc.caps.can_fast_zero = false;
  CHECK_INT (validate (c, NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FAST_ZERO, 0, 512), EPERM);

  c = full_conn ();
  cfg.readonly = true;                  /* --readonly beats a writable plugin */
  CHECK_INT (validate (c, NBD_CMD_WRITE, 0, 0, 512), EPERM);
  cfg.readonly = false;

  c = full_conn ();
  c->pc.caps.can_trim = false;
  CHECK_INT (validate (c, NBD_CMD_TRIM, 0, 0, 512), EINVAL);
  c->pc.caps.can_flush = false;
  CHECK_INT (validate (c, NBD_CMD_FLUSH, 0, 0, 0), EINVAL);
  c->pc.caps.can_cache = NBDKIT_CACHE_NONE;
  CHECK_INT (validate (c, NBD_CMD_CACHE, 0, 0, 512), EINVAL);
  c->meta_base_allocation = false;
  CHECK_INT (validate (c, NBD_CMD_BLOCK_STATUS, 0, 0, 512), EINVAL);
  unit_end (before);
}

static void
test_ranges (void)
{
  int before = unit_begin ("offsets, lengths and block sizes");
  struct conn *c = full_conn ();
  CHECK_INT (validate (c, NBD_CMD_READ, 0, 0, 0), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_TRIM, 0, 0, 0), EINVAL);
  /* FLUSH carries no range at all. */
  CHECK_INT (validate (c, NBD_CMD_FLUSH, 0, 0, 512), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_FLUSH, 0, 512, 0), EINVAL);
  /* Past the end: writes say ENOSPC, the rest EINVAL. */
  CHECK_INT (validate (c, NBD_CMD_READ, 0, MiB, 1), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_READ, 0, MiB - 512, 1024), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_WRITE, 0, MiB - 512, 1024), ENOSPC);
  CHECK_INT (validate (c, NBD_CMD_WRITE_ZEROES, 0, MiB, 512), ENOSPC);
  CHECK_INT (validate (c, NBD_CMD_TRIM, 0, MiB, 512), EINVAL);
  /* offset + count must not wrap around. */
  CHECK_INT (validate (c, NBD_CMD_READ, 0, UINT64_MAX - 10, 512), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_WRITE, 0, UINT64_MAX, 1), ENOSPC);

  /* READ/WRITE above the advertised maximum: --max-request, or the
   * plugin's block_max when smaller.  Other commands have no such cap. */
  c->pc.caps.size = 64 * MiB;
  cfg.max_request = MiB;
  CHECK_INT (validate (c, NBD_CMD_READ, 0, 0, MiB), 0);
  CHECK_INT (validate (c, NBD_CMD_READ, 0, 0, MiB + 1), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_WRITE, 0, 0, MiB + 1), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_TRIM, 0, 0, 2 * MiB), 0);
  c->pc.caps.block_max = 64 * 1024;
  CHECK_INT (validate (c, NBD_CMD_READ, 0, 0, 64 * 1024), 0);
  CHECK_INT (validate (c, NBD_CMD_READ, 0, 0, 64 * 1024 + 512), EINVAL);

  /* The plugin's minimum block size: offset and count both aligned. */
  c = full_conn ();
  c->pc.caps.block_min = 4096;
  CHECK_INT (validate (c, NBD_CMD_READ, 0, 4096, 4096), 0);
  CHECK_INT (validate (c, NBD_CMD_READ, 0, 512, 4096), EINVAL);
  CHECK_INT (validate (c, NBD_CMD_WRITE, 0, 0, 4096 + 512), EINVAL);
  unit_end (before);
}

int
main (void)
{
  test_valid_requests ();
  test_commands_and_flags ();
  test_capabilities ();
  test_ranges ();
  return unit_exit ("unit-protocol");
}
