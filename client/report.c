/* Results out: the netperf-style tables and the --json objects for single runs and compare mode. */
#include <math.h>
#include <string.h>

#include "blkperf.h"

#define BP_MIB 1048576.0

double
bp_iter_metric (const struct bp_iter *it, int which)
{
  switch (which) {
  case BP_M_MIBS: return it->bytes_per_s / BP_MIB;
  case BP_M_IOPS: return it->iops;
  case BP_M_LAT_MEAN: return it->lat_mean_us;
  case BP_M_LAT_P99: return it->lat_p99_us;
  default: return NAN;
  }
}

static const char *const bp_metric_names[BP_NMETRICS] = {
  [BP_M_MIBS] = "throughput_mib_s", [BP_M_IOPS] = "iops",
  [BP_M_LAT_MEAN] = "latency_mean_us", [BP_M_LAT_P99] = "latency_p99_us",
};
static const char *const bp_metric_labels[BP_NMETRICS] = {
  [BP_M_MIBS] = "Throughput MiB/s", [BP_M_IOPS] = "IOPS",
  [BP_M_LAT_MEAN] = "Latency mean us", [BP_M_LAT_P99] = "Latency p99 us",
};

static int
bp_primary (const struct bp_opts *o)
{
  return bp_test_primary_is_iops (o->test) ? BP_M_IOPS : BP_M_MIBS;
}

void
bp_result_summary (const struct bp_opts *o, const struct bp_result *r, int metric,
                   struct bp_summary *s)
{
  double x[BP_MAX_ITER];
  for (unsigned i = 0; i < r->n; i++)
    x[i] = bp_iter_metric (&r->it[i], metric);
  bp_summarize (x, r->n, o->ci_level, s);
}

bool
bp_ci_met (const struct bp_opts *o, const struct bp_result *r)
{
  struct bp_summary s;
  bp_result_summary (o, r, bp_primary (o), &s);
  return s.n >= 2 && !isnan (s.width_pct) && s.width_pct <= o->ci_width;
}

/* ---- derived numbers -------------------------------------------------- */

struct bp_cpu_view {
  bool have;
  double user, system, idle;   /* percent; NAN when unknown */
  double steal;                /* local only: hypervisor steal, percent */
  double busy;                 /* percent: user + system, or process CPU */
  double sd_kb, sd_req;        /* CPU us per KB (1024 bytes) and per request */
  double proc_pct, proc_sd_kb; /* local only: blkperf's own process */
  double user_s, system_s, cpu_s;
  const char *basis;
};

static double
bp_div (double a, double b)
{
  return b > 0 ? a / b : NAN;
}

static void
bp_local_view (const struct bp_result *r, struct bp_cpu_view *v)
{
  memset (v, 0, sizeof *v);
  v->have = r->cpu.valid;
  if (!v->have)
    return;
  const struct bp_cpu_acc *c = &r->cpu;
  v->user = 100.0 * c->user_ticks / c->total_ticks;
  v->system = 100.0 * c->system_ticks / c->total_ticks;
  v->idle = 100.0 * c->idle_ticks / c->total_ticks;
  v->steal = 100.0 * c->steal_ticks / c->total_ticks;
  v->busy = v->user + v->system;
  /* netperf's service demand: the whole machine's busy CPU time over the
   * window, per KB moved.  On loopback that includes the server.  Steal
   * is not counted as busy: it was someone else's work. */
  double busy_s = (c->user_ticks + c->system_ticks) / (double) bp_cpu_ticks_per_s ();
  v->sd_kb = bp_div (busy_s * 1e6, (double) r->cpu_bytes / 1024.0);
  v->sd_req = bp_div (busy_s * 1e6, (double) r->cpu_requests);
  v->user_s = c->proc_user_s;
  v->system_s = c->proc_sys_s;
  v->cpu_s = c->proc_user_s + c->proc_sys_s;
  v->proc_pct = bp_div (100.0 * v->cpu_s, c->wall_s);
  v->proc_sd_kb = bp_div (v->cpu_s * 1e6, (double) r->cpu_bytes / 1024.0);
  v->basis = "machine";
}

