/* Local CPU accounting: /proc/stat for the machine's user/system/idle split, getrusage for blkperf itself. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "blkperf.h"

long
bp_cpu_ticks_per_s (void)
{
  long hz = sysconf (_SC_CLK_TCK);
  return hz > 0 ? hz : 100;
}

long
bp_cpu_count (void)
{
  long n = sysconf (_SC_NPROCESSORS_ONLN);
  return n > 0 ? n : 1;
}

/* The first line of /proc/stat sums all CPUs:
 *   cpu user nice system idle iowait irq softirq steal guest guest_nice
 * guest time is already inside user, so it is not added again.  nice
 * counts as user, irq and softirq as system (that is where network
 * processing lands), iowait as idle, as top(1) and netperf's looper do.
 * steal (a hypervisor running someone else) is kept apart: it is neither
 * our work nor idle, and on shared VMs it reaches several percent. */
static bool
bp_cpu_read_stat (struct bp_cpu_sample *s)
{
  FILE *f = fopen ("/proc/stat", "re");
  if (!f)
    return false;
  unsigned long long v[8] = { 0 };
  int n = fscanf (f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu",
                  &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
  fclose (f);
  if (n < 4)
    return false;
  s->user = v[0] + v[1];
  s->system = v[2] + v[5] + v[6];
  s->idle = v[3] + v[4];
  s->steal = v[7];
  s->total = s->user + s->system + s->idle + s->steal;
  return true;
}

void
bp_cpu_sample (struct bp_cpu_sample *s)
{
  memset (s, 0, sizeof *s);
  s->mono_ns = now_ns ();
  s->have_stat = bp_cpu_read_stat (s);
  struct rusage ru;
  if (getrusage (RUSAGE_SELF, &ru) == 0) {
    s->proc_user_s = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
    s->proc_sys_s = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
  }
}

bool
bp_cpu_accumulate (struct bp_cpu_acc *acc, const struct bp_cpu_sample *a,
                   const struct bp_cpu_sample *b)
{
  if (!a->have_stat || !b->have_stat || b->total <= a->total)
    return false;
  acc->valid = true;
  acc->wall_s += (double) (b->mono_ns - a->mono_ns) / 1e9;
  acc->user_ticks += (double) (b->user - a->user);
  acc->system_ticks += (double) (b->system - a->system);
  acc->idle_ticks += (double) (b->idle - a->idle);
  acc->steal_ticks += (double) (b->steal - a->steal);
  acc->total_ticks += (double) (b->total - a->total);
  acc->proc_user_s += b->proc_user_s - a->proc_user_s;
  acc->proc_sys_s += b->proc_sys_s - a->proc_sys_s;
  return true;
}
