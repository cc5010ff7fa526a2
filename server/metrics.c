/* The metrics endpoint (--metrics ADDR:PORT): /metrics in the Prometheus
 * text format, /stats as JSON, /healthz.
 *
 * evhttp runs on a thread and event base of its own rather than on the
 * main loop: the main thread spends shutdown blocked joining the shards
 * while they drain, and /healthz must answer 503 exactly then.  The thread
 * never touches a struct shard or a struct conn: it reads
 *   - the per-shard stat blocks (delayacct.c), which outlive the shards,
 *     with relaxed atomic loads of single-writer counters (no locks);
 *   - per-connection records (delayacct.c), walked under their registry
 *     lock (taken at connect and disconnect only; their counters are
 *     single-writer and read with relaxed loads);
 *   - the cache's striped counters (cache_totals) and getrusage.
 * The iobuf pool publishes its size into the shard's stat block
 * (struct iobuf_counters), so no other thread reads the pool itself. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netdb.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "cache.h"
#include "delayacct.h"
#include "metrics.h"

static struct event_base *mbase;
static struct evhttp *http;
static struct event *ev_quit;
static int quit_fd = -1;
static pthread_t mthread;
static bool mthread_started;
static uint64_t t_start_ns;

/* The label of stat slot k: the command's name, "other" for the last. */
static const char *
cmd_label (int k)
{
  return k < NBD_CMD_COUNT ? nbd_cmd_name (k) : "other";
}
static const char *const phase_name[DA_PHASES] = { "queued", "plugin", "send" };
static const char *const mode_name[] = { "compact", "locked", "off" };

/* ---- gathering ------------------------------------------------------ */

struct totals {
  uint64_t requests[DA_NCMD], bytes[DA_NCMD], errors[DA_NCMD];
  uint64_t started, completed;
};

static void
gather (struct totals *t)
{
  memset (t, 0, sizeof *t);
  for (int i = 0; i < stats_nshards (); i++) {
    struct shard_stats *st = stats_shard (i);
    for (int k = 0; k < DA_NCMD; k++) {
      t->requests[k] += stat_get (&st->cmd[k].requests);
      t->bytes[k] += stat_get (&st->cmd[k].bytes);
      t->errors[k] += stat_get (&st->cmd[k].errors);
    }
    /* completed first: a request counted as completed was started, so
     * in flight never reads negative. */
    t->completed += stat_get (&st->completed);
    t->started += stat_get (&st->started);
  }
}

