/* Command line: options, per-test defaults, sizes and usage text. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "blkperf.h"
#include "size.h"

#ifndef BLKD_VERSION
#define BLKD_VERSION "dev"
#endif

static const char *const bp_test_names[BP_NTESTS] = {
  [BP_STREAM_READ] = "STREAM_READ", [BP_STREAM_WRITE] = "STREAM_WRITE",
  [BP_RR] = "RR", [BP_RAND_READ] = "RAND_READ", [BP_RAND_WRITE] = "RAND_WRITE",
  [BP_RAND_RW] = "RAND_RW", [BP_SEQ_REWRITE] = "SEQ_REWRITE", [BP_CHURN] = "CHURN",
};

const char *
bp_test_name (enum bp_test t)
{
  return (unsigned) t < BP_NTESTS ? bp_test_names[t] : "?";
}

int
bp_test_parse (const char *s)
{
  for (int i = 0; i < BP_NTESTS; i++)
    if (strcasecmp (s, bp_test_names[i]) == 0)
      return i;
  return -1;
}

bool
bp_test_writes (enum bp_test t)
{
  return t == BP_STREAM_WRITE || t == BP_RAND_WRITE || t == BP_RAND_RW
         || t == BP_SEQ_REWRITE || t == BP_CHURN;
}

bool
bp_test_reads (enum bp_test t)
{
  return t == BP_STREAM_READ || t == BP_RR || t == BP_RAND_READ || t == BP_RAND_RW;
}

bool
bp_test_sequential (enum bp_test t)
{
  return t == BP_STREAM_READ || t == BP_STREAM_WRITE || t == BP_SEQ_REWRITE
         || t == BP_CHURN;
}

bool
bp_test_primary_is_iops (enum bp_test t)
{
  return !(t == BP_STREAM_READ || t == BP_STREAM_WRITE || t == BP_SEQ_REWRITE);
}

unsigned
bp_wake_replies (const struct bp_opts *o)
{
  if (!bp_test_reads (o->test) || bp_test_writes (o->test))
    return 0;
  if (o->wake_replies >= 0)
    return (unsigned) o->wake_replies;
  return o->bs >= (64u << 10) ? 1 : 0;
}

static void
vwarn (const char *fmt, va_list ap)
{
  fputs ("blkperf: ", stderr);
  vfprintf (stderr, fmt, ap);
  fputc ('\n', stderr);
}

void
bp_die (const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  vwarn (fmt, ap);
  va_end (ap);
  exit (1);
}

void
bp_warn (const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  vwarn (fmt, ap);
  va_end (ap);
}

/* "4096", "4k", "256K", "1M", "1MiB", "2g": binary multiples throughout,
 * as block sizes are never meant in powers of ten (common/size.c, the
 * server's parser, plus the KiB/kB spellings). */
int
bp_parse_size (const char *s, uint64_t *out)
{
  int64_t v;
  if (size_parse (s, SIZE_IEC_SPELLINGS, &v, NULL) != SIZE_OK)
    return -1;
  *out = (uint64_t) v;
  return 0;
}

