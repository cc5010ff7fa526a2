/* Unit tests for the layer stack (server/stack.c, server/backend.c): built
 * from the real in-tree ram plugin, blkd's cache and one of nbdkit's own
 * filters, then driven through backend_* as the protocol drives it: the
 * order of the layers, key=value routing, nbdkit's rules on every call
 * (range and flag checks, can_* cached, a read-only context asked
 * nothing), and zero copy as a layer operation: lent and placed through
 * the plugin alone, "not supported" through the cache or a filter. */
#include <errno.h>

#include "blkd-plugin.h"
#include "unit.h"
#include "unitstack.h"

static void
fill (uint8_t *p, size_t n, unsigned seed)
{
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t) (i * 31 + seed + (i >> 9));
}

static uint64_t
lent_total (const struct blkd_lend *l)
{
  uint64_t sum = 0;
  for (unsigned i = 0; i < l->n; i++)
    sum += l->iov[i].iov_len;
  return sum;
}

/* Copy a lent range out, piece by piece. */
static void
gather (const struct blkd_lend *l, uint8_t *out)
{
  for (unsigned i = 0; i < l->n; i++) {
    memcpy (out, l->iov[i].iov_base, l->iov[i].iov_len);
    out += l->iov[i].iov_len;
  }
}

static void
test_plugin_alone (void)
{
  int before = unit_begin ("the ram plugin alone");
  static uint8_t buf[256 * KiB], want[256 * KiB];
  struct backend_conn bc;
  int err = 0;

  CHECK_INT (stack_load_ram (NULL, 0, "size=1M"), 0);
  CHECK (backend_top && strcmp (backend_top->type, "plugin") == 0);
  CHECK (backend_top && backend_top->next == NULL && backend_top->i == 0);
  CHECK (backend_top && strcmp (backend_top->name, "ram") == 0);
  CHECK_INT (backend_thread_model (), NBDKIT_THREAD_MODEL_PARALLEL);
  CHECK (backend_inline_safe ());       /* ram is an in-memory plugin */

  backend_conn_init (&bc, -1);
  CHECK_INT (backend_conn_open (&bc, "", false), 0);
  CHECK_INT (bc.caps.size, MiB);
  CHECK (bc.caps.can_write && bc.caps.can_flush && bc.caps.can_trim);
  CHECK (bc.caps.can_multi_conn && bc.caps.can_extents && bc.caps.can_fast_zero);
  CHECK_INT (bc.caps.can_zero, NBDKIT_ZERO_NATIVE);
  struct context *c = bc.top;
  /* Asked once at open and cached on the context, as nbdkit does. */
  CHECK_INT (c->can_write, 1);
  CHECK_INT (c->exportsize, MiB);

  /* Ranges and flags the layer below never sees. */
  CHECK_INT (CALL (&bc, backend_pread (c, buf, 4 * KiB, MiB - 4 * KiB + 1, 0, &err)), -1);
  CHECK_INT (err, EINVAL);
  err = 0;
  CHECK_INT (CALL (&bc, backend_pread (c, buf, 0, 0, 0, &err)), -1);
  CHECK_INT (err, EINVAL);
  err = 0;
  CHECK_INT (CALL (&bc, backend_pread (c, buf, 512, 0, NBDKIT_FLAG_FUA, &err)), -1);
  CHECK_INT (err, EINVAL);
  err = 0;
  CHECK_INT (CALL (&bc, backend_pwrite (c, buf, 512, 0, NBDKIT_FLAG_MAY_TRIM, &err)), -1);
  CHECK_INT (err, EINVAL);
  err = 0;
  CHECK_INT (CALL (&bc, backend_flush (c, NBDKIT_FLAG_FUA, &err)), -1);
  CHECK_INT (err, EINVAL);

  /* Data goes through and comes back. */
  fill (want, sizeof want, 7);
  CHECK_INT (CALL (&bc, backend_pwrite (c, want, sizeof want, 128 * KiB, NBDKIT_FLAG_FUA,
                                        &err)), 0);
  CHECK_INT (CALL (&bc, backend_pread (c, buf, sizeof buf, 128 * KiB, 0, &err)), 0);
  CHECK (memcmp (buf, want, sizeof buf) == 0);
  CHECK_INT (CALL (&bc, backend_zero (c, 64 * KiB, 128 * KiB, NBDKIT_FLAG_MAY_TRIM
                                      | NBDKIT_FLAG_FAST_ZERO, &err)), 0);
  CHECK_INT (CALL (&bc, backend_pread (c, buf, 64 * KiB, 128 * KiB, 0, &err)), 0);
  memset (want, 0, 64 * KiB);
  CHECK (memcmp (buf, want, 64 * KiB) == 0);

  /* Lent straight from the plugin's chunks, exactly covering the range. */
  struct iovec iov[REQ_LEND_MAX];
  void *token[REQ_LEND_MAX];
  struct blkd_lend l = { .iov = iov, .token = token, .max = REQ_LEND_MAX };
  fill (want, sizeof want, 7);
  CHECK_INT (CALL (&bc, backend_pread_lend (c, 128 * KiB, 192 * KiB, 0, &l, &err)), 0);
  CHECK (l.n >= 1 && l.n <= REQ_LEND_MAX);
  CHECK_INT (lent_total (&l), 128 * KiB);
  gather (&l, buf);
  CHECK (memcmp (buf, want + 64 * KiB, 128 * KiB) == 0);
  struct plugin_lend_stats ls;
  plugin_lend_stats (&ls);
  CHECK_INT (ls.lent_bytes, 128 * KiB);
  backend_lend_release (backend_top, l.token, l.n, 128 * KiB);
  plugin_lend_stats (&ls);
  CHECK_INT (ls.lent_bytes, 0);
  err = 0;
  CHECK_INT (CALL (&bc, backend_pread_lend (c, 4 * KiB, MiB - 1, 0, &l, &err)), -1);
  CHECK_INT (err, EINVAL);

  /* A write received in place: committed, it is the disk's; discarded,
   * the disk keeps its old bytes. */
  struct blkd_lend dst = { .iov = iov, .token = token, .max = REQ_LEND_MAX };
  CHECK_INT (CALL (&bc, backend_pwrite_place (c, 64 * KiB, 512 * KiB, 0, &dst, &err)), 0);
  CHECK_INT (lent_total (&dst), 64 * KiB);
  fill (want, 64 * KiB, 99);
  const uint8_t *from = want;
  for (unsigned i = 0; i < dst.n; i++) {
    memcpy (dst.iov[i].iov_base, from, dst.iov[i].iov_len);
    from += dst.iov[i].iov_len;
  }
  CHECK_INT (CALL (&bc, backend_pwrite_commit (c, 64 * KiB, 512 * KiB, NBDKIT_FLAG_FUA, &dst,
                                               true, &err)), 0);
  CHECK_INT (CALL (&bc, backend_pread (c, buf, 64 * KiB, 512 * KiB, 0, &err)), 0);
  CHECK (memcmp (buf, want, 64 * KiB) == 0);
  dst.n = 0;
  CHECK_INT (CALL (&bc, backend_pwrite_place (c, 64 * KiB, 512 * KiB, 0, &dst, &err)), 0);
  for (unsigned i = 0; i < dst.n; i++)
    memset (dst.iov[i].iov_base, 0xee, dst.iov[i].iov_len);
  CHECK_INT (CALL (&bc, backend_pwrite_commit (c, 64 * KiB, 512 * KiB, 0, &dst, false,
                                               &err)), 0);
  CHECK_INT (CALL (&bc, backend_pread (c, buf, 64 * KiB, 512 * KiB, 0, &err)), 0);
  CHECK (memcmp (buf, want, 64 * KiB) == 0);
  plugin_lend_stats (&ls);
  CHECK_INT (ls.placed_bytes, 0);

  /* A read-only context: the write-dependent answers are 0 without
   * asking the plugin, and writes of every kind are refused. */
  backend_lock_request (&bc);
  struct context *ro = backend_open (backend_top, 1, "", 1);
  CHECK (ro != NULL);
  if (ro) {
    CHECK_INT (backend_prepare (ro), 0);
    CHECK_INT (backend_can_write (ro), 0);
    CHECK_INT (backend_can_trim (ro), 0);
    CHECK_INT (backend_can_zero (ro), 0);
    CHECK_INT (backend_can_fast_zero (ro), 0);
    CHECK_INT (backend_can_fua (ro), 0);
    CHECK_INT (backend_can_flush (ro), 1);   /* not write-dependent */
    err = 0;
    CHECK_INT (backend_pwrite (ro, want, 512, 0, 0, &err), -1);
    CHECK_INT (err, EROFS);
    err = 0;
    CHECK_INT (backend_trim (ro, 512, 0, 0, &err), -1);
    CHECK_INT (err, EROFS);
    err = 0;
    CHECK_INT (backend_pwrite_place (ro, 64 * KiB, 0, 0, &dst, &err), -1);
    CHECK_INT (err, EROFS);
    CHECK_INT (backend_pread (ro, buf, 64 * KiB, 512 * KiB, 0, &err), 0);
    CHECK (memcmp (buf, want, 64 * KiB) == 0);
    CHECK_INT (backend_finalize (ro), 0);
    backend_close (ro);
  }
  backend_unlock_request (&bc);

  backend_conn_fini (&bc);
  backend_stack_unload ();
  CHECK (backend_top == NULL);
  unit_end (before);
}

