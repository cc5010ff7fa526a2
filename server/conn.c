/* Connections: socket input and output on the shard's loop, back-pressure,
 * and the lifetime of a client from accept to free. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "internal.h"
#include "delayacct.h"

#define RBUF_SIZE        (64 * 1024)
/* A payload at least this big is read straight into its buffer (one copy
 * fewer), to its last byte; smaller ones go through rbuf, so many small
 * writes arrive in one read() instead of one read() each. */
#define DIRECT_THRESHOLD (32 * 1024)
#define READS_PER_EVENT  16           /* fairness among a shard's clients */
#define SEND_IOV_MAX     64
/* Handshake replies a client has not read: past this, stop parsing its
 * options, or a client that never reads could grow c->out without bound. */
#define OBUF_PAUSE       (64 * 1024)
/* Replies queued past this are sent before the next request runs, while
 * their bytes are still in cache: a client with 64 x 256 KiB reads in
 * flight would otherwise have 16 MiB read from the plugin before the first
 * byte is copied (or sealed) again, from memory instead of L2. */
#define SEND_EAGER       (128 * 1024)
/* A full socket stops the parser (running more reads then only fills
 * buffers nobody can send, and lets them go cold), but only for this
 * long: a client that writes requests without reading replies until it is
 * done (READ, then a WRITE and its payload, then read) would otherwise
 * wait for us while we wait for it.  After the timer the connection is
 * parsed as if the socket had room, bounded by --max-inflight and its
 * share of the pool, until the socket drains again.  A client reading at
 * network speed drains it in well under a millisecond. */
#define SEND_STALL_MS    20

static atomic_ullong next_conn_id = 1;
void (*conn_handoff_hook) (struct conn *c);

static void conn_on_read (evutil_socket_t fd, short what, void *arg);
static size_t handoff_need (const struct conn *c);
static void conn_on_write (evutil_socket_t fd, short what, void *arg);
static void conn_on_input (evutil_socket_t fd, short what, void *arg);
static void conn_on_stall (evutil_socket_t fd, short what, void *arg);
static bool conn_maybe_free (struct conn *c);
static void conn_resume_reading (struct conn *c);
static void conn_wake_waiters (struct shard *s);

static struct conn *
conn_new (struct shard *s, int fd, const char *peer)
{
  struct conn *c = calloc (1, sizeof *c);
  if (!c)
    return NULL;
  c->id = atomic_fetch_add (&next_conn_id, 1);
  snprintf (c->peer, sizeof c->peer, "%s", peer);
  c->log.conn_id = c->id;
  c->log.peer = c->peer;
  c->shard = s;
  c->fd = fd;
  c->held_fd = -1;
  c->t_created = c->t_active = now_ns ();
  c->rcap = RBUF_SIZE;
  c->rcvlowat = 1;                  /* the kernel's default */
  c->rbuf = malloc (c->rcap);
  if (!c->rbuf)
    goto fail;

  int fl = fcntl (fd, F_GETFL);
  if (fl == -1 || fcntl (fd, F_SETFL, fl | O_NONBLOCK) == -1)
    goto fail;
  int one = 1;
  /* Fails harmlessly on Unix sockets, and so tells them apart. */
  c->tcp = setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0;
  /* --tcp-congestion: BBR (a common default) paces its sends with a
   * timer per socket; a stream of big READ replies sent faster than its
   * pacing rate keeps arming it, and in a VM each arming and expiry exits
   * to the hypervisor, while on loopback there is nothing to pace for
   * (docs/ARCHITECTURE.md, "What a big READ costs").  main.c checked the
   * name at start. */
  if (c->tcp && cfg.tcp_congestion
      && setsockopt (fd, IPPROTO_TCP, TCP_CONGESTION, cfg.tcp_congestion,
                     strlen (cfg.tcp_congestion)) == -1) {
    /* Not expected once main.c's check passed with our rights; named
     * with the connection, which is not the current one yet. */
    const struct log_ctx *was = log_current;
    log_current = &c->log;
    log_warn ("--tcp-congestion %s: %m; this connection keeps the system's default",
              cfg.tcp_congestion);
    log_current = was;
  }

  c->ev_read = event_new (s->base, fd, EV_READ | EV_PERSIST, conn_on_read, c);
  c->ev_write = event_new (s->base, fd, EV_WRITE | EV_PERSIST, conn_on_write, c);
  c->ev_stall = evtimer_new (s->base, conn_on_stall, c);
  c->ev_input = event_new (s->base, fd, EV_READ, conn_on_input, c);
  if (!c->ev_read || !c->ev_write || !c->ev_stall || !c->ev_input)
    goto fail;
  backend_conn_init (&c->pc, fd);

  c->next = s->conns;
  if (s->conns)
    s->conns->prev = c;
  s->conns = c;
  s->nconns++;
  stats_conn_new (c);
  return c;

fail:
  if (c->ev_read)
    event_free (c->ev_read);
  if (c->ev_write)
    event_free (c->ev_write);
  if (c->ev_stall)
    event_free (c->ev_stall);
  if (c->ev_input)
    event_free (c->ev_input);
  free (c->rbuf);
  free (c);
  return NULL;
}

static void
conn_start (struct conn *c)
{
  log_current = &c->log;
  log_debug ("new connection");
  if (backend_conn_preconnect (&c->pc, cfg.readonly) == -1) {
    log_error ("plugin refused the connection (preconnect)");
    conn_close_now (c);
    return;
  }
  handshake_start (c);
  event_add (c->ev_read, NULL);
  conn_flush (c);
}

/* ---- output -------------------------------------------------------- */

/* sent_at: as delayacct_done's (NULL where r's reply was not just sent). */
static void
request_free (struct conn *c, struct request *r, uint64_t *sent_at)
{
  struct iobuf_pool *pool = c->shard->pool;
  delayacct_done (c, r, sent_at); /* counts, and the send time if fully sent */
  protocol_release (r);           /* lent memory or a placed payload goes back */
  c->buf_bytes -= r->held;
  if (r->buf)
    c->buf_bytes -= r->buf->cap;
  iobuf_put (pool, r->buf);
  request_put (pool, r);
  /* Idle time counts from the last reply too, not only the last request:
   * a request that ran longer than --idle-timeout is not idleness. */
  if (--c->inflight == 0 && cfg.idle_timeout)
    c->t_active = now_ns ();
}

