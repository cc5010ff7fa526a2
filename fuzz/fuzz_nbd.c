/* libFuzzer harness for blkd's two parsers: option haggling (handshake.c)
 * and transmission requests (protocol.c), through the real server.
 *
 * Built twice by fuzz/fuzz.mk: -DFUZZ_TARGET_HANDSHAKE and
 * -DFUZZ_TARGET_REQUEST.  The server objects are compiled with
 * -fsanitize=fuzzer-no-link,address,undefined; the plugin is the in-tree
 * ram plugin, built with the same sanitizers.
 *
 * Start-up mirrors main.c: backend_stack_load, backend_stack_after_fork, then
 * shard_start_all with one shard and inline dispatch, so one shard thread
 * runs its libevent loop exactly as in production.  Each input is one
 * client: a socketpair whose server end is handed over with
 * shard_handoff(), the way the acceptor does it.  The harness writes the
 * input (non-blocking, interleaved with reading and discarding whatever
 * the server answers), half-closes, reads to EOF, and then waits until the
 * shard has freed the connection, so nothing carries over to the next
 * input except what the pool deliberately caches.  Before each input a
 * well-behaved client zeroes the ram disk, so every input starts from the
 * same empty disk and a saved input replays as it ran.
 *
 *   handshake: the input is everything the client sends after the
 *              greeting (client flags, options, and, if it gets there,
 *              requests).
 *   request:   the first input byte picks the negotiation -- bit 0
 *              structured replies, bit 1 base:allocation, bit 2 a
 *              read-only server, bit 3 EXPORT_NAME instead of GO, bit 4
 *              extended headers (sent first: the stream is then 32-byte
 *              requests) -- the harness does that handshake, and the rest
 *              of the input is the transmission stream.
 *
 * A connection that neither closes nor lets the server free it within
 * BLKD_FUZZ_HANG_MS (default 5000) after the client half-closed and read
 * every byte is a hang: the harness aborts, so libFuzzer saves the input.
 * BLKD_FUZZ_HANGS=0 turns that into a warning (for hunting other bugs
 * while a hang is known).
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#if !defined (FUZZ_TARGET_HANDSHAKE) && !defined (FUZZ_TARGET_REQUEST)
#error "define FUZZ_TARGET_HANDSHAKE or FUZZ_TARGET_REQUEST"
#endif

#define FUZZ_MAX_REQUEST   (64 * 1024)   /* small: reads stay cheap */
#define FUZZ_POOL          (4 * FUZZ_MAX_REQUEST)
#define FUZZ_MAX_INFLIGHT  16            /* reachable back-pressure */

static bool strict_hangs = true;
static int hang_ms = 5000;
static unsigned long hangs_seen;

static uint64_t
ms_now (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *
plugin_path (void)
{
  const char *env = getenv ("BLKD_FUZZ_PLUGIN");
  if (env)
    return strdup (env);
  char *dir = layer_exe_dir ();
  char *p = NULL;
  if (dir && asprintf (&p, "%s/nbdkit-ram-plugin.so", dir) < 0)
    p = NULL;
  free (dir);
  return p;
}

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  signal (SIGPIPE, SIG_IGN);
  const char *h = getenv ("BLKD_FUZZ_HANGS");
  if (h && strcmp (h, "0") == 0)
    strict_hangs = false;
  const char *ms = getenv ("BLKD_FUZZ_HANG_MS");
  if (ms && atoi (ms) > 0)
    hang_ms = atoi (ms);

  cfg.shards = 1;
  cfg.workers = 1;
  cfg.dispatch = DISPATCH_INLINE;
  cfg.max_request = FUZZ_MAX_REQUEST;
  cfg.max_inflight = FUZZ_MAX_INFLIGHT;
  cfg.iobuf_mem = FUZZ_POOL;

  char *path = plugin_path ();
  static char size_arg[] = "size=1M";     /* split in place by the config */
  char *pargv[] = { size_arg };
  if (!path || backend_stack_load (path, NULL, 0, 1, pargv) == -1
      || backend_stack_after_fork () == -1) {
    fprintf (stderr, "fuzz: cannot load the ram plugin from %s (set BLKD_FUZZ_PLUGIN)\n",
             path ? path : "?");
    exit (1);
  }
  free (path);
  if (shard_start_all (&conn_shard_ops) == -1) {
    fprintf (stderr, "fuzz: cannot start the shard\n");
    exit (1);
  }
  return 0;
}

static void
hang (const char *what)
{
  hangs_seen++;
  if (strict_hangs) {
    fprintf (stderr, "fuzz: HANG: %s after %d ms (the client half-closed and read "
             "everything)\n", what, hang_ms);
    abort ();
  }
  if (hangs_seen == 1 || hangs_seen % 1000 == 0)
    fprintf (stderr, "fuzz: warning: %lu hang(s) so far (%s); BLKD_FUZZ_HANGS=0\n",
             hangs_seen, what);
}

/* One client: send pre then data, half-close, read to EOF, wait for the
 * shard to free the connection. */
