/* blkperf internals: options, per-iteration results and the functions the client's files share. */
#ifndef BLKPERF_H
#define BLKPERF_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "monotime.h"

/* ---- tests ------------------------------------------------------------ */

enum bp_test {
  BP_STREAM_READ,
  BP_STREAM_WRITE,
  BP_RR,
  BP_RAND_READ,
  BP_RAND_WRITE,
  BP_RAND_RW,
  BP_SEQ_REWRITE,
  BP_CHURN,
  BP_NTESTS
};

/* Request kinds a slot can carry; index into per-kind counters. */
enum bp_op { BP_OP_READ, BP_OP_WRITE, BP_OP_TRIM, BP_NOPS };

const char *bp_test_name (enum bp_test t);
int bp_test_parse (const char *s);           /* -1 when unknown */
bool bp_test_writes (enum bp_test t);        /* needs a writable export */
bool bp_test_reads (enum bp_test t);
bool bp_test_sequential (enum bp_test t);    /* connections split the span */
/* Which metric decides "better": IOPS for request-bound tests, bytes/s for
 * the streaming ones (they are proportional for a fixed block size, but a
 * reader should see the unit the test is about). */
bool bp_test_primary_is_iops (enum bp_test t);

/* ---- options ---------------------------------------------------------- */

#define BP_MAX_ITER 1000

struct bp_opts {
  enum bp_test test;
  bool compare;
  const char *uri[2];            /* A (and B in compare mode) */
  char *uri_owned[2];            /* rewritten for TLS, freed at exit */
  double duration_s;             /* -l, used when nrequests == 0 */
  uint64_t nrequests;            /* -n, total over all connections */
  uint64_t bs;                   /* -b */
  unsigned depth;                /* -q */
  unsigned conns;                /* -C */
  unsigned iter_max, iter_min;   /* -i */
  double ci_level, ci_width;     /* -I, in percent */
  bool ci_requested;             /* -i or -I given: stop on the CI goal */
  bool cpu_local;                /* -c */
  const char *metrics_url[2];    /* -M, A then B; B falls back to A */
  bool json;
  double warmup_s;               /* -w */
  uint64_t seed;                 /* -s */
  uint64_t span, offset;         /* --span, --offset; span 0 = default */
  unsigned read_pct;             /* --rw-mix */
  bool prefill;                  /* --prefill (always on for SEQ_REWRITE) */
  bool quiet;                    /* no progress line */
  bool io_libnbd;                /* --io=libnbd: libnbd's aio loop, not wire.c */
  int wake_replies;              /* --wake-replies; -1: the default (bp_wake_replies) */
  const char *plot;              /* --plot FILE.svg */
  const char *label[2];          /* --label: A's and B's names on the chart */
  /* TLS, applied to every handle before nbd_connect_uri. */
  const char *tls_certificates, *tls_psk, *tls_username;
  bool tls_verify_peer, tls_verify_set, tls_any;
};

/* Parses argv into *o (defaults filled in per test); prints usage and
 * exits 2 on a usage error, exits 0 after --help. */
void bp_opts_parse (struct bp_opts *o, int argc, char **argv);
/* How many whole replies the wire loop lets queue before TCP wakes it
 * (wire.c, bp_wire_wake): --wake-replies, else 1 for read-only tests with
 * blocks of 64 KiB or more, else 0 (woken by every arrival).  0 for tests
 * that write, whose replies do not all have one size. */
unsigned bp_wake_replies (const struct bp_opts *o);

/* ---- latency histogram (hist.c) --------------------------------------- */

/* Log-linear buckets over nanoseconds: values below 128 ns are exact, above
 * that each power of two is split into 64 buckets, so a bucket is at most
 * 1/64 of its value wide (under 0.8% error at the bucket's midpoint). */
#define BP_HIST_SUB 64
#define BP_HIST_BUCKETS (2 * BP_HIST_SUB + (64 - 7) * BP_HIST_SUB)

struct bp_hist {
  uint64_t count;
  uint64_t min_ns, max_ns;
  double sum_ns;
  uint64_t b[BP_HIST_BUCKETS];
};

