/* The unit tests' harness: CHECK() counts a failure and goes on, so one run
 * reports every failed check; unit_exit() gives the status tests/run.sh
 * reads.  Header-only: each tests/unit-*.c is one program. */
#ifndef BLKD_TESTS_UNIT_H
#define BLKD_TESTS_UNIT_H

#include <stdio.h>

static int unit_failures;
static const char *unit_group = "";

#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      printf ("FAIL [%s] %s:%d: %s\n", unit_group, __FILE__, __LINE__,  \
              #cond);                                                   \
      unit_failures++;                                                  \
    }                                                                   \
  } while (0)

/* CHECK_INT: like CHECK (a == b) but says both values when they differ. */
#define CHECK_INT(a, b)                                                 \
  do {                                                                  \
    long long a_ = (long long) (a), b_ = (long long) (b);               \
    if (a_ != b_) {                                                     \
      printf ("FAIL [%s] %s:%d: %s == %s: got %lld, want %lld\n",       \
              unit_group, __FILE__, __LINE__, #a, #b, a_, b_);          \
      unit_failures++;                                                  \
    }                                                                   \
  } while (0)

static inline int
unit_begin (const char *name)
{
  unit_group = name;
  return unit_failures;
}

static inline void
unit_end (int before)
{
  printf ("%s: %s\n", unit_failures == before ? "ok  " : "FAIL", unit_group);
  fflush (stdout);
}

static inline int
unit_exit (const char *prog)
{
  if (unit_failures) {
    printf ("%s: %d check(s) failed\n", prog, unit_failures);
    return 1;
  }
  printf ("%s: all checks passed\n", prog);
  return 0;
}

#endif
