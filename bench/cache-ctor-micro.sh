#!/usr/bin/env bash
# Seed 004 without the network: the cache's allocate/free path alone.
# Links the server's cache layer (cache.o, with the stack in backend.o)
# over a stub in-memory plugin layer and runs akpm's
# create-delete loop in one process -- write a 16 MiB region through the
# cache block by block (every block a fresh entry), trim it (every entry
# freed), again and again -- with --cache-ctor=no and =yes alternating
# A B A B for $ROUNDS rounds (the order flipped every other round).  Prints
# ns per write+trim pair of one block -- median and spread of each side,
# and the median and spread of the per-round B/A ratios -- for 64 KiB
# blocks (the copy dominates) and 4 KiB blocks (the allocator shows most).
#   ROUNDS=9 PASSES=40 bench/cache-ctor-micro.sh
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
: "${ROUNDS:=9}" "${PASSES:=40}"
make -s build/plain/server/cache.o build/plain/server/backend.o build/plain/server/public.o \
  build/plain/server/log.o
out=build/bench
mkdir -p "$out"
cat >"$out/cache-micro.c" <<'EOF'
/* A stub in-memory plugin layer under the real cache layer (backend.o,
 * cache.o), and the create-delete loop. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"

struct blkd_config cfg;
atomic_bool server_stopping;
static unsigned char *disk;
#define DISK (64u << 20)

/* What backend.o needs besides the stub layer. */
const char *plugin_name (void) { return "stub"; }
char *plugin_exe_dir (void) { return NULL; }
struct backend *filter_layer_load (struct backend *next, const char *name) { return NULL; }
void server_request_stop (void) { }

static int stub_model (struct backend *b) { return NBDKIT_THREAD_MODEL_PARALLEL; }
static const char *stub_magic (struct backend *b) { return NULL; }
static int stub_config (struct backend *b, const char *k, const char *v) { return -1; }
static int stub_b (struct backend *b) { return 0; }
static void stub_v (struct backend *b) { }
static int stub_preconnect (struct backend *b, int ro) { return 0; }
static const char *stub_default (struct backend *b, int ro, int tls) { return ""; }
static void *stub_open (struct context *c, int ro, const char *n, int tls) { return disk; }
static int stub_c (struct context *c) { return 0; }
static int stub_prepare (struct context *c, int ro) { return 0; }
static void stub_close (struct context *c) { }
static int64_t stub_size (struct context *c) { return DISK; }
static int stub_1 (struct context *c) { return 1; }
static int stub_fua (struct context *c) { return NBDKIT_FUA_NATIVE; }
static int stub_zero (struct context *c) { return NBDKIT_ZERO_NATIVE; }
static int stub_block_size (struct context *c, uint32_t *a, uint32_t *b, uint32_t *m)
{ *a = *b = *m = 0; return 0; }
static int stub_pread (struct context *c, void *b, uint32_t n, uint64_t o, uint32_t f, int *e)
{ memcpy (b, disk + o, n); return 0; }
static int stub_pwrite (struct context *c, const void *b, uint32_t n, uint64_t o, uint32_t f,
                        int *e)
{ memcpy (disk + o, b, n); return 0; }
static int stub_flush (struct context *c, uint32_t f, int *e) { return 0; }
static int stub_trim (struct context *c, uint32_t n, uint64_t o, uint32_t f, int *e)
{ memset (disk + o, 0, n); return 0; }
static struct backend stub = {
  .type = "plugin", .name = (char *) "stub", .inline_safe = true,
  .thread_model = stub_model, .magic_config_key = stub_magic, .config = stub_config,
  .config_complete = stub_b, .get_ready = stub_b, .after_fork = stub_b,
  .cleanup = stub_v, .unload = stub_v, .preconnect = stub_preconnect,
  .default_export = stub_default, .open = stub_open, .prepare = stub_prepare,
  .finalize = stub_c, .close = stub_close, .get_size = stub_size,
  .block_size = stub_block_size, .can_write = stub_1, .can_flush = stub_1,
  .can_trim = stub_1, .can_zero = stub_zero, .can_fua = stub_fua, .is_rotational = stub_c,
  .can_fast_zero = stub_c, .can_extents = stub_c, .can_cache = stub_c,
  .can_multi_conn = stub_1, .pread = stub_pread, .pwrite = stub_pwrite,
  .flush = stub_flush, .trim = stub_trim, .zero = stub_trim,
};
struct backend *plugin_layer_load (const char *name) { return &stub; }

