/* Output buffers: bytes queued for a socket (handshake replies), grown as
 * the common vector grows. */
#include <string.h>

#include "internal.h"
#include "vector.h"

int
outbuf_append (struct outbuf *o, const void *data, size_t len)
{
  uint8_t *nb = vec_grow (o->data, &o->cap, o->len + len, 1, 1024);
  if (!nb)
    return -1;
  o->data = nb;
  memcpy (o->data + o->len, data, len);
  o->len += len;
  return 0;
}
