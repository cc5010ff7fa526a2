/* Shards: one thread and one libevent base per core; connections are handed
 * over by the acceptor and stay on their shard for life. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <event2/event.h>

#include "internal.h"
#include "backend.h"
#include "delayacct.h"
#include "vector.h"

struct shard *shards;
int nshards;
static struct queue *global_queue;     /* --queue=global: one for all */
static atomic_uint total_conns;        /* handed over and not yet freed */
static atomic_uint next_shard;
void (*shard_conn_gone_hook) (struct shard *s);
/* The connections' side (conn.c's conn_shard_ops): the shard's one way up. */
static const struct shard_conn_ops *conn_ops;
static void shard_sweep_arm (struct shard *s);

unsigned
shard_total_conns (void)
{
  return atomic_load (&total_conns);
}

static void
shard_notify (struct shard *s)
{
  uint64_t one = 1;
  /* eventfd writes only fail when the counter would overflow, which
   * cannot happen before the shard drains it. */
  if (write (s->notify_fd, &one, sizeof one) != sizeof one && errno != EAGAIN)
    log_error ("shard %d: eventfd write: %m", s->index);
}

/* ---- work placement ------------------------------------------------ */

static bool
dispatch_inline (void)
{
  if (cfg.queue == QUEUE_GLOBAL)
    return false;                   /* the "before": everything via one queue */
  if (cfg.dispatch == DISPATCH_INLINE)
    return true;
  if (cfg.dispatch == DISPATCH_WORKER)
    return false;
  return backend_inline_safe ();
}

/* The plugin's aio completion, on its thread: build the reply, then back
 * to the shard as from a worker. */
static void
shard_aio_done (struct blkd_aio *a, int err)
{
  struct request *r = protocol_aio_finish (a, err);
  atomic_fetch_sub_explicit (&r->conn->shard->aio_inflight, 1, memory_order_relaxed);
  shard_complete (r);
}

bool
shard_dispatch (struct request *r)
{
  struct shard *s = r->conn->shard;

  /* A plugin that completes requests itself (aio) needs no thread here.
   * Counted before it starts: its completion may come before the call
   * returns.  Other plugins pay no atomic for it. */
  if (backend_aio_ready (r->conn->pc.top)) {
    atomic_fetch_add_explicit (&s->aio_inflight, 1, memory_order_relaxed);
    enum protocol_aio started = protocol_start_aio (r, shard_aio_done);
    if (started == PROTOCOL_AIO_STARTED)
      return false;
    atomic_fetch_sub_explicit (&s->aio_inflight, 1, memory_order_relaxed);
    if (started == PROTOCOL_AIO_ANSWERED)
      return true;
  }
  if (dispatch_inline ()) {
    log_current = &r->conn->log;
    protocol_execute (r);
    return true;
  }
  queue_push (global_queue ? global_queue : s->queue, r);
  return false;
}

bool
shard_runs_inline (const struct request *r)
{
  return !backend_aio_ready (r->conn->pc.top) && dispatch_inline ();
}

/* A worker's job: run the request (or a handshake's plugin call), then
 * hand it back to its shard. */
static void
shard_run_request (struct request *r)
{
  if (__builtin_expect (r->type == REQUEST_HANDSHAKE, 0)) {
    log_current = &r->conn->log;
    handshake_call (r->conn);
    log_current = NULL;
  }
  else
    protocol_execute (r);
  shard_complete (r);
}

/* A handshake option's plugin calls (.open, .list_exports, ...) go where
 * requests go: the plugin's .open may wait as long as its storage does
 * (a Ceph cluster missing a monitor), and on the shard thread that would
 * stall every other connection of the shard. */
int
shard_handshake_call (struct conn *c)
{
  if (dispatch_inline ()) {
    handshake_call (c);
    return 1;
  }
  struct request *r = request_get (c->shard->pool);
  if (!r)
    return -1;
  r->conn = c;
  r->type = REQUEST_HANDSHAKE;
  c->inflight++;
  queue_push (global_queue ? global_queue : c->shard->queue, r);
  return 0;
}

