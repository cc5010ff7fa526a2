/* Statistics for iterations: Student t distribution, confidence intervals, Welch's two-sample test. */
#include <math.h>

#include "blkperf.h"

/* Continued fraction for the incomplete beta function, evaluated with the
 * modified Lentz method.  Converges fast for x < (a+1)/(a+b+2); the caller
 * uses the symmetry I_x(a,b) = 1 - I_{1-x}(b,a) otherwise. */
static double
bp_betacf (double a, double b, double x)
{
  const double tiny = 1e-300, eps = 1e-15;
  double c = 1.0, d = 1.0 - (a + b) * x / (a + 1.0);
  if (fabs (d) < tiny) d = tiny;
  d = 1.0 / d;
  double f = d;
  for (int m = 1; m <= 500; m++) {
    double m2 = 2.0 * m;
    /* even step */
    double num = m * (b - m) * x / ((a + m2 - 1.0) * (a + m2));
    d = 1.0 + num * d; if (fabs (d) < tiny) d = tiny;
    c = 1.0 + num / c; if (fabs (c) < tiny) c = tiny;
    d = 1.0 / d;
    f *= d * c;
    /* odd step */
    num = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0));
    d = 1.0 + num * d; if (fabs (d) < tiny) d = tiny;
    c = 1.0 + num / c; if (fabs (c) < tiny) c = tiny;
    d = 1.0 / d;
    double delta = d * c;
    f *= delta;
    if (fabs (delta - 1.0) < eps)
      break;
  }
  return f;
}

/* Regularized incomplete beta I_x(a, b). */
static double
bp_ibeta (double a, double b, double x)
{
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  double lbt = lgamma (a + b) - lgamma (a) - lgamma (b)
               + a * log (x) + b * log1p (-x);
  if (x < (a + 1.0) / (a + b + 2.0))
    return exp (lbt) * bp_betacf (a, b, x) / a;
  return 1.0 - exp (lbt) * bp_betacf (b, a, 1.0 - x) / b;
}

double
bp_t_cdf (double t, double df)
{
  if (isinf (df))
    return 0.5 * erfc (-t / M_SQRT2);
  double x = df / (df + t * t);
  double tail = 0.5 * bp_ibeta (df / 2.0, 0.5, x);   /* P(T > |t|) */
  return t > 0 ? 1.0 - tail : tail;
}

/* Inverts the CDF by bracketing and bisection: slow next to a rational
 * approximation, but it is called a handful of times per run and is exact
 * to double precision for any df, fractional Welch df included. */
double
bp_t_quantile (double p, double df)
{
  if (p <= 0) return -INFINITY;
  if (p >= 1) return INFINITY;
  if (p == 0.5) return 0;
  double lo = -1, hi = 1;
  while (bp_t_cdf (lo, df) > p) lo *= 2;
  while (bp_t_cdf (hi, df) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * fabs (hi); i++) {
    double mid = (lo + hi) / 2;
    if (bp_t_cdf (mid, df) < p) lo = mid; else hi = mid;
  }
  return (lo + hi) / 2;
}

void
bp_summarize (const double *x, unsigned n, double level_pct, struct bp_summary *s)
{
  s->n = n;
  s->mean = s->sd = s->half = s->width_pct = NAN;
  if (n == 0)
    return;
  double sum = 0;
  for (unsigned i = 0; i < n; i++) sum += x[i];
  s->mean = sum / n;
  if (n < 2)
    return;
  double ss = 0;
  for (unsigned i = 0; i < n; i++) ss += (x[i] - s->mean) * (x[i] - s->mean);
  s->sd = sqrt (ss / (n - 1));
  double tq = bp_t_quantile (0.5 + level_pct / 200.0, n - 1);
  s->half = tq * s->sd / sqrt ((double) n);
  /* netperf's -I width is the whole interval, i.e. +/- width/2. */
  s->width_pct = s->mean != 0 ? 200.0 * s->half / fabs (s->mean) : NAN;
}

/* Welch's unequal-variance t on the difference of means B - A, with the
 * Welch-Satterthwaite degrees of freedom.  The percent interval divides the
 * difference interval by mean A and so treats mean A as exact; the verdict
 * (does the interval exclude zero) is unaffected by that division. */
void
bp_welch (const double *a, unsigned na, const double *b, unsigned nb,
          double level_pct, struct bp_welch *w)
{
  struct bp_summary sa, sb;
  bp_summarize (a, na, level_pct, &sa);
  bp_summarize (b, nb, level_pct, &sb);
  w->diff = sb.mean - sa.mean;
  w->pct = sa.mean != 0 ? 100.0 * w->diff / sa.mean : NAN;
  w->se = w->df = w->t = w->p = w->lo = w->hi = w->lo_pct = w->hi_pct = NAN;
  w->significant = false;
  if (na < 2 || nb < 2)
    return;
  double qa = sa.sd * sa.sd / na, qb = sb.sd * sb.sd / nb;
  w->se = sqrt (qa + qb);
  if (w->se == 0) {
    /* No spread at all: only an exact difference can decide. */
    w->df = na + nb - 2;
    w->lo = w->hi = w->diff;
    w->p = w->diff == 0 ? 1.0 : 0.0;
    w->t = w->diff == 0 ? 0 : copysign (INFINITY, w->diff);
  }
  else {
    w->df = (qa + qb) * (qa + qb)
            / (qa * qa / (na - 1) + qb * qb / (nb - 1));
    w->t = w->diff / w->se;
    w->p = 2.0 * (1.0 - bp_t_cdf (fabs (w->t), w->df));
    double tq = bp_t_quantile (0.5 + level_pct / 200.0, w->df);
    w->lo = w->diff - tq * w->se;
    w->hi = w->diff + tq * w->se;
  }
  if (sa.mean != 0) {
    w->lo_pct = 100.0 * w->lo / sa.mean;
    w->hi_pct = 100.0 * w->hi / sa.mean;
    if (sa.mean < 0) { double tmp = w->lo_pct; w->lo_pct = w->hi_pct; w->hi_pct = tmp; }
  }
  w->significant = w->lo > 0 || w->hi < 0;
}