static void
cpu_times (double *user, double *sys)
{
  struct rusage ru;
  getrusage (RUSAGE_SELF, &ru);
  *user = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
  *sys = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static void
head (struct evbuffer *b, const char *name, const char *type, const char *help)
{
  evbuffer_add_printf (b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A series with no labels: its HELP/TYPE head and its one value. */
static void
scalar (struct evbuffer *b, const char *name, const char *type, const char *help,
        uint64_t v)
{
  head (b, name, type, help);
  evbuffer_add_printf (b, "%s %" PRIu64 "\n", name, v);
}

/* Every endpoint builds its body in a fresh buffer and sends it whole. */
static struct evbuffer *
reply_begin (struct evhttp_request *req)
{
  struct evbuffer *b = evbuffer_new ();
  if (!b)
    evhttp_send_error (req, 500, "out of memory");
  return b;
}

static void
reply_end (struct evhttp_request *req, int code, const char *reason,
           const char *content_type, struct evbuffer *b)
{
  evhttp_add_header (evhttp_request_get_output_headers (req), "Content-Type", content_type);
  evhttp_send_reply (req, code, reason, b);
  evbuffer_free (b);
}

/* ---- /metrics ------------------------------------------------------- */

static void
prom_delay (struct evbuffer *b, int ph)
{
  struct da_snap snap[DA_NCMD];
  bool any = false;
  for (int k = 0; k < DA_NCMD; k++) {
    da_snapshot (k, ph, &snap[k]);
    any |= snap[k].used;
  }
  char name[96], help[160];
  snprintf (name, sizeof name, "blkd_delay_%s_seconds_total", phase_name[ph]);
  snprintf (help, sizeof help, "Time requests spent %s, by command.",
            ph == DA_QUEUED ? "queued before the plugin call"
            : ph == DA_PLUGIN ? "in the plugin" : "sending the reply");
  head (b, name, "counter", help);
  for (int k = 0; k < DA_NCMD; k++)
    if (snap[k].used)
      evbuffer_add_printf (b, "%s{cmd=\"%s\"} %.9f\n", name, cmd_label (k),
                           snap[k].total_ns / 1e9);
  if (!any)
    return;
  snprintf (name, sizeof name, "blkd_delay_%s_max_seconds", phase_name[ph]);
  head (b, name, "gauge", "Longest single delay of this phase, by command.");
  for (int k = 0; k < DA_NCMD; k++)
    if (snap[k].used)
      evbuffer_add_printf (b, "%s{cmd=\"%s\"} %.9f\n", name, cmd_label (k),
                           snap[k].max_ns / 1e9);
  snprintf (name, sizeof name, "blkd_delay_%s_duration_seconds", phase_name[ph]);
  head (b, name, "histogram", "Delays of this phase: log2 buckets of nanoseconds.");
  for (int k = 0; k < DA_NCMD; k++) {
    if (!snap[k].used)
      continue;
    /* Bucket b holds [2^(b-1), 2^b) ns; below 1 us the detail is noise,
     * so the first bound printed is 2^10 ns. */
    uint64_t cum = 0;
    for (int bk = 0; bk < DA_BUCKETS - 1; bk++) {
      cum += snap[k].hist[bk];
      if (bk >= 10)
        evbuffer_add_printf (b, "%s_bucket{cmd=\"%s\",le=\"%.9g\"} %" PRIu64 "\n", name,
                             cmd_label (k), (double) (UINT64_C (1) << bk) / 1e9, cum);
    }
    cum += snap[k].hist[DA_BUCKETS - 1];
    evbuffer_add_printf (b, "%s_bucket{cmd=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", name,
                         cmd_label (k), cum);
    evbuffer_add_printf (b, "%s_sum{cmd=\"%s\"} %.9f\n", name, cmd_label (k),
                         snap[k].total_ns / 1e9);
    evbuffer_add_printf (b, "%s_count{cmd=\"%s\"} %" PRIu64 "\n", name, cmd_label (k), cum);
  }
}

static void
on_metrics (struct evhttp_request *req, void *arg)
{
  struct evbuffer *b = reply_begin (req);
  if (!b)
    return;
  struct totals t;
  gather (&t);
  int last = t.requests[NBD_CMD_COUNT] ? DA_NCMD : NBD_CMD_COUNT;

  head (b, "blkd_requests_total", "counter", "Requests answered (or dropped), by command.");
  for (int k = 0; k < last; k++)
    evbuffer_add_printf (b, "blkd_requests_total{cmd=\"%s\"} %" PRIu64 "\n", cmd_label (k),
                         t.requests[k]);
  head (b, "blkd_bytes_total", "counter", "Payload bytes of successful reads and writes.");
  for (int k = 0; k < last; k++)
    evbuffer_add_printf (b, "blkd_bytes_total{cmd=\"%s\"} %" PRIu64 "\n", cmd_label (k),
                         t.bytes[k]);
  head (b, "blkd_errors_total", "counter",
        "Requests answered with an error or dropped unanswered, by command.");
  for (int k = 0; k < last; k++)
    evbuffer_add_printf (b, "blkd_errors_total{cmd=\"%s\"} %" PRIu64 "\n", cmd_label (k),
                         t.errors[k]);
  scalar (b, "blkd_requests_in_flight", "gauge", "Requests parsed and not yet finished.",
          t.started > t.completed ? t.started - t.completed : 0);
  scalar (b, "blkd_connections", "gauge", "Client connections open now.",
          shard_total_conns ());
  scalar (b, "blkd_connections_accepted_total", "counter", "Client connections accepted.",
          stats_conns_total ());
  scalar (b, "blkd_restarts_total", "counter",
          "Live restarts (SIGUSR2) this process went through.", restart_count ());
  scalar (b, "blkd_restart_connections_total", "counter",
          "Client connections handed over to a new image by live restarts.",
          restart_handed_total ());

  head (b, "blkd_delayacct_info", "gauge", "Delay accounting mode (--delayacct).");
  evbuffer_add_printf (b, "blkd_delayacct_info{mode=\"%s\"} 1\n", mode_name[cfg.delayacct]);
  if (cfg.delayacct != DELAYACCT_OFF)
    for (int ph = 0; ph < DA_PHASES; ph++)
      prom_delay (b, ph);

  if (cfg.cache_size) {
    struct cache_totals c;
    cache_totals (&c);
    scalar (b, "blkd_cache_hits_total", "counter",
            "Block cache lookups that found the block.", c.hits);
    scalar (b, "blkd_cache_misses_total", "counter",
            "Block cache lookups that read the plugin.", c.misses);
    scalar (b, "blkd_cache_evictions_total", "counter",
            "Blocks evicted to make room.", c.evictions);
    scalar (b, "blkd_cache_writebacks_total", "counter",
            "Dirty blocks written to the plugin.", c.writebacks);
    scalar (b, "blkd_cache_dirty_bytes", "gauge",
            "Bytes in dirty blocks (writeback).", c.dirty_bytes);
    scalar (b, "blkd_cache_entries", "gauge",
            "Blocks held.", c.entries);
    scalar (b, "blkd_cache_bytes", "gauge",
            "Memory of the cache's slabs.", c.bytes);
    scalar (b, "blkd_cache_capacity_bytes", "gauge",
            "Bound on the blocks held (--cache).", c.capacity_bytes);
    scalar (b, "blkd_cache_instances", "gauge",
            "Cache instances: one per export for multi-conn plugins, else one per "
            "connection.", c.instances);
  }

  struct plugin_lend_stats ls;
  plugin_lend_stats (&ls);
  scalar (b, "blkd_lend_bytes", "gauge", "Plugin memory lent to replies not yet sent.",
          ls.lent_bytes);
  scalar (b, "blkd_lend_replies_total", "counter", "READ replies sent from lent memory.",
          ls.lent_replies);
  scalar (b, "blkd_sendfile_replies_total", "counter", "READ replies sent with sendfile.",
          ls.sendfile_replies);
  scalar (b, "blkd_write_placed_bytes", "gauge",
          "Plugin memory holding WRITE payloads not yet committed.", ls.placed_bytes);
  scalar (b, "blkd_write_placed_total", "counter",
          "WRITE payloads received in place and committed.", ls.placed_writes);

  head (b, "blkd_iobuf_pool_bytes", "gauge", "Request buffer pool memory, by shard.");
  for (int i = 0; i < stats_nshards (); i++)
    evbuffer_add_printf (b, "blkd_iobuf_pool_bytes{shard=\"%d\"} %" PRIu64 "\n", i,
                         stat_get (&stats_shard (i)->iobuf.bytes));

  double user, sys;
  cpu_times (&user, &sys);
  head (b, "blkd_process_cpu_user_seconds_total", "counter", "User CPU time of blkd.");
  evbuffer_add_printf (b, "blkd_process_cpu_user_seconds_total %.6f\n", user);
  head (b, "blkd_process_cpu_system_seconds_total", "counter", "System CPU time of blkd.");
  evbuffer_add_printf (b, "blkd_process_cpu_system_seconds_total %.6f\n", sys);
  head (b, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.");
  evbuffer_add_printf (b, "process_cpu_seconds_total %.6f\n", user + sys);

  reply_end (req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", b);
}

/* ---- /stats --------------------------------------------------------- */

static void
json_str (struct evbuffer *b, const char *s)
{
  evbuffer_add (b, "\"", 1);
  for (; *s; s++) {
    unsigned char ch = *s;
    if (ch == '"' || ch == '\\')
      evbuffer_add_printf (b, "\\%c", ch);
    else if (ch < 0x20 || ch >= 0x7f)
      evbuffer_add_printf (b, "\\u%04x", ch);
    else
      evbuffer_add (b, s, 1);
  }
  evbuffer_add (b, "\"", 1);
}

static void
json_conn (const struct conn_stats *cs, bool first, void *arg)
{
  struct evbuffer *b = arg;
  uint64_t done = stat_get (&cs->completed), started = stat_get (&cs->started);
  evbuffer_add_printf (b, "%s{\"id\":%" PRIu64 ",\"shard\":%d,\"peer\":",
                       first ? "" : ",", cs->id, cs->shard);
  json_str (b, cs->peer);
  evbuffer_add_printf (b, ",\"export\":");
  if (cs->export_name)
    json_str (b, cs->export_name);
  else
    evbuffer_add_printf (b, "null");
  evbuffer_add_printf (b, ",\"inflight\":%" PRIu64 ",\"requests\":%" PRIu64
                       ",\"bytes_read\":%" PRIu64 ",\"bytes_written\":%" PRIu64 "}",
                       started > done ? started - done : 0, done,
                       stat_get (&cs->bytes_read), stat_get (&cs->bytes_written));
}

static void
on_stats (struct evhttp_request *req, void *arg)
{
  struct evbuffer *b = reply_begin (req);
  if (!b)
    return;
  struct totals t;
  gather (&t);
  double user, sys;
  cpu_times (&user, &sys);

  evbuffer_add_printf (b, "{\"version\":\"%s\",\"plugin\":", BLKD_VERSION);
  json_str (b, plugin_name ());
  evbuffer_add_printf (b, ",\"uptime_seconds\":%.3f,\"shards\":%d,\"connections\":%u,"
                       "\"requests_in_flight\":%" PRIu64 ",\"draining\":%s,"
                       "\"cpu\":{\"user_seconds\":%.6f,\"system_seconds\":%.6f},",
                       (now_ns () - t_start_ns) / 1e9, stats_nshards (), shard_total_conns (),
                       t.started > t.completed ? t.started - t.completed : 0,
                       atomic_load (&server_stopping) ? "true" : "false", user, sys);
  evbuffer_add_printf (b, "\"delayacct\":{\"mode\":\"%s\",\"phase_bytes\":%zu,"
                       "\"phase_bytes_locked\":%zu,\"phase_counter_bytes\":%zu,"
                       "\"phase_counter_bytes_locked\":%zu},",
                       mode_name[cfg.delayacct], da_phase_size (false), da_phase_size (true),
                       da_phase_size (false) - sizeof (uint64_t) * DA_BUCKETS,
                       da_phase_size (true) - sizeof (uint64_t) * DA_BUCKETS);

  evbuffer_add_printf (b, "\"commands\":{");
  for (int k = 0; k < DA_NCMD; k++) {
    evbuffer_add_printf (b, "%s\"%s\":{\"requests\":%" PRIu64 ",\"bytes\":%" PRIu64
                         ",\"errors\":%" PRIu64, k ? "," : "", cmd_label (k), t.requests[k],
                         t.bytes[k], t.errors[k]);
    if (cfg.delayacct != DELAYACCT_OFF) {
      evbuffer_add_printf (b, ",\"delay\":{");
      for (int ph = 0; ph < DA_PHASES; ph++) {
        struct da_snap s;
        da_snapshot (k, ph, &s);
        evbuffer_add_printf (b, "%s\"%s\":{\"count\":%" PRIu64 ",\"total_seconds\":%.9f,"
                             "\"max_seconds\":%.9f}", ph ? "," : "", phase_name[ph],
                             s.count, s.total_ns / 1e9, s.max_ns / 1e9);
      }
      evbuffer_add_printf (b, "}");
    }
    evbuffer_add_printf (b, "}");
  }
  evbuffer_add_printf (b, "},");

  if (cfg.cache_size) {
    struct cache_totals c;
    cache_totals (&c);
    evbuffer_add_printf (b, "\"cache\":{\"mode\":\"%s\",\"ctor\":%s,\"block\":%" PRIu64
                         ",\"stripes\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64
                         ",\"evictions\":%" PRIu64 ",\"writebacks\":%" PRIu64
                         ",\"dirty_bytes\":%" PRIu64 ",\"entries\":%" PRIu64
                         ",\"bytes\":%" PRIu64 ",\"capacity_bytes\":%" PRIu64
                         ",\"instances\":%" PRIu64 "},",
                         cfg.cache_mode == CACHE_WRITEBACK ? "writeback" : "writethrough",
                         cfg.cache_ctor ? "true" : "false", c.block, c.stripes, c.hits,
                         c.misses, c.evictions, c.writebacks, c.dirty_bytes, c.entries,
                         c.bytes, c.capacity_bytes, c.instances);
  }
  else
    evbuffer_add_printf (b, "\"cache\":null,");

  evbuffer_add_printf (b, "\"iobuf_pool_bytes\":[");
  for (int i = 0; i < stats_nshards (); i++)
    evbuffer_add_printf (b, "%s%" PRIu64, i ? "," : "", stat_get (&stats_shard (i)->iobuf.bytes));
  evbuffer_add_printf (b, "],\"conns\":[");

  stats_conns_each (json_conn, b);
  evbuffer_add_printf (b, "]}\n");

  reply_end (req, 200, "OK", "application/json", b);
}

/* ---- /healthz and the rest ------------------------------------------ */

static void
on_healthz (struct evhttp_request *req, void *arg)
{
  struct evbuffer *b = reply_begin (req);
  if (!b)
    return;
  bool draining = atomic_load (&server_stopping);
  evbuffer_add_printf (b, draining ? "draining\n" : "ok\n");
  reply_end (req, draining ? 503 : 200, draining ? "Service Unavailable" : "OK",
             "text/plain", b);
}

static void
on_other (struct evhttp_request *req, void *arg)
{
  evhttp_send_error (req, 404, "try /metrics, /stats or /healthz");
}

static void
on_quit (evutil_socket_t fd, short what, void *arg)
{
  event_base_loopbreak (mbase);
}

static void *
metrics_main (void *arg)
{
  pthread_setname_np (pthread_self (), "blkd.metrics");
  event_base_dispatch (mbase);
  return NULL;
}

/* "ADDR:PORT", "[V6ADDR]:PORT" or ":PORT" (all addresses). */
static int
split_addr (const char *spec, char *host, size_t hostlen, uint16_t *port)
{
  const char *colon = strrchr (spec, ':');
  if (!colon)
    return -1;
  const char *h = spec;
  size_t hl = colon - spec;
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  if (hl >= hostlen)
    return -1;
  memcpy (host, h, hl);
  host[hl] = '\0';
  if (hl == 0)
    snprintf (host, hostlen, "0.0.0.0");
  char *end;
  long p = strtol (colon + 1, &end, 10);
  if (*end || end == colon + 1 || p < 0 || p > 65535)
    return -1;
  *port = p;
  return 0;
}

int
metrics_start (void)
{
  t_start_ns = now_ns ();
  if (!cfg.metrics_addr)
    return 0;
  char host[256];
  uint16_t port;
  if (split_addr (cfg.metrics_addr, host, sizeof host, &port) == -1) {
    fprintf (stderr, "blkd: --metrics: '%s' is not ADDR:PORT\n", cfg.metrics_addr);
    return -1;
  }
  mbase = event_base_new ();
  http = mbase ? evhttp_new (mbase) : NULL;
  quit_fd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (!http || quit_fd < 0) {
    fprintf (stderr, "blkd: --metrics: cannot set up the HTTP server: %m\n");
    goto fail;
  }
  ev_quit = event_new (mbase, quit_fd, EV_READ, on_quit, NULL);
  if (!ev_quit || event_add (ev_quit, NULL) == -1)
    goto fail;
  evhttp_set_allowed_methods (http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
  evhttp_set_cb (http, "/metrics", on_metrics, NULL);
  evhttp_set_cb (http, "/stats", on_stats, NULL);
  evhttp_set_cb (http, "/healthz", on_healthz, NULL);
  evhttp_set_gencb (http, on_other, NULL);
  struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle (http, host, port);
  if (!bs) {
    fprintf (stderr, "blkd: --metrics: cannot listen on %s port %u: %m\n", host, port);
    goto fail;
  }
  if (cfg.foreground && !cfg.run_cmd) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char h[NI_MAXHOST], p[NI_MAXSERV];
    evutil_socket_t fd = evhttp_bound_socket_get_fd (bs);
    if (getsockname (fd, (struct sockaddr *) &ss, &sl) == 0
        && getnameinfo ((struct sockaddr *) &ss, sl, h, sizeof h, p, sizeof p,
                        NI_NUMERICHOST | NI_NUMERICSERV) == 0)
      fprintf (stderr, "blkd: metrics on http://%s%s%s:%s/metrics\n",
               strchr (h, ':') ? "[" : "", h, strchr (h, ':') ? "]" : "", p);
  }

  /* Signals stay with the main thread. */
  sigset_t block, old;
  sigfillset (&block);
  pthread_sigmask (SIG_BLOCK, &block, &old);
  int err = pthread_create (&mthread, NULL, metrics_main, NULL);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (err) {
    errno = err;
    fprintf (stderr, "blkd: --metrics: cannot start the thread: %m\n");
    goto fail;
  }
  mthread_started = true;
  return 0;

fail:
  metrics_stop ();
  return -1;
}

void
metrics_stop (void)
{
  if (mthread_started) {
    uint64_t one = 1;
    if (write (quit_fd, &one, sizeof one) != sizeof one)
      log_error ("metrics: cannot wake the HTTP thread: %m");
    pthread_join (mthread, NULL);
    mthread_started = false;
  }
  if (http)
    evhttp_free (http);
  http = NULL;
  if (ev_quit)
    event_free (ev_quit);
  ev_quit = NULL;
  if (mbase)
    event_base_free (mbase);
  mbase = NULL;
  if (quit_fd >= 0)
    close (quit_fd);
  quit_fd = -1;
}
