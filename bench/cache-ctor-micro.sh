#!/usr/bin/env bash
# Seed 004 without the network: the cache's allocate/free path alone.
# Links the server's cache.o with a stub in-memory "plugin" and runs akpm's
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
make -s build/plain/server/cache.o
out=build/bench
mkdir -p "$out"
cat >"$out/cache-micro.c" <<'EOF'
/* Stubs for what cache.o calls, and the create-delete loop. */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "cache.h"

struct blkd_config cfg;
atomic_bool server_stopping;
bool log_verbose;
__thread const struct log_ctx *log_current;
__thread struct public_conn_ctx *public_current;
static unsigned char *disk;
#define DISK (64u << 20)

void log_msg (enum log_level l, const char *fmt, ...) { (void) l; (void) fmt; }
const char *plugin_name (void) { return "stub"; }
const char *plugin_default_export (bool ro, bool tls) { return ""; }
void plugin_conn_init (struct plugin_conn *pc, int fd) { memset (pc, 0, sizeof *pc); }
void plugin_conn_fini (struct plugin_conn *pc) { }
int plugin_open (struct plugin_conn *pc, const char *n, bool ro)
{
  pc->caps.size = DISK; pc->caps.can_write = pc->caps.can_multi_conn = true;
  pc->caps.can_flush = pc->caps.can_trim = true; pc->handle = pc;
  return 0;
}
int plugin_pread (struct plugin_conn *pc, void *b, uint32_t n, uint64_t o)
{ memcpy (b, disk + o, n); return 0; }
int plugin_pwrite (struct plugin_conn *pc, const void *b, uint32_t n, uint64_t o, bool f)
{ memcpy (disk + o, b, n); return 0; }
int plugin_flush (struct plugin_conn *pc) { return 0; }
int plugin_trim (struct plugin_conn *pc, uint32_t n, uint64_t o, bool f)
{ memset (disk + o, 0, n); return 0; }
int plugin_zero (struct plugin_conn *pc, uint32_t n, uint64_t o, bool t, bool f, bool fast)
{ memset (disk + o, 0, n); return 0; }
int plugin_cache (struct plugin_conn *pc, uint32_t n, uint64_t o) { return 0; }
int plugin_extents (struct plugin_conn *pc, uint32_t n, uint64_t o, bool one,
                    struct nbdkit_extents *e) { return 0; }

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
  if (cache_setup () == -1)
    exit (1);
  struct plugin_conn pc;
  plugin_open (&pc, "", false);
  pc.ctx.export_name = "";
  uint32_t region = 16u << 20;
  uint64_t t0 = now_ns ();
  for (int p = 0; p < passes; p++) {
    for (uint32_t off = 0; off < region; off += block)
      cache_pwrite (&pc, data, block, off, false);
    for (uint32_t off = 0; off < region; off += block)
      cache_trim (&pc, block, off, false);
  }
  uint64_t t1 = now_ns ();
  cache_stop ();
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
  "$out/cache-micro.c" build/plain/server/cache.o
"$out/cache-micro" "$ROUNDS" "$PASSES"
