/* blkperf's own NBD transmission phase on the socket libnbd negotiated: batched sends, one recv for many replies. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "blkperf.h"
#include "nbd-proto.h"

/* Why not libnbd's own aio loop: libnbd sends each request with its own
 * send() as it is issued, reads every reply in three or four recv() calls
 * (16-byte simple header, 4 more bytes of a structured header, the 8-byte
 * offset, then the data), and needs a poll() per wake-up.  Here a wake-up
 * is one recv() into a 256 KiB buffer that usually holds many replies, the
 * refills go out in one sendmsg(), and a large payload is received
 * straight into its request's buffer.  libnbd still does what it is good
 * at and what a benchmark must not get wrong: URI parsing, the handshake,
 * option negotiation, and TLS (TLS connections stay on libnbd's path). */

#define BP_WIRE_RXBUF (256u << 10)
/* Payloads at least this big are received straight into the request's
 * buffer; smaller ones go through the receive buffer, so that one recv()
 * also brings the replies behind them. */
#define BP_WIRE_DIRECT (64u << 10)
/* An error chunk's message is at most 4096 bytes by the protocol. */
#define BP_WIRE_MAX_ERR_CHUNK (4096u + 64u)
/* Receive timeouts: the usual one bounds how late ^C or a stalled server
 * is noticed; the shorter one applies while the wake-up threshold is armed
 * and bounds the one stall a short reply can cause (bp_wire_wake). */
#define BP_WIRE_RCVTIMEO_US 200000
#define BP_WIRE_WAKE_RCVTIMEO_US 50000

static inline void
bp_put16 (uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = (uint8_t) v; }
static inline void
bp_put32 (uint8_t *p, uint32_t v) { bp_put16 (p, v >> 16); bp_put16 (p + 2, (uint16_t) v); }
static inline void
bp_put64 (uint8_t *p, uint64_t v) { bp_put32 (p, v >> 32); bp_put32 (p + 4, (uint32_t) v); }
static inline uint16_t
bp_get16 (const uint8_t *p) { return (uint16_t) (p[0] << 8 | p[1]); }
static inline uint32_t
bp_get32 (const uint8_t *p) { return (uint32_t) bp_get16 (p) << 16 | bp_get16 (p + 2); }
static inline uint64_t
bp_get64 (const uint8_t *p) { return (uint64_t) bp_get32 (p) << 32 | bp_get32 (p + 4); }

static int
bp_wire_fail (struct bp_wire *w, const char *fmt, const char *detail)
{
  snprintf (w->err, sizeof w->err, fmt, detail);
  w->dead = true;
  return -1;
}

