/* blkperf entry point: the single-target run and the A/B compare loop, their stopping rules and exit status. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "blkperf.h"

static void
bp_on_sigint (int sig)
{
  /* First ^C: finish the iteration early and report what was measured.
   * Second: the default action, for a server that never answers. */
  bp_interrupted = 1;
  signal (sig, SIG_DFL);
}

static struct bp_result *
bp_result_new (const struct bp_target *t)
{
  struct bp_result *r = calloc (1, sizeof *r);
  if (!r)
    bp_die ("out of memory");
  r->tgt = *t;
  bp_hist_reset (&r->hist);
  return r;
}

static uint64_t
bp_errors (const struct bp_result *r)
{
  uint64_t e = 0;
  for (unsigned i = 0; i < r->n; i++)
    e += r->it[i].errors;
  return e;
}

/* Both sides must reach the precision goal: the stopping rule looks at
 * each side's own spread, never at the difference, so stopping early
 * cannot favour a "significant" verdict. */
static bool
bp_compare_done (const struct bp_opts *o, const struct bp_result *a,
                 const struct bp_result *b, unsigned pairs)
{
  if (pairs >= o->iter_max)
    return true;
  if (pairs < o->iter_min)
    return false;
  return bp_ci_met (o, a) && bp_ci_met (o, b);
}

int
main (int argc, char **argv)
{
  struct bp_opts o;
  bp_opts_parse (&o, argc, argv);
  bp_plot_check (&o);

  struct sigaction sa = { .sa_handler = bp_on_sigint };
  sigemptyset (&sa.sa_mask);
  sigaction (SIGINT, &sa, NULL);
  sigaction (SIGTERM, &sa, NULL);
  signal (SIGPIPE, SIG_IGN);

  unsigned nt = o.compare ? 2 : 1;
  struct bp_target t[2];
  struct bp_result *ra = NULL, *rb = NULL;
  int status = 1;
  memset (t, 0, sizeof t);
  for (unsigned i = 0; i < nt; i++) {
    t[i].uri = o.uri[i];
    t[i].metrics_url = o.metrics_url[i];
    if (bp_probe (&o, &t[i]) == -1)
      goto out;
  }
  if (bp_settle_range (&o, t, nt) == -1)
    goto out;
  if (o.prefill)
    for (unsigned i = 0; i < nt; i++)
      if (bp_prefill (&o, &t[i]) == -1) {
        bp_warn ("%s: prefilling the span failed", t[i].uri);
        goto out;
      }

  ra = bp_result_new (&t[0]);
  rb = o.compare ? bp_result_new (&t[1]) : NULL;
  status = 0;
  if (!o.compare) {
    for (unsigned i = 0; i < o.iter_max && !bp_interrupted; i++) {
      if (bp_run_iteration (&o, ra, i, NULL) == -1) {
        status = 1;
        break;
      }
      if (o.ci_requested && i + 1 >= o.iter_min && bp_ci_met (&o, ra))
        break;
    }
    if (ra->n) {
      bp_report_run (stdout, &o, ra);
      fflush (stdout);
      if (bp_plot_write (&o, ra, NULL) == -1)
        status = 1;
    }
  }
  else {
    unsigned pairs = 0;
    while (!bp_interrupted && !bp_compare_done (&o, ra, rb, pairs)) {
      /* Same iteration number on both sides: the same seeds and so the
       * same offsets.  The order turns every pair (A B, B A, A B, ...):
       * alternating spreads slow drift over A and B alike, and turning
       * keeps either side from always going first or always landing on
       * the same event loop of a server that hands connections out
       * round robin (with A B A B, A's connections are always the even
       * ones, so a slow loop or CPU would look like a slow A). */
      bool b_first = pairs % 2 == 1;
      struct bp_result *first = b_first ? rb : ra, *second = b_first ? ra : rb;
      int rc = bp_run_iteration (&o, first, pairs, b_first ? "B" : "A");
      if (rc == 0 && !bp_interrupted)
        rc = bp_run_iteration (&o, second, pairs, b_first ? "A" : "B");
      if (rc == -1) {
        status = 1;
        break;
      }
      if (bp_interrupted) {
        /* 130 below, with the whole pairs: an iteration whose partner
         * never ran is not compared. */
        if (first->n > second->n)
          first->n--;
        break;
      }
      pairs++;
    }
    if (ra->n && rb->n) {
      bp_report_compare (stdout, &o, ra, rb);
      fflush (stdout);
      if (bp_plot_write (&o, ra, rb) == -1)
        status = 1;
    }
  }
  fflush (stdout);

  if (status == 0 && (bp_errors (ra) || (rb && bp_errors (rb))))
    status = 1;                  /* failed requests make the numbers suspect */
  if (bp_interrupted && status == 0)
    status = 130;

 out:
  for (unsigned i = 0; i < nt; i++)
    free (t[i].export_name);
  if (ra)
    free (ra->ts);
  if (rb)
    free (rb->ts);
  free (ra);
  free (rb);
  bp_workers_free ();
  free (o.uri_owned[0]);
  free (o.uri_owned[1]);
  return status;
}