/* Called by a worker: hand the finished request back to its shard. */
void
shard_complete (struct request *r)
{
  struct shard *s = r->conn->shard;
  bool was_empty;

  r->next = NULL;
  pthread_mutex_lock (&s->lock);
  was_empty = s->done_head == NULL;
  if (s->done_tail)
    s->done_tail->next = r;
  else
    s->done_head = r;
  s->done_tail = r;
  pthread_mutex_unlock (&s->lock);
  /* One wake-up per batch: if the list was not empty the shard has been
   * told already and will take this one with the rest. */
  if (was_empty)
    shard_notify (s);
}

/* ---- connections leaving ------------------------------------------ */

void
shard_conn_gone (struct shard *s, struct conn *c)
{
  atomic_fetch_sub (&s->nconns_shared, 1);
  atomic_fetch_sub (&total_conns, 1);
  /* -s: its one client has gone.  Through the hook main.c sets, so
   * shard.c links without main.o (the fuzz harness does). */
  if (cfg.single && public_shutdown_hook)
    public_shutdown_hook ();
  if (s->draining && s->nconns == 0)
    event_base_loopbreak (s->base);
  if (shard_conn_gone_hook)
    shard_conn_gone_hook (s);
}

/* ---- hand-over from the acceptor ------------------------------------ */

void
shard_handoff (int fd, const char *peer)
{
  /* Fewest connections wins; round robin breaks ties so a burst of
   * accepts spreads before any of them is counted. */
  unsigned start = atomic_fetch_add (&next_shard, 1);
  struct shard *best = &shards[start % nshards];
  for (int i = 0; i < nshards; i++) {
    struct shard *s = &shards[(start + i) % nshards];
    if (atomic_load (&s->nconns_shared) < atomic_load (&best->nconns_shared))
      best = s;
  }
  atomic_fetch_add (&best->nconns_shared, 1);
  atomic_fetch_add (&total_conns, 1);

  pthread_mutex_lock (&best->lock);
  struct shard_new *nv = vec_grow (best->new_conns, &best->cap_new, best->n_new + 1,
                                   sizeof *nv, 16);
  if (!nv) {
    pthread_mutex_unlock (&best->lock);
    log_error ("shard %d: out of memory handing over %s", best->index, peer);
    close (fd);
    atomic_fetch_sub (&best->nconns_shared, 1);
    atomic_fetch_sub (&total_conns, 1);
    return;
  }
  best->new_conns = nv;
  nv[best->n_new].fd = fd;
  snprintf (nv[best->n_new].peer, sizeof nv->peer, "%s", peer);
  best->n_new++;
  pthread_mutex_unlock (&best->lock);
  shard_notify (best);
}

/* ---- calls from the main thread (a live restart, restart.c) ----------- */

struct shard_call {
  struct shard_call *next;
  void (*fn) (struct shard *, void *);
  void *arg;
};

int
shard_call (struct shard *s, void (*fn) (struct shard *, void *), void *arg)
{
  struct shard_call *k = malloc (sizeof *k);
  if (!k)
    return -1;
  *k = (struct shard_call) { .fn = fn, .arg = arg };
  pthread_mutex_lock (&s->lock);
  struct shard_call **pp = &s->calls;
  while (*pp)
    pp = &(*pp)->next;
  *pp = k;
  pthread_mutex_unlock (&s->lock);
  shard_notify (s);
  return 0;
}

/* The calls taken off s->calls under the lock; run (s) or dropped (NULL). */
static void
shard_run_calls (struct shard *s, struct shard_call *k)
{
  while (k) {
    struct shard_call *next = k->next;
    if (s)
      k->fn (s, k->arg);
    free (k);
    k = next;
  }
}

struct conn *
shard_conn_adopt (struct shard *s, int fd, const char *peer)
{
  atomic_fetch_add (&s->nconns_shared, 1);
  atomic_fetch_add (&total_conns, 1);
  struct conn *c = conn_ops->open (s, fd, peer);
  if (!c) {
    atomic_fetch_sub (&s->nconns_shared, 1);
    atomic_fetch_sub (&total_conns, 1);
  }
  else
    shard_sweep_arm (s);
  return c;
}