static void
bp_usage (FILE *f)
{
  fprintf (f,
"usage: blkperf [options] URI\n"
"       blkperf compare [options] URI_A URI_B\n"
"\n"
"URI is any libnbd URI: nbd://host[:port][/export], nbds://...,\n"
"nbd+unix:///export?socket=PATH (tls-certificates= and tls-psk-file= are\n"
"accepted in the query).\n"
"\n"
"Test:\n"
"  -t TEST            STREAM_READ (default), STREAM_WRITE, RR, RAND_READ,\n"
"                     RAND_WRITE, RAND_RW, SEQ_REWRITE, CHURN\n"
"  -l SECONDS         length of each iteration (default 10)\n"
"  -n REQUESTS        instead of -l: requests per iteration, all connections\n"
"  -w SECONDS         warm-up before each iteration's measurement (default 0)\n"
"  -b SIZE            request size (default 256k streams, 64k CHURN,\n"
"                     16k SEQ_REWRITE, else 4k)\n"
"  -q DEPTH           requests in flight per connection (default 16; 32 for\n"
"                     RAND_*; RR is always 1)\n"
"  -C CONNECTIONS     connections, one thread each (default 1)\n"
"  --span SIZE        bytes of the export to use (default all; CHURN 16M,\n"
"                     SEQ_REWRITE 256M)\n"
"  --offset SIZE      where the span starts (default 0)\n"
"  --rw-mix R[/W]     RAND_RW read share, percent or ratio (default 60/40)\n"
"  -s SEED            PRNG seed for offsets and data (default 1)\n"
"  --prefill          write the span once, untimed, before measuring, so reads\n"
"                     return data rather than holes (always on for SEQ_REWRITE)\n"
"\n"
"Repetition, like netperf:\n"
"  -i MAX[,MIN]       iterations (default 1; compare 10,3)\n"
"  -I LEVEL[,WIDTH]   repeat until the LEVEL%% confidence interval of the mean\n"
"                     is narrower than WIDTH%% of it (default 99,5; compare 95,5)\n"
"\n"
"Measurement:\n"
"  -c                 local CPU: /proc/stat split and blkperf's getrusage\n"
"  -M URL             server metrics (http://host:port/metrics): remote CPU\n"
"                     and blkd delay accounting; in compare mode a second -M\n"
"                     is B's (default: the same URL)\n"
"  --json             one JSON object on stdout instead of the table\n"
"  --quiet            no progress line on stderr\n"
"  --plot FILE.svg    draw the latency percentiles and the throughput per\n"
"                     second (A and B together in compare mode); needs gnuplot\n"
"  --label NAME       the chart's name for A (default its URI); again for B\n"
"  --io ENGINE        wire (default): blkperf's own batched request loop on\n"
"                     the connection libnbd negotiated; libnbd: libnbd's aio\n"
"                     calls, one per request (TLS always runs on libnbd)\n"
"  --wake-replies N   wire loop, read-only tests: sleep until N whole replies\n"
"                     are queued (0: wake on every arrival; default 1 for\n"
"                     blocks of 64 KiB or more, else 0); at most -q\n"
"\n"
"TLS (also in the URI; any of these turns nbd:// into nbds://):\n"
"  --tls-certificates DIR   --tls-psk FILE   --tls-username NAME\n"
"  --tls-verify-peer / --no-tls-verify-peer\n"
"\n"
"  -h, --help         this text       -V, --version\n");
}

enum {
  BP_OPT_JSON = 256, BP_OPT_SPAN, BP_OPT_OFFSET, BP_OPT_RWMIX, BP_OPT_QUIET,
  BP_OPT_TLS_CERTS, BP_OPT_TLS_PSK, BP_OPT_TLS_USER, BP_OPT_TLS_VERIFY,
  BP_OPT_TLS_NOVERIFY, BP_OPT_PREFILL, BP_OPT_IO, BP_OPT_PLOT, BP_OPT_LABEL,
  BP_OPT_WAKE,
};

static const struct option bp_long_opts[] = {
  { "test", required_argument, NULL, 't' },
  { "length", required_argument, NULL, 'l' },
  { "requests", required_argument, NULL, 'n' },
  { "block-size", required_argument, NULL, 'b' },
  { "depth", required_argument, NULL, 'q' },
  { "connections", required_argument, NULL, 'C' },
  { "iterations", required_argument, NULL, 'i' },
  { "confidence", required_argument, NULL, 'I' },
  { "cpu", no_argument, NULL, 'c' },
  { "metrics", required_argument, NULL, 'M' },
  { "warmup", required_argument, NULL, 'w' },
  { "seed", required_argument, NULL, 's' },
  { "json", no_argument, NULL, BP_OPT_JSON },
  { "span", required_argument, NULL, BP_OPT_SPAN },
  { "offset", required_argument, NULL, BP_OPT_OFFSET },
  { "rw-mix", required_argument, NULL, BP_OPT_RWMIX },
  { "quiet", no_argument, NULL, BP_OPT_QUIET },
  { "prefill", no_argument, NULL, BP_OPT_PREFILL },
  { "io", required_argument, NULL, BP_OPT_IO },
  { "wake-replies", required_argument, NULL, BP_OPT_WAKE },
  { "plot", required_argument, NULL, BP_OPT_PLOT },
  { "label", required_argument, NULL, BP_OPT_LABEL },
  { "tls-certificates", required_argument, NULL, BP_OPT_TLS_CERTS },
  { "tls-psk", required_argument, NULL, BP_OPT_TLS_PSK },
  { "tls-username", required_argument, NULL, BP_OPT_TLS_USER },
  { "tls-verify-peer", no_argument, NULL, BP_OPT_TLS_VERIFY },
  { "no-tls-verify-peer", no_argument, NULL, BP_OPT_TLS_NOVERIFY },
  { "help", no_argument, NULL, 'h' },
  { "version", no_argument, NULL, 'V' },
  { NULL, 0, NULL, 0 },
};