static void
drop_output (struct conn *c)
{
  while (c->sendq_head) {
    struct request *r = c->sendq_head;
    c->sendq_head = r->next;
    request_free (c, r, NULL);
  }
  c->sendq_tail = NULL;
  c->sendq_bytes = 0;
  c->out.len = c->out.off = 0;
}

/* The transport: the socket, or TLS records once STARTTLS switched (the
 * STARTTLS ACK itself still goes out in clear). */
static inline ssize_t
conn_sendv (struct conn *c, struct iovec *iov, int n, int flags)
{
  if (c->tls && !(c->read_block & CONN_READ_STARTTLS))
    return tls_sendv (c, iov, n);
  struct msghdr msg = { .msg_iov = iov, .msg_iovlen = n };
  return sendmsg (c->fd, &msg, MSG_NOSIGNAL | flags);
}

/* What the send steps below tell their caller.  The first three are
 * tls_flushed's -1/0/1 too, so its answer passes straight through. */
enum send_result {
  SEND_CLOSE = -1,                /* an error: close the connection */
  SEND_IDLE = 0,                  /* nothing waits for the socket: all sent,
                                   * or TLS waits for the client's input (the
                                   * read event that brings it flushes again) */
  SEND_FULL = 1,                  /* the socket is full: wait for writability */
  SEND_AGAIN = 2,                 /* go on sending (EINTR, or more to send) */
};

/* A send that failed with errno: SEND_FULL, SEND_IDLE when TLS waits for
 * the client's input (reading must go on), SEND_AGAIN after EINTR, or
 * SEND_CLOSE. */
static enum send_result
send_failed (struct conn *c, const char *what)
{
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    if (tls_send_waits_input (c))
      return SEND_IDLE;
    if (!c->stall_expired)
      c->read_block |= CONN_READ_SEND_FULL;
    return SEND_FULL;
  }
  if (errno == EINTR)
    return SEND_AGAIN;
  if (errno != EPIPE && errno != ECONNRESET)
    log_error ("%s: %m", what);
  return SEND_CLOSE;
}

/* What a sendfile reply sends once its file ended early. */
static const uint8_t conn_zeros[64 * 1024];

/* The head reply's file data (its header is out): the kernel sends it
 * from the page cache.  SEND_AGAIN to go on, else as send_pending. */
static enum send_result
send_file_part (struct conn *c, struct request *r)
{
  ssize_t sent;
  if (r->send_fd >= 0) {
    off_t off = r->send_off;
    sent = sendfile (c->fd, r->send_fd, &off, r->send_len);
  }
  else {
    struct iovec v = { (void *) conn_zeros,
                       r->send_len < sizeof conn_zeros ? r->send_len : sizeof conn_zeros };
    sent = conn_sendv (c, &v, 1, 0);
  }
  if (sent < 0)
    return send_failed (c, r->send_fd >= 0 ? "sendfile" : "send");
  if (sent == 0) {
    /* The file shrank under the reply (another program truncated it).
     * The header promised send_len more bytes; the plugin's pread reads
     * past the end of the file as zeros, so the rest goes out as zeros:
     * the same bytes the copying path gives, and the connection and its
     * other requests go on.  Never the pool's bytes: nothing is copied.
     * Said once per connection: a truncated file would otherwise log a
     * line for every READ past its new end. */
    if (!c->sendfile_short_logged)
      log_warn ("sendfile: file ended %u bytes short of a READ reply; sending zeros for "
                "them (said once per connection)", r->send_len);
    c->sendfile_short_logged = true;
    r->send_fd = -1;
    return SEND_AGAIN;
  }
  if (cfg.idle_timeout)
    c->t_active = now_ns ();
  r->send_off += sent;
  r->send_len -= sent;
  c->sendq_bytes -= sent;
  if (r->send_len == 0) {
    c->sendq_head = r->next;
    if (!c->sendq_head)
      c->sendq_tail = NULL;
    request_free (c, r, NULL);
  }
  return SEND_AGAIN;
}

static inline ssize_t
conn_recv (struct conn *c, void *buf, size_t len)
{
  if (c->tls)
    return tls_recv (c, buf, len);
  return read (c->fd, buf, len);
}

/* Gather handshake bytes and as many queued replies as fit into one
 * sendmsg; repeat until the socket is full or nothing is left:
 * SEND_IDLE, SEND_FULL or SEND_CLOSE. */
static enum send_result
send_pending (struct conn *c)
{
  c->sendq_new = 0;
  for (;;) {
    struct iovec iov[SEND_IOV_MAX];
    int n = 0, flags = 0;
    struct request *h = c->sendq_head;
    if (c->out.off == c->out.len && h && h->iov_sent == h->niov && h->send_len) {
      enum send_result r = send_file_part (c, h);
      if (r != SEND_AGAIN)
        return r;
      continue;
    }
    if (c->out.off < c->out.len) {
      iov[n].iov_base = c->out.data + c->out.off;
      iov[n].iov_len = c->out.len - c->out.off;
      n++;
    }
    /* Gather up to a reply whose data is a file: sendfile sends that, right
     * behind its header (MSG_MORE keeps the header for the same segment). */
    for (struct request *r = c->sendq_head; r && n < SEND_IOV_MAX; r = r->next) {
      for (unsigned i = r->iov_sent; i < r->niov && n < SEND_IOV_MAX; i++)
        iov[n++] = r->iov[i];
      if (r->send_len) {
        flags = MSG_MORE;
        break;
      }
    }
    if (n == 0) {
      enum send_result r = c->tls ? tls_flushed (c) : SEND_IDLE;
      if (r == SEND_FULL && tls_unsent (c) && !c->stall_expired)
        c->read_block |= CONN_READ_SEND_FULL;   /* sealed records wait for the socket */
      return r;
    }

    ssize_t sent = conn_sendv (c, iov, n, flags);
    if (sent < 0) {
      enum send_result r = send_failed (c, "send");
      if (r == SEND_AGAIN)
        continue;
      if (r == SEND_IDLE) {
        /* TLS waits for the client's input: records sealed before that
         * still go out (the client may wait for them to send the rest). */
        r = tls_flushed (c);
        if (r == SEND_FULL && !c->stall_expired)
          c->read_block |= CONN_READ_SEND_FULL;
      }
      return r;
    }

    size_t left = sent;
    if (cfg.idle_timeout && sent > 0)
      c->t_active = now_ns ();      /* output moving: the client is alive */
    if (c->out.off < c->out.len) {
      size_t k = c->out.len - c->out.off < left ? c->out.len - c->out.off : left;
      c->out.off += k;
      left -= k;
      if (c->out.off == c->out.len)
        c->out.off = c->out.len = 0;
    }
    c->sendq_bytes -= left;
    uint64_t sent_at = 0;           /* one clock read for the replies this send ends */
    while (c->sendq_head && (left > 0 || c->sendq_head->iov_sent == c->sendq_head->niov)) {
      struct request *r = c->sendq_head;
      while (r->iov_sent < r->niov && left > 0) {
        struct iovec *v = &r->iov[r->iov_sent];
        if (left >= v->iov_len) {
          left -= v->iov_len;
          r->iov_sent++;
        }
        else {
          v->iov_base = (char *) v->iov_base + left;
          v->iov_len -= left;
          left = 0;
        }
      }
      if (r->iov_sent < r->niov || r->send_len)
        break;                      /* more iovecs, or its file data */
      c->sendq_head = r->next;
      if (!c->sendq_head)
        c->sendq_tail = NULL;
      request_free (c, r, &sent_at);
    }
  }
}