static int
bp_wire_set_rcvtimeo (int fd, long us)
{
  struct timeval tv = { .tv_sec = us / 1000000, .tv_usec = us % 1000000 };
  return setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* The wake-up threshold (by default one whole reply, for reads of 64 KiB
 * and more; --wake-replies sets how many).  Without it, a thread asleep in
 * recv() is woken
 * by every segment that arrives: over loopback a 256 KiB reply comes as
 * four 64 KiB segments, so four wake-ups, each a context switch here and a
 * wake-up call (and, on a VM, often an IPI to an idle vCPU) in the server
 * thread that is sending, usually while it holds its connection's send
 * lock.  With SO_RCVLOWAT at one whole reply, TCP wakes us once the whole
 * reply is queued, and the header and payload recv() calls then find it
 * all there; at several, one wake-up serves several replies (and the
 * refills go out together, a burst the server has to take apart).  It is armed only when every reply has that one size (the
 * caller says all requests are reads of wake_len bytes) and only after
 * a run of whole replies, so a server that answers with holes or errors
 * (shorter on the wire) never arms it; one that starts doing so later
 * disarms it at the first short reply, after at most one stall bounded
 * by the shorter receive timeout.  Failure to set it is not fatal: the
 * loop is correct without it, only slower. */
static void
bp_wire_wake (struct bp_wire *w, bool on)
{
  int lowat = on ? (int) w->wake_bytes : 1;
  if (setsockopt (w->fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat) == -1
      || bp_wire_set_rcvtimeo (w->fd, on ? BP_WIRE_WAKE_RCVTIMEO_US : BP_WIRE_RCVTIMEO_US) == -1)
    w->wake_off = true;
  w->wake_on = on && !w->wake_off;
}

/* Called for every reply (or chunk) parsed: whole = it was one complete
 * read reply of the expected size. */
static inline void
bp_wire_wake_note (struct bp_wire *w, bool whole)
{
  if (w->wake_reply == 0 || w->wake_off)
    return;
  if (!whole) {
    w->wake_off = true;
    if (w->wake_on)
      bp_wire_wake (w, false);
    return;
  }
  /* A queue's worth of whole replies first, and preferably a receive
   * buffer that autotuning has grown to two replies or more: on a smaller
   * one SO_RCVLOWAT grows the buffer itself and sets the window clamp to
   * one reply, until autotuning raises both again.  Not yet: look again
   * after another queue's worth; on the fourth look arm all the same (a
   * buffer that has not grown by then belongs to a connection too slow
   * for one reply's window to limit it). */
  if (w->wake_on || ++w->wake_run < (w->depth > 4 ? w->depth : 4))
    return;
  int rcvbuf;
  socklen_t sl = sizeof rcvbuf;
  w->wake_run = 0;
  if (++w->wake_looks >= 4
      || (getsockopt (w->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &sl) == 0
          && rcvbuf >= 0 && (size_t) rcvbuf >= 2 * w->wake_bytes))
    bp_wire_wake (w, true);
}

void
bp_wire_wake_stop (struct bp_wire *w)
{
  if (w->wake_on)
    bp_wire_wake (w, false);
  w->wake_off = true;
}

int
bp_wire_init (struct bp_wire *w, int fd, bool structured, unsigned depth, bool big_reads,
              uint32_t wake_len, unsigned wake_k)
{
  memset (w, 0, sizeof *w);
  w->fd = fd;
  w->structured = structured;
  w->big_reads = big_reads;
  w->depth = depth;
  if (wake_len && wake_k) {
    w->wake_reply = (structured ? 28u : 16u) + (size_t) wake_len;
    w->wake_bytes = wake_k * w->wake_reply;
  }
  w->req = calloc (depth, sizeof *w->req);
  w->iov = calloc (2 * (size_t) depth + 1, sizeof *w->iov);
  w->rx = malloc (BP_WIRE_RXBUF);
  if (!w->req || !w->iov || !w->rx)
    goto fail;
  /* Blocking receives with a timeout: a wake-up is then the recv() itself
   * rather than poll() followed by recv(); the timeout bounds how late a
   * ^C or a stalled server is noticed.  Sends use MSG_DONTWAIT. */
  int fl = fcntl (fd, F_GETFL);
  if (fl == -1 || fcntl (fd, F_SETFL, fl & ~O_NONBLOCK) == -1)
    goto fail;
  w->saved_flags = fl;
  w->flags_changed = true;       /* from here on, bp_wire_free restores them */
  if (bp_wire_set_rcvtimeo (fd, BP_WIRE_RCVTIMEO_US) == -1)
    goto fail;
  return 0;

 fail:;
  int e = errno ? errno : ENOMEM;
  bp_wire_free (w);
  errno = e;
  return -1;
}

/* Gives the socket back the way libnbd set it up, so that libnbd can say
 * goodbye on it (nbd_shutdown) once every reply has been read. */
void
bp_wire_free (struct bp_wire *w)
{
  if (w->fd >= 0 && w->flags_changed) {
    if (w->wake_reply) {         /* armed, or half-armed by a failed call */
      int one = 1;
      setsockopt (w->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    }
    bp_wire_set_rcvtimeo (w->fd, 0);
    fcntl (w->fd, F_SETFL, w->saved_flags);
  }
  free (w->req);
  free (w->iov);
  free (w->rx);
  w->req = NULL;
  w->iov = NULL;
  w->rx = NULL;
  w->fd = -1;
  w->flags_changed = false;
}

bool
bp_wire_idle (const struct bp_wire *w)
{
  return !w->dead && w->inflight == 0 && w->niov == w->iov_head
         && w->rx_head == w->rx_tail && w->phase == BP_WIRE_HDR;
}

void
bp_wire_queue (struct bp_wire *w, uint32_t slot, int op, uint64_t off,
               uint32_t len, char *rbuf, const char *wbuf)
{
  struct bp_wire_req *r = &w->req[slot];
  static const uint16_t types[BP_NOPS] = {
    [BP_OP_READ] = NBD_CMD_READ, [BP_OP_WRITE] = NBD_CMD_WRITE, [BP_OP_TRIM] = NBD_CMD_TRIM,
  };
  r->off = off;
  r->len = len;
  r->buf = rbuf;
  r->op = (uint8_t) op;
  r->error = 0;
  r->busy = true;
  bp_put32 (r->hdr, NBD_REQUEST_MAGIC);
  bp_put16 (r->hdr + 4, 0);
  bp_put16 (r->hdr + 6, types[op]);
  bp_put64 (r->hdr + 8, slot);
  bp_put64 (r->hdr + 16, off);
  bp_put32 (r->hdr + 24, len);
  w->iov[w->niov++] = (struct iovec) { r->hdr, sizeof r->hdr };
  if (op == BP_OP_WRITE)
    w->iov[w->niov++] = (struct iovec) { (void *) wbuf, len };
  w->inflight++;
}

int
bp_wire_flush (struct bp_wire *w)
{
  while (w->iov_head < w->niov) {
    unsigned n = w->niov - w->iov_head;
    struct msghdr m = { .msg_iov = &w->iov[w->iov_head],
                        .msg_iovlen = n > IOV_MAX ? IOV_MAX : n };
    ssize_t s = sendmsg (w->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (s < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        /* The rest goes when poll says POLLOUT.  Move it to the front:
         * the array has room for every request in flight, not for the
         * ones already sent as well. */
        memmove (w->iov, &w->iov[w->iov_head], (w->niov - w->iov_head) * sizeof *w->iov);
        w->niov -= w->iov_head;
        w->iov_head = 0;
        return 0;
      }
      return bp_wire_fail (w, "connection lost while sending: %s", strerror (errno));
    }
    size_t left = (size_t) s;
    while (left > 0) {
      struct iovec *v = &w->iov[w->iov_head];
      if (left >= v->iov_len) {
        left -= v->iov_len;
        w->iov_head++;
      }
      else {
        v->iov_base = (char *) v->iov_base + left;
        v->iov_len -= left;
        left = 0;
      }
    }
  }
  w->niov = w->iov_head = 0;
  return 0;
}

/* Finishes the reply for the current request: hands it to the caller. */
static void
bp_wire_retire (struct bp_wire *w, uint32_t slot, bp_wire_done_fn *done, void *opaque)
{
  struct bp_wire_req *r = &w->req[slot];
  r->busy = false;
  w->inflight--;
  done (opaque, slot, r->error);
}

/* Parses one reply header (and the fixed part of a chunk) at the front of
 * the receive buffer.  Returns 1 when one was consumed, 0 when more bytes
 * are needed, -1 on a protocol error. */
static int
bp_wire_header (struct bp_wire *w, bp_wire_done_fn *done, void *opaque)
{
  const uint8_t *p = w->rx + w->rx_head;
  size_t avail = w->rx_tail - w->rx_head;
  char what[96];
  if (avail < 4)
    return 0;
  uint32_t magic = bp_get32 (p);
  if (magic == NBD_SIMPLE_REPLY_MAGIC) {
    if (avail < 16)
      return 0;
    uint32_t err = bp_get32 (p + 4);
    uint64_t h = bp_get64 (p + 8);
    if (h >= w->depth || !w->req[h].busy)
      goto bad_handle;
    struct bp_wire_req *r = &w->req[h];
    w->rx_head += 16;
    r->error = err ? (int) err : 0;
    bp_wire_wake_note (w, r->op == BP_OP_READ && err == 0 && !w->structured
                       && 16u + (size_t) r->len == w->wake_reply);
    /* A successful simple reply to a read carries the whole data, and
     * structured replies forbid a simple reply to a read (it could not
     * say where its data ends). */
    if (r->op == BP_OP_READ && err == 0) {
      if (w->structured)
        return bp_wire_fail (w, "protocol error: %s", "simple reply to a read "
                             "after structured replies were negotiated");
      w->phase = BP_WIRE_DATA;
      w->cur = (uint32_t) h;
      w->dst = r->buf;
      w->left = r->len;
      w->last = true;
      return 1;
    }
    bp_wire_retire (w, (uint32_t) h, done, opaque);
    return 1;
  }
  if (magic != NBD_STRUCTURED_REPLY_MAGIC || !w->structured) {
    snprintf (what, sizeof what, "reply magic 0x%08x", magic);
    return bp_wire_fail (w, "protocol error: unexpected %s", what);
  }
  if (avail < 20)
    return 0;
  uint16_t flags = bp_get16 (p + 4), type = bp_get16 (p + 6);
  uint64_t h = bp_get64 (p + 8);
  uint32_t len = bp_get32 (p + 16);
  if (h >= w->depth || !w->req[h].busy)
    goto bad_handle;
  struct bp_wire_req *r = &w->req[h];
  bool last = flags & NBD_REPLY_FLAG_DONE;
  if (type & NBD_REPLY_TYPE_ERROR_BIT) {
    if (len < 6 || len > BP_WIRE_MAX_ERR_CHUNK)
      return bp_wire_fail (w, "protocol error: %s", "bad error chunk length");
    if (avail < 20 + (size_t) len)
      return 0;
    uint32_t err = bp_get32 (p + 20);
    bp_wire_wake_note (w, false);
    if (!r->error)
      r->error = err ? (int) err : EIO;
    w->rx_head += 20 + len;
  }
  else if (type == NBD_REPLY_TYPE_NONE) {
    if (len != 0 || !last)
      return bp_wire_fail (w, "protocol error: %s", "bad NONE chunk");
    bp_wire_wake_note (w, false);
    w->rx_head += 20;
  }
  else if (type == NBD_REPLY_TYPE_OFFSET_DATA || type == NBD_REPLY_TYPE_OFFSET_HOLE) {
    bool hole = type == NBD_REPLY_TYPE_OFFSET_HOLE;
    if (r->op != BP_OP_READ || len < 8 || (hole && len != 12))
      return bp_wire_fail (w, "protocol error: %s", "bad data chunk");
    if (avail < 20 + (size_t) (hole ? 12 : 8))
      return 0;
    uint64_t off = bp_get64 (p + 20);
    uint64_t n = hole ? bp_get32 (p + 28) : len - 8;
    if (off < r->off || off - r->off > r->len || n > r->len - (off - r->off))
      return bp_wire_fail (w, "protocol error: %s", "data chunk outside the request");
    w->rx_head += 20 + (hole ? 12 : 8);
    bp_wire_wake_note (w, !hole && last && off == r->off && n == r->len
                       && 28u + (size_t) n == w->wake_reply);
    if (hole)
      memset (r->buf + (off - r->off), 0, n);
    else {
      w->phase = BP_WIRE_DATA;
      w->cur = (uint32_t) h;
      w->dst = r->buf + (off - r->off);
      w->left = n;
      w->last = last;
      return 1;
    }
  }
  else {
    snprintf (what, sizeof what, "structured reply type %u", type);
    return bp_wire_fail (w, "protocol error: unexpected %s", what);
  }
  if (last)
    bp_wire_retire (w, (uint32_t) h, done, opaque);
  return 1;

 bad_handle:
  snprintf (what, sizeof what, "%llu", (unsigned long long) bp_get64 (p + 8));
  return bp_wire_fail (w, "protocol error: reply for unknown request handle %s", what);
}

/* Consumes what the receive buffer holds.  Returns -1 on a protocol
 * error, else 0. */
static int
bp_wire_parse (struct bp_wire *w, bp_wire_done_fn *done, void *opaque)
{
  for (;;) {
    if (w->phase == BP_WIRE_DATA) {
      size_t have = w->rx_tail - w->rx_head, n = have < w->left ? have : w->left;
      memcpy (w->dst, w->rx + w->rx_head, n);
      w->rx_head += n;
      w->dst += n;
      w->left -= n;
      if (w->left > 0)
        break;
      w->phase = BP_WIRE_HDR;
      if (w->last)
        bp_wire_retire (w, w->cur, done, opaque);
      continue;
    }
    int r = bp_wire_header (w, done, opaque);
    if (r <= 0)
      return r;
  }
  return 0;
}

int
bp_wire_recv (struct bp_wire *w, bp_wire_done_fn *done, void *opaque)
{
  if (w->dead)
    return -1;
  if (w->niov > w->iov_head) {
    /* Output is stuck: wait for either direction, so that a server that
     * only reads once we read its replies cannot deadlock us. */
    struct pollfd pfd = { .fd = w->fd, .events = POLLIN | POLLOUT };
    int n = poll (&pfd, 1, 200);
    if (n < 0 && errno != EINTR)
      return bp_wire_fail (w, "poll: %s", strerror (errno));
    if (n <= 0)
      return 0;
    if (pfd.revents & POLLOUT && bp_wire_flush (w) == -1)
      return -1;
    if (!(pfd.revents & (POLLIN | POLLHUP | POLLERR)))
      return 0;
  }
  ssize_t got;
  if (w->phase == BP_WIRE_DATA && w->left >= BP_WIRE_DIRECT
      && w->rx_head == w->rx_tail) {
    /* MSG_WAITALL: one call for the whole payload; the receive timeout
     * still returns what came so far.  Limit: with writes still queued
     * (RAND_RW), a server that finished this reply only after reading
     * them would cost us up to that timeout, not a deadlock. */
    got = recv (w->fd, w->dst, w->left, MSG_WAITALL);
    if (got > 0) {
      w->dst += got;
      w->left -= (size_t) got;
      if (w->left == 0) {
        w->phase = BP_WIRE_HDR;
        if (w->last)
          bp_wire_retire (w, w->cur, done, opaque);
      }
      return 1;
    }
  }
  else {
    if (w->rx_head == w->rx_tail)
      w->rx_head = w->rx_tail = 0;
    else if (w->rx_head > 0 && BP_WIRE_RXBUF - w->rx_tail < BP_WIRE_MAX_ERR_CHUNK + 20) {
      memmove (w->rx, w->rx + w->rx_head, w->rx_tail - w->rx_head);
      w->rx_tail -= w->rx_head;
      w->rx_head = 0;
    }
    size_t want = BP_WIRE_RXBUF - w->rx_tail;
    if (w->big_reads) {
      /* Large reads: take just the header (and a data chunk's offset), so
       * that the payload behind it lands in its buffer with one copy, not
       * first here and then again there. */
      size_t need = w->structured ? 28 : 16, have = w->rx_tail - w->rx_head;
      want = have < need ? need - have : need;
    }
    got = recv (w->fd, w->rx + w->rx_tail, want, w->big_reads ? MSG_WAITALL : 0);
    if (got > 0) {
      w->rx_tail += (size_t) got;
      return bp_wire_parse (w, done, opaque) == -1 ? -1 : 1;
    }
  }
  if (got == 0)
    return bp_wire_fail (w, "connection lost: %s", "the server closed it");
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
    return 0;                    /* the receive timeout: nothing arrived */
  return bp_wire_fail (w, "connection lost: %s", strerror (errno));
}