static void __attribute__((noreturn, format (printf, 1, 2)))
bp_usage_error (const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  fputs ("blkperf: ", stderr);
  vfprintf (stderr, fmt, ap);
  fputs ("\n(blkperf --help lists the options)\n", stderr);
  va_end (ap);
  exit (2);
}

static double
bp_parse_seconds (const char *opt, const char *s)
{
  char *end;
  errno = 0;
  double v = strtod (s, &end);
  if (errno || end == s || *end || !isfinite (v) || v < 0 || v > 1e6)
    bp_usage_error ("%s: bad number of seconds: %s", opt, s);
  return v;
}

static unsigned long long
bp_parse_count (const char *opt, const char *s, unsigned long long lo,
                unsigned long long hi)
{
  char *end;
  errno = 0;
  unsigned long long v = strtoull (s, &end, 10);
  if (errno || end == s || *end || *s == '-' || v < lo || v > hi)
    bp_usage_error ("%s: expected an integer from %llu to %llu: %s", opt, lo, hi, s);
  return v;
}

/* "A,B" or "A" into two strings in buf. */
static const char *
bp_split_pair (const char *s, char *buf, size_t len)
{
  snprintf (buf, len, "%s", s);
  char *comma = strchr (buf, ',');
  if (!comma)
    return NULL;
  *comma = '\0';
  return comma + 1;
}

/* nbd:// and nbd+unix:// with TLS credentials on the command line almost
 * certainly mean "use TLS"; libnbd would otherwise disable TLS for those
 * schemes and silently ignore the credentials. */
static char *
bp_tls_scheme (const char *uri)
{
  if (strncmp (uri, "nbd:", 4) != 0 && strncmp (uri, "nbd+", 4) != 0)
    return NULL;
  char *s;
  if (asprintf (&s, "nbds%s", uri + 3) < 0)
    bp_die ("out of memory");
  return s;
}