/* Reading was paused: resume once nothing that paused it still holds. */
static void
resume_if_unblocked (struct conn *c)
{
  if ((c->read_block & (CONN_READ_PAUSED | CONN_READ_BUFFERS | CONN_READ_SEND_FULL
                        | CONN_READ_HS_CALL)) == CONN_READ_PAUSED && !c->stalled_req
      && c->inflight < cfg.max_inflight && c->out.len - c->out.off <= OBUF_PAUSE)
    conn_resume_reading (c);
}

/* Send what can be sent; watch for writability if the socket is full;
 * resume reading if back-pressure eased; free the connection when done. */
void
conn_flush (struct conn *c)
{
  if (c->fd >= 0) {
    enum send_result r = send_pending (c);
    if (r == SEND_CLOSE) {
      conn_close_now (c);
      return;
    }
    if (r == SEND_FULL)
      event_add (c->ev_write, NULL);
    else {
      event_del (c->ev_write);
      c->read_block &= ~CONN_READ_SEND_FULL;
      c->stall_expired = false;
      event_del (c->ev_stall);
    }
    /* TLS waits for the client's input to send, and reading is paused
     * (requests in flight at the limit, a pool wait, closing): nothing
     * would read the rest of the message.  Flush once the socket is
     * readable; SSL_write reads it itself. */
    bool watch = r == SEND_IDLE && c->tls && tls_send_waits_input (c)
                 && (c->read_block & CONN_READ_PAUSED);
    if (watch != c->input_watch) {
      if (watch)
        event_add (c->ev_input, NULL);
      else
        event_del (c->ev_input);
      c->input_watch = watch;
    }
  }
  if (conn_maybe_free (c))
    return;
  resume_if_unblocked (c);
  if (__builtin_expect (c->handoff, 0))
    conn_handoff_hook (c);
}

static void
conn_on_write (evutil_socket_t fd, short what, void *arg)
{
  struct conn *c = arg;
  struct shard *s = c->shard;
  log_current = &c->log;
  conn_flush (c);
  if (s->waiters)
    conn_wake_waiters (s);
  log_current = NULL;
}

/* Input for a TLS message SSL_write waits on, while reading is paused:
 * the one-shot watch has fired; flushing lets SSL_write read it. */
static void
conn_on_input (evutil_socket_t fd, short what, void *arg)
{
  struct conn *c = arg;
  c->input_watch = false;
  conn_on_write (fd, what, arg);
}

/* Does the reply built for r send bytes from its pool buffer? */
static bool
reply_uses_buf (const struct request *r)
{
  const char *lo = r->buf->data, *hi = lo + r->buf->cap;
  for (unsigned i = 0; i < r->niov; i++) {
    const char *p = r->iov[i].iov_base;
    if (p >= lo && p < hi)
      return true;
  }
  return false;
}

/* Queue c's replies for the flush at the end of this round (the shard's
 * flush list): one send for all the replies a round completes. */
static void
conn_mark_flush (struct shard *s, struct conn *c)
{
  if (c->flush_pending)
    return;
  c->flush_pending = true;
  c->flush_next = s->flush_list;
  s->flush_list = c;
}

static void
conn_flush_marked (struct shard *s)
{
  while (s->flush_list) {
    struct conn *c = s->flush_list;
    s->flush_list = c->flush_next;
    c->flush_pending = false;
    conn_flush (c);               /* may free c */
  }
}

