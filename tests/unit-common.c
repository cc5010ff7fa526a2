/* Unit tests for common/: size strings in both spellings, growable
 * arrays and MIN/MAX. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "minmax.h"
#include "monotime.h"
#include "size.h"
#include "vector.h"
#include "unit.h"

static int64_t
sz (const char *s, int flags, enum size_status want)
{
  int64_t v = -1;
  enum size_status st = size_parse (s, flags, &v, NULL);
  if (st != want) {
    printf ("FAIL [%s] size_parse (\"%s\", %d): status %d, want %d\n", unit_group, s, flags,
            st, want);
    unit_failures++;
  }
  return v;
}

static void
test_size_nbdkit (void)
{
  int before = unit_begin ("sizes as nbdkit reads them");
  CHECK_INT (sz ("0", 0, SIZE_OK), 0);
  CHECK_INT (sz ("4096", 0, SIZE_OK), 4096);
  CHECK_INT (sz ("100b", 0, SIZE_OK), 100);
  CHECK_INT (sz ("2s", 0, SIZE_OK), 1024);
  CHECK_INT (sz ("64k", 0, SIZE_OK), 65536);
  CHECK_INT (sz ("64K", 0, SIZE_OK), 65536);
  CHECK_INT (sz ("1M", 0, SIZE_OK), 1 << 20);
  CHECK_INT (sz ("3g", 0, SIZE_OK), 3LL << 30);
  CHECK_INT (sz ("2T", 0, SIZE_OK), 2LL << 40);
  CHECK_INT (sz ("5p", 0, SIZE_OK), 5LL << 50);
  CHECK_INT (sz ("7E", 0, SIZE_OK), 7LL << 60);
  sz ("", 0, SIZE_NO_NUMBER);
  sz ("k", 0, SIZE_NO_NUMBER);
  sz ("-1", 0, SIZE_NEGATIVE);
  sz ("99999999999999999999", 0, SIZE_TOO_BIG);
  sz ("8E", 0, SIZE_OVERFLOW);
  sz ("1.5G", 0, SIZE_BAD_SUFFIX);
  sz ("1MiB", 0, SIZE_BAD_SUFFIX);        /* nbdkit 1.32 says unknown suffix */
  sz ("1x", 0, SIZE_BAD_SUFFIX);
  sz ("1kk", 0, SIZE_BAD_SUFFIX);
  const char *suffix = NULL;
  int64_t v;
  CHECK (size_parse ("12Q", 0, &v, &suffix) == SIZE_BAD_SUFFIX && strcmp (suffix, "Q") == 0);
  unit_end (before);
}

static void
test_size_iec (void)
{
  int before = unit_begin ("blkperf's spellings too");
  CHECK_INT (sz ("4k", SIZE_IEC_SPELLINGS, SIZE_OK), 4096);
  CHECK_INT (sz ("4KiB", SIZE_IEC_SPELLINGS, SIZE_OK), 4096);
  CHECK_INT (sz ("4kB", SIZE_IEC_SPELLINGS, SIZE_OK), 4096);
  CHECK_INT (sz ("1MiB", SIZE_IEC_SPELLINGS, SIZE_OK), 1 << 20);
  CHECK_INT (sz ("2Gib", SIZE_IEC_SPELLINGS, SIZE_OK), 2LL << 30);
  CHECK_INT (sz ("4096B", SIZE_IEC_SPELLINGS, SIZE_OK), 4096);
  sz ("4KiBB", SIZE_IEC_SPELLINGS, SIZE_BAD_SUFFIX);
  sz ("4ii", SIZE_IEC_SPELLINGS, SIZE_BAD_SUFFIX);
  sz ("-4k", SIZE_IEC_SPELLINGS, SIZE_NEGATIVE);
  unit_end (before);
}

static void
test_vector (void)
{
  int before = unit_begin ("vec_grow");
  int *v = NULL;
  size_t cap = 0;
  for (size_t n = 0; n < 1000; n++) {
    int *nv = vec_grow (v, &cap, n + 1, sizeof *v, 16);
    CHECK (nv != NULL);
    if (!nv)
      break;
    v = nv;
    v[n] = (int) n;
  }
  CHECK (cap >= 1000 && cap <= 2048);
  int sum_ok = 1;
  for (int i = 0; i < 1000; i++)
    sum_ok &= v[i] == i;
  CHECK (sum_ok);
  size_t before_cap = cap;
  CHECK (vec_grow (v, &cap, 10, sizeof *v, 16) == v && cap == before_cap);
  /* A size that overflows size_t fails cleanly, leaving v as it was. */
  errno = 0;
  CHECK (vec_grow (v, &cap, SIZE_MAX / 2, sizeof *v, 16) == NULL && errno == ENOMEM);
  CHECK (cap == before_cap && v[999] == 999);
  free (v);
  cap = 0;
  char *c = vec_grow (NULL, &cap, 1, 1, 8);
  CHECK (c != NULL && cap == 8);
  free (c);
  unit_end (before);
}

static void
test_minmax_time (void)
{
  int before = unit_begin ("MIN, MAX, now_ns");
  int i = 0;
  CHECK_INT (MIN (3, 5), 3);
  CHECK_INT (MAX (3, 5), 5);
  CHECK_INT (MIN (-3, 5), -3);
  CHECK_INT (MAX (UINT64_C (1) << 40, UINT64_C (7)), UINT64_C (1) << 40);
  CHECK_INT (MIN (i++, 10), 0);          /* each argument once */
  CHECK_INT (i, 1);
  uint64_t t0 = now_ns (), t1 = now_ns ();
  CHECK (t0 > 0 && t1 >= t0);
  unit_end (before);
}

int
main (void)
{
  test_size_nbdkit ();
  test_size_iec ();
  test_vector ();
  test_minmax_time ();
  return unit_exit ("unit-common");
}