void bp_hist_reset (struct bp_hist *h);
void bp_hist_merge (struct bp_hist *dst, const struct bp_hist *src);
double bp_hist_quantile_us (const struct bp_hist *h, double q);
double bp_hist_mean_us (const struct bp_hist *h);

static inline unsigned
bp_hist_index (uint64_t v)
{
  if (v < 2 * BP_HIST_SUB)
    return (unsigned) v;
  unsigned msb = 63 - (unsigned) __builtin_clzll (v);
  unsigned shift = msb - 6;                 /* keep the top 7 bits */
  unsigned top = (unsigned) (v >> shift);   /* 64..127 */
  return 2 * BP_HIST_SUB + (shift - 1) * BP_HIST_SUB + (top - BP_HIST_SUB);
}

static inline void
bp_hist_add (struct bp_hist *h, uint64_t v)
{
  h->b[bp_hist_index (v)]++;
  h->count++;
  h->sum_ns += (double) v;
  if (v < h->min_ns) h->min_ns = v;
  if (v > h->max_ns) h->max_ns = v;
}

/* ---- statistics (stats.c) --------------------------------------------- */

struct bp_summary {
  unsigned n;
  double mean, sd;
  double half;         /* half-width of the CI, NAN when n < 2 */
  double width_pct;    /* full CI width as % of the mean, like netperf's -I */
};

/* Quantile of Student's t with (possibly fractional) df: P(T <= x) = p. */
double bp_t_quantile (double p, double df);
double bp_t_cdf (double t, double df);
void bp_summarize (const double *x, unsigned n, double level_pct,
                   struct bp_summary *s);

struct bp_welch {
  double diff, se, df, t, p;       /* B - A, two-sided p */
  double lo, hi;                   /* CI of B - A at the level */
  double pct, lo_pct, hi_pct;      /* the same as % of mean A */
  bool significant;                /* the interval excludes zero */
};
void bp_welch (const double *a, unsigned na, const double *b, unsigned nb,
               double level_pct, struct bp_welch *w);

/* ---- CPU accounting (cpu.c) ------------------------------------------- */

struct bp_cpu_sample {
  uint64_t mono_ns;
  /* /proc/stat "cpu" line, in clock ticks, summed over all CPUs. */
  uint64_t user, system, idle, steal, total;
  bool have_stat;
  double proc_user_s, proc_sys_s;   /* getrusage (RUSAGE_SELF) */
};

void bp_cpu_sample (struct bp_cpu_sample *s);

/* Totals over one or more windows; bp_cpu_accumulate adds a window's
 * deltas and says whether it could (false: no /proc/stat, or no tick). */
struct bp_cpu_acc {
  bool valid;
  double wall_s;
  double user_ticks, system_ticks, idle_ticks, steal_ticks, total_ticks;
  double proc_user_s, proc_sys_s;
};
bool bp_cpu_accumulate (struct bp_cpu_acc *acc, const struct bp_cpu_sample *a,
                        const struct bp_cpu_sample *b);
long bp_cpu_ticks_per_s (void);
long bp_cpu_count (void);

/* ---- server metrics (metrics.c) --------------------------------------- */

/* What one scrape of /metrics told us; NAN where the metric was absent. */
struct bp_metrics {
  bool ok;
  uint64_t mono_ns;                 /* when the reply arrived */
  double proc_cpu_s;                /* process_cpu_seconds_total */
  double blkd_user_s, blkd_sys_s;   /* blkd_process_cpu_{user,system}_seconds_total */
  double node_user_s, node_sys_s, node_idle_s, node_total_s;  /* node_cpu_seconds_total */
  double delay_queued_s, delay_plugin_s, delay_send_s;        /* blkd_delay_* */
  double requests;                  /* blkd_requests_total, all commands */
  char delay_mode[16];              /* blkd_delayacct_info{mode=...} 1 */
};

/* Fetches URL (http://host[:port]/path) with HTTP/1.0; on failure m->ok is
 * false and err (if not NULL) holds a reason. */
void bp_metrics_fetch (const char *url, struct bp_metrics *m,
                       char *err, size_t errlen);

/* Remote totals over windows, same idea as bp_cpu_acc.  Each field counts
 * only windows where both scrapes had it. */