static void
bp_remote_view (const struct bp_result *r, struct bp_cpu_view *v)
{
  memset (v, 0, sizeof *v);
  const struct bp_remote_acc *m = &r->remote;
  v->user = v->system = v->idle = v->steal = v->busy = v->sd_kb = v->sd_req = NAN;
  v->proc_pct = v->proc_sd_kb = v->user_s = v->system_s = v->cpu_s = NAN;
  if (m->windows == 0 || (m->cpu_n == 0 && m->node_n == 0))
    return;
  v->have = true;
  double kb = (double) r->remote_bytes / 1024.0;
  if (m->node_n) {
    /* node_exporter is there: the machine split, as on the local side. */
    v->user = 100.0 * m->node_user_s / m->node_total_s;
    v->system = 100.0 * m->node_sys_s / m->node_total_s;
    v->idle = 100.0 * m->node_idle_s / m->node_total_s;
    v->busy = v->user + v->system;
    v->basis = "machine";
  }
  else {
    /* Only the server process: percent of one CPU, idle unknowable. */
    v->busy = 100.0 * m->cpu_s / m->wall_s;
    if (m->split_n) {
      v->user = 100.0 * m->user_s / m->wall_s;
      v->system = 100.0 * m->sys_s / m->wall_s;
    }
    v->basis = "process";
  }
  if (m->cpu_n) {
    /* The server's own CPU per KB: what a server change can move. */
    v->cpu_s = m->cpu_s;
    if (m->split_n) { v->user_s = m->user_s; v->system_s = m->sys_s; }
    v->proc_pct = 100.0 * m->cpu_s / m->wall_s;
    v->sd_kb = bp_div (m->cpu_s * 1e6, kb);
    v->sd_req = bp_div (m->cpu_s * 1e6, (double) r->remote_requests);
  }
  else {
    double busy_s = m->node_user_s + m->node_sys_s;
    v->sd_kb = bp_div (busy_s * 1e6, kb);
    v->sd_req = bp_div (busy_s * 1e6, (double) r->remote_requests);
  }
}

struct bp_agg {
  double mibs, iops, elapsed;     /* means over iterations */
  double elapsed_total;
  uint64_t bytes, requests, errors, ops[BP_NOPS];
  int rcvbuf, sndbuf;
  struct bp_summary primary;
};

static void
bp_aggregate (const struct bp_opts *o, const struct bp_result *r, struct bp_agg *a)
{
  memset (a, 0, sizeof *a);
  a->rcvbuf = a->sndbuf = -1;
  for (unsigned i = 0; i < r->n; i++) {
    const struct bp_iter *it = &r->it[i];
    a->mibs += it->bytes_per_s / BP_MIB;
    a->iops += it->iops;
    a->elapsed_total += it->elapsed_s;
    a->bytes += it->bytes;
    a->requests += it->requests;
    a->errors += it->errors;
    for (int k = 0; k < BP_NOPS; k++)
      a->ops[k] += it->ops[k];
    a->rcvbuf = it->rcvbuf;
    a->sndbuf = it->sndbuf;
  }
  if (r->n) {
    a->mibs /= r->n;
    a->iops /= r->n;
    a->elapsed = a->elapsed_total / r->n;
  }
  bp_result_summary (o, r, bp_primary (o), &a->primary);
}

/* ---- table output ----------------------------------------------------- */

static void
bp_num (FILE *f, int width, int prec, double v)
{
  if (isnan (v))
    fprintf (f, "%*s", width, "n/a");
  else
    fprintf (f, "%*.*f", width, prec, v);
}

static void
bp_banner (FILE *f, const struct bp_opts *o, const struct bp_target *t, const char *what)
{
  fprintf (f, "NBD %s %s to %s (export \"%s\", %llu bytes)\n",
           bp_test_name (o->test), what, t->uri, t->export_name,
           (unsigned long long) t->size);
}