/* The stack's order, and zero copy answered "not supported" by the
 * layers that cannot pass it through: the request copies instead. */
static void
test_layers_copy (void)
{
  int before = unit_begin ("a filter and the cache copy");
  static uint8_t buf[64 * KiB], want[64 * KiB];
  const char *filters[] = { "nofilter" };
  char *so = layer_find_so ("nofilter", "filter", "filters", BLKD_FILTERDIR,
                            NBDKIT_FILTERDIR);
  int nfilters = so ? 1 : 0;
  if (!so)
    printf ("note: nbdkit's nofilter filter is not installed: the cache alone\n");
  free (so);

  cfg.cache_size = 4 * MiB;
  CHECK_INT (stack_load_ram (filters, nfilters, "2M"), 0);   /* bare: ram's magic key */
  struct backend *b = backend_top;
  if (nfilters) {
    CHECK (b && strcmp (b->type, "filter") == 0 && strcmp (b->name, "nofilter") == 0);
    CHECK (b && b->i == 2);
    b = b ? b->next : NULL;
  }
  CHECK (b && strcmp (b->type, "cache") == 0 && b->i == 1);
  CHECK (b && b->next && strcmp (b->next->type, "plugin") == 0 && b->next->i == 0);

  struct backend_conn bc;
  int err = 0;
  backend_conn_init (&bc, -1);
  CHECK_INT (backend_conn_open (&bc, "", false), 0);
  CHECK_INT (bc.caps.size, 2 * MiB);
  struct context *c = bc.top;
  fill (want, sizeof want, 3);
  CHECK_INT (CALL (&bc, backend_pwrite (c, want, sizeof want, 64 * KiB, 0, &err)), 0);

  struct iovec iov[REQ_LEND_MAX];
  void *token[REQ_LEND_MAX];
  struct blkd_lend l = { .iov = iov, .token = token, .max = REQ_LEND_MAX };
  CHECK_INT (CALL (&bc, backend_pread_lend (c, 64 * KiB, 64 * KiB, 0, &l, &err)), -1);
  CHECK_INT (err, ENOTSUP);
  int fd;
  uint64_t foff;
  err = 0;
  CHECK_INT (CALL (&bc, backend_pread_fd (c, 64 * KiB, 64 * KiB, 0, &fd, &foff, &err)), -1);
  CHECK_INT (err, ENOTSUP);
  err = 0;
  CHECK_INT (CALL (&bc, backend_pwrite_place (c, 64 * KiB, 64 * KiB, 0, &l, &err)), -1);
  CHECK_INT (err, ENOTSUP);
  struct plugin_lend_stats ls;
  plugin_lend_stats (&ls);
  CHECK_INT (ls.lent_bytes + ls.placed_bytes, 0);
  /* The copy path those requests fall back to. */
  CHECK_INT (CALL (&bc, backend_pread (c, buf, sizeof buf, 64 * KiB, 0, &err)), 0);
  CHECK (memcmp (buf, want, sizeof buf) == 0);

  backend_conn_fini (&bc);
  backend_stack_unload ();
  cfg.cache_size = 0;
  unit_end (before);
}

static void
test_load_errors (void)
{
  int before = unit_begin ("loading fails cleanly");
  CHECK_INT (backend_stack_load ("plugins/none/nbdkit-none-plugin.so", NULL, 0, 0, NULL), -1);
  backend_stack_unload ();
  CHECK (backend_top == NULL);
  /* ram refuses a key it does not know; the stack unloads. */
  CHECK_INT (stack_load_ram (NULL, 0, "colour=blue"), -1);
  backend_stack_unload ();
  CHECK (backend_top == NULL);
  /* And a stack loads again afterwards. */
  CHECK_INT (stack_load_ram (NULL, 0, "size=64K"), 0);
  struct backend_conn bc;
  backend_conn_init (&bc, -1);
  CHECK_INT (backend_conn_open (&bc, "", false), 0);
  CHECK_INT (bc.caps.size, 64 * KiB);
  backend_conn_fini (&bc);
  backend_stack_unload ();
  unit_end (before);
}

int
main (void)
{
  stack_need_ram ();
  test_plugin_alone ();
  test_layers_copy ();
  test_load_errors ();
  stack_args_free ();
  return unit_exit ("unit-backend");
}
