/* size_parse(): "4096", "64k", "1M", "2G" ... as the server's options,
 * nbdkit_parse_size() and blkperf's options read them. */
#ifndef BLKD_COMMON_SIZE_H
#define BLKD_COMMON_SIZE_H

#include <stdint.h>

enum size_status {
  SIZE_OK,
  SIZE_NO_NUMBER,                       /* no digits where the number goes */
  SIZE_NEGATIVE,
  SIZE_TOO_BIG,                         /* the number alone overflows */
  SIZE_BAD_SUFFIX,                      /* *suffix says which */
  SIZE_OVERFLOW,                        /* number times suffix overflows */
};

/* Accept the "KiB"/"kB"/"B" spellings too (blkperf), not only nbdkit's
 * single letter. */
#define SIZE_IEC_SPELLINGS 1

/* Decimal (hex digits would collide with the suffixes), then at most one
 * suffix: b (bytes), s (512-byte sectors) or k m g t p e (powers of
 * 1024), any case, as nbdkit 1.32 reads them.  No fractions.  The result
 * fits int64_t.  On failure *suffix (if not NULL) points at the suffix. */
enum size_status size_parse (const char *str, int flags, int64_t *out,
                             const char **suffix);

#endif