static void
shard_drain_timeout (evutil_socket_t fd, short what, void *arg)
{
  struct shard *s = arg;
  log_warn ("shard %d: %u connection(s) did not drain in time; closing them",
            s->index, s->nconns);
  /* Closing frees a connection only once its requests are back from the
   * workers; the last free breaks the loop (shard_conn_gone). */
  for (struct conn *c = s->conns, *next; c; c = next) {
    next = c->next;
    conn_ops->close_now (c);
  }
}

/* Timeouts are checked by one sweep a second per shard rather than a
 * timer per connection: re-arming a timer on every request would cost a
 * heap operation per request for a limit that is counted in seconds.
 * And only while some connection may time out (one in its handshake, or
 * any with --idle-timeout): with a timer pending, every sleep in
 * epoll_wait has a timeout, which the kernel arms and cancels as an
 * hrtimer each time, and libevent reads the clock for it on every turn
 * of the loop; with none, the shard sleeps with no timeout at all. */
static void
shard_sweep (evutil_socket_t fd, short what, void *arg)
{
  struct shard *s = arg;
  if (conn_ops->sweep (s))
    shard_sweep_arm (s);
}

/* A connection arrived (or may need the sweep again): make sure it runs. */
static void
shard_sweep_arm (struct shard *s)
{
  static const struct timeval sec = { .tv_sec = 1 };
  if (s->ev_sweep && !evtimer_pending (s->ev_sweep, NULL) && evtimer_add (s->ev_sweep, &sec) == -1)
    log_error ("shard %d: cannot arm the timeout sweep", s->index);
}

static void
shard_begin_drain (struct shard *s)
{
  if (s->draining)
    return;
  s->draining = true;
  if (s->nconns == 0) {
    event_base_loopbreak (s->base);
    return;
  }
  for (struct conn *c = s->conns, *next; c; c = next) {
    next = c->next;
    conn_ops->shutdown (c);
  }
  s->ev_drain_timeout = evtimer_new (s->base, shard_drain_timeout, s);
  struct timeval tv = { .tv_sec = 10 };
  if (s->ev_drain_timeout)
    evtimer_add (s->ev_drain_timeout, &tv);
}

static void
shard_on_notify (evutil_socket_t fd, short what, void *arg)
{
  struct shard *s = arg;
  uint64_t n;
  if (read (s->notify_fd, &n, sizeof n) < 0 && errno != EAGAIN)
    log_error ("shard %d: eventfd read: %m", s->index);

  pthread_mutex_lock (&s->lock);
  struct request *done = s->done_head;
  s->done_head = s->done_tail = NULL;
  struct shard_call *calls = s->calls;
  s->calls = NULL;
  size_t n_new = s->n_new;
  struct shard_new *nc = NULL;
  if (n_new) {
    nc = s->new_conns;
    s->new_conns = NULL;
    s->n_new = s->cap_new = 0;
  }
  pthread_mutex_unlock (&s->lock);

  conn_ops->completed (s, done);

  for (size_t i = 0; i < n_new; i++) {
    if (s->draining || atomic_load (&server_stopping)) {
      close (nc[i].fd);
      atomic_fetch_sub (&s->nconns_shared, 1);
      atomic_fetch_sub (&total_conns, 1);
      continue;
    }
    struct conn *c = conn_ops->open (s, nc[i].fd, nc[i].peer);
    if (!c) {
      log_error ("shard %d: cannot set up connection from %s: %m", s->index, nc[i].peer);
      if (cfg.single && public_shutdown_hook)
        public_shutdown_hook ();
      close (nc[i].fd);
      atomic_fetch_sub (&s->nconns_shared, 1);
      atomic_fetch_sub (&total_conns, 1);
      continue;
    }
    shard_sweep_arm (s);
    conn_ops->start (c);
  }
  free (nc);
  /* After the new connections: a live restart's quiesce must see them. */
  shard_run_calls (s, calls);

  if (atomic_load (&server_stopping))
    shard_begin_drain (s);
}

/* Is the peer on this machine?  Over loopback, or to an address of ours,
 * its packets are processed on the CPU that sent them. */