static void
run_client (const uint8_t *pre, size_t npre, const uint8_t *data, size_t n)
{
  int sv[2];
  if (socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == -1) {
    perror ("fuzz: socketpair");
    abort ();
  }
  int fl = fcntl (sv[1], F_GETFL);
  fcntl (sv[1], F_SETFL, fl | O_NONBLOCK);
  shard_handoff (sv[0], "fuzz");            /* the shard owns sv[0] now */

  size_t total = npre + n, off = 0;
  bool shut = false, eof = false;
  static char sink[256 * 1024];
  uint64_t deadline = 0;

  while (!eof) {
    if (off == total && !shut) {
      shutdown (sv[1], SHUT_WR);
      shut = true;
      deadline = ms_now () + hang_ms;
    }
    struct pollfd p = { .fd = sv[1], .events = POLLIN | (off < total ? POLLOUT : 0) };
    poll (&p, 1, 50);
    if (p.revents & POLLOUT) {
      const uint8_t *src = off < npre ? pre + off : data + (off - npre);
      size_t len = off < npre ? npre - off : total - off;
      ssize_t w = write (sv[1], src, len);
      if (w > 0)
        off += w;
      else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        /* The server closed its end: the rest of the input is moot. */
        off = total;
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = read (sv[1], sink, sizeof sink);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
        eof = true;
      else if (r > 0 && shut)
        deadline = ms_now () + hang_ms;     /* still answering: not stuck */
    }
    if (shut && !eof && ms_now () > deadline) {
      hang ("connection still open");
      break;
    }
  }
  close (sv[1]);

  /* The socket closes before the connection is freed (requests may still
   * be finishing); wait for the free so inputs do not overlap. */
  uint64_t until = ms_now () + hang_ms;
  while (shard_total_conns () != 0) {
    if (ms_now () > until) {
      hang ("connection closed but never freed");
      return;
    }
    struct timespec ts = { 0, 20000 };
    nanosleep (&ts, NULL);
  }
}

static size_t opt (uint8_t *p, uint32_t option, const void *d, uint32_t len);

/* Start every input from an empty disk, so an input found by the fuzzer
 * replays the same on its own as in a run: a well-behaved client zeroes
 * (trims) the whole 1 MiB ram disk.  Its replies are not parsed: the
 * stream below is answered with GO's replies, one simple reply, and EOF
 * after DISC. */
static void
reset_disk (void)
{
  uint8_t s[128];
  size_t n = 0;
  uint32_t flags = htobe32 (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
  memcpy (s, &flags, 4);
  n = 4;
  static const uint8_t go[6] = { 0 };
  n += opt (s + n, NBD_OPT_GO, go, sizeof go);
  struct nbd_request r = {
    .magic = htobe32 (NBD_REQUEST_MAGIC), .type = htobe16 (NBD_CMD_WRITE_ZEROES),
    .cookie = 1, .offset = 0, .count = htobe32 (1024 * 1024),
  };
  memcpy (s + n, &r, sizeof r);
  n += sizeof r;
  r.type = htobe16 (NBD_CMD_DISC);
  r.count = 0;
  memcpy (s + n, &r, sizeof r);
  n += sizeof r;
  cfg.readonly = false;
  run_client (s, n, NULL, 0);
}

static size_t
opt (uint8_t *p, uint32_t option, const void *d, uint32_t len)
{
  uint64_t magic = htobe64 (NBD_OPTS_MAGIC);
  uint32_t o = htobe32 (option), l = htobe32 (len);
  memcpy (p, &magic, 8);
  memcpy (p + 8, &o, 4);
  memcpy (p + 12, &l, 4);
  if (len)
    memcpy (p + 16, d, len);
  return 16 + len;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  reset_disk ();
#ifdef FUZZ_TARGET_HANDSHAKE
  cfg.readonly = false;
  run_client (NULL, 0, data, size);
#else
  if (size < 1)
    return 0;
  uint8_t mode = data[0];
  uint8_t pre[256];
  size_t n = 0;
  uint32_t flags = htobe32 (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
  memcpy (pre, &flags, 4);
  n = 4;
  if (mode & 16)
    n += opt (pre + n, NBD_OPT_EXTENDED_HEADERS, NULL, 0);
  if (mode & 1)
    n += opt (pre + n, NBD_OPT_STRUCTURED_REPLY, NULL, 0);
  if (mode & 2) {
    static const uint8_t meta[] = { 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 15,
                                    'b', 'a', 's', 'e', ':', 'a', 'l', 'l',
                                    'o', 'c', 'a', 't', 'i', 'o', 'n' };
    n += opt (pre + n, NBD_OPT_SET_META_CONTEXT, meta, sizeof meta);
  }
  if (mode & 8)
    n += opt (pre + n, NBD_OPT_EXPORT_NAME, NULL, 0);
  else {
    static const uint8_t go[6] = { 0 };
    n += opt (pre + n, NBD_OPT_GO, go, sizeof go);
  }
  cfg.readonly = mode & 4;
  run_client (pre, n, data + 1, size - 1);
#endif
  return 0;
}
