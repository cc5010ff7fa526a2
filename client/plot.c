/* --plot: the latency percentile curve and throughput per second, A and B with their intervals, drawn by gnuplot into an SVG. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blkperf.h"

/* Percentiles on the curve; the x axis is -log10(1 - q) ("nines"), so
 * that the tail gets as much room as the median. */
const double bp_plot_q[BP_NQ] = {
  0.01, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999,
};

static bool
bp_on_path (const char *prog)
{
  const char *path = getenv ("PATH");
  if (!path || !*path)
    path = "/usr/local/bin:/usr/bin:/bin";
  char buf[4096];
  while (*path) {
    size_t n = strcspn (path, ":");
    if (n > 0 && snprintf (buf, sizeof buf, "%.*s/%s", (int) n, path, prog) < (int) sizeof buf
        && access (buf, X_OK) == 0)
      return true;
    path += n + (path[n] == ':');
  }
  return false;
}

void
bp_plot_check (const struct bp_opts *o)
{
  if (!o->plot)
    return;
  /* Before the run, not after it: minutes of measurement should not end
   * in "cannot draw". */
  if (!bp_on_path ("gnuplot"))
    bp_die ("--plot needs gnuplot, which is not installed (Debian: apt-get install gnuplot-nox)");
  FILE *f = fopen (o->plot, "w");
  if (!f)
    bp_die ("--plot: cannot write %s: %s", o->plot, strerror (errno));
  fclose (f);
}

/* Mean and interval of n values at the run's confidence level; with one
 * value the interval collapses onto it. */
static void
bp_plot_ci (const struct bp_opts *o, const double *x, unsigned n, double *mean,
            double *lo, double *hi)
{
  struct bp_summary s;
  bp_summarize (x, n, o->ci_level, &s);
  *mean = s.mean;
  double h = isnan (s.half) ? 0 : s.half;
  *lo = s.mean - h;
  *hi = s.mean + h;
}

/* gnuplot single-quoted string: a quote is written twice. */
static void
bp_plot_str (FILE *f, const char *s)
{
  fputc ('\'', f);
  for (; *s; s++) {
    if (*s == '\'')
      fputc ('\'', f);
    fputc (*s == '\n' ? ' ' : *s, f);
  }
  fputc ('\'', f);
}

/* The data blocks return their row count: a side without rows gets no
 * series (gnuplot skips an empty one, but fails when every one is). */
static unsigned
bp_plot_lat_block (FILE *f, const struct bp_opts *o, const struct bp_result *r, char side)
{
  double x[BP_MAX_ITER];
  unsigned rows = 0;
  fprintf (f, "$%c_lat << EOD\n", side);
  for (int k = 0; k < BP_NQ; k++) {
    /* A percentile needs enough requests behind it to mean anything. */
    if ((double) r->hist.count * (1 - bp_plot_q[k]) < 1.0)
      continue;
    unsigned n = 0;
    for (unsigned i = 0; i < r->n; i++)
      if (!isnan (r->it[i].lat_q_us[k]))
        x[n++] = r->it[i].lat_q_us[k];
    if (n == 0)
      continue;
    double m, lo, hi;
    bp_plot_ci (o, x, n, &m, &lo, &hi);
    if (lo <= 0)
      lo = m / 10;               /* a log axis cannot show a bound at or below 0 */
    fprintf (f, "%.6f %.3f %.3f %.3f\n", -log10 (1 - bp_plot_q[k]), m, lo, hi);
    rows++;
  }
  fputs ("EOD\n", f);
  return rows;
}

/* The last whole second any iteration of r recorded (0: none lasted one). */
static unsigned
bp_plot_last_second (const struct bp_result *r)
{
  unsigned maxsec = 0;
  for (unsigned k = 0; k < r->nts; k++)
    if (r->ts[k].sec > maxsec)
      maxsec = r->ts[k].sec;
  return maxsec;
}