static bool
shard_peer_local (int fd)
{
  struct sockaddr_storage me, peer;
  socklen_t lm = sizeof me, lp = sizeof peer;
  if (getsockname (fd, (struct sockaddr *) &me, &lm) < 0
      || getpeername (fd, (struct sockaddr *) &peer, &lp) < 0 || me.ss_family != peer.ss_family)
    return false;
  if (peer.ss_family == AF_INET) {
    struct in_addr m = ((struct sockaddr_in *) &me)->sin_addr;
    struct in_addr p = ((struct sockaddr_in *) &peer)->sin_addr;
    return (ntohl (p.s_addr) >> 24) == 127 || m.s_addr == p.s_addr;
  }
  if (peer.ss_family == AF_INET6) {
    const struct in6_addr *m = &((struct sockaddr_in6 *) &me)->sin6_addr;
    const struct in6_addr *p = &((struct sockaddr_in6 *) &peer)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK (p) || IN6_ARE_ADDR_EQUAL (m, p)
      || (IN6_IS_ADDR_V4MAPPED (p) && p->s6_addr[12] == 127);
  }
  return false;                     /* Unix: no SO_INCOMING_CPU */
}

/* Whether the last reader's connection (by id) has a local peer: asked
 * once per connection. */
struct shard_place {
  uint64_t conn_id;
  bool local;
};

/* Does the client that read last run on the CPU this thread runs on?  For
 * a local TCP peer, SO_INCOMING_CPU (the CPU that processed the
 * connection's latest packet) is the CPU the client sent it from.
 * Spinning there only delays the client: it cannot send its next request
 * until this thread gives the CPU up (docs/BENCHMARKS.md, "Polling and
 * placement").  A remote peer's packets are processed where the NIC's
 * interrupt lands, which says nothing of where the client runs: false, as
 * for Unix sockets. */
static bool
shard_peer_on_my_cpu (struct shard *s, struct shard_place *place)
{
  int fd = s->last_reader_fd, cpu = -1;
  socklen_t len = sizeof cpu;
  if (fd < 0)
    return false;
  if (place->conn_id != s->last_reader_id) {
    place->conn_id = s->last_reader_id;
    place->local = shard_peer_local (fd);
  }
  if (!place->local || getsockopt (fd, SOL_SOCKET, SO_INCOMING_CPU, &cpu, &len) < 0 || cpu < 0)
    return false;
  return cpu == sched_getcpu ();
}

/* Times this thread was preempted (switched out while runnable). */
static long
shard_preemptions (void)
{
  struct rusage ru;
  return getrusage (RUSAGE_THREAD, &ru) == 0 ? ru.ru_nivcsw : 0;
}

/* Preempted on at least PREEMPT_NUM of every PREEMPT_DEN reads while
 * polling: the CPU is shared with a thread that wakes as often as the
 * requests come, which is what a client on this CPU does (preempting the
 * spinning shard once a request); other busy threads preempt at their
 * own pace, seldom that often. */
enum { PREEMPT_NUM = 2, PREEMPT_DEN = 3 };

