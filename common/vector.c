/* Growable arrays: see vector.h. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "vector.h"

void *
vec_grow (void *v, size_t *cap, size_t need, size_t elem, size_t first)
{
  if (need <= *cap)
    return v;
  size_t ncap = *cap > SIZE_MAX / 2 ? SIZE_MAX : *cap * 2;
  if (ncap < first)
    ncap = first;
  if (ncap < need)
    ncap = need;
  if (elem && ncap > SIZE_MAX / elem) {
    errno = ENOMEM;
    return NULL;
  }
  void *nv = realloc (v, ncap * elem);
  if (!nv)
    return NULL;                        /* realloc set ENOMEM */
  *cap = ncap;
  return nv;
}