/* A finished request, reply already built: queue it behind the others. */
static void
conn_on_complete (struct request *r)
{
  struct conn *c = r->conn;

  if (c->fd < 0) {                  /* client gone: nobody to answer */
    request_free (c, r, NULL);
    conn_maybe_free (c);
    return;
  }
  r->next = NULL;
  if (c->sendq_tail)
    c->sendq_tail->next = r;
  else
    c->sendq_head = r;
  c->sendq_tail = r;
  for (unsigned i = 0; i < r->niov; i++)
    c->sendq_bytes += r->iov[i].iov_len;
  c->sendq_bytes += r->send_len;
  c->sendq_new++;
  /* A reply that does not send from its pool buffer (a WRITE's, whose
   * payload the plugin has consumed; an error; lent memory; a file) gives
   * it back now, not once the client has read the reply.  For a stream of
   * WRITEs this is what keeps the payload buffer warm: replies go out in
   * batches, and a buffer held until its reply left would make the next
   * WRITEs take others, a buffer per request in the batch, whose lines the
   * plugin's copy into its own (cold) memory has evicted by then; given
   * back now, the next WRITE receives into the one the plugin just read.
   * Lent memory still counts against the connection's share until it is
   * sent: it pins the plugin's memory (a chunk replaced meanwhile stays
   * alive for it), and a client that never reads must not pin more than
   * the pool would let it hold.  A file's pages belong to the page cache. */
  if (r->buf && (r->nlent || r->send_len || !reply_uses_buf (r))) {
    c->buf_bytes -= r->buf->cap;
    iobuf_put (c->shard->pool, r->buf);
    r->buf = NULL;
    if (r->nlent) {
      r->held = r->lent_bytes;
      c->buf_bytes += r->held;      /* request_free gives it back */
    }
  }
  /* Big replies go out now, before the next request evicts them from
   * cache; and so do --reply-batch small ones, so that a client that
   * waits for replies before it sends more (a queue depth's worth at a
   * time) is woken while the rest of the batch is still being served,
   * not after it: where a wake-up across CPUs is dear, the client's and
   * the server's work then overlap instead of taking turns.  Not for
   * TLS, where each send seals records of its own.  A full socket sets
   * CONN_READ_SEND_FULL, which stops the parser.  An error stops it too
   * (CONN_READ_CLOSING); the conn_flush that follows every batch meets
   * the error again and closes: closing here would free c under the
   * parser. */
  bool batch_full = cfg.reply_batch && c->sendq_new >= cfg.reply_batch && !c->tls;
  if ((c->sendq_bytes >= SEND_EAGER || batch_full) && c->phase == CONN_TRANSMISSION
      && !(c->read_block & (CONN_READ_SEND_FULL | CONN_READ_CLOSING | CONN_READ_STARTTLS))
      && send_pending (c) == SEND_CLOSE)
    c->read_block |= CONN_READ_CLOSING;  /* stop parsing; conn_flush closes */
  conn_mark_flush (c->shard, c);
}

/* A worker finished a handshake option's plugin calls: queue the
 * answer; conn_flush sends it and resumes reading, which parses the
 * options the client sent behind it.  A connection closed meanwhile is
 * closed for good now (conn_close_now kept its socket), and freed. */
static void
conn_handshake_answered (struct request *r)
{
  struct conn *c = r->conn;
  request_put (c->shard->pool, r);
  c->inflight--;
  c->read_block &= ~CONN_READ_HS_CALL;
  log_current = &c->log;
  if (c->fd < 0 || c->phase == CONN_CLOSING || (c->read_block & CONN_READ_CLOSING)) {
    handshake_call_discard (c);
    conn_close_now (c);             /* frees c */
  }
  else {
    if (handshake_call_done (c) == -1)
      c->read_block |= CONN_READ_CLOSING;   /* conn_flush closes once it is sent */
    conn_mark_flush (c->shard, c);
  }
  log_current = NULL;
}

/* Requests workers and the plugin's aio finished (shard.c, after each
 * wake-up): queue them, send, and let pool waiters retry. */
static void
conn_completed (struct shard *s, struct request *done)
{
  while (done) {
    struct request *r = done;
    done = r->next;
    if (__builtin_expect (r->type == REQUEST_HANDSHAKE, 0))
      conn_handshake_answered (r);
    else
      conn_on_complete (r);
  }
  conn_flush_marked (s);
  conn_wake_waiters (s);
}

/* ---- requests: from the parser to the shard ------------------------- */

/* Run r (shard.c); a reply built at once is queued here. */
static inline void
conn_dispatch (struct request *r)
{
  if (shard_dispatch (r))
    conn_on_complete (r);
}

/* The parser handed back: do what it asks.  False: stop parsing. */
static bool
conn_take (struct conn *c, enum protocol_next next, struct request *r);

/* Park c until pool buffers come back (conn_wake_waiters). */
static void
conn_wait_buffers (struct conn *c)
{
  struct shard *s = c->shard;
  if (c->read_block & CONN_READ_BUFFERS)
    return;
  c->read_block |= CONN_READ_BUFFERS;
  c->wait_next = s->waiters;
  s->waiters = c;
}

/* Buffers came back: let waiting connections try again.  Each waiter
 * needs only its one buffer to move on; resuming schedules its read
 * callback rather than running it, so the list is stable while we walk. */
static void
conn_wake_waiters (struct shard *s)
{
  struct conn **pp = &s->waiters;
  while (*pp) {
    struct conn *c = *pp;
    struct request *r = NULL;
    enum protocol_next next = protocol_retry_stalled (c, &r);
    if (next != PROTOCOL_STALLED) {
      *pp = c->wait_next;
      c->read_block &= ~CONN_READ_BUFFERS;
      /* A WRITE's payload is left to the read callback resuming runs:
       * it parses as the stream allows (CLOSING, a full socket). */
      if (next != PROTOCOL_PAYLOAD)
        conn_take (c, next, r);
      conn_resume_reading (c);
    }
    else
      pp = &c->wait_next;
  }
  /* A retried request may have run inline and queued its reply. */
  conn_flush_marked (s);
}

/* The buffered part of c->recv_req's payload into its place (the pool
 * buffer, or the pieces the plugin placed it in); true once it is whole. */
static bool
payload_from_rbuf (struct conn *c)
{
  struct request *r = c->recv_req;
  struct iovec v;
  while (c->roff < c->rlen && protocol_payload_iov (r, c->recv_have, &v, 1) == 1) {
    size_t avail = c->rlen - c->roff;
    size_t k = v.iov_len < avail ? v.iov_len : avail;
    memcpy (v.iov_base, c->rbuf + c->roff, k);
    c->recv_have += k;
    c->roff += k;
  }
  return c->recv_have >= r->count;
}

/* A WRITE whose payload rbuf holds whole, run on the shard thread at
 * once: the plugin reads the payload where it lies, without the copy into
 * the pool buffer first (the kernel client's small writes arrive several
 * to a read, each header with its payload).  rbuf is not touched until
 * the plugin call returns: nothing reads inside it.  A request for a
 * worker or the plugin's aio outlives this round, and takes the copy; so
 * does one for a stack run inline only because the user said so
 * (--dispatch inline on rawio): its plugin may do O_DIRECT from the
 * page-aligned pool buffer, where an address in rbuf would cost it a
 * bounce buffer.  In-memory stacks copy from anywhere. */
