/* The number of CPUs the calling thread may run on, for the server and the plugins. */
#ifndef BLKD_COMMON_AFFINITY_H
#define BLKD_COMMON_AFFINITY_H

#include <errno.h>
#include <sched.h>

/* The CPUs in the calling thread's affinity mask (inherited from the
 * process: taskset, systemd's CPUAffinity=, a container's cpuset), or -1
 * where it cannot be read.  The mask grows from 1024 CPUs: sched_getaffinity
 * fails with EINVAL while the kernel's mask (its possible CPUs, whatever
 * the affinity) is larger than the one given.  Header-only, so that a
 * plugin that loads into nbdkit too needs no object of blkd's. */
static inline long
affinity_cpu_count (void)
{
  long n = -1;

  for (int ncpus = 1024; n < 0 && ncpus <= 1 << 16; ncpus *= 2) {
    cpu_set_t *set = CPU_ALLOC (ncpus);
    size_t size = CPU_ALLOC_SIZE (ncpus);
    if (set == NULL)
      break;
    int r = sched_getaffinity (0, size, set), err = errno;
    if (r == 0)
      n = CPU_COUNT_S (size, set);
    CPU_FREE (set);
    if (r != 0 && err != EINVAL)
      break;
  }
  return n;
}

#endif /* BLKD_COMMON_AFFINITY_H */
