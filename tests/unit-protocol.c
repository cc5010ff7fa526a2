/* Unit tests for protocol_validate(): which request headers are answered
 * with which error before anything reaches the plugin; and the parse of
 * compact and extended request headers. */
#include <endian.h>
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

/* Wire images of the two request forms. */
static size_t
compact_hdr (uint8_t *b, uint32_t magic, uint16_t flags, uint16_t type, uint64_t cookie,
             uint64_t offset, uint32_t count)
{
  struct nbd_request q = {
    .magic = htobe32 (magic), .flags = htobe16 (flags), .type = htobe16 (type),
    .cookie = cookie, .offset = htobe64 (offset), .count = htobe32 (count),
  };
  memcpy (b, &q, sizeof q);
  return sizeof q;
}

static size_t
extended_hdr (uint8_t *b, uint32_t magic, uint16_t flags, uint16_t type, uint64_t cookie,
              uint64_t offset, uint64_t length)
{
  struct nbd_extended_request x = {
    .magic = htobe32 (magic), .flags = htobe16 (flags), .type = htobe16 (type),
    .cookie = cookie, .offset = htobe64 (offset), .length = htobe64 (length),
  };
  memcpy (b, &x, sizeof x);
  return sizeof x;
}

static void
test_parse_headers (void)
{
  int before = unit_begin ("compact and extended request headers");
  uint8_t b[64];
  struct protocol_header h;

  CHECK_INT (sizeof (struct nbd_request), 28);
  CHECK_INT (sizeof (struct nbd_extended_request), 32);
  CHECK_INT (sizeof (struct nbd_extended_reply), 32);

  size_t n = compact_hdr (b, NBD_REQUEST_MAGIC, NBD_CMD_FLAG_FUA, NBD_CMD_WRITE,
                          0x1122334455667788, 4096, 512);
  CHECK_INT (protocol_parse_header (false, b, n, &h), 28);
  CHECK_INT (h.type, NBD_CMD_WRITE);
  CHECK_INT (h.flags, NBD_CMD_FLAG_FUA);
  CHECK_INT (h.offset, 4096);
  CHECK_INT (h.length, 512);
  CHECK (h.cookie == 0x1122334455667788);   /* wire order, untouched */
  /* Short: wait for the rest. */
  CHECK_INT (protocol_parse_header (false, b, n - 1, &h), 0);
  /* A compact header where extended ones were negotiated, and back. */
  CHECK_INT (protocol_parse_header (true, b, sizeof b, &h), -1);

  n = extended_hdr (b, NBD_EXTENDED_REQUEST_MAGIC, 0, NBD_CMD_WRITE_ZEROES, 7,
                    UINT64_C (1) << 40, UINT64_C (64) << 30);
  CHECK_INT (protocol_parse_header (true, b, n, &h), 32);
  CHECK_INT (h.type, NBD_CMD_WRITE_ZEROES);
  CHECK (h.length == UINT64_C (64) << 30);    /* all 64 bits */
  CHECK (h.offset == UINT64_C (1) << 40);
  CHECK_INT (protocol_parse_header (true, b, 31, &h), 0);
  CHECK_INT (protocol_parse_header (false, b, n, &h), -1);
  /* Each other magic is refused in each form. */
  compact_hdr (b, NBD_EXTENDED_REQUEST_MAGIC, 0, 0, 0, 0, 0);
  CHECK_INT (protocol_parse_header (false, b, 28, &h), -1);
  extended_hdr (b, NBD_REQUEST_MAGIC, 0, 0, 0, 0, 0);
  CHECK_INT (protocol_parse_header (true, b, 32, &h), -1);
  unit_end (before);
}

static enum ext_payload
ext_payload (struct conn *c, uint16_t type, uint16_t flags, uint64_t length, uint64_t *payload,
             uint16_t *flags_after)
{
  struct request r = { .conn = c, .type = type, .flags = flags, .count = length };
  enum ext_payload ep = protocol_ext_payload (c, &r, payload);
  *flags_after = r.flags;
  return ep;
}