static unsigned
bp_plot_tput_block (FILE *f, const struct bp_opts *o, const struct bp_result *r,
                    char side, bool iops)
{
  unsigned maxsec = bp_plot_last_second (r), rows = 0;
  double *x = malloc ((r->n ? r->n : 1) * sizeof *x);
  if (!x)
    bp_die ("out of memory");
  fprintf (f, "$%c_tput << EOD\n", side);
  for (unsigned sec = 1; sec <= maxsec; sec++) {
    unsigned n = 0;
    for (unsigned k = 0; k < r->nts && n < r->n; k++)
      if (r->ts[k].sec == sec)
        x[n++] = iops ? r->ts[k].iops : r->ts[k].mibs;
    if (n == 0)
      continue;
    double m, lo, hi;
    bp_plot_ci (o, x, n, &m, &lo, &hi);
    fprintf (f, "%u %.3f %.3f %.3f\n", sec, m, lo, hi);
    rows++;
  }
  fputs ("EOD\n", f);
  free (x);
  return rows;
}

static void
bp_plot_series (FILE *f, const struct bp_opts *o, char side, const char *what,
                const char *color, const struct bp_result *r, bool last)
{
  const char *name = o->label[side - 'A'] ? o->label[side - 'A'] : r->tgt.uri;
  fprintf (f, "  $%c_%s using 1:3:4 with filledcurves lc rgb '%s' notitle, \\\n", side, what, color);
  fprintf (f, "  $%c_%s using 1:2 with linespoints pt 7 ps 0.5 lw 2 lc rgb '%s' title ",
           side, what, color);
  char label[700];
  snprintf (label, sizeof label, "%s: %s", side == 'A' ? "A (before)" : "B (after)", name);
  bp_plot_str (f, label);
  fputs (last ? "\n" : ", \\\n", f);
}

/* The axes every panel starts from: set before the first, and put back
 * after a note. */
#define BP_PLOT_AXES "set grid xtics ytics mytics lc rgb '#d8d8d8'\n" \
                     "set border 3\nset xtics nomirror\nset ytics nomirror\n"

/* A panel with nothing to draw says why in words, then puts back what the
 * next panel expects. */
static void
bp_plot_note (FILE *f, const char *why)
{
  fputs ("unset logscale y\nunset key\nunset border\nunset xtics\nunset ytics\n"
         "unset grid\nset xlabel ''\nset ylabel ''\nset xrange [0:1]\nset yrange [0:1]\n"
         "set label 1 ", f);
  bp_plot_str (f, why);
  fputs (" at 0.5,0.5 center\nplot -1 notitle\nunset label 1\nset autoscale x\n"
         BP_PLOT_AXES, f);
}

/* The plot command for the sides that have rows of WHAT. */
static void
bp_plot_sides (FILE *f, const struct bp_opts *o, const char *what, const struct bp_result *a,
               unsigned a_rows, const struct bp_result *b, unsigned b_rows)
{
  fputs ("plot \\\n", f);
  if (a_rows)
    bp_plot_series (f, o, 'A', what, "#1f77b4", a, b_rows == 0);
  if (b_rows)
    bp_plot_series (f, o, 'B', what, "#d62728", b, true);
}

