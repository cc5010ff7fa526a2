/* Size strings with binary suffixes, parsed once for the server and
 * blkperf: see size.h. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "size.h"

enum size_status
size_parse (const char *str, int flags, int64_t *out, const char **suffix)
{
  static const char units[] = "bkmgtpe";
  char *end;
  int64_t scale = 1;

  errno = 0;
  intmax_t size = strtoimax (str, &end, 10);
  if (suffix)
    *suffix = end;
  if (end == str)
    return SIZE_NO_NUMBER;
  if (size < 0)
    return SIZE_NEGATIVE;
  if (errno != 0)
    return SIZE_TOO_BIG;

  if (*end != '\0') {
    char c = tolower ((unsigned char) *end);
    const char *u = strchr (units, c);
    const char *rest = end + 1;

    if (c == 's')
      scale = 512;
    else if (u && c != '\0') {
      for (const char *p = units; p < u; p++)
        scale *= 1024;
    }
    else
      return SIZE_BAD_SUFFIX;
    /* blkperf's spellings: 4KiB, 4kB, 4Kib, 4096B ("b" alone is nbdkit's
     * byte suffix already). */
    if ((flags & SIZE_IEC_SPELLINGS) && scale > 512) {
      if (*rest == 'i')
        rest++;
      if (*rest == 'B' || *rest == 'b')
        rest++;
    }
    if (*rest != '\0')
      return SIZE_BAD_SUFFIX;
  }

  if (INT64_MAX / scale < size)
    return SIZE_OVERFLOW;
  *out = (int64_t) size * scale;
  return SIZE_OK;
}