static bool
payload_in_place (struct conn *c)
{
  struct request *r = c->recv_req;
  if (c->recv_have || r->placed || c->rlen - c->roff < r->count || !backend_inline_safe ()
      || !shard_runs_inline (r))
    return false;
  r->payload = c->rbuf + c->roff;
  c->roff += r->count;
  c->recv_have = r->count;
  return true;
}

static bool
conn_take (struct conn *c, enum protocol_next next, struct request *r)
{
  switch (next) {
  case PROTOCOL_RUN:
    conn_dispatch (r);
    return true;
  case PROTOCOL_ANSWER:
    conn_on_complete (r);
    return true;
  case PROTOCOL_PAYLOAD:
    if (!payload_in_place (c) && !payload_from_rbuf (c))
      return false;                 /* read_some reads the rest */
    r = c->recv_req;
    c->recv_req = NULL;
    conn_dispatch (r);
    return true;
  case PROTOCOL_STALLED:
    conn_wait_buffers (c);
    return false;
  case PROTOCOL_WAIT:
  case PROTOCOL_CLOSE:
    break;
  }
  return false;
}

/* Transmission: parse requests from rbuf and start each; 0 to go on
 * reading, -1 to close. */
static int
conn_parse (struct conn *c)
{
  for (;;) {
    struct request *r = NULL;
    enum protocol_next next = protocol_consume (c, &r);
    if (next == PROTOCOL_CLOSE)
      return -1;
    if (!conn_take (c, next, r))
      return 0;
  }
}

/* ---- input --------------------------------------------------------- */

/* An option needs the layer stack: run its calls, inline or on a worker
 * (conn_pump then stops reading until conn_handshake_answered).  0 once
 * answered, -1 to close, HANDSHAKE_CALL while a worker has it. */
static int
conn_handshake_call (struct conn *c)
{
  switch (shard_handshake_call (c)) {
  case 1:
    return handshake_call_done (c);
  case 0:
    c->read_block |= CONN_READ_HS_CALL;
    return HANDSHAKE_CALL;
  default:
    log_error ("cannot queue the handshake's plugin call: %m");
    handshake_call_discard (c);
    return -1;
  }
}

static int
process_input (struct conn *c)
{
  while (c->phase == CONN_HS_CLIENT_FLAGS || c->phase == CONN_HS_OPTIONS) {
    enum conn_phase before = c->phase;
    size_t avail = c->rlen - c->roff;
    int r = handshake_consume (c);
    if (r == HANDSHAKE_CALL && (r = conn_handshake_call (c)) == HANDSHAKE_CALL)
      return 0;                     /* conn_pump stops reading */
    if (r == -1)
      return -1;
    if (c->out.len - c->out.off > OBUF_PAUSE)
      return 0;                     /* conn_pump pauses until it drains */
    if (c->phase == before && c->rlen - c->roff == avail)
      return 0;                     /* needs more bytes */
  }
  if (c->phase == CONN_TRANSMISSION)
    return conn_parse (c);
  return 0;
}

static void
pause_reading (struct conn *c)
{
  if (!(c->read_block & CONN_READ_PAUSED)) {
    event_del (c->ev_read);
    c->read_block |= CONN_READ_PAUSED;
  }
}

/* What read_some returns when it read nothing (0 is EOF, more is bytes). */
enum read_result {
  READ_ERROR = -1,                /* errno says why: close */
  READ_EMPTY = -2,                /* the socket has nothing now */
  READ_RBUF_FULL = -3,            /* rbuf is full: parse what it holds first */
};

/* Read once into the right place: straight into a big write payload's
 * buffer, else into rbuf.  Returns bytes read, 0 at EOF, or an enum
 * read_result. */