static void
bp_cpu_row (FILE *f, const char *name, const struct bp_cpu_view *v, const char *basis)
{
  fprintf (f, "%-8s", name);
  if (!v->have) {
    fprintf (f, "%8s %8s %8s %8s %12s %12s  %s\n", "n/a", "n/a", "n/a", "n/a",
             "n/a", "n/a", basis);
    return;
  }
  bp_num (f, 8, 1, v->busy);
  bp_num (f, 9, 1, v->user);
  bp_num (f, 9, 1, v->system);
  bp_num (f, 9, 1, v->idle);
  bp_num (f, 13, 3, v->sd_kb);
  bp_num (f, 13, 2, v->sd_req);
  fprintf (f, "  %s\n", basis);
}

static void
bp_table_cpu (FILE *f, const struct bp_opts *o, const struct bp_result *r)
{
  struct bp_cpu_view lv, rv;
  bp_local_view (r, &lv);
  bp_remote_view (r, &rv);
  char basis[320];
  fprintf (f, "\nCPU        util %%   user %%    sys %%   idle %%   SD us/KB    SD us/req  basis\n");
  if (o->cpu_local) {
    snprintf (basis, sizeof basis, "machine, /proc/stat, %ld CPUs, steal %.1f%%",
              bp_cpu_count (), lv.have ? lv.steal : 0.0);
    bp_cpu_row (f, "Local", &lv, basis);
    struct bp_cpu_view pv = lv;
    pv.busy = lv.proc_pct;
    pv.user = bp_div (100.0 * lv.user_s, r->cpu.wall_s);
    pv.system = bp_div (100.0 * lv.system_s, r->cpu.wall_s);
    pv.idle = NAN;
    pv.sd_kb = lv.proc_sd_kb;
    pv.sd_req = bp_div (lv.cpu_s * 1e6, (double) r->cpu_requests);
    bp_cpu_row (f, "blkperf", &pv, "process, getrusage, % of one CPU");
  }
  else
    bp_cpu_row (f, "Local", &lv, "not measured (-c)");
  if (r->tgt.metrics_url) {
    if (rv.have)
      snprintf (basis, sizeof basis, "%s, %s",
                !strcmp (rv.basis, "machine") ? "machine, node_cpu_seconds_total"
                                              : "server process, % of one CPU",
                r->remote.cpu_source ? r->remote.cpu_source : "");
    else
      snprintf (basis, sizeof basis, "%s",
                r->remote.windows ? "no CPU metrics on the server"
                : r->remote_err[0] ? r->remote_err : "metrics not reachable");
    bp_cpu_row (f, "Remote", &rv, basis);
  }
  else
    bp_cpu_row (f, "Remote", &rv, "not measured (-M)");
}

/* Per-request divisor for the server's delay sums: its own count when it
 * exported one in every window, else the requests blkperf counted. */
static double
bp_delay_divisor (const struct bp_result *r)
{
  const struct bp_remote_acc *m = &r->remote;
  if (m->srv_req_n && m->srv_req_n == m->delay_n)
    return m->srv_requests;
  return (double) r->remote_requests;
}

static void
bp_table_delay (FILE *f, const struct bp_result *r)
{
  const struct bp_remote_acc *m = &r->remote;
  double nreq = bp_delay_divisor (r);
  fprintf (f, "Server delay accounting%s%s%s, us per request:   queued ",
           m->delay_mode[0] ? " (" : "", m->delay_mode, m->delay_mode[0] ? ")" : "");
  bp_num (f, 0, 2, m->delay_n ? bp_div (m->queued_s * 1e6, nreq) : NAN);
  fputs ("   plugin ", f);
  bp_num (f, 0, 2, m->delay_n ? bp_div (m->plugin_s * 1e6, nreq) : NAN);
  fputs ("   send ", f);
  bp_num (f, 0, 2, m->delay_n ? bp_div (m->send_s * 1e6, nreq) : NAN);
  fputc ('\n', f);
}

