/* MIN and MAX for the server and blkperf: each argument evaluated once,
 * and mixing signed with unsigned is a compile error, not a silent wrap. */
#ifndef BLKD_COMMON_MINMAX_H
#define BLKD_COMMON_MINMAX_H

#undef MIN
#undef MAX

#define MIN(a, b) ({                                                    \
      __typeof__ (a) min_a_ = (a);                                      \
      __typeof__ (b) min_b_ = (b);                                      \
      _Static_assert (((__typeof__ (min_a_)) -1 < 1) == ((__typeof__ (min_b_)) -1 < 1), \
                      "MIN of a signed and an unsigned value");         \
      min_a_ < min_b_ ? min_a_ : min_b_;                                \
    })

#define MAX(a, b) ({                                                    \
      __typeof__ (a) max_a_ = (a);                                      \
      __typeof__ (b) max_b_ = (b);                                      \
      _Static_assert (((__typeof__ (max_a_)) -1 < 1) == ((__typeof__ (max_b_)) -1 < 1), \
                      "MAX of a signed and an unsigned value");         \
      max_a_ > max_b_ ? max_a_ : max_b_;                                \
    })

#endif
