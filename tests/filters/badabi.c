/* badabi test filter: claims to be built for another nbdkit, so a host that checks the filter ABI must refuse it. */

/* nbdkit guarantees only _api_version and _version of struct nbdkit_filter
 * across releases; everything after them is laid out as in the release the
 * filter was built for.  BADABI=api makes the API version wrong, anything
 * else (or unset) the release string. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

static struct nbdkit_filter filter = {
  .name = "badabi",
  .longname = "filter built for another nbdkit",
};

NBDKIT_DLL_PUBLIC struct nbdkit_filter *
filter_init (void)
{
  const char *which = getenv ("BADABI");
  bool api = which && strcmp (which, "api") == 0;
  filter._api_version = api ? NBDKIT_FILTER_API_VERSION - 1 : NBDKIT_FILTER_API_VERSION;
  filter._version = api ? NBDKIT_VERSION_STRING : "0.0.1";
  return &filter;
}