static void
bp_table_run (FILE *f, const struct bp_opts *o, const struct bp_result *r)
{
  struct bp_agg a;
  bp_aggregate (o, r, &a);
  bp_banner (f, o, &r->tgt, "TEST");
  fprintf (f,
"Recv     Send     Request  Queue  Conns  Elapsed  Throughput  Throughput        IOPS   Latency usec\n"
"Socket   Socket   Size     Depth         Time     10^6bits/s       MiB/s                   p50       p99     p99.9\n"
"Size     Size     bytes                  secs.\n"
"bytes    bytes\n\n");
  fprintf (f, "%-8d %-8d %-8llu %-6u %-6u %-8.2f ", a.rcvbuf, a.sndbuf,
           (unsigned long long) o->bs, o->depth, o->conns, a.elapsed);
  bp_num (f, 10, 2, a.mibs * BP_MIB * 8 / 1e6);
  bp_num (f, 12, 2, a.mibs);
  bp_num (f, 12, 1, a.iops);
  bp_num (f, 10, 1, bp_hist_quantile_us (&r->hist, 0.50));
  bp_num (f, 10, 1, bp_hist_quantile_us (&r->hist, 0.99));
  bp_num (f, 10, 1, bp_hist_quantile_us (&r->hist, 0.999));
  fputc ('\n', f);

  fprintf (f, "\nRequests %llu (read %llu, write %llu, trim %llu), %llu bytes, %llu errors",
           (unsigned long long) a.requests, (unsigned long long) a.ops[BP_OP_READ],
           (unsigned long long) a.ops[BP_OP_WRITE], (unsigned long long) a.ops[BP_OP_TRIM],
           (unsigned long long) a.bytes, (unsigned long long) a.errors);
  fprintf (f, "; latency mean %.1f us, max %.1f us\n", bp_hist_mean_us (&r->hist),
           r->hist.count ? (double) r->hist.max_ns / 1000.0 : NAN);
  const char *pm = bp_test_primary_is_iops (o->test) ? "IOPS" : "throughput";
  if (r->n >= 2) {
    bool met = a.primary.width_pct <= o->ci_width;
    if (o->ci_requested && !met)
      fprintf (f, "!!! WARNING: desired confidence was not achieved within the "
               "specified iterations.\n");
    fprintf (f, "Iterations %u: %g%% confidence interval of %s is %.2f%% of the mean "
             "(+/- %.2f%%; goal %g%%)%s\n", r->n, o->ci_level, pm, a.primary.width_pct,
             a.primary.width_pct / 2, o->ci_width,
             met ? ", met" : ", NOT met");
  }
  else
    fprintf (f, "Iterations 1: no confidence interval (use -i/-I to repeat)\n");
  if (r->interrupted)
    fprintf (f, "Interrupted: the last iteration is partial.\n");
  if (o->cpu_local || r->tgt.metrics_url)
    bp_table_cpu (f, o, r);
  if (r->tgt.metrics_url)
    bp_table_delay (f, r);
}

/* ---- JSON ------------------------------------------------------------- */

static void
bp_jstr (FILE *f, const char *s)
{
  fputc ('"', f);
  for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf (f, "\\%c", *p);
    else if (*p < 0x20)
      fprintf (f, "\\u%04x", *p);
    else
      fputc (*p, f);
  }
  fputc ('"', f);
}

static void
bp_jnum (FILE *f, double v)
{
  if (isnan (v) || isinf (v))
    fputs ("null", f);
  else
    fprintf (f, "%.6g", v);
}

/* "key": number, with the comma handled by the caller's sep. */
static void
bp_jkv (FILE *f, const char **sep, const char *k, double v)
{
  fprintf (f, "%s\"%s\": ", *sep, k);
  bp_jnum (f, v);
  *sep = ", ";
}

