/* Latency histogram: fixed-memory log-linear buckets (HDR style) and percentiles from them. */
#include <math.h>
#include <string.h>

#include "blkperf.h"

void
bp_hist_reset (struct bp_hist *h)
{
  memset (h, 0, sizeof *h);
  h->min_ns = UINT64_MAX;
}

void
bp_hist_merge (struct bp_hist *dst, const struct bp_hist *src)
{
  if (src->count == 0)
    return;
  for (unsigned i = 0; i < BP_HIST_BUCKETS; i++)
    dst->b[i] += src->b[i];
  dst->count += src->count;
  dst->sum_ns += src->sum_ns;
  if (src->min_ns < dst->min_ns) dst->min_ns = src->min_ns;
  if (src->max_ns > dst->max_ns) dst->max_ns = src->max_ns;
}

/* Lowest value and width of bucket i: the inverse of bp_hist_index. */
static void
bp_hist_bucket (unsigned i, double *low, double *width)
{
  if (i < 2 * BP_HIST_SUB) {
    *low = i;
    *width = 1;
    return;
  }
  unsigned shift = (i - 2 * BP_HIST_SUB) / BP_HIST_SUB + 1;
  unsigned top = (i - 2 * BP_HIST_SUB) % BP_HIST_SUB + BP_HIST_SUB;
  *low = ldexp ((double) top, (int) shift);
  *width = ldexp (1.0, (int) shift);
}

/* The q-quantile (0 < q <= 1) in microseconds: the smallest bucket whose
 * cumulative count reaches ceil(q * count), reported at the bucket's
 * midpoint and clamped to the exact min/max seen, so p100 is the max. */
double
bp_hist_quantile_us (const struct bp_hist *h, double q)
{
  if (h->count == 0)
    return NAN;
  double want = ceil (q * (double) h->count);
  if (want < 1)
    want = 1;
  uint64_t seen = 0;
  for (unsigned i = 0; i < BP_HIST_BUCKETS; i++) {
    seen += h->b[i];
    if ((double) seen >= want) {
      double low, width;
      bp_hist_bucket (i, &low, &width);
      double v = width > 1 ? low + width / 2 : low;
      if (v < (double) h->min_ns) v = (double) h->min_ns;
      if (v > (double) h->max_ns) v = (double) h->max_ns;
      return v / 1000.0;
    }
  }
  return (double) h->max_ns / 1000.0;
}

double
bp_hist_mean_us (const struct bp_hist *h)
{
  if (h->count == 0)
    return NAN;
  return h->sum_ns / (double) h->count / 1000.0;
}