static ssize_t
read_some (struct conn *c)
{
  ssize_t n;
  size_t want, need = SIZE_MAX;
  struct request *r = c->recv_req;

  /* A live restart waits for this request to arrive whole; the next one
   * stays in the socket for the next image. */
  if (__builtin_expect (c->handoff, 0) && (need = handoff_need (c)) == 0) {
    c->read_drained = true;
    return -2;
  }
  if (r && r->count >= DIRECT_THRESHOLD && c->roff == c->rlen) {
    /* Into the payload's buffer, or the pieces the plugin placed it in,
     * and the next request's header into rbuf in the same readv: a client
     * with writes queued has it right behind the payload, and reading it
     * now saves the read (and often the epoll round) that would fetch it
     * alone.  Only the header: the next payload goes to its own buffer
     * once the header says where.  A big payload's short tail too: read
     * into rbuf, it would bring the next big payload's first rbuf-full
     * with it, and that would be copied out of rbuf again.  TLS reads a
     * record at a time. */
    struct iovec v[8];
    unsigned nv = protocol_payload_iov (r, c->recv_have, v, c->tls ? 1 : 7);
    size_t payload = 0;
    for (unsigned i = 0; i < nv; i++)
      payload += v[i].iov_len;
    want = payload;
    c->roff = c->rlen = 0;
    if (!c->tls && payload == r->count - c->recv_have && !c->handoff) {
      v[nv++] = (struct iovec) { c->rbuf, protocol_header_size (c) };
      want += protocol_header_size (c);
    }
    c->write_stream = true;
    n = c->tls ? tls_recv (c, v[0].iov_base, v[0].iov_len) : readv (c->fd, v, nv);
    if (n > 0) {
      size_t k = (size_t) n < payload ? (size_t) n : payload;
      c->recv_have += k;
      c->rlen = n - k;
    }
  }
  else if (c->write_stream && !r && !c->discard_left && c->roff == c->rlen
           && c->phase == CONN_TRANSMISSION && !c->tls) {
    /* The last request was a big WRITE: the next is likely one too, so
     * read only its header, and the payload goes straight to its buffer
     * on the next read instead of through rbuf and a copy.  Costs one
     * read when the guess is wrong (write_stream is then cleared). */
    c->roff = c->rlen = 0;
    c->write_stream = false;        /* the direct read above sets it again */
    want = protocol_header_size (c);
    n = read (c->fd, c->rbuf, want);
    if (n > 0)
      c->rlen = n;
  }
  else {
    /* Keep room for the largest unit we parse whole (an option), so a
     * header or option never straddles the end of rbuf. */
    if (c->roff == c->rlen)
      c->roff = c->rlen = 0;
    else if (c->roff > 0 && c->rcap - c->rlen < c->rcap / 2) {
      memmove (c->rbuf, c->rbuf + c->roff, c->rlen - c->roff);
      c->rlen -= c->roff;
      c->roff = 0;
    }
    if (c->rlen == c->rcap)
      return READ_RBUF_FULL;        /* the parser is waiting on us */
    want = c->rcap - c->rlen;
    if (want > need)
      want = need;
    n = conn_recv (c, c->rbuf + c->rlen, want);
    if (n > 0)
      c->rlen += n;
  }
  if (n > 0 && cfg.delayacct != DELAYACCT_OFF)
    c->t_read = now_ns ();          /* the queued phase of what it brought */
  /* Less than we asked for: the socket is empty now, so another read
   * would only say EAGAIN.  Let the loop ask epoll instead. */
  c->read_drained = n >= 0 && (size_t) n < want
                    && (!c->tls || !tls_pending (c));  /* TLS: a record at a time */
  if (n < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? READ_EMPTY : READ_ERROR;
  return n;
}

/* Going back to epoll with part of a big WRITE payload still to come:
 * ask the kernel not to wake us until the rest is there (SO_RCVLOWAT),
 * instead of once per segment, each wake-up a readv of a piece of the
 * payload; back to 1 byte otherwise, so a lone request wakes us at once.
 * Only the payload, never the next header: a client with nothing more to
 * send would wait for ever.  The kernel still wakes us early when its
 * receive window is nearly closed, at EOF and on errors.  Capped, so a
 * huge payload takes a few wake-ups rather than a huge receive buffer.
 * Clear text only: a TLS record does not map to a byte count.  AF_UNIX
 * accepts the option but its poll ignores it: no gain there, no harm.
 * Limit: on TCP the kernel may also raise the receive buffer and clamp
 * the window to the mark the first time (tcp_set_rcvlowat); the mark is
 * at least what the client is about to send, so that never stalls it. */
#define LOWAT_MAX (1024 * 1024)

/* Set the mark to want (bytes), keeping the shard's count of
 * connections that wait on one.  A socket that refuses keeps the mark
 * it has and is left alone from then on; -1 when that mark is above one
 * byte: it could outlast the payload it was set for, and the loop would
 * sleep through the requests after it, so the caller stops reading. */
static int
conn_lowat_to (struct conn *c, int want)
{
  if (want == c->rcvlowat)
    return 0;
  if (setsockopt (c->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == -1) {
    c->lowat_off = true;
    if (c->rcvlowat == 1) {
      log_debug ("SO_RCVLOWAT: %m; waking per segment");
      return 0;
    }
    log_error ("SO_RCVLOWAT: %m; the mark stays at %d bytes: closing", c->rcvlowat);
    return -1;
  }
  if (want > 1 && c->rcvlowat == 1)
    c->shard->lowat_conns++;
  else if (want == 1)
    c->shard->lowat_conns--;
  c->rcvlowat = want;
  return 0;
}

static int
conn_set_lowat (struct conn *c)
{
  int want = 1;
  if (c->lowat_off)
    return 0;
  if (c->recv_req && c->roff == c->rlen) {
    uint32_t left = c->recv_req->count - c->recv_have;
    if (left >= DIRECT_THRESHOLD)
      want = left < LOWAT_MAX ? (int) left : LOWAT_MAX;
  }
  return conn_lowat_to (c, want);
}

/* While the shard works through a stream of big WRITEs, the mark is
 * raised far above anything queued (conn_pump), and conn_set_lowat puts
 * it back before the loop sleeps.  The mark changes when TCP
 * acknowledges: data that arrives while the application has not read
 * what came before (and the window would shrink) is acknowledged only
 * when we read it, unless less than the mark is queued
 * (__tcp_ack_snd_check).  Those held acknowledgements are what let the
 * client send: its congestion window (a few dozen segments on loopback
 * with BBR) fills with segments sitting unread in our receive queue, the
 * rest of its refill waits in its socket, and each readv here then
 * acknowledges, which on loopback runs the client's transmit of the
 * next segments on our CPU, inside our readv.  With every segment pair
 * acknowledged on arrival, the client's whole queue depth reaches our
 * receive queue, and the shard reads a backlog
 * instead of taking turns with the client.  Costs two setsockopt calls
 * per wake-up of a big-write stream; TCP only (a Unix socket has no
 * acknowledgements to hurry).  Limit: a receive buffer locked
 * small (SO_RCVBUF) caps the mark at half of it, and the kernel may
 * raise an unlocked buffer to fit the mark (tcp_set_rcvlowat) — within
 * net.ipv4.tcp_rmem's maximum, which autotuning reaches anyway. */
#define LOWAT_ACK (8 * 1024 * 1024)

/* Stop reading: answer what came, then close (conn_maybe_free does, once
 * the replies are out). */
static void
conn_answer_then_close (struct conn *c)
{
  c->read_block |= CONN_READ_CLOSING;
  pause_reading (c);
}

/* Input handling shared by the read event and resumption after a pause. */
static void
conn_pump (struct conn *c, bool do_read)
{
  bool blocked = false;
  /* Acknowledge at once meanwhile (above); a mark that then cannot come
   * down stops reading before anything is read under it. */
  bool mark_stuck = c->write_stream && c->tcp && !c->lowat_off && !c->tls && c->fd >= 0
                    && conn_lowat_to (c, LOWAT_ACK) == -1;

  for (int i = 0; !mark_stuck && i < READS_PER_EVENT; i++) {
    if (do_read) {
      ssize_t n = read_some (c);
      if (n == 0) {
        log_debug ("client closed the connection");
        conn_close_now (c);
        return;
      }
      if (n == READ_ERROR) {
        if (errno != ECONNRESET && errno != EPROTO)   /* EPROTO: tls.c logged it */
          log_error ("read: %m");
        conn_close_now (c);
        return;
      }
      if (n == READ_EMPTY || n == READ_RBUF_FULL) {
        blocked = n == READ_EMPTY;
        if (c->rlen == c->roff && !c->recv_req)
          break;
        i = READS_PER_EVENT;        /* parse what is buffered, then stop */
      }
    }
    do_read = true;
    if (process_input (c) == -1) {
      conn_answer_then_close (c);   /* a protocol error */
      break;
    }
    if (c->out.len - c->out.off > OBUF_PAUSE) {
      pause_reading (c);
      break;
    }
    if (c->phase == CONN_CLOSING || (c->read_block & (CONN_READ_CLOSING | CONN_READ_HS_CALL))) {
      pause_reading (c);
      break;
    }
    if (c->read_block & CONN_READ_SEND_FULL) {
      pause_reading (c);
      static const struct timeval stall = { 0, SEND_STALL_MS * 1000 };
      if (!evtimer_pending (c->ev_stall, NULL))
        evtimer_add (c->ev_stall, &stall);
      break;
    }
    if (c->stalled_req || c->inflight >= cfg.max_inflight) {
      pause_reading (c);
      break;
    }
    if (c->read_drained)
      break;
  }
  /* A mark stuck above one byte: close rather than sleep on it. */
  if (mark_stuck
      || (!c->tls && c->fd >= 0 && c->phase == CONN_TRANSMISSION && conn_set_lowat (c) == -1))
    conn_answer_then_close (c);
  if (c->handoff && c->fd >= 0 && handoff_need (c) == 0)
    pause_reading (c);              /* at a request boundary: no more input */
  /* TLS may hold whole records the socket will not announce again. */
  if (c->tls && !blocked && !(c->read_block & CONN_READ_PAUSED) && tls_pending (c))
    event_active (c->ev_read, EV_READ, 1);
  /* Replies queued this round put c on the shard's flush list, which the
   * read callback flushes right after: once per wake-up, not twice. */
  if (!c->flush_pending)
    conn_flush (c);
}

static void
conn_on_read (evutil_socket_t fd, short what, void *arg)
{
  struct conn *c = arg;
  struct shard *s = c->shard;
  log_current = &c->log;
  s->reads++;
  if (s->last_reader != c) {        /* several clients busy: no polling (shard.c) */
    s->last_reader = c;
    s->last_reader_fd = c->fd;      /* where its client runs (shard.c) */
    s->last_reader_id = c->id;
    s->reader_changes++;
  }
  if (cfg.idle_timeout)
    c->t_active = now_ns ();       /* vDSO: no syscall */
  conn_pump (c, true);
  conn_flush_marked (s);
  /* Replies just sent gave buffers back; a connection parked on the pool
   * (maybe this one) can go on.  Nothing else would wake it when the
   * socket took every byte. */
  if (s->waiters)
    conn_wake_waiters (s);
  log_current = NULL;
}

/* The socket stayed full for SEND_STALL_MS: parse without waiting for it
 * until it drains (conn_flush clears stall_expired). */
static void
conn_on_stall (evutil_socket_t fd, short what, void *arg)
{
  struct conn *c = arg;
  log_current = &c->log;
  c->stall_expired = true;
  c->read_block &= ~CONN_READ_SEND_FULL;
  resume_if_unblocked (c);
  log_current = NULL;
}

static void
conn_resume_reading (struct conn *c)
{
  if (c->fd < 0 || (c->read_block & (CONN_READ_CLOSING | CONN_READ_HS_CALL))
      || c->phase == CONN_CLOSING)
    return;
  if ((c->read_block & CONN_READ_PAUSED) && !(c->handoff && handoff_need (c) == 0)) {
    c->read_block &= ~CONN_READ_PAUSED;
    event_add (c->ev_read, NULL);
  }
  /* Bytes already buffered are not announced by the socket again: run
   * the read callback from the loop (never from here: conn_flush calls us,
   * and pumping from inside it would recurse). */
  if (c->rlen > c->roff || (c->tls && tls_pending (c)))
    event_active (c->ev_read, EV_READ, 1);
}

/* ---- shutdown ------------------------------------------------------ */

/* Server shutdown: take no new requests, finish the ones in flight, then
 * close.  A write whose payload has not fully arrived was never
 * acknowledged, so it is dropped. */
void
conn_shutdown (struct conn *c)
{
  log_current = &c->log;
  c->read_block |= CONN_READ_CLOSING;
  pause_reading (c);
  if (c->phase != CONN_TRANSMISSION) {
    conn_close_now (c);
    return;
  }
  conn_flush (c);
}

/* ---- live restart (restart.c) ---------------------------------------- */

/* Bytes still to read from the socket to finish the request whose start
 * is buffered: its header's rest, its payload's rest, or the rest of a
 * payload being discarded; 0 when what is buffered ends at a request
 * boundary (complete headers still buffered are parsed first). */
static size_t
handoff_need (const struct conn *c)
{
  size_t avail = c->rlen - c->roff;
  if (c->recv_req) {
    uint64_t left = c->recv_req->count - c->recv_have;
    return left > avail ? left - avail : 0;
  }
  if (c->discard_left)
    return c->discard_left > avail ? c->discard_left - avail : 0;
  size_t hdr = protocol_header_size (c);
  return avail > 0 && avail < hdr ? hdr - avail : 0;
}

void
conn_quiesce (struct conn *c, bool on)
{
  log_current = &c->log;
  c->handoff = on;
  if (on) {
    if (handoff_need (c) == 0)
      pause_reading (c);
    conn_flush (c);               /* may find it ready at once */
  }
  else
    resume_if_unblocked (c);
  log_current = NULL;
}

bool
conn_handoff_ready (const struct conn *c)
{
  return c->handoff && c->fd >= 0 && !c->tls && c->phase == CONN_TRANSMISSION
         && !(c->read_block & CONN_READ_CLOSING) && c->inflight == 0 && !c->recv_req
         && !c->stalled_req && !c->discard_left && c->rlen == c->roff && !c->sendq_head
         && c->out.len == c->out.off;
}

/* Release requests that never reached the plugin. */
static void
drop_unstarted (struct conn *c)
{
  if (c->recv_req) {
    request_free (c, c->recv_req, NULL);
    c->recv_req = NULL;
  }
  if (c->stalled_req) {
    request_free (c, c->stalled_req, NULL);
    c->stalled_req = NULL;
  }
  if (c->discard_req) {
    request_free (c, c->discard_req, NULL);
    c->discard_req = NULL;
  }
}

static void
conn_events_off (struct conn *c)
{
  event_del (c->ev_read);
  event_del (c->ev_write);
  event_del (c->ev_stall);
  event_del (c->ev_input);
  c->input_watch = false;
}

void
conn_close_now (struct conn *c)
{
  struct shard *s = c->shard;

  if (s->last_reader == c) {
    s->last_reader = NULL;          /* shard.c's polling must not ask its socket */
    s->last_reader_fd = -1;
  }
  if (c->fd >= 0 && (c->read_block & CONN_READ_HS_CALL)) {
    /* A worker is in the plugin's .open (or .list_exports) for this
     * connection, which may ask for the client's address on this socket
     * (nbdkit_peer_name): the descriptor stays ours until the call
     * returns (conn_handshake_answered closes it then), so no new
     * connection can get its number meanwhile.  The client sees its
     * connection end now. */
    conn_events_off (c);
    tls_free (c);
    shutdown (c->fd, SHUT_RDWR);
    c->read_block |= CONN_READ_CLOSING;
    c->phase = CONN_CLOSING;
    drop_output (c);
    return;
  }
  drop_unstarted (c);
  drop_output (c);                  /* both count in inflight */
  if (c->fd >= 0) {
    conn_events_off (c);
    tls_free (c);
    if (c->inflight > 0) {
      /* Workers (or the plugin's aio) hold requests of this connection,
       * and the plugin may use the socket meanwhile (nbdkit_peer_name,
       * nbdkit_nanosleep read peer_fd, unlocked): closing would let a new
       * client's socket get the number.  Shut down now, so the client sees
       * the end, and close once the last request is back
       * (conn_maybe_free).  Everything else treats the client as gone. */
      shutdown (c->fd, SHUT_RDWR);
      c->held_fd = c->fd;
    }
    else {
      close (c->fd);
      c->pc.ctx.peer_fd = -1;
    }
    c->fd = -1;
  }
  c->phase = CONN_CLOSING;
  conn_maybe_free (c);
}

/* Free once nothing refers to the connection any more: no request with a
 * worker, no reply unsent (or no socket to send it on). */
static bool
conn_maybe_free (struct conn *c)
{
  bool closing = c->fd < 0 || (c->read_block & CONN_READ_CLOSING);
  if (!closing)
    return false;
  if (c->fd >= 0 && (c->sendq_head || c->out.len > c->out.off || tls_unsent (c)))
    return false;                   /* still sending the last replies */
  if (c->fd >= 0) {
    drop_unstarted (c);
    if (c->inflight > 0)
      return false;
    conn_events_off (c);
    tls_free (c);                   /* close_notify goes out before the FIN */
    close (c->fd);
    c->fd = -1;
  }
  if (c->inflight > 0)
    return false;                   /* workers still hold requests */
  if (c->held_fd >= 0) {            /* no request left to use it */
    close (c->held_fd);
    c->held_fd = -1;
    c->pc.ctx.peer_fd = -1;
  }

  struct shard *s = c->shard;
  log_debug ("connection closed");
  for (struct conn **pp = &s->waiters; *pp; pp = &(*pp)->wait_next)
    if (*pp == c) {
      *pp = c->wait_next;
      break;
    }
  for (struct conn **pp = &s->flush_list; *pp; pp = &(*pp)->flush_next)
    if (*pp == c) {
      *pp = c->flush_next;
      break;
    }
  backend_conn_fini (&c->pc);
  tls_free (c);
  if (c->prev)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  s->nconns--;
  if (c->rcvlowat > 1)
    s->lowat_conns--;
  event_free (c->ev_read);
  event_free (c->ev_write);
  event_free (c->ev_stall);
  event_free (c->ev_input);
  if (s->last_reader == c) {
    s->last_reader = NULL;          /* a new conn may get this address */
    s->last_reader_fd = -1;
  }
  free (c->rbuf);
  free (c->out.data);
  free (c->export_name);
  if (log_current == &c->log)
    log_current = NULL;
  stats_conn_gone (c);
  shard_conn_gone (s, c);
  free (c);
  return true;
}

/* ---- the shard's side ------------------------------------------------ */

/* Timeouts: handshake not finished, or idle (nothing in flight, or
 * replies the client is not reading: a client that stops reading must not
 * hold its buffers for ever).  Once a second while a connection may still
 * meet one (shard.c); returns whether one may. */
static bool
conn_sweep (struct shard *s)
{
  uint64_t now = now_ns ();
  const uint64_t sec = 1000000000;

  for (struct conn *c = s->conns, *next; c; c = next) {
    next = c->next;
    if (c->fd < 0)
      continue;
    log_current = &c->log;
    if (c->phase != CONN_TRANSMISSION && c->phase != CONN_CLOSING && cfg.handshake_timeout
        && now - c->t_created >= cfg.handshake_timeout * sec) {
      log_info ("handshake not finished after %u s; closing", cfg.handshake_timeout);
      conn_close_now (c);
    }
    else if (c->phase == CONN_TRANSMISSION && cfg.idle_timeout
             && (c->inflight == 0 || c->sendq_head || c->out.len > c->out.off || tls_unsent (c))
             && now - c->t_active >= cfg.idle_timeout * sec) {
      log_info ("idle for %u s; closing", cfg.idle_timeout);
      conn_close_now (c);
    }
    log_current = NULL;
  }
  /* Connections closed above gave their buffers back: let waiters retry. */
  if (s->waiters)
    conn_wake_waiters (s);
  /* Who may still time out: with --idle-timeout any connection not
   * closing (one in transmission may fall idle at any time, and one in
   * its handshake reaches transmission with nothing to arm the sweep
   * again: only a new connection does), else one in its handshake. */
  for (struct conn *c = s->conns; c; c = c->next)
    if (c->fd >= 0 && c->phase != CONN_CLOSING
        && (cfg.idle_timeout || (cfg.handshake_timeout && c->phase != CONN_TRANSMISSION)))
      return true;
  return false;
}

const struct shard_conn_ops conn_shard_ops = {
  .open = conn_new,
  .start = conn_start,
  .completed = conn_completed,
  .sweep = conn_sweep,
  .shutdown = conn_shutdown,
  .close_now = conn_close_now,
};
