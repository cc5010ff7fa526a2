/* now_ns(): the monotonic clock in nanoseconds, for the server and blkperf
 * alike (a vDSO call, no syscall).  Never compared with wall-clock time. */
#ifndef BLKD_COMMON_MONOTIME_H
#define BLKD_COMMON_MONOTIME_H

#include <stdint.h>
#include <time.h>

static inline uint64_t
now_ns (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

#endif