struct bp_remote_acc {
  unsigned windows;                 /* scrape pairs that succeeded */
  double wall_s;
  double cpu_s; unsigned cpu_n;     /* process user+system */
  double user_s, sys_s; unsigned split_n;
  double node_user_s, node_sys_s, node_idle_s, node_total_s; unsigned node_n;
  double queued_s, plugin_s, send_s; unsigned delay_n;
  double srv_requests; unsigned srv_req_n;   /* in windows with delay sums */
  char delay_mode[16];
  const char *cpu_source;
};
bool bp_remote_accumulate (struct bp_remote_acc *acc, const struct bp_metrics *a,
                           const struct bp_metrics *b);

/* ---- running (worker.c, run.c) ---------------------------------------- */

/* What the probe connection learned about a target. */
struct bp_target {
  const char *uri;
  const char *metrics_url;
  char *export_name;
  uint64_t size;
  bool read_only, can_trim, can_multi_conn;
  uint64_t span, offset;            /* the range this run uses */
};

/* Percentiles kept per iteration for --plot's latency curve (plot.c). */
#define BP_NQ 13
extern const double bp_plot_q[BP_NQ];

/* Throughput over one second of an iteration's window. */
struct bp_tsample {
  unsigned iter, sec;            /* sec: 1 = the window's first second */
  double mibs, iops;
};

/* One iteration's measurements. */
struct bp_iter {
  double elapsed_s;
  uint64_t bytes;
  uint64_t ops[BP_NOPS];
  uint64_t requests;
  uint64_t errors;
  double bytes_per_s, iops;
  double lat_mean_us, lat_p50_us, lat_p99_us, lat_p999_us;
  double lat_q_us[BP_NQ];        /* at bp_plot_q */
  int rcvbuf, sndbuf;
  bool interrupted;
};

/* Everything measured against one target over all its iterations. */
struct bp_result {
  struct bp_target tgt;
  unsigned n;                        /* iterations done */
  struct bp_iter it[BP_MAX_ITER];
  struct bp_hist hist;               /* all iterations merged */
  struct bp_cpu_acc cpu;
  uint64_t cpu_bytes, cpu_requests;        /* in windows cpu covers */
  struct bp_remote_acc remote;
  uint64_t remote_bytes, remote_requests;  /* in windows remote covers */
  char remote_err[256];              /* last scrape failure, for the report */
  bool interrupted;
  bool failed;                       /* a connection died or could not start */
  bool wire;                         /* the request loop was wire.c's */
  struct bp_tsample *ts;             /* per-second throughput, all iterations */
  size_t nts, tscap;
};

extern volatile sig_atomic_t bp_interrupted;


/* Connects once to learn size and flags, checks the test can run there,
 * and settles span/offset.  Returns -1 (message printed) on failure. */
int bp_probe (const struct bp_opts *o, struct bp_target *t);
/* Makes span/offset of two targets agree so A and B do the same work. */
int bp_settle_range (const struct bp_opts *o, struct bp_target *t,
                     unsigned ntargets);
/* SEQ_REWRITE: writes the region once, untimed, so the test rewrites. */
int bp_prefill (const struct bp_opts *o, const struct bp_target *t);
/* Runs one iteration against t and appends it to r.  Returns -1 when the
 * iteration could not run (r->failed set, message printed). */
int bp_run_iteration (const struct bp_opts *o, struct bp_result *r,
                      unsigned iter_no, const char *label);
void bp_workers_free (void);

/* Per-iteration primary metric and friends, for statistics. */
double bp_iter_metric (const struct bp_iter *it, int which);
enum { BP_M_MIBS, BP_M_IOPS, BP_M_LAT_MEAN, BP_M_LAT_P99, BP_NMETRICS };

/* ---- raw transmission phase (wire.c) ---------------------------------- */

#include <sys/uio.h>

/* One request as the wire engine tracks it, indexed by slot (the handle). */
struct bp_wire_req {
  uint8_t hdr[28];                 /* the request as sent */
  uint64_t off;
  uint32_t len;
  char *buf;                       /* read destination */
  int error;                       /* first error the server reported */
  uint8_t op;
  bool busy;
};

