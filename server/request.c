/* Request descriptors: taken from and given back to the shard's pool
 * (or calloc'd and freed with --iobuf=calloc). */
#include <stdlib.h>

#include "internal.h"

static void
request_reset (struct request *r)
{
  /* Exactly the fields read before anything writes them; the kilobyte
   * of reply space after them is written before it is sent. */
  r->next = NULL;
  r->conn = NULL;
  r->error = 0;
  r->buf = NULL;
  r->payload = NULL;
  r->niov = 0;
  r->iov_sent = 0;
  r->nlent = 0;
  r->held = 0;
  r->placed = false;
  r->send_len = 0;
}

/* --iobuf=calloc is the comparison: allocate and zero each request, free
 * it when done.  The pool mode recycles descriptors and resets only the
 * fields request_reset names. */
struct request *
request_get (struct iobuf_pool *p)
{
  struct request *r;

  if (cfg.iobuf == IOBUF_CALLOC)
    r = calloc (1, sizeof *r);      /* blind zeroing of ~1 KiB, each time */
  else {
    r = iobuf_desc_get (p);
    if (!r)
      r = malloc (sizeof *r);
  }
  if (r)
    request_reset (r);
  return r;
}

void
request_put (struct iobuf_pool *p, struct request *r)
{
  if (cfg.iobuf == IOBUF_CALLOC)
    free (r);
  else
    iobuf_desc_put (p, r);
}
