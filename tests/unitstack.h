/* What the layer-stack unit tests share (unit-backend.c, unit-cache.c): a
 * stack over the in-tree ram plugin, and calls made the way
 * protocol_execute makes them.  Header-only, like unit.h. */
#ifndef BLKD_TESTS_UNITSTACK_H
#define BLKD_TESTS_UNITSTACK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../server/backend.h"

#define KiB 1024
#define MiB (1024 * 1024)

/* Run from the top of the tree (tests/run.sh does). */
static const char ram_so[] = "plugins/ram/nbdkit-ram-plugin.so";

/* Arguments are split in place and kept by the layers, as nbdkit's are:
 * each load gets its own writable copy, freed by stack_args_free. */
static char *stack_args[8];
static int stack_nargs;

/* The ram plugin under `filters` (and the cache if cfg.cache_size), with
 * one key=value (or bare size) argument; -1 after printing why. */
static inline int
stack_load_ram (const char *const *filters, int nfilters, const char *arg)
{
  if (stack_nargs == (int) (sizeof stack_args / sizeof stack_args[0]))
    return -1;
  stack_args[stack_nargs] = strdup (arg);
  return backend_stack_load (ram_so, filters, nfilters, 1, &stack_args[stack_nargs++]);
}

static inline void
stack_args_free (void)
{
  for (int i = 0; i < stack_nargs; i++)
    free (stack_args[i]);
  stack_nargs = 0;
}

/* Exit 77 (skipped) when the plugin is not built. */
static inline void
stack_need_ram (void)
{
  if (access (ram_so, R_OK) != 0) {
    printf ("skipped: %s is not built (make all)\n", ram_so);
    exit (77);
  }
}

/* One call as protocol_execute makes it: under the request's lock, which
 * also sets the connection nbdkit_export_name() etc. answer for. */
#define CALL(bc, expr)                                                  \
  ({ backend_lock_request (bc); __typeof__ (expr) r_ = (expr);          \
     backend_unlock_request (bc); r_; })

#endif
