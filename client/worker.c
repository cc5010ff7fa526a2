/* The load generator: one libnbd connection per thread, a fixed set of request slots, the poll loop and one iteration's timing. */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>

#include "blkperf.h"
#include "vector.h"

volatile sig_atomic_t bp_interrupted;

/* Counters the progress line reads from another thread: stored with
 * relaxed atomics (plain moves on x86) so the read is not a data race. */
static inline void
bp_bump (uint64_t *p, uint64_t v)
{
  __atomic_store_n (p, *p + v, __ATOMIC_RELAXED);
}

static inline uint64_t
bp_peek (const uint64_t *p)
{
  return __atomic_load_n (p, __ATOMIC_RELAXED);
}

/* ---- PRNG ------------------------------------------------------------- */

static uint64_t
bp_splitmix (uint64_t *x)
{
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* xorshift64*: a few cycles, good enough to scatter offsets; not for
 * anything that needs statistical quality beyond that. */
static inline uint64_t
bp_rand (uint64_t *s)
{
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545f4914f6cdd1dull;
}

/* Uniform in [0, n) without a division (Lemire's multiply-shift; the bias
 * is below n / 2^64, invisible here). */
static inline uint64_t
bp_below (uint64_t *s, uint64_t n)
{
  return (uint64_t) (((unsigned __int128) bp_rand (s) * n) >> 64);
}

/* ---- connections ------------------------------------------------------ */

struct bp_conn;

struct bp_slot {
  struct bp_conn *c;
  char *rbuf, *wbuf;
  uint64_t t_issue;
  uint32_t idx;
  uint8_t op;
  bool counted;
};

struct bp_conn {
  unsigned id;
  struct nbd_handle *h;
  enum bp_test test;
  uint64_t bs;
  unsigned depth;
  unsigned read_pct;
  uint64_t lo, hi, nblocks;   /* byte range [lo, hi) in whole blocks */
  uint64_t cursor;
  uint64_t rng;
  bool count_mode;
  uint64_t quota;              /* count mode: counted requests left to issue */
  uint64_t ws, we;             /* measurement window, monotonic ns */
  int churn_op;                /* CHURN: BP_OP_WRITE or BP_OP_TRIM pass */
  bool churn_pass_issued;      /* whole pass issued, waiting for it to drain */

  struct bp_slot *slots;
  uint32_t *free;
  unsigned nfree, inflight;

  /* results: bytes and requests are read live by the progress line */
  uint64_t bytes, requests, errors;
  uint64_t ops[BP_NOPS];
  uint64_t last_done_ns;        /* last counted completion */
  uint64_t last_any_ns;         /* last completion of any kind, for stalls */
  struct bp_hist hist;
  int first_error;
  bool failed;
  char err[256];
  int rcvbuf, sndbuf;
  uint64_t p99_ns;              /* latest p99 so far, for the progress line */
  uint64_t p99_at;              /* when it was last computed */
  bool use_wire;                /* this connection runs on wire.c */
  struct bp_wire wire;
  pthread_t thread;
  const struct bp_opts *o;
  const char *uri;
};

static struct bp_conn *bp_conns;
static unsigned bp_nconns;
static size_t bp_conn_bufsize;

static struct {
  pthread_barrier_t connected, go;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  unsigned ndone;
  bool abort;
} bp_sync = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

/* Opens and connects a handle with the run's TLS settings. */
static struct nbd_handle *
bp_open (const struct bp_opts *o, const char *uri, char *err, size_t errlen)
{
  struct nbd_handle *h = nbd_create ();
  if (!h) {
    snprintf (err, errlen, "nbd_create: %s", nbd_get_error ());
    return NULL;
  }
  /* URIs may name a PSK file or certificate directory (tls-psk-file=,
   * tls-certificates=); the user typed the URI, so reading them is fine. */
  if (nbd_set_uri_allow_local_file (h, true) == -1
      || (o->tls_certificates && nbd_set_tls_certificates (h, o->tls_certificates) == -1)
      || (o->tls_psk && nbd_set_tls_psk_file (h, o->tls_psk) == -1)
      || (o->tls_username && nbd_set_tls_username (h, o->tls_username) == -1)
      || (o->tls_verify_set && nbd_set_tls_verify_peer (h, o->tls_verify_peer) == -1)
      /* libnbd zeroes every read buffer before each read unless told not
       * to: a memset of the whole request that no real client on a hot
       * path keeps, and that would make blkperf slower than the server it
       * measures.  Buffers here are never read after a failed request. */
      || nbd_set_pread_initialize (h, false) == -1
#ifdef LIBNBD_HAVE_NBD_SET_REQUEST_EXTENDED_HEADERS
      /* wire.c speaks the classic 28-byte request header; newer libnbd
       * would otherwise negotiate 64-bit extended headers. */
      || nbd_set_request_extended_headers (h, false) == -1
#endif
      || nbd_connect_uri (h, uri) == -1) {
    snprintf (err, errlen, "%s: %s", uri, nbd_get_error ());
    nbd_close (h);
    return NULL;
  }
  return h;
}

int
bp_probe (const struct bp_opts *o, struct bp_target *t)
{
  char err[512];
  struct nbd_handle *h = bp_open (o, t->uri, err, sizeof err);
  if (!h) {
    bp_warn ("cannot connect to %s", err);
    return -1;
  }
  int64_t size = nbd_get_size (h);
  char *name = nbd_get_export_name (h);
  t->export_name = name ? name : strdup ("");
  t->read_only = nbd_is_read_only (h) == 1;
  t->can_trim = nbd_can_trim (h) == 1;
  t->can_multi_conn = nbd_can_multi_conn (h) == 1;
  nbd_shutdown (h, 0);
  nbd_close (h);
  if (size < 0) {
    bp_warn ("%s: cannot get the export size", t->uri);
    return -1;
  }
  t->size = (uint64_t) size;
  if ((bp_test_writes (o->test) || o->prefill) && t->read_only) {
    bp_warn ("%s: %s writes, but the export is read-only", t->uri,
             bp_test_writes (o->test) ? bp_test_name (o->test) : "--prefill");
    return -1;
  }
  if (o->test == BP_CHURN && !t->can_trim) {
    bp_warn ("%s: CHURN trims, but the server does not support trim", t->uri);
    return -1;
  }
  if (o->conns > 1 && bp_test_writes (o->test) && !t->can_multi_conn)
    bp_warn ("note: %s does not advertise multi-conn; writes over %u "
             "connections are measured all the same", t->uri, o->conns);
  return 0;
}

int
bp_settle_range (const struct bp_opts *o, struct bp_target *t, unsigned n)
{
  uint64_t avail = UINT64_MAX;
  for (unsigned i = 0; i < n; i++) {
    if (o->offset >= t[i].size) {
      bp_warn ("%s: --offset %llu is beyond the export (%llu bytes)", t[i].uri,
               (unsigned long long) o->offset, (unsigned long long) t[i].size);
      return -1;
    }
    if (t[i].size - o->offset < avail)
      avail = t[i].size - o->offset;
  }
  uint64_t span = o->span;
  if (span == 0) {
    span = avail;
    /* The region tests default to a region, not the disk: CHURN is akpm's
     * 16 MB create-delete file; SEQ_REWRITE is prefilled, so keep that
     * short on big exports. */
    if (o->test == BP_CHURN && span > (16u << 20))
      span = 16u << 20;
    if (o->test == BP_SEQ_REWRITE && span > (256u << 20))
      span = 256u << 20;
  }
  else if (span > avail) {
    bp_warn ("--span %llu from --offset %llu runs past the end of the export "
             "(%llu bytes available)", (unsigned long long) span,
             (unsigned long long) o->offset, (unsigned long long) avail);
    return -1;
  }
  uint64_t per = bp_test_sequential (o->test) ? span / o->conns : span;
  if (per < o->bs) {
    bp_warn ("the span (%llu bytes%s) holds no whole %llu-byte request",
             (unsigned long long) span,
             bp_test_sequential (o->test) && o->conns > 1 ? ", split over the connections" : "",
             (unsigned long long) o->bs);
    return -1;
  }
  for (unsigned i = 0; i < n; i++) {
    t[i].span = span;
    t[i].offset = o->offset;
  }
  return 0;
}

/* ---- the hot path ----------------------------------------------------- */

/* One request finished: counts it when it belongs to the window.  Both
 * engines end here; the wire engine reads the clock once per batch of
 * replies that one recv() brought, since they arrived together. */
static inline void
bp_complete (struct bp_conn *c, struct bp_slot *s, int error, uint64_t now)
{
  c->inflight--;
  c->free[c->nfree++] = s->idx;
  c->last_any_ns = now;
  if (__builtin_expect (error != 0, 0)) {
    bp_bump (&c->errors, 1);
    if (!c->first_error)
      c->first_error = error;
    return;
  }
  /* Time mode counts what completes inside the window, which in steady
   * state is exactly rate x window; count mode counts what it issued. */
  bool count = c->count_mode ? s->counted : (now >= c->ws && now <= c->we);
  if (count) {
    c->ops[s->op]++;
    if (s->op != BP_OP_TRIM)
      bp_bump (&c->bytes, c->bs);
    bp_bump (&c->requests, 1);
    bp_hist_add (&c->hist, now - s->t_issue);
    c->last_done_ns = now;
  }
}

static int
bp_on_done (void *user_data, int *error)
{
  struct bp_slot *s = user_data;
  bp_complete (s->c, s, *error, now_ns ());
  return 1;                      /* retire the command now */
}

/* Chooses the next request; false when none may be issued right now
 * (a CHURN pass must drain before the next pass touches the same blocks). */
static inline bool
bp_next (struct bp_conn *c, uint64_t *off, int *op)
{
  switch (c->test) {
  case BP_STREAM_READ:
  case BP_STREAM_WRITE:
  case BP_SEQ_REWRITE:
    *op = c->test == BP_STREAM_READ ? BP_OP_READ : BP_OP_WRITE;
    *off = c->cursor;
    c->cursor += c->bs;
    if (c->cursor + c->bs > c->hi)
      c->cursor = c->lo;
    return true;
  case BP_RR:
  case BP_RAND_READ:
  case BP_RAND_WRITE:
    *op = c->test == BP_RAND_WRITE ? BP_OP_WRITE : BP_OP_READ;
    *off = c->lo + bp_below (&c->rng, c->nblocks) * c->bs;
    return true;
  case BP_RAND_RW:
    *op = bp_below (&c->rng, 100) < c->read_pct ? BP_OP_READ : BP_OP_WRITE;
    *off = c->lo + bp_below (&c->rng, c->nblocks) * c->bs;
    return true;
  case BP_CHURN:
    if (c->churn_pass_issued) {
      if (c->inflight > 0)
        return false;
      c->churn_pass_issued = false;
      c->churn_op = c->churn_op == BP_OP_WRITE ? BP_OP_TRIM : BP_OP_WRITE;
      c->cursor = c->lo;
    }
    *op = c->churn_op;
    *off = c->cursor;
    c->cursor += c->bs;
    if (c->cursor + c->bs > c->hi)
      c->churn_pass_issued = true;
    return true;
  default:
    return false;
  }
}

/* A server that answers nothing for this long is stuck, not slow; NBD
 * has no timeout of its own and a benchmark must end. */
#define BP_GIVE_UP_NS (30ull * 1000000000u)

static inline bool
bp_stopping (const struct bp_conn *c, uint64_t now)
{
  return bp_interrupted || c->failed || (!c->count_mode && now >= c->we)
         || (c->count_mode && c->quota == 0);
}

/* True (and the connection failed) when requests wait with no reply. */
static bool
bp_stalled (struct bp_conn *c, uint64_t now)
{
  if (c->inflight == 0 || now - c->last_any_ns <= BP_GIVE_UP_NS)
    return false;
  snprintf (c->err, sizeof c->err,
            "no reply for 30 s with %u requests in flight; giving up", c->inflight);
  c->failed = true;
  return true;
}

/* Takes a free slot for the next request, stamped `now` and counted in
 * flight; NULL when none may be issued right now. */
static inline struct bp_slot *
bp_take (struct bp_conn *c, uint64_t now, uint64_t *off)
{
  int op;
  if (!bp_next (c, off, &op))
    return NULL;
  struct bp_slot *s = &c->slots[c->free[--c->nfree]];
  s->op = (uint8_t) op;
  s->counted = c->count_mode && now >= c->ws;
  s->t_issue = now;
  c->inflight++;
  return s;
}

/* libnbd's loop: the slot was counted in flight before the call, since
 * libnbd may read replies (and so run bp_on_done for earlier requests)
 * while it sends this one. */
static int
bp_issue (struct bp_conn *c, struct bp_slot *s, uint64_t off)
{
  uint32_t idx = s->idx;
  int op = s->op;
  nbd_completion_callback cb = { .callback = bp_on_done, .user_data = s };
  int64_t r;

  s->t_issue = now_ns ();
  switch (op) {
  case BP_OP_READ:
    r = nbd_aio_pread (c->h, s->rbuf, c->bs, off, cb, 0);
    break;
  case BP_OP_WRITE:
    r = nbd_aio_pwrite (c->h, s->wbuf, c->bs, off, cb, 0);
    break;
  default:
    r = nbd_aio_trim (c->h, c->bs, off, cb, 0);
    break;
  }
  if (__builtin_expect (r == -1, 0)) {
    /* Not queued, so the callback will never run: undo by hand. */
    c->inflight--;
    c->free[c->nfree++] = idx;
    if (nbd_aio_is_dead (c->h) || nbd_aio_is_closed (c->h))
      snprintf (c->err, sizeof c->err, "connection lost: the server closed it "
                "or died (%s)", nbd_get_error ());
    else
      snprintf (c->err, sizeof c->err, "issuing request: %s", nbd_get_error ());
    return -1;
  }
  return 0;
}

/* Refreshes the connection's p99 for the progress line a few times a
 * second: a scan of the histogram, cheap at that rate, and it keeps the
 * other thread from reading buckets that are being written. */
static inline void
bp_publish (struct bp_conn *c, uint64_t now)
{
  if (now - c->p99_at < 250000000u)
    return;
  c->p99_at = now;
  double q = c->hist.count ? bp_hist_quantile_us (&c->hist, 0.99) * 1000.0 : 0;
  __atomic_store_n (&c->p99_ns, (uint64_t) q, __ATOMIC_RELAXED);
}

static void
bp_conn_loop (struct bp_conn *c)
{
  c->last_any_ns = now_ns ();
  for (;;) {
    uint64_t now = now_ns (), off;
    bool stop = bp_stopping (c, now);
    struct bp_slot *s;
    while (!stop && c->nfree > 0 && (s = bp_take (c, now, &off))) {
      if (bp_issue (c, s, off) == -1) {
        c->failed = true;
        break;
      }
      if (s->counted && --c->quota == 0)
        break;
    }
    if (c->inflight == 0) {
      if (stop || c->failed)
        break;
      continue;                  /* a CHURN pass just drained */
    }
    /* The timeout only bounds how late we notice ^C or a stalled server;
     * replies wake the poll as soon as they arrive. */
    if (nbd_poll (c->h, 200) == -1) {
      snprintf (c->err, sizeof c->err, "connection lost: %s", nbd_get_error ());
      c->failed = true;
      break;
    }
    uint64_t after = now_ns ();
    bp_publish (c, after);
    if (bp_stalled (c, after))
      break;
  }
}

struct bp_wire_ctx {
  struct bp_conn *c;
  uint64_t now;                  /* read once per batch, on its first reply */
};

static void
bp_wire_done (void *opaque, uint32_t slot, int error)
{
  struct bp_wire_ctx *x = opaque;
  if (!x->now)
    x->now = now_ns ();
  bp_complete (x->c, &x->c->slots[slot], error, x->now);
}

/* The same schedule as bp_conn_loop, on wire.c: every slot the last batch
 * of replies freed is refilled and sent in one sendmsg(), then one recv()
 * waits for the next batch.  Requests are stamped with the batch's clock
 * reading, which is when they were queued. */
static void
bp_conn_loop_wire (struct bp_conn *c)
{
  struct bp_wire *w = &c->wire;
  struct bp_wire_ctx x = { .c = c };
  uint64_t now = now_ns (), off;
  c->last_any_ns = now;
  for (;;) {
    bool stop = bp_stopping (c, now);
    struct bp_slot *s;
    while (!stop && c->nfree > 0 && (s = bp_take (c, now, &off))) {
      bp_wire_queue (w, s->idx, s->op, off, (uint32_t) c->bs, s->rbuf, s->wbuf);
      if (s->counted && --c->quota == 0)
        break;
    }
    if (stop || (c->count_mode && c->quota == 0))
      bp_wire_wake_stop (w);   /* cheap when unarmed; fewer replies are left */
    if (bp_wire_flush (w) == -1)
      break;
    if (c->inflight == 0) {
      if (stop)
        return;
      continue;                  /* a CHURN pass just drained */
    }
    x.now = 0;
    if (bp_wire_recv (w, bp_wire_done, &x) == -1)
      break;
    now = x.now ? x.now : now_ns ();
    bp_publish (c, now);
    if (bp_stalled (c, now))
      return;
  }
  snprintf (c->err, sizeof c->err, "%s", w->err);
  c->failed = true;
}

/* Hands the negotiated connection to wire.c unless it runs TLS (the
 * session lives inside libnbd) or --io=libnbd asked for libnbd's loop. */
static void
bp_conn_run (struct bp_conn *c)
{
  c->use_wire = false;
  if (c->o->io_libnbd || nbd_get_tls_negotiated (c->h) == 1) {
    bp_conn_loop (c);
    return;
  }
  int fd = nbd_aio_get_fd (c->h);
  int sr = nbd_get_structured_replies_negotiated (c->h);
  bool big = c->bs >= 65536 && bp_test_reads (c->test);
  unsigned wake_k = c->test == c->o->test ? bp_wake_replies (c->o) : 0;
  if (fd < 0 || sr < 0 || bp_wire_init (&c->wire, fd, sr == 1, c->depth, big,
                                        (uint32_t) c->bs, wake_k) == -1) {
    snprintf (c->err, sizeof c->err, "taking over the connection: %s",
              fd < 0 || sr < 0 ? nbd_get_error () : strerror (errno));
    c->failed = true;
    return;
  }
  c->use_wire = true;
  bp_conn_loop_wire (c);
  /* libnbd may say goodbye only on a stream that is at a reply boundary. */
  if (!bp_wire_idle (&c->wire))
    c->failed = true;
  bp_wire_free (&c->wire);
}

static void *
bp_conn_thread (void *arg)
{
  struct bp_conn *c = arg;
  c->h = bp_open (c->o, c->uri, c->err, sizeof c->err);
  if (!c->h)
    c->failed = true;
  pthread_barrier_wait (&bp_sync.connected);
  pthread_barrier_wait (&bp_sync.go);
  if (c->h && !bp_sync.abort) {
    int fd = nbd_aio_get_fd (c->h);
    bp_conn_run (c);
    socklen_t sl = sizeof c->rcvbuf;
    if (fd < 0 || getsockopt (fd, SOL_SOCKET, SO_RCVBUF, &c->rcvbuf, &sl) == -1)
      c->rcvbuf = -1;
    sl = sizeof c->sndbuf;
    if (fd < 0 || getsockopt (fd, SOL_SOCKET, SO_SNDBUF, &c->sndbuf, &sl) == -1)
      c->sndbuf = -1;
  }
  pthread_mutex_lock (&bp_sync.lock);
  bp_sync.ndone++;
  pthread_cond_signal (&bp_sync.cond);
  pthread_mutex_unlock (&bp_sync.lock);
  if (c->h) {
    if (!c->failed)
      nbd_shutdown (c->h, 0);
    nbd_close (c->h);
    c->h = NULL;
  }
  return NULL;
}

/* Buffers and slots live for the whole run: no allocation per request or
 * per iteration.  Write buffers hold non-zero random data so a server
 * cannot take a zero-detection shortcut; read buffers are touched once so
 * page faults stay out of the measurement. */
static void
bp_conns_setup (const struct bp_opts *o)
{
  size_t need = (size_t) o->bs;
  if (bp_conns && bp_nconns == o->conns && bp_conn_bufsize == need)
    return;
  bp_workers_free ();
  bp_conns = calloc (o->conns, sizeof *bp_conns);
  if (!bp_conns)
    bp_die ("out of memory");
  bp_nconns = o->conns;
  bp_conn_bufsize = need;
  bool rd = bp_test_reads (o->test), wr = bp_test_writes (o->test) || o->prefill;
  uint64_t fill = o->seed ^ 0x5eed5eed5eedull;
  for (unsigned i = 0; i < o->conns; i++) {
    struct bp_conn *c = &bp_conns[i];
    c->id = i;
    c->slots = calloc (o->depth, sizeof *c->slots);
    c->free = calloc (o->depth, sizeof *c->free);
    if (!c->slots || !c->free)
      bp_die ("out of memory");
    for (unsigned k = 0; k < o->depth; k++) {
      struct bp_slot *s = &c->slots[k];
      s->c = c;
      s->idx = k;
      void *p;
      if (rd) {
        if (posix_memalign (&p, 4096, need) != 0)
          bp_die ("out of memory for %u x %zu-byte buffers", o->depth, need);
        memset (p, 0, need);
        s->rbuf = p;
      }
      if (wr) {
        if (posix_memalign (&p, 4096, need) != 0)
          bp_die ("out of memory for %u x %zu-byte buffers", o->depth, need);
        uint64_t w;
        for (size_t b = 0; b < need; b += sizeof w) {
          do
            w = bp_splitmix (&fill);
          while (w == 0);
          memcpy ((char *) p + b, &w, need - b < sizeof w ? need - b : sizeof w);
        }
        s->wbuf = p;
      }
    }
  }
}

void
bp_workers_free (void)
{
  for (unsigned i = 0; bp_conns && i < bp_nconns; i++) {
    for (unsigned k = 0; bp_conns[i].slots && k < bp_conns[i].depth; k++) {
      free (bp_conns[i].slots[k].rbuf);
      free (bp_conns[i].slots[k].wbuf);
    }
    free (bp_conns[i].slots);
    free (bp_conns[i].free);
  }
  free (bp_conns);
  bp_conns = NULL;
  bp_nconns = 0;
}

/* Per-iteration state of each connection: range, seed, counters. */
static void
bp_conn_reset (struct bp_conn *c, const struct bp_opts *o, enum bp_test test,
               const struct bp_target *t, unsigned iter_no, uint64_t quota)
{
  c->o = o;
  c->uri = t->uri;
  c->test = test;
  c->bs = o->bs;
  c->depth = o->depth;
  c->read_pct = o->read_pct;
  if (bp_test_sequential (test)) {
    /* Sequential streams each own a slice, like netperf's parallel
     * streams to separate files; random tests share the whole span. */
    uint64_t per = t->span / bp_nconns / o->bs * o->bs;
    c->lo = t->offset + per * c->id;
    c->hi = c->lo + per;
    if (c->id == bp_nconns - 1)  /* the last slice takes the leftover blocks */
      c->hi = t->offset + t->span / o->bs * o->bs;
  }
  else {
    c->lo = t->offset;
    c->hi = t->offset + t->span / o->bs * o->bs;
  }
  c->nblocks = (c->hi - c->lo) / o->bs;
  c->cursor = c->lo;
  /* Same seed, iteration and connection give the same offsets, so A and B
   * in compare mode see identical request streams. */
  uint64_t x = o->seed * 0x100000001b3ull + iter_no * 1024u + c->id;
  c->rng = bp_splitmix (&x) | 1;
  c->count_mode = o->nrequests > 0 || test != o->test;
  c->quota = quota;
  c->churn_op = BP_OP_WRITE;
  c->churn_pass_issued = false;
  c->nfree = o->depth;
  for (unsigned k = 0; k < o->depth; k++)
    c->free[k] = o->depth - 1 - k;
  c->inflight = 0;
  c->bytes = c->requests = c->errors = 0;
  memset (c->ops, 0, sizeof c->ops);
  c->last_done_ns = 0;
  bp_hist_reset (&c->hist);
  c->first_error = 0;
  c->failed = false;
  c->err[0] = '\0';
  c->rcvbuf = c->sndbuf = -1;
  c->p99_ns = c->p99_at = 0;
}

/* ---- one iteration ---------------------------------------------------- */

static bool
bp_progress_wanted (const struct bp_opts *o)
{
  return !o->quiet && isatty (STDERR_FILENO);
}

static void
bp_totals (uint64_t *bytes, uint64_t *req)
{
  *bytes = *req = 0;
  for (unsigned i = 0; i < bp_nconns; i++) {
    *bytes += bp_peek (&bp_conns[i].bytes);
    *req += bp_peek (&bp_conns[i].requests);
  }
}

/* The done condition variable waits on CLOCK_MONOTONIC like everything
 * else here, so a wall-clock step cannot stretch an iteration. */
static void
bp_sync_init (void)
{
  static bool done;
  if (done)
    return;
  pthread_condattr_t ca;
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  pthread_cond_destroy (&bp_sync.cond);
  pthread_cond_init (&bp_sync.cond, &ca);
  pthread_condattr_destroy (&ca);
  done = true;
}

/* The worst connection's p99 so far: each connection publishes its own
 * (bp_publish); merging histograms across threads live would race. */
static double
bp_live_p99_us (void)
{
  uint64_t m = 0;
  for (unsigned i = 0; i < bp_nconns; i++) {
    uint64_t v = __atomic_load_n (&bp_conns[i].p99_ns, __ATOMIC_RELAXED);
    if (v > m)
      m = v;
  }
  return (double) m / 1000.0;
}

/* Records one second of the window for --plot. */
static void
bp_record_second (struct bp_result *r, unsigned iter_no, unsigned sec, double mibs,
                  double iops)
{
  struct bp_tsample *p = vec_grow (r->ts, &r->tscap, r->nts + 1, sizeof *p, 64);
  if (!p)
    return;                      /* the chart loses a point; the run goes on */
  r->ts = p;
  r->ts[r->nts++] = (struct bp_tsample) { iter_no, sec, mibs, iops };
}

/* Waits until `until`, or until every connection is done (until == 0, or
 * all of them stopped early).  On each whole second of the window it
 * records the second's throughput and, on a terminal, redraws the
 * progress line in place. */
static void
bp_wait (const struct bp_opts *o, const char *label, unsigned iter_no,
         uint64_t ws, uint64_t until, bool progress, struct bp_result *r)
{
  uint64_t now = now_ns (), ln = now, lb, lr;
  uint64_t tick = ws + 1000000000u;
  while (tick <= now)
    tick += 1000000000u;
  bp_totals (&lb, &lr);
  for (;;) {
    now = now_ns ();
    if (until && now >= until)
      return;
    uint64_t step = now + 200000000u;   /* 0.2 s: notice ^C promptly */
    if (step > tick)
      step = tick;
    if (until && step > until)
      step = until;
    struct timespec ts = { .tv_sec = (time_t) (step / 1000000000u),
                           .tv_nsec = (long) (step % 1000000000u) };
    pthread_mutex_lock (&bp_sync.lock);
    while (bp_sync.ndone < bp_nconns && !bp_interrupted)
      if (pthread_cond_timedwait (&bp_sync.cond, &bp_sync.lock, &ts) == ETIMEDOUT)
        break;
    bool done = bp_sync.ndone == bp_nconns;
    pthread_mutex_unlock (&bp_sync.lock);
    if (done || bp_interrupted)
      return;
    now = now_ns ();
    if (now < tick)
      continue;
    uint64_t b, q;
    bp_totals (&b, &q);
    double dt = (double) (now - ln) / 1e9;
    double mibs = (double) (b - lb) / dt / 1048576.0, iops = (double) (q - lr) / dt;
    if (r && ln >= ws)
      bp_record_second (r, iter_no, (unsigned) ((tick - ws) / 1000000000u), mibs, iops);
    if (progress)
      fprintf (stderr, "\r\033[K%s%siteration %u/%u  %6.1fs  %10.1f MiB/s  %10.0f IOPS"
               "  p99 %9.1f us", label ? label : "", label ? ": " : "", iter_no + 1,
               o->iter_max, (double) (now - ws) / 1e9, mibs, iops, bp_live_p99_us ());
    lb = b;
    lr = q;
    ln = now;
    while (tick <= now)
      tick += 1000000000u;
  }
}

/* Runs the connection threads once: connect, release together, measure,
 * collect.  measure == false is the untimed prefill (test STREAM_WRITE). */
static int
bp_iteration (const struct bp_opts *o, const struct bp_target *t, enum bp_test test,
              unsigned iter_no, uint64_t nreq, const char *label, bool measure,
              struct bp_result *r, struct bp_iter *it)
{
  bp_sync_init ();
  bp_conns_setup (o);
  for (unsigned i = 0; i < bp_nconns; i++) {
    uint64_t share = nreq / bp_nconns + (i < nreq % bp_nconns);
    bp_conn_reset (&bp_conns[i], o, test, t, iter_no, share);
    if (!measure)                /* the prefill: exactly one pass per slice */
      bp_conns[i].quota = bp_conns[i].nblocks;
  }
  if (pthread_barrier_init (&bp_sync.connected, NULL, bp_nconns + 1) != 0
      || pthread_barrier_init (&bp_sync.go, NULL, bp_nconns + 1) != 0)
    bp_die ("pthread_barrier_init failed");
  bp_sync.ndone = 0;
  bp_sync.abort = false;
  for (unsigned i = 0; i < bp_nconns; i++) {
    int e = pthread_create (&bp_conns[i].thread, NULL, bp_conn_thread, &bp_conns[i]);
    if (e != 0)
      bp_die ("cannot start connection thread %u: %s", i, strerror (e));
  }
  pthread_barrier_wait (&bp_sync.connected);
  for (unsigned i = 0; i < bp_nconns; i++)
    if (bp_conns[i].failed)
      bp_sync.abort = true;
  uint64_t t0 = now_ns ();
  bool count_mode = bp_conns[0].count_mode;
  uint64_t ws = t0 + (uint64_t) (o->warmup_s * 1e9);
  uint64_t we = count_mode ? UINT64_MAX : ws + (uint64_t) (o->duration_s * 1e9);
  if (!measure)
    ws = t0;
  for (unsigned i = 0; i < bp_nconns; i++) {
    bp_conns[i].ws = ws;
    bp_conns[i].we = we;
  }
  pthread_barrier_wait (&bp_sync.go);

  bool progress = measure && bp_progress_wanted (o);
  struct bp_cpu_sample c0, c1;
  struct bp_metrics m0, m1;
  bool want_metrics = measure && t->metrics_url;
  uint64_t end_ns = 0;
  if (!bp_sync.abort && measure) {
    if (ws > t0)
      bp_wait (o, label, iter_no, ws, ws, progress, NULL);
    /* Scrape first, then sample local CPU, so the local window is the one
     * closest to the measurement window; the scrape's own cost lands just
     * inside the remote window, which is its honest place. */
    if (want_metrics)
      bp_metrics_fetch (t->metrics_url, &m0, r->remote_err, sizeof r->remote_err);
    bp_cpu_sample (&c0);
    bp_wait (o, label, iter_no, ws, count_mode ? 0 : we, progress, r);
    bp_cpu_sample (&c1);
    end_ns = c1.mono_ns;
    if (want_metrics)
      bp_metrics_fetch (t->metrics_url, &m1, r->remote_err, sizeof r->remote_err);
  }
  for (unsigned i = 0; i < bp_nconns; i++)
    pthread_join (bp_conns[i].thread, NULL);
  if (progress)
    fputs ("\r\033[K", stderr);
  pthread_barrier_destroy (&bp_sync.connected);
  pthread_barrier_destroy (&bp_sync.go);

  int rc = 0;
  for (unsigned i = 0; i < bp_nconns; i++) {
    if (bp_conns[i].failed) {
      bp_warn ("%s%sconnection %u: %s", label ? label : "", label ? ": " : "",
               i, bp_conns[i].err[0] ? bp_conns[i].err : "failed");
      rc = -1;
    }
  }
  if (!measure) {
    for (unsigned i = 0; i < bp_nconns; i++)
      if (bp_conns[i].errors) {
        bp_warn ("%s: %llu requests failed (%s)", t->uri,
                 (unsigned long long) bp_conns[i].errors,
                 strerror (bp_conns[i].first_error));
        rc = -1;
      }
    return rc;
  }
  if (rc == -1)
    return -1;

  memset (it, 0, sizeof *it);
  struct bp_hist *h = malloc (sizeof *h);
  if (!h)
    bp_die ("out of memory");
  bp_hist_reset (h);
  uint64_t last = ws;
  int first_error = 0;
  for (unsigned i = 0; i < bp_nconns; i++) {
    struct bp_conn *c = &bp_conns[i];
    it->bytes += c->bytes;
    it->requests += c->requests;
    it->errors += c->errors;
    for (int k = 0; k < BP_NOPS; k++)
      it->ops[k] += c->ops[k];
    if (c->last_done_ns > last)
      last = c->last_done_ns;
    if (!first_error)
      first_error = c->first_error;
    bp_hist_merge (h, &c->hist);
  }
  if (it->errors)
    bp_warn ("%s%s%llu requests failed, first with: %s", label ? label : "",
             label ? ": " : "", (unsigned long long) it->errors, strerror (first_error));
  it->interrupted = bp_interrupted;
  /* An interrupt before the measured window began leaves nothing
   * measured (0 s), not a wrapped difference. */
  uint64_t end = count_mode ? last : end_ns < we ? end_ns : we;
  it->elapsed_s = end > ws ? (double) (end - ws) / 1e9 : 0;
  if (it->elapsed_s > 0) {
    it->bytes_per_s = (double) it->bytes / it->elapsed_s;
    it->iops = (double) it->requests / it->elapsed_s;
  }
  it->lat_mean_us = bp_hist_mean_us (h);
  it->lat_p50_us = bp_hist_quantile_us (h, 0.50);
  it->lat_p99_us = bp_hist_quantile_us (h, 0.99);
  it->lat_p999_us = bp_hist_quantile_us (h, 0.999);
  for (int k = 0; k < BP_NQ; k++)
    it->lat_q_us[k] = bp_hist_quantile_us (h, bp_plot_q[k]);
  r->wire = bp_conns[0].use_wire;
  it->rcvbuf = bp_conns[0].rcvbuf;
  it->sndbuf = bp_conns[0].sndbuf;
  bp_hist_merge (&r->hist, h);
  free (h);
  if (o->cpu_local && bp_cpu_accumulate (&r->cpu, &c0, &c1)) {
    r->cpu_bytes += it->bytes;
    r->cpu_requests += it->requests;
  }
  if (want_metrics && bp_remote_accumulate (&r->remote, &m0, &m1)) {
    r->remote_bytes += it->bytes;
    r->remote_requests += it->requests;
  }
  return 0;
}

int
bp_run_iteration (const struct bp_opts *o, struct bp_result *r, unsigned iter_no,
                  const char *label)
{
  if (r->n >= BP_MAX_ITER)
    return -1;
  struct bp_iter *it = &r->it[r->n];
  if (bp_iteration (o, &r->tgt, o->test, iter_no, o->nrequests, label, true, r, it) == -1) {
    r->failed = true;
    return -1;
  }
  if (it->interrupted)
    r->interrupted = true;
  if (it->interrupted && it->elapsed_s <= 0)
    return 0;                         /* stopped before it measured: not kept */
  r->n++;
  return 0;
}

int
bp_prefill (const struct bp_opts *o, const struct bp_target *t)
{
  /* One sequential pass over each connection's slice, untimed. */
  return bp_iteration (o, t, BP_STREAM_WRITE, 0, 1, NULL, false, NULL, NULL);
}