static void *
shard_main (void *arg)
{
  struct shard *s = arg;
  char name[16];
  snprintf (name, sizeof name, "blkd.s%d", s->index);
  pthread_setname_np (pthread_self (), name);
  if (cfg.poll_us == 0) {
    event_base_loop (s->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
  }
  /* Poll before sleeping: after a round that read requests, look again
   * without blocking for up to --poll-us.  A client waiting on its reply
   * (QD1) sends the next request within that window, and finds this thread
   * running instead of asleep in epoll_wait: no wake-up, no idle exit of
   * the CPU.  Only while requests come closer together than the window:
   * a round that read requests polls afterwards only if the previous one
   * ended less than a window before, so a client with longer gaps costs at
   * most one wasted window, and an idle shard sleeps as before.  Not while
   * a connection waits for the rest of a big WRITE payload: the kernel
   * wakes us once it is all there (SO_RCVLOWAT, conn.c), and spinning
   * until then only takes the CPU from the client sending it.  Nor while
   * more than one connection sends requests (reads came from another
   * connection than the last within MULTI_QUIET windows): their requests
   * keep the shard busy anyway, and the spinning took the CPU their
   * clients needed (measured with 4 connections on 2 CPUs: docs/lab/).
   * Nor while the plugin's aio holds requests of this shard: what the
   * shard waits for then is their completion, made by the plugin's
   * threads (librbd's, and the storage's behind them), which the spinning
   * takes the CPU from; the eventfd wakes us when they are done.  With
   * many connections their reads are often too far apart for the check
   * above to see them, so this is what stops the spinning there. */
  enum { MULTI_QUIET = 16, PLACE_CHECK = 20, BACKOFF_MAX = 64 };
  uint64_t window = (uint64_t) cfg.poll_us * 1000, last_read = 0, seen = s->reads;
  uint64_t changes_seen = s->reader_changes, last_change = 0, last_where = 0;
  uint64_t reads_at_check = s->reads, yield_until = 0;
  long preempted_at_check = shard_preemptions ();
  unsigned backoff = 1;
  bool close_together = false, peer_here = false;
  struct shard_place place = { 0, false };
  /* The time the last round that read requests ended: the next round
   * starts at once, so it stands for "now" there (one clock read fewer
   * per busy round). */
  uint64_t fresh = 0;
  for (;;) {
    uint64_t now = fresh ? fresh : now_ns ();
    fresh = 0;
    if (yield_until && now >= yield_until) {
      /* The next check period counts preemptions while polling only. */
      yield_until = 0;
      reads_at_check = s->reads;
      preempted_at_check = shard_preemptions ();
      last_where = now;
    }
    bool poll = close_together && !s->lowat_conns && !peer_here && !yield_until &&
      now - last_read < window &&
      atomic_load_explicit (&s->aio_inflight, memory_order_relaxed) == 0;
    event_base_loop (s->base, (poll ? EVLOOP_NONBLOCK : EVLOOP_ONCE) | EVLOOP_NO_EXIT_ON_EMPTY);
    if (event_base_got_break (s->base) || event_base_got_exit (s->base))
      break;
    if (s->reads != seen) {
      uint64_t t = now_ns ();
      /* The first connection to read is no change of reader. */
      if (s->reader_changes - changes_seen > (changes_seen == 0))
        last_change = t;
      changes_seen = s->reader_changes;
      close_together = t - last_read < window && t - last_change >= MULTI_QUIET * window;
      /* Whether the client shares this CPU, looked up at most once per
       * PLACE_CHECK windows (a getsockopt and a getrusage): the scheduler
       * moves threads far less often than that.  Two signs: a local TCP
       * client's SO_INCOMING_CPU, and, for any client, this thread
       * preempted on most reads while it polled (PREEMPT_NUM)
       * (someone runnable on this CPU wanted it: the client, or any other
       * thread the spinning starves).  The first stops polling until a
       * look says otherwise; the second for 1, 2, 4 ... BACKOFF_MAX check
       * periods, doubling while each trial period is preempted again, so
       * a client that moved away is polled for again. */
      if (close_together && !yield_until && t - last_where >= PLACE_CHECK * window) {
        long pre = shard_preemptions ();
        uint64_t nreads = s->reads - reads_at_check;
        bool contended = !peer_here && pre - preempted_at_check >= 2
          && (uint64_t) (pre - preempted_at_check) * PREEMPT_DEN >= nreads * PREEMPT_NUM;
        peer_here = shard_peer_on_my_cpu (s, &place);
        if (contended) {
          yield_until = t + (uint64_t) backoff * PLACE_CHECK * window;
          if (backoff < BACKOFF_MAX)
            backoff *= 2;
        } else if (!peer_here)
          backoff = 1;
        reads_at_check = s->reads;
        preempted_at_check = pre;
        last_where = t;
      }
      seen = s->reads;
      last_read = fresh = t;
    }
  }
  return NULL;
}

int
shard_start_all (const struct shard_conn_ops *ops)
{
  bool need_workers = !dispatch_inline ();
  conn_ops = ops;
  nshards = cfg.shards;
  /* One connection may hold a quarter of its shard's pool (at least one
   * largest request), so a client that never reads its replies cannot
   * starve the others on its shard.  main.c ensures the pool holds two. */
  cfg.iobuf_conn_cap = cfg.iobuf_mem / nshards / 4;
  if (cfg.iobuf_conn_cap < cfg.max_request)
    cfg.iobuf_conn_cap = cfg.max_request;
  shards = calloc (nshards, sizeof *shards);
  if (!shards)
    return -1;

  if (need_workers && cfg.queue == QUEUE_GLOBAL) {
    global_queue = queue_new (cfg.workers * nshards, "blkd.g", shard_run_request);
    if (!global_queue) {
      fprintf (stderr, "blkd: cannot start worker threads: %m\n");
      return -1;
    }
  }
  for (int i = 0; i < nshards; i++) {
    struct shard *s = &shards[i];
    s->index = i;
    s->last_reader_fd = -1;
    pthread_mutex_init (&s->lock, NULL);
    struct event_config *ec = event_config_new ();
    if (!ec)
      return -1;
    /* The base is touched only by its own thread: no libevent locking.
     * And no cached time: libevent would read the clock after every
     * epoll_wait to keep it, for callbacks that never ask for it. */
    event_config_set_flag (ec, EVENT_BASE_FLAG_NOLOCK | EVENT_BASE_FLAG_NO_CACHE_TIME);
    s->base = event_base_new_with_config (ec);
    event_config_free (ec);
    s->notify_fd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->stats = stats_shard (i);
    s->pool = iobuf_pool_new (cfg.iobuf_mem / nshards, s->stats ? &s->stats->iobuf : NULL);
    if (!s->base || s->notify_fd < 0 || !s->pool || !s->stats) {
      fprintf (stderr, "blkd: cannot create shard %d: %m\n", i);
      return -1;
    }
    s->ev_notify = event_new (s->base, s->notify_fd, EV_READ | EV_PERSIST, shard_on_notify, s);
    if (!s->ev_notify || event_add (s->ev_notify, NULL) == -1)
      return -1;
    if (cfg.handshake_timeout || cfg.idle_timeout) {
      s->ev_sweep = evtimer_new (s->base, shard_sweep, s);   /* armed by connections */
      if (!s->ev_sweep)
        return -1;
    }
    if (need_workers && cfg.queue == QUEUE_SPLIT) {
      char qname[24];
      snprintf (qname, sizeof qname, "blkd.s%d", i);
      s->queue = queue_new (cfg.workers, qname, shard_run_request);
      if (!s->queue) {
        fprintf (stderr, "blkd: cannot start worker threads: %m\n");
        return -1;
      }
    }
  }
  for (int i = 0; i < nshards; i++) {
    int err = pthread_create (&shards[i].thread, NULL, shard_main, &shards[i]);
    if (err) {
      errno = err;
      fprintf (stderr, "blkd: cannot start shard thread: %m\n");
      return -1;
    }
  }
  return 0;
}

/* Ask every shard to drain (finish in-flight requests, close), wait for
 * them, then stop the workers and free everything. */
void
shard_stop_all (void)
{
  if (!shards)
    return;
  for (int i = 0; i < nshards; i++)
    shard_notify (&shards[i]);
  for (int i = 0; i < nshards; i++)
    pthread_join (shards[i].thread, NULL);
  /* Connections are gone, so no request is queued: workers exit at once. */
  for (int i = 0; i < nshards; i++)
    queue_stop (shards[i].queue);
  queue_stop (global_queue);
  global_queue = NULL;
  for (int i = 0; i < nshards; i++) {
    struct shard *s = &shards[i];
    for (size_t j = 0; j < s->n_new; j++)
      close (s->new_conns[j].fd);
    free (s->new_conns);
    shard_run_calls (NULL, s->calls);   /* too late to run */
    if (s->ev_drain_timeout)
      event_free (s->ev_drain_timeout);
    if (s->ev_sweep)
      event_free (s->ev_sweep);
    event_free (s->ev_notify);
    event_base_free (s->base);
    close (s->notify_fd);
    iobuf_pool_free (s->pool);
    pthread_mutex_destroy (&s->lock);
  }
  free (shards);
  shards = NULL;
}