static void
bp_jcpu (FILE *f, const struct bp_cpu_view *v, bool local, const struct bp_result *r,
         const char *source)
{
  if (!v->have) {
    fputs ("null", f);
    return;
  }
  const char *sep = "";
  fputc ('{', f);
  bp_jkv (f, &sep, "user", v->user);
  bp_jkv (f, &sep, "system", v->system);
  bp_jkv (f, &sep, "idle", v->idle);
  if (local)
    bp_jkv (f, &sep, "steal", v->steal);
  bp_jkv (f, &sep, "util", v->busy);
  bp_jkv (f, &sep, "service_demand_us_per_kb", v->sd_kb);
  bp_jkv (f, &sep, "service_demand_us_per_req", v->sd_req);
  fprintf (f, ", \"basis\": ");
  bp_jstr (f, v->basis);
  if (local) {
    fprintf (f, ", \"cpus\": %ld, \"process\": {", bp_cpu_count ());
    sep = "";
    bp_jkv (f, &sep, "user_s", v->user_s);
    bp_jkv (f, &sep, "system_s", v->system_s);
    bp_jkv (f, &sep, "util", v->proc_pct);
    bp_jkv (f, &sep, "service_demand_us_per_kb", v->proc_sd_kb);
    fputc ('}', f);
  }
  else {
    fputs (", \"process\": {", f);
    sep = "";
    bp_jkv (f, &sep, "user_s", v->user_s);
    bp_jkv (f, &sep, "system_s", v->system_s);
    bp_jkv (f, &sep, "cpu_s", v->cpu_s);
    bp_jkv (f, &sep, "util", v->proc_pct);
    fputs ("}, \"source\": ", f);
    if (source) bp_jstr (f, source); else fputs ("null", f);
    fprintf (f, ", \"windows\": %u", r->remote.windows);
  }
  fputc ('}', f);
}