static void
bp_plot_script (FILE *f, const struct bp_opts *o, const struct bp_result *a,
                const struct bp_result *b)
{
  bool iops = bp_test_primary_is_iops (o->test);
  unsigned iters = b ? (a->n < b->n ? a->n : b->n) : a->n;
  fputs ("set terminal svg size 960,900 dynamic noenhanced font 'sans,12' "
         "background rgb 'white'\nset encoding utf8\nset output ", f);
  bp_plot_str (f, o->plot);
  fputc ('\n', f);
  unsigned a_lat = bp_plot_lat_block (f, o, a, 'A');
  unsigned a_tput = bp_plot_tput_block (f, o, a, 'A', iops);
  unsigned b_lat = 0, b_tput = 0;
  if (b) {
    b_lat = bp_plot_lat_block (f, o, b, 'B');
    b_tput = bp_plot_tput_block (f, o, b, 'B', iops);
  }
  char head[256];
  snprintf (head, sizeof head, "blkperf %s%s: %llu-byte requests, queue depth %u, %u connection%s",
            b ? "compare " : "", bp_test_name (o->test), (unsigned long long) o->bs,
            o->depth, o->conns, o->conns == 1 ? "" : "s");
  fputs ("set multiplot layout 2,1 title ", f);
  bp_plot_str (f, head);
  fputs (" font ',14'\n", f);
  char band[160];
  if (iters >= 2)
    snprintf (band, sizeof band, "line: mean of %u iterations%s, band: its %g%% confidence interval",
              iters, b ? " per side" : "", o->ci_level);
  else
    snprintf (band, sizeof band, "one iteration: no interval (use -i)");
  fputs (BP_PLOT_AXES
         /* The curve rises to the right: its top left is empty. */
         "set key top left inside opaque box lc rgb '#bbbbbb'\n"
         "set format y '%g'\n"
         "set style fill transparent solid 0.22 noborder\n"
         "set xlabel 'percentile'\nset ylabel 'latency, µs (log scale)'\n"
         "set logscale y\n"
         "set xtics ('1' 0.00436, '25' 0.1249, '50' 0.30103, '75' 0.60206, '90' 1, "
         "'99' 2, '99.9' 3, '99.99' 4, '99.999' 5)\n"
         "set title ", f);
  char t1[320];
  snprintf (t1, sizeof t1, "Latency by percentile (%s)", band);
  bp_plot_str (f, t1);
  fputc ('\n', f);
  if (a_lat + b_lat == 0)
    /* Every percentile needs more requests behind it (-n 1). */
    bp_plot_note (f, "too few requests for any percentile: no latency curve to draw");
  else
    bp_plot_sides (f, o, "lat", a, a_lat, b, b_lat);
  char t2[320];
  snprintf (t2, sizeof t2, "%s per second (%s)", iops ? "IOPS" : "Throughput", band);
  fputs ("set title ", f);
  bp_plot_str (f, t2);
  fputc ('\n', f);
  if (a_tput + b_tput == 0) {
    /* Rates are sampled once a second; iterations shorter than that (-n
     * with few requests) leave no point. */
    bp_plot_note (f, "no iteration lasted a whole second: no rate per second to draw");
    fputs ("unset multiplot\n", f);
    return;
  }
  unsigned maxsec = bp_plot_last_second (a);
  if (b && bp_plot_last_second (b) > maxsec)
    maxsec = bp_plot_last_second (b);
  fprintf (f, "unset logscale y\nset xtics %u\nset format x '%%.0f'\nset yrange [0:*]\n",
           maxsec > 10 ? (maxsec + 9) / 10 : 1);
  fputs (
         "set xlabel 'seconds into the iteration'\nset ylabel ", f);
  bp_plot_str (f, iops ? "IOPS" : "MiB/s");
  /* Rates fill the panel's middle: the key goes under the axis. */
  fputs ("\nset key below nobox noopaque\n", f);
  bp_plot_sides (f, o, "tput", a, a_tput, b, b_tput);
  fputs ("unset multiplot\n", f);
}

int
bp_plot_write (const struct bp_opts *o, const struct bp_result *a,
               const struct bp_result *b)
{
  if (!o->plot)
    return 0;
  /* gnuplot reads the script on stdin; its own complaints go to our
   * stderr, which is where a user looks when the chart is missing. */
  FILE *g = popen ("gnuplot", "w");
  if (!g) {
    bp_warn ("--plot: cannot start gnuplot: %s", strerror (errno));
    return -1;
  }
  bp_plot_script (g, o, a, b);
  int st = pclose (g);
  if (st == -1 || !WIFEXITED (st) || WEXITSTATUS (st) != 0) {
    bp_warn ("--plot: gnuplot failed to draw %s", o->plot);
    return -1;
  }
  return 0;
}