static int
cmp (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return x < y ? -1 : x > y;
}

/* One round: ns per (write + trim) of one block. */
static double
round_ns (bool ctor, uint32_t block, int passes, const void *data)
{
  cfg.cache_size = 64u << 20;
  cfg.cache_block = block;
  cfg.cache_mode = CACHE_WRITETHROUGH;
  cfg.cache_ctor = ctor;
  if (backend_stack_load ("stub", NULL, 0, 0, NULL) == -1 || backend_stack_after_fork () == -1)
    exit (1);
  struct backend_conn bc;
  backend_conn_init (&bc, -1);
  if (backend_conn_open (&bc, "", false) == -1)
    exit (1);
  uint32_t region = 16u << 20;
  int err;
  uint64_t t0 = now_ns ();
  for (int p = 0; p < passes; p++) {
    for (uint32_t off = 0; off < region; off += block)
      backend_pwrite (bc.top, data, block, off, 0, &err);
    for (uint32_t off = 0; off < region; off += block)
      backend_trim (bc.top, block, off, 0, &err);
  }
  uint64_t t1 = now_ns ();
  backend_conn_fini (&bc);
  backend_stack_unload ();
  return (double) (t1 - t0) / ((double) passes * (region / block));
}

int
main (int argc, char **argv)
{
  int rounds = atoi (argv[1]), passes = atoi (argv[2]);
  disk = calloc (1, DISK);
  void *data;
  if (posix_memalign (&data, 4096, 1 << 16))
    return 1;
  memset (data, 0xab, 1 << 16);
  uint32_t blocks[] = { 65536, 4096 };
  printf ("| cache block | A ctor=no ns/pair | B ctor=yes ns/pair | B/A median | B/A spread |\n");
  printf ("|---|---|---|---|---|\n");
  for (int b = 0; b < 2; b++) {
    double a[64], y[64], ratio[64];
    round_ns (false, blocks[b], 2, data);       /* warm up */
    for (int r = 0; r < rounds; r++) {
      if (r % 2 == 0) {
        a[r] = round_ns (false, blocks[b], passes, data);
        y[r] = round_ns (true, blocks[b], passes, data);
      }
      else {
        y[r] = round_ns (true, blocks[b], passes, data);
        a[r] = round_ns (false, blocks[b], passes, data);
      }
      ratio[r] = y[r] / a[r];
    }
    qsort (a, rounds, sizeof *a, cmp);
    qsort (y, rounds, sizeof *y, cmp);
    qsort (ratio, rounds, sizeof *ratio, cmp);
    printf ("| %u KiB | %.0f (%.0f..%.0f) | %.0f (%.0f..%.0f) | %.3f | %.3f..%.3f |\n",
            blocks[b] / 1024, a[rounds / 2], a[0], a[rounds - 1], y[rounds / 2], y[0],
            y[rounds - 1], ratio[rounds / 2], ratio[0], ratio[rounds - 1]);
  }
  return 0;
}
EOF
cc -O2 -g -std=gnu11 -D_GNU_SOURCE -Iinclude -Iserver -pthread -o "$out/cache-micro" \
  "$out/cache-micro.c" build/plain/server/cache.o build/plain/server/backend.o \
  build/plain/server/public.o build/plain/server/log.o
"$out/cache-micro" "$ROUNDS" "$PASSES"