static void
bp_json_run (FILE *f, const struct bp_opts *o, const struct bp_result *r)
{
  struct bp_agg a;
  bp_aggregate (o, r, &a);
  fputs ("{\"test\": ", f);
  bp_jstr (f, bp_test_name (o->test));
  fputs (", \"uri\": ", f);
  bp_jstr (f, r->tgt.uri);
  fputs (", \"export\": ", f);
  bp_jstr (f, r->tgt.export_name);
  fprintf (f, ", \"export_size\": %llu, \"block_size\": %llu, \"queue_depth\": %u, "
           "\"connections\": %u, \"span\": %llu, \"offset\": %llu, \"seed\": %llu",
           (unsigned long long) r->tgt.size, (unsigned long long) o->bs, o->depth,
           o->conns, (unsigned long long) r->tgt.span, (unsigned long long) r->tgt.offset,
           (unsigned long long) o->seed);
  if (o->test == BP_RAND_RW)
    fprintf (f, ", \"read_pct\": %u", o->read_pct);
  fprintf (f, ", \"prefill\": %s", o->prefill ? "true" : "false");
  fprintf (f, ", \"io\": \"%s\"", r->wire ? "wire" : "libnbd");
  if (r->wire)
    fprintf (f, ", \"wake_replies\": %u", bp_wake_replies (o));
  fputs (", \"mode\": ", f);
  bp_jstr (f, o->nrequests ? "requests" : "time");
  const char *sep = ", ";
  if (o->nrequests)
    fprintf (f, ", \"requests_per_iteration\": %llu", (unsigned long long) o->nrequests);
  else
    bp_jkv (f, &sep, "length_s", o->duration_s);
  bp_jkv (f, &sep, "warmup_s", o->warmup_s);
  fprintf (f, ", \"socket\": {\"rcvbuf\": %d, \"sndbuf\": %d}", a.rcvbuf, a.sndbuf);
  bp_jkv (f, &sep, "elapsed_s", a.elapsed);
  bp_jkv (f, &sep, "elapsed_total_s", a.elapsed_total);
  bp_jkv (f, &sep, "throughput_mib_s", a.mibs);
  bp_jkv (f, &sep, "throughput_mbit_s", a.mibs * BP_MIB * 8 / 1e6);
  bp_jkv (f, &sep, "iops", a.iops);
  fputs (", \"latency_us\": {", f);
  sep = "";
  bp_jkv (f, &sep, "p50", bp_hist_quantile_us (&r->hist, 0.50));
  bp_jkv (f, &sep, "p99", bp_hist_quantile_us (&r->hist, 0.99));
  bp_jkv (f, &sep, "p999", bp_hist_quantile_us (&r->hist, 0.999));
  bp_jkv (f, &sep, "mean", bp_hist_mean_us (&r->hist));
  bp_jkv (f, &sep, "min", r->hist.count ? (double) r->hist.min_ns / 1000.0 : NAN);
  bp_jkv (f, &sep, "max", r->hist.count ? (double) r->hist.max_ns / 1000.0 : NAN);
  fputc ('}', f);

  struct bp_cpu_view lv, rv;
  bp_local_view (r, &lv);
  bp_remote_view (r, &rv);
  fputs (", \"cpu\": {\"local\": ", f);
  bp_jcpu (f, &lv, true, r, NULL);
  fputs (", \"remote\": ", f);
  bp_jcpu (f, &rv, false, r, r->remote.cpu_source);
  fputs ("}, \"delay_us_per_req\": ", f);
  if (r->remote.delay_n) {
    double nreq = bp_delay_divisor (r);
    sep = "";
    fputc ('{', f);
    bp_jkv (f, &sep, "queued", bp_div (r->remote.queued_s * 1e6, nreq));
    bp_jkv (f, &sep, "plugin", bp_div (r->remote.plugin_s * 1e6, nreq));
    bp_jkv (f, &sep, "send", bp_div (r->remote.send_s * 1e6, nreq));
    bp_jkv (f, &sep, "server_requests", r->remote.srv_req_n ? r->remote.srv_requests : NAN);
    fputs (", \"mode\": ", f);
    if (r->remote.delay_mode[0]) bp_jstr (f, r->remote.delay_mode); else fputs ("null", f);
    fputc ('}', f);
  }
  else
    fputs ("null", f);
  if (r->tgt.metrics_url) {
    fputs (", \"metrics_url\": ", f);
    bp_jstr (f, r->tgt.metrics_url);
    if (r->remote_err[0]) {
      fputs (", \"metrics_error\": ", f);
      bp_jstr (f, r->remote_err);
    }
  }

  fprintf (f, ", \"iterations\": %u, \"ci\": {", r->n);
  sep = "";
  bp_jkv (f, &sep, "level", o->ci_level);
  bp_jkv (f, &sep, "width_pct", a.primary.width_pct);
  bp_jkv (f, &sep, "target_width_pct", o->ci_width);
  fprintf (f, ", \"met\": %s, \"metric\": \"%s\"}",
           bp_ci_met (o, r) ? "true" : "false",
           bp_metric_names[bp_primary (o)]);
  fprintf (f, ", \"bytes\": %llu, \"requests\": %llu, \"reads\": %llu, "
           "\"writes\": %llu, \"trims\": %llu, \"errors\": %llu, \"interrupted\": %s",
           (unsigned long long) a.bytes, (unsigned long long) a.requests,
           (unsigned long long) a.ops[BP_OP_READ], (unsigned long long) a.ops[BP_OP_WRITE],
           (unsigned long long) a.ops[BP_OP_TRIM], (unsigned long long) a.errors,
           r->interrupted ? "true" : "false");
  fputs (", \"samples\": [", f);
  for (unsigned i = 0; i < r->n; i++) {
    const struct bp_iter *it = &r->it[i];
    sep = "";
    fputs (i ? ", {" : "{", f);
    bp_jkv (f, &sep, "elapsed_s", it->elapsed_s);
    bp_jkv (f, &sep, "throughput_mib_s", it->bytes_per_s / BP_MIB);
    bp_jkv (f, &sep, "iops", it->iops);
    bp_jkv (f, &sep, "latency_mean_us", it->lat_mean_us);
    bp_jkv (f, &sep, "latency_p50_us", it->lat_p50_us);
    bp_jkv (f, &sep, "latency_p99_us", it->lat_p99_us);
    bp_jkv (f, &sep, "latency_p999_us", it->lat_p999_us);
    fprintf (f, ", \"requests\": %llu, \"errors\": %llu}",
             (unsigned long long) it->requests, (unsigned long long) it->errors);
  }
  fputs ("]}", f);
}