void
bp_opts_parse (struct bp_opts *o, int argc, char **argv)
{
  memset (o, 0, sizeof *o);
  o->test = BP_STREAM_READ;
  o->duration_s = 10;
  o->seed = 1;
  o->read_pct = 60;
  o->wake_replies = -1;
  bool have_b = false, have_q = false, have_i = false, have_I = false,
       have_l = false, have_n = false;
  int nmetrics = 0, nlabels = 0;

  if (argc > 1 && strcmp (argv[1], "compare") == 0) {
    o->compare = true;
    argv[1] = argv[0];
    argv++;
    argc--;
  }

  int c;
  char pair[128];
  while ((c = getopt_long (argc, argv, "t:l:n:b:q:C:i:I:cM:w:s:hV",
                           bp_long_opts, NULL)) != -1) {
    switch (c) {
    case 't': {
      int t = bp_test_parse (optarg);
      if (t < 0)
        bp_usage_error ("-t: unknown test %s", optarg);
      o->test = (enum bp_test) t;
      break;
    }
    case 'l':
      o->duration_s = bp_parse_seconds ("-l", optarg);
      if (o->duration_s <= 0)
        bp_usage_error ("-l: must be more than 0 seconds");
      have_l = true;
      break;
    case 'n':
      o->nrequests = bp_parse_count ("-n", optarg, 1, UINT64_MAX >> 1);
      have_n = true;
      break;
    case 'b':
      if (bp_parse_size (optarg, &o->bs) == -1 || o->bs == 0 || o->bs > (32u << 20))
        bp_usage_error ("-b: a size from 1 to 32M: %s", optarg);
      have_b = true;
      break;
    case 'q':
      o->depth = (unsigned) bp_parse_count ("-q", optarg, 1, 4096);
      have_q = true;
      break;
    case 'C':
      o->conns = (unsigned) bp_parse_count ("-C", optarg, 1, 1024);
      break;
    case 'i': {
      const char *min = bp_split_pair (optarg, pair, sizeof pair);
      o->iter_max = (unsigned) bp_parse_count ("-i", pair, 1, BP_MAX_ITER);
      o->iter_min = min ? (unsigned) bp_parse_count ("-i", min, 1, BP_MAX_ITER)
                        : (o->iter_max < 3 ? o->iter_max : 3);
      if (o->iter_min > o->iter_max)
        bp_usage_error ("-i MAX,MIN: MIN (%u) exceeds MAX (%u)", o->iter_min, o->iter_max);
      have_i = true;
      break;
    }
    case 'I': {
      const char *w = bp_split_pair (optarg, pair, sizeof pair);
      o->ci_level = bp_parse_seconds ("-I", pair);
      o->ci_width = w ? bp_parse_seconds ("-I", w) : 5;
      if (o->ci_level < 50 || o->ci_level >= 100 || o->ci_width <= 0)
        bp_usage_error ("-I LEVEL,WIDTH: LEVEL in [50,100), WIDTH > 0: %s", optarg);
      have_I = true;
      break;
    }
    case 'c': o->cpu_local = true; break;
    case 'M':
      if (nmetrics >= 2)
        bp_usage_error ("-M: at most two (A's, then B's)");
      if (strncasecmp (optarg, "http://", 7) != 0)
        bp_usage_error ("-M: expected http://host:port/metrics, got %s", optarg);
      o->metrics_url[nmetrics++] = optarg;
      break;
    case 'w': o->warmup_s = bp_parse_seconds ("-w", optarg); break;
    case 's': o->seed = bp_parse_count ("-s", optarg, 0, UINT64_MAX); break;
    case BP_OPT_JSON: o->json = true; break;
    case BP_OPT_QUIET: o->quiet = true; break;
    case BP_OPT_PREFILL: o->prefill = true; break;
    case BP_OPT_IO:
      if (strcmp (optarg, "libnbd") == 0)
        o->io_libnbd = true;
      else if (strcmp (optarg, "wire") == 0)
        o->io_libnbd = false;
      else
        bp_usage_error ("--io: expected wire or libnbd, got %s", optarg);
      break;
    case BP_OPT_PLOT: o->plot = optarg; break;
    case BP_OPT_WAKE:
      o->wake_replies = (int) bp_parse_count ("--wake-replies", optarg, 0, 4096);
      break;
    case BP_OPT_LABEL:
      if (nlabels >= 2)
        bp_usage_error ("--label: at most two (A's, then B's)");
      o->label[nlabels++] = optarg;
      break;
    case BP_OPT_SPAN:
      if (bp_parse_size (optarg, &o->span) == -1 || o->span == 0)
        bp_usage_error ("--span: bad size %s", optarg);
      break;
    case BP_OPT_OFFSET:
      if (bp_parse_size (optarg, &o->offset) == -1)
        bp_usage_error ("--offset: bad size %s", optarg);
      break;
    case BP_OPT_RWMIX: {
      const char *w = bp_split_pair (optarg, pair, sizeof pair);
      if (!w) {
        char *slash = strpbrk (pair, "/:");
        if (slash) { *slash = '\0'; w = slash + 1; }
      }
      char *end;
      double r = strtod (pair, &end);
      if (end == pair || *end || r < 0)
        bp_usage_error ("--rw-mix: expected READ_PCT or R/W: %s", optarg);
      if (w) {
        double wr = strtod (w, &end);
        if (end == w || *end || wr < 0 || r + wr <= 0)
          bp_usage_error ("--rw-mix: expected READ_PCT or R/W: %s", optarg);
        r = 100.0 * r / (r + wr);
      }
      if (r > 100)
        bp_usage_error ("--rw-mix: read share above 100%%: %s", optarg);
      o->read_pct = (unsigned) lround (r);
      break;
    }
    case BP_OPT_TLS_CERTS: o->tls_certificates = optarg; o->tls_any = true; break;
    case BP_OPT_TLS_PSK: o->tls_psk = optarg; o->tls_any = true; break;
    case BP_OPT_TLS_USER: o->tls_username = optarg; o->tls_any = true; break;
    case BP_OPT_TLS_VERIFY:
      o->tls_verify_peer = o->tls_verify_set = o->tls_any = true;
      break;
    case BP_OPT_TLS_NOVERIFY:
      o->tls_verify_peer = false;
      o->tls_verify_set = true;
      break;
    case 'h': bp_usage (stdout); exit (0);
    case 'V': printf ("blkperf %s\n", BLKD_VERSION); exit (0);
    default:
      fputs ("(blkperf --help lists the options)\n", stderr);
      exit (2);
    }
  }

  int want = o->compare ? 2 : 1;
  if (argc - optind != want)
    bp_usage_error (o->compare ? "compare needs two URIs, A and B"
                               : "expected one URI");
  for (int i = 0; i < want; i++) {
    o->uri_owned[i] = o->tls_any ? bp_tls_scheme (argv[optind + i]) : NULL;
    o->uri[i] = o->uri_owned[i] ? o->uri_owned[i] : argv[optind + i];
  }
  if (!o->compare && nmetrics > 1)
    bp_usage_error ("-M: give it once (twice only in compare mode)");
  if (nmetrics == 1)
    o->metrics_url[1] = o->metrics_url[0];
  if (have_l && have_n)
    bp_usage_error ("-l and -n exclude each other");
  (void) have_n;

  if (!have_b) {
    switch (o->test) {
    case BP_STREAM_READ: case BP_STREAM_WRITE: o->bs = 256 << 10; break;
    case BP_SEQ_REWRITE: o->bs = 16 << 10; break;
    case BP_CHURN: o->bs = 64 << 10; break;
    default: o->bs = 4 << 10; break;
    }
  }
  if (o->test == BP_RR) {
    /* TCP_RR's definition: one transaction outstanding, so that the
     * rate is 1 / round trip.  Deeper queues are RAND_READ's job. */
    if (have_q && o->depth != 1)
      bp_usage_error ("-q: RR keeps one request in flight per connection; "
                      "use RAND_READ for deeper queues");
    o->depth = 1;
  }
  else if (!have_q)
    o->depth = o->test == BP_RAND_READ || o->test == BP_RAND_WRITE
               || o->test == BP_RAND_RW ? 32 : 16;
  if (!o->conns)
    o->conns = 1;
  if (o->test == BP_SEQ_REWRITE)
    o->prefill = true;           /* a rewrite needs something to rewrite */
  if (o->wake_replies > (int) o->depth)
    bp_usage_error ("--wake-replies %d: more than the %u requests in flight (-q); "
                    "the replies could never all be queued", o->wake_replies, o->depth);
  if ((uint64_t) o->depth * o->bs > (1ull << 30))
    bp_usage_error ("-q x -b is %llu bytes of buffers per connection; keep it "
                    "under 1 GiB", (unsigned long long) o->depth * o->bs);

  /* netperf's defaults: -I alone means up to 10 iterations, -i alone
   * means a 99% / 5% goal.  compare always repeats: one sample per side
   * cannot tell signal from noise. */
  if (o->compare) {
    if (!have_i) { o->iter_max = 10; o->iter_min = 3; }
    if (!have_I) { o->ci_level = 95; o->ci_width = 5; }
    if (o->iter_max < 2)
      bp_usage_error ("compare needs at least 2 iterations per side (-i)");
    if (o->iter_min < 2)
      o->iter_min = 2;
    o->ci_requested = true;
  }
  else {
    if (!have_i && !have_I) { o->iter_max = o->iter_min = 1; o->ci_level = 99; o->ci_width = 5; }
    else if (!have_i) { o->iter_max = 10; o->iter_min = 3; }
    else if (!have_I) { o->ci_level = 99; o->ci_width = 5; }
    o->ci_requested = o->iter_max > 1;
  }
}