static void
test_payload_len (void)
{
  int before = unit_begin ("extended headers: NBD_CMD_FLAG_PAYLOAD_LEN");
  struct conn *c = full_conn ();
  c->extended = true;
  uint64_t pl;
  uint16_t f;
  /* WRITE carries the flag; it is taken off before validation. */
  CHECK_INT (ext_payload (c, NBD_CMD_WRITE, NBD_CMD_FLAG_PAYLOAD_LEN | NBD_CMD_FLAG_FUA,
                          4096, &pl, &f), EXT_PAYLOAD_NONE);
  CHECK_INT (pl, 4096);
  CHECK_INT (f, NBD_CMD_FLAG_FUA);
  /* WRITE without it (qemu 10's client): the length is still its payload. */
  CHECK_INT (ext_payload (c, NBD_CMD_WRITE, 0, 4096, &pl, &f), EXT_PAYLOAD_NONE);
  CHECK_INT (pl, 4096);
  CHECK_INT (ext_payload (c, NBD_CMD_WRITE, 0, UINT64_C (1) << 40, &pl, &f),
             EXT_PAYLOAD_CLOSE);
  /* A payload on a command that takes none: read past it, EINVAL. */
  CHECK_INT (ext_payload (c, NBD_CMD_TRIM, NBD_CMD_FLAG_PAYLOAD_LEN, 100, &pl, &f),
             EXT_PAYLOAD_REFUSE);
  CHECK_INT (pl, 100);
  CHECK_INT (ext_payload (c, NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_PAYLOAD_LEN, 8, &pl, &f),
             EXT_PAYLOAD_REFUSE);
  /* Absurd payloads: over the limit (never less than 32 MiB) closes. */
  cfg.max_request = MiB;
  CHECK_INT (ext_payload (c, NBD_CMD_WRITE, NBD_CMD_FLAG_PAYLOAD_LEN, 32 * MiB, &pl, &f),
             EXT_PAYLOAD_NONE);
  CHECK_INT (ext_payload (c, NBD_CMD_WRITE, NBD_CMD_FLAG_PAYLOAD_LEN, 32 * MiB + 1, &pl, &f),
             EXT_PAYLOAD_CLOSE);
  CHECK_INT (ext_payload (c, NBD_CMD_READ, NBD_CMD_FLAG_PAYLOAD_LEN, UINT64_MAX, &pl, &f),
             EXT_PAYLOAD_CLOSE);
  /* No flag: the length is an effect length, nothing follows. */
  CHECK_INT (ext_payload (c, NBD_CMD_TRIM, 0, UINT64_C (1) << 40, &pl, &f),
             EXT_PAYLOAD_NONE);
  CHECK_INT (pl, 0);
  unit_end (before);
}

static int
validate64 (struct conn *c, uint16_t type, uint16_t flags, uint64_t offset, uint64_t count)
{
  struct request r = { .conn = c, .type = type, .flags = flags, .offset = offset,
                       .count = count };
  return protocol_validate (c, &r);
}

static void
test_extended_ranges (void)
{
  int before = unit_begin ("extended headers: 64-bit lengths and the payload limit");
  struct conn *c = full_conn ();
  c->extended = true;
  c->pc.caps.size = INT64_C (1) << 40;     /* 1 TiB */
  uint64_t big = UINT64_C (64) << 30;
  CHECK_INT (validate64 (c, NBD_CMD_TRIM, 0, 0, big), 0);
  CHECK_INT (validate64 (c, NBD_CMD_WRITE_ZEROES, 0, 0, big), 0);
  CHECK_INT (validate64 (c, NBD_CMD_BLOCK_STATUS, 0, 0, UINT64_C (1) << 40), 0);
  CHECK_INT (validate64 (c, NBD_CMD_CACHE, 0, 4096, big), 0);
  /* Past the end, and wrapping, in 64 bits. */
  CHECK_INT (validate64 (c, NBD_CMD_TRIM, 0, 4096, UINT64_C (1) << 40), EINVAL);
  CHECK_INT (validate64 (c, NBD_CMD_WRITE_ZEROES, 0, 1, UINT64_MAX), ENOSPC);
  CHECK_INT (validate64 (c, NBD_CMD_BLOCK_STATUS, 0, UINT64_MAX, 2), EINVAL);
  /* READ over the payload limit: EOVERFLOW (proto.md), the errno that
   * becomes NBD_EOVERFLOW on the wire once extended headers are on;
   * WRITE stays EINVAL.  Compact headers keep EINVAL for both. */
  struct request r = { .conn = c, .type = NBD_CMD_READ };
  CHECK_INT (validate64 (c, NBD_CMD_READ, 0, 0, 32 * MiB + 1), EOVERFLOW);
  CHECK_INT (protocol_nbd_error (EOVERFLOW, &r), NBD_EOVERFLOW);
  CHECK_INT (validate64 (c, NBD_CMD_READ, 0, 0, big), EOVERFLOW);
  CHECK_INT (validate64 (c, NBD_CMD_WRITE, 0, 0, 32 * MiB + 1), EINVAL);
  c->extended = false;
  CHECK_INT (validate64 (c, NBD_CMD_READ, 0, 0, 32 * MiB + 1), EINVAL);
  CHECK_INT (protocol_nbd_error (EOVERFLOW, &r), NBD_EINVAL);
  /* PAYLOAD_LEN is not a flag validation lets through (compact use). */
  CHECK_INT (validate64 (c, NBD_CMD_WRITE, NBD_CMD_FLAG_PAYLOAD_LEN, 0, 512), EINVAL);
  unit_end (before);
}

int
main (void)
{
  test_valid_requests ();
  test_commands_and_flags ();
  test_capabilities ();
  test_ranges ();
  test_parse_headers ();
  test_payload_len ();
  test_extended_ranges ();
  return unit_exit ("unit-protocol");
}