void
bp_report_run (FILE *f, const struct bp_opts *o, const struct bp_result *r)
{
  if (o->json) {
    bp_json_run (f, o, r);
    fputc ('\n', f);
  }
  else
    bp_table_run (f, o, r);
}

/* ---- compare ---------------------------------------------------------- */

static bool
bp_metric_lower_better (int m)
{
  return m == BP_M_LAT_MEAN || m == BP_M_LAT_P99;
}

static void
bp_compare_metric (const struct bp_opts *o, const struct bp_result *a,
                   const struct bp_result *b, int m, struct bp_welch *w)
{
  double xa[BP_MAX_ITER], xb[BP_MAX_ITER];
  for (unsigned i = 0; i < a->n; i++) xa[i] = bp_iter_metric (&a->it[i], m);
  for (unsigned i = 0; i < b->n; i++) xb[i] = bp_iter_metric (&b->it[i], m);
  bp_welch (xa, a->n, xb, b->n, o->ci_level, w);
}

static void
bp_pct (FILE *f, int width, double v)
{
  if (isnan (v))
    fprintf (f, "%*s", width, "n/a");
  else
    fprintf (f, "%+*.2f%%", width - 1, v);
}

void
bp_report_compare (FILE *f, const struct bp_opts *o, const struct bp_result *a,
                   const struct bp_result *b)
{
  int pm = bp_primary (o);
  struct bp_welch w[BP_NMETRICS];
  for (int m = 0; m < BP_NMETRICS; m++)
    bp_compare_metric (o, a, b, m, &w[m]);

  if (o->json) {
    fputs ("{\"mode\": \"compare\", \"test\": ", f);
    bp_jstr (f, bp_test_name (o->test));
    fputs (", \"a\": ", f);
    bp_json_run (f, o, a);
    fputs (", \"b\": ", f);
    bp_json_run (f, o, b);
    fprintf (f, ", \"primary\": \"%s\", \"better\": \"%s\"", bp_metric_names[pm],
             bp_metric_lower_better (pm) ? "lower" : "higher");
    const char *sep = ", ";
    bp_jkv (f, &sep, "improvement_pct", w[pm].pct);
    fputs (", \"ci_pct\": [", f);
    bp_jnum (f, w[pm].lo_pct);
    fputs (", ", f);
    bp_jnum (f, w[pm].hi_pct);
    fputs ("]", f);
    bp_jkv (f, &sep, "ci_level", o->ci_level);
    bp_jkv (f, &sep, "p_value", w[pm].p);
    bp_jkv (f, &sep, "df", w[pm].df);
    fprintf (f, ", \"significant\": %s, \"method\": \"welch\", \"metrics\": {",
             w[pm].significant ? "true" : "false");
    for (int m = 0; m < BP_NMETRICS; m++) {
      struct bp_summary sa, sb;
      bp_result_summary (o, a, m, &sa);
      bp_result_summary (o, b, m, &sb);
      fprintf (f, "%s\"%s\": {", m ? ", " : "", bp_metric_names[m]);
      sep = "";
      bp_jkv (f, &sep, "a", sa.mean);
      bp_jkv (f, &sep, "b", sb.mean);
      bp_jkv (f, &sep, "improvement_pct", w[m].pct);
      fputs (", \"ci_pct\": [", f);
      bp_jnum (f, w[m].lo_pct);
      fputs (", ", f);
      bp_jnum (f, w[m].hi_pct);
      fprintf (f, "], \"p_value\": ");
      bp_jnum (f, w[m].p);
      fprintf (f, ", \"significant\": %s, \"better\": \"%s\"}",
               w[m].significant ? "true" : "false",
               bp_metric_lower_better (m) ? "lower" : "higher");
    }
    fputs ("}}\n", f);
    return;
  }

  fprintf (f, "NBD %s COMPARE, %u iterations each, alternating A B, B A, ...\n",
           bp_test_name (o->test), a->n < b->n ? a->n : b->n);
  bp_banner (f, o, &a->tgt, "A (before)");
  bp_banner (f, o, &b->tgt, "B (after) ");
  fprintf (f, "%llu-byte requests, queue depth %u, %u connection%s, span %llu bytes\n\n",
           (unsigned long long) o->bs, o->depth, o->conns, o->conns == 1 ? "" : "s",
           (unsigned long long) a->tgt.span);
  fprintf (f, "%-18s %14s %14s %12s   %-23s %s\n", "", "Before (A)", "After (B)",
           "Improvement", "", "better is");
  char cil[32];
  snprintf (cil, sizeof cil, "%g%% CI", o->ci_level);
  fprintf (f, "%-18s %14s %14s %12s   %-23s\n", "", "mean", "mean", "B over A", cil);
  for (int m = 0; m < BP_NMETRICS; m++) {
    struct bp_summary sa, sb;
    bp_result_summary (o, a, m, &sa);
    bp_result_summary (o, b, m, &sb);
    fprintf (f, "%-18s ", bp_metric_labels[m]);
    bp_num (f, 14, 2, sa.mean);
    fputc (' ', f);
    bp_num (f, 14, 2, sb.mean);
    fputc (' ', f);
    bp_pct (f, 12, w[m].pct);
    char ci[64];
    if (isnan (w[m].lo_pct))
      snprintf (ci, sizeof ci, "n/a");
    else
      snprintf (ci, sizeof ci, "[%+.2f%%, %+.2f%%]", w[m].lo_pct, w[m].hi_pct);
    fprintf (f, "   %-23s %-6s%s\n", ci, bp_metric_lower_better (m) ? "lower" : "higher",
             w[m].significant ? "  *" : "");
  }
  const struct bp_welch *p = &w[pm];
  bool better = p->diff > 0;
  fprintf (f, "\nVerdict on %s: ", bp_metric_labels[pm]);
  if (isnan (p->lo_pct))
    fprintf (f, "too few iterations to decide: not significant\n");
  else if (p->significant)
    fprintf (f, "%+.2f%% [%+.2f%%, %+.2f%%] at %g%%: significant (B is %s, p = %.3g)\n",
             p->pct, p->lo_pct, p->hi_pct, o->ci_level, better ? "better" : "worse", p->p);
  else
    fprintf (f, "%+.2f%% [%+.2f%%, %+.2f%%] at %g%%: not significant (p = %.3g); "
             "the difference could just be noise\n",
             p->pct, p->lo_pct, p->hi_pct, o->ci_level, p->p);
  fprintf (f, "Method: Welch's t on per-iteration means (df %.1f); interval as %% of A's mean. "
           "* = interval excludes 0.\n", p->df);
  struct bp_summary sa, sb;
  bp_result_summary (o, a, pm, &sa);
  bp_result_summary (o, b, pm, &sb);
  bool met = sa.width_pct <= o->ci_width && sb.width_pct <= o->ci_width;
  fprintf (f, "Precision: %s CI width A %.2f%%, B %.2f%% of the mean (goal %g%%)%s\n",
           bp_metric_labels[pm], sa.width_pct, sb.width_pct, o->ci_width,
           met ? ", met" : ", NOT met: more iterations (-i) would narrow the interval");
  uint64_t errs = 0;
  for (unsigned i = 0; i < a->n; i++) errs += a->it[i].errors;
  for (unsigned i = 0; i < b->n; i++) errs += b->it[i].errors;
  if (errs)
    fprintf (f, "Errors: %llu requests failed; the numbers are suspect.\n",
             (unsigned long long) errs);
  if (a->interrupted || b->interrupted)
    fprintf (f, "Interrupted: the last iteration is partial.\n");
  if (o->cpu_local || a->tgt.metrics_url) {
    fputs ("\nA:", f);
    bp_table_cpu (f, o, a);
    if (a->tgt.metrics_url) bp_table_delay (f, a);
    fputs ("\nB:", f);
    bp_table_cpu (f, o, b);
    if (b->tgt.metrics_url) bp_table_delay (f, b);
  }
}
