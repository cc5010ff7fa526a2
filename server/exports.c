/* The exports list nbdkit's API hands .list_exports (plugins and
 * filters), with nbdkit's limits, and the default export's resolution. */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <nbdkit-filter.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "public.h"
#include "vector.h"

/* nbdkit's caps (server/exports.c). */
#define MAX_EXPORTS 10000
#define MAX_STRING 4096             /* NBD protocol's limit on a string */

struct nbdkit_exports *
public_exports_new (void)
{
  struct nbdkit_exports *x = calloc (1, sizeof *x);

  if (x == NULL)
    nbdkit_error ("nbdkit_exports_new: malloc: %m");
  return x;
}

void
public_exports_free (struct nbdkit_exports *x)
{
  if (x) {
    for (size_t i = 0; i < x->len; i++) {
      free (x->v[i].name);
      free (x->v[i].description);
    }
    free (x->v);
    free (x);
  }
}

PUBLIC_API void
nbdkit_exports_free (struct nbdkit_exports *x)
{
  public_exports_free (x);
}

PUBLIC_API struct nbdkit_exports *
nbdkit_exports_new (void)
{
  return public_exports_new ();
}

PUBLIC_API size_t
nbdkit_exports_count (const struct nbdkit_exports *x)
{
  return x->len;
}

/* nbdkit-filter.h declares the result const; clang holds a definition to
 * that, gcc's -Wignored-qualifiers calls the const pointless. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-qualifiers"
PUBLIC_API const struct nbdkit_export
nbdkit_get_export (const struct nbdkit_exports *x, size_t i)
{
  if (i >= x->len)
    public_index_abort ("nbdkit_get_export", i, x->len);
  return (struct nbdkit_export) {
    .name = x->v[i].name, .description = x->v[i].description,
  };
}
#pragma GCC diagnostic pop

PUBLIC_API int
nbdkit_add_export (struct nbdkit_exports *x,
                   const char *name, const char *description)
{
  char *n = NULL, *d = NULL;

  if (x->len >= MAX_EXPORTS) {
    nbdkit_error ("nbdkit_add_export: too many exports");
    errno = EINVAL;
    return -1;
  }
  /* NBD_OPT_LIST replies carry these as protocol strings. */
  if (name == NULL) {
    nbdkit_error ("nbdkit_add_export: no export name given");
    errno = EINVAL;
    return -1;
  }
  if (strlen (name) > MAX_STRING ||
      (description && strlen (description) > MAX_STRING)) {
    nbdkit_error ("nbdkit_add_export: string too long");
    errno = EINVAL;
    return -1;
  }
  struct public_export *nv = vec_grow (x->v, &x->cap, x->len + 1, sizeof *nv, 8);
  if (nv == NULL)
    goto nomem;
  x->v = nv;
  n = strdup (name);
  if (n == NULL)
    goto nomem;
  if (description) {
    d = strdup (description);
    if (d == NULL)
      goto nomem;
  }
  x->v[x->len].name = n;
  x->v[x->len].description = d;
  x->len++;
  return 0;

 nomem:
  nbdkit_error ("nbdkit_add_export: %m");
  free (n);
  errno = ENOMEM;
  return -1;
}

int
public_exports_add_name (struct nbdkit_exports *x, const char *name)
{
  x->use_default = false;
  return nbdkit_add_export (x, name, NULL);
}

PUBLIC_API int
nbdkit_use_default_export (struct nbdkit_exports *x)
{
  x->use_default = true;
  return 0;
}