enum bp_wire_phase { BP_WIRE_HDR, BP_WIRE_DATA };

struct bp_wire {
  int fd, saved_flags;
  bool flags_changed, structured, dead;
  bool big_reads;                  /* read payloads >= 64 KiB: headers alone */
  unsigned depth, inflight;
  struct bp_wire_req *req;
  struct iovec *iov;               /* queued, not yet sent */
  unsigned niov, iov_head;
  uint8_t *rx;                     /* receive buffer, [rx_head, rx_tail) unparsed */
  size_t rx_head, rx_tail;
  enum bp_wire_phase phase;        /* in DATA: copying a payload to dst */
  uint32_t cur;
  char *dst;
  size_t left;
  bool last;                       /* the payload ends its reply */
  /* Wake-up threshold for uniform reads (wire.c, bp_wire_wake). */
  size_t wake_reply;               /* one whole reply on the wire; 0: never */
  size_t wake_bytes;               /* the threshold: wake_k whole replies */
  unsigned wake_run;               /* whole replies in a row, before arming */
  unsigned wake_looks;             /* times arming was considered */
  bool wake_on, wake_off;          /* armed now; disarmed for good */
  char err[160];
};

typedef void bp_wire_done_fn (void *opaque, uint32_t slot, int error);

/* Takes over a connected socket (libnbd's, negotiated and idle): makes it
 * blocking with a 200 ms receive timeout.  big_reads: reads of at least
 * 64 KiB are coming, receive their headers alone.  wake_len: every request
 * is a read of this many bytes (0: not so), so each reply has one size and
 * the socket may wake us once wake_k whole replies are queued (0: never).
 * -1 with errno on failure. */
int bp_wire_init (struct bp_wire *w, int fd, bool structured, unsigned depth,
                  bool big_reads, uint32_t wake_len, unsigned wake_k);
/* No more requests will be issued: drops the wake-up threshold, so the
 * last replies (fewer than it may be) wake us as they come. */
void bp_wire_wake_stop (struct bp_wire *w);
/* Restores the socket's flags and frees the buffers. */
void bp_wire_free (struct bp_wire *w);
/* Queues a request under handle SLOT (< depth, not in flight). */
void bp_wire_queue (struct bp_wire *w, uint32_t slot, int op, uint64_t off,
                    uint32_t len, char *rbuf, const char *wbuf);
/* Sends what is queued without blocking; -1 (w->err) when the connection died. */
int bp_wire_flush (struct bp_wire *w);
/* Waits up to 200 ms for replies and retires what arrived through DONE;
 * 1 when something was received, 0 on timeout, -1 (w->err) on a lost
 * connection or a protocol error. */
int bp_wire_recv (struct bp_wire *w, bp_wire_done_fn *done, void *opaque);
/* Nothing in flight, queued or half-parsed: the stream is at a boundary. */
bool bp_wire_idle (const struct bp_wire *w);

/* ---- reporting (report.c) --------------------------------------------- */

void bp_report_run (FILE *f, const struct bp_opts *o, const struct bp_result *r);
void bp_report_compare (FILE *f, const struct bp_opts *o,
                        const struct bp_result *a, const struct bp_result *b);
/* Summary of r's primary metric over its iterations. */
void bp_result_summary (const struct bp_opts *o, const struct bp_result *r,
                        int metric, struct bp_summary *s);
bool bp_ci_met (const struct bp_opts *o, const struct bp_result *r);

/* ---- charts (plot.c) ------------------------------------------------- */

/* With --plot: dies with one line unless gnuplot is there and the file
 * can be written, so a long run does not end in "cannot draw". */
void bp_plot_check (const struct bp_opts *o);
/* Draws o->plot from a (and b in compare mode); -1 (warned) on failure. */
int bp_plot_write (const struct bp_opts *o, const struct bp_result *a,
                   const struct bp_result *b);

/* ---- small helpers (opts.c) ------------------------------------------- */

void bp_die (const char *fmt, ...) __attribute__((format (printf, 1, 2), noreturn));
void bp_warn (const char *fmt, ...) __attribute__((format (printf, 1, 2)));
int bp_parse_size (const char *s, uint64_t *out);

#endif
