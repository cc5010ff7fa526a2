/* TLS sessions: the STARTTLS switch of one connection, its handshake, and
 * the thin layer over OpenSSL's records that conn.c's reads and gathered
 * writes go through once a session is up (the context they start from,
 * with its credentials, is tlsctx.c's).
 *
 * conn.c knows only c->tls (NULL in clear: one pointer test on the hot
 * path), CONN_READ_STARTTLS in c->read_block and the CONN_TLS_HANDSHAKE
 * phase; everything OpenSSL is here.  All of it runs on the connection's
 * shard thread.  OpenSSL frames, keys and seals every record; blkd only
 * chooses what goes into each record and where the records go:
 * - kernel TLS (TLS 1.2 only), when the kernel has the tls module: OpenSSL
 *   hands the keys to the socket and SSL_write is a plain write.
 * - otherwise SSL_write: small pieces (reply headers, short payloads,
 *   several small replies in a row) are copied into a 16 KiB staging
 *   buffer and sealed as one record, and large payload spans are written
 *   straight from the pooled (or lent) buffer, one full record per
 *   SSL_write.  Once the handshake is done OpenSSL's write BIO is ours
 *   (collect_bio): a full record with nothing queued ahead of it goes to
 *   the socket straight from OpenSSL's buffer; every other record is
 *   appended to `out`, which goes to the socket in one send(2) when full
 *   or when the queued replies are all sealed, so small replies share
 *   sends.  Limit: a large reply's header is a small record of its own,
 *   queued ahead of the payload's first full records, which are then
 *   appended (copied) too until `out` fills: 8 of the 16 records of a
 *   256 KiB reply (strace: one send of the header and 8 records, then 8
 *   of one record each).  Whatever else OpenSSL writes (alerts,
 *   KeyUpdates, close_notify) lands in `out` in its order.
 * - after TLS_REKEY_RECORDS records under one TLS 1.3 key, a KeyUpdate
 *   (ossl_rekey_policy), and a client's update_requested is answered
 *   without waiting for the next reply (answer_key_update). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "internal.h"
#include "tlsctx.h"

#define TLS_RECORD   SSL3_RT_MAX_PLAIN_LENGTH   /* 16 KiB of plaintext */

/* The largest record SSL_write makes: TLS 1.2 AES-GCM adds 29 bytes (an
 * explicit nonce), more than TLS 1.3's 22; rounded up. */
#define TLS_RECORD_MAX  (TLS_RECORD + 64)
/* Sealed records per send(2), and room kept for the short records
 * OpenSSL may still want sent (alerts, KeyUpdate) whenever it likes. */
#define TLS_OUT_RECORDS 8
#define TLS_OUT_RESERVE 1024
#define TLS_OUT_CAP     (TLS_OUT_RECORDS * TLS_RECORD_MAX + TLS_OUT_RESERVE)
/* RFC 8446 5.5: AES-GCM keys are good for about 2^24.5 full records; we
 * send a KeyUpdate after 2^24 (256 GiB).  In test builds
 * (BLKD_TEST_HOOKS) BLKD_TLS_REKEY_RECORDS lowers it. */
#define TLS_REKEY_RECORDS (UINT64_C (1) << 24)

/* One connection's session.  c->tls points here. */
struct tls_conn {
  SSL *ssl;
  uint8_t *out;                   /* OpenSSL's records (collect_bio) the socket
                                   * has not taken; NULL: OpenSSL writes them */
  size_t out_len, out_off;
  bool broken;                    /* a key update could not be answered:
                                   * nothing more goes out */
  struct tls_psk_note psk;        /* which PSK identity the client used */
  bool up;                        /* handshake finished */
  bool read_wants_write;          /* SSL_read needs the socket writable */
  bool write_retry;               /* SSL_write holds a record to write again */
  bool write_wants_read;          /* SSL_write waits for the rest of a handshake
                                   * message the client sent part of */
  uint64_t records;               /* records sealed under this key */
  uint8_t stage[TLS_RECORD];      /* small pieces gathered into one record */
};

static uint64_t rekey_records = TLS_REKEY_RECORDS;
static BIO_METHOD *collect_method;  /* collect_bio's, made in tls_setup */

static int out_drain (struct conn *c, struct tls_conn *t);

/* A client's KeyUpdate with update_requested leaves OpenSSL owing one of
 * its own, which it would send only at the next SSL_write: have it
 * written now (into out), so a client that has all its data gets the
 * answer without waiting for more; but not while OpenSSL holds a record
 * for a retry, nor without room in out: then the next SSL_write sends it
 * ahead of its record, which is all RFC 8446 4.6.3 asks. */
static void
write_owed_key_update (struct tls_conn *t)
{
  if (!t->out || t->write_retry || TLS_OUT_CAP - t->out_len < TLS_OUT_RESERVE)
    return;
  /* Mid-way through another post-handshake message OpenSSL refuses
   * (still in init): the next tls_recv tries again. */
  if (SSL_is_init_finished (t->ssl)
      && SSL_get_key_update_type (t->ssl) != SSL_KEY_UPDATE_NONE) {
    if (SSL_key_update (t->ssl, SSL_KEY_UPDATE_NOT_REQUESTED) != 1
        || SSL_do_handshake (t->ssl) != 1) {
      log_error ("TLS: cannot answer the client's key update; closing");
      t->broken = true;
    }
    ERR_clear_error ();
  }
}

static void
answer_key_update (struct conn *c, struct tls_conn *t)
{
  write_owed_key_update (t);
  if (tls_unsent (c) || t->broken)
    event_add (c->ev_write, NULL);
}

/* Send collected records: 0 all out, 1 the socket is full, -1 error (errno). */
static int
out_drain (struct conn *c, struct tls_conn *t)
{
  while (t->out_off < t->out_len) {
    ssize_t k = send (c->fd, t->out + t->out_off, t->out_len - t->out_off, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? 1 : -1;
    }
    t->out_off += k;
    if (cfg.idle_timeout)
      c->t_active = now_ns ();      /* the client is reading */
  }
  t->out_off = t->out_len = 0;
  return 0;
}

/* ---- OpenSSL's records, collected ------------------------------------ */

/* collect_bio's write: send a full record at once when out is empty (the
 * rest of it, if the socket takes only part, stays in out), else append
 * the record OpenSSL just sealed to out.  When out has no room, send what
 * it holds first; if the socket will not take enough, refuse with a
 * retry, as a full socket BIO would (OpenSSL keeps the record and writes
 * it again on the next call).  Never reorders: out is sent from its
 * front, appended at its end, and bypassed only while it is empty. */
static int
collect_write (BIO *b, const char *data, size_t len, size_t *written)
{
  struct conn *c = BIO_get_data (b);
  struct tls_conn *t = c->tls;

  BIO_clear_retry_flags (b);
  /* A full record with nothing queued ahead of it goes to the socket
   * straight from OpenSSL's buffer: copying 16 KiB into out to save a
   * send costs more than the send where each side has a CPU of its own
   * (docs/BENCHMARKS.md, TLS).  What the socket does not take is kept
   * in out, in order, as any other record. */
  if (len >= TLS_RECORD && t->out_off == t->out_len) {
    size_t sent = 0;
    while (sent < len) {
      ssize_t k = send (c->fd, data + sent, len - sent, MSG_NOSIGNAL);
      if (k < 0) {
        if (errno == EINTR)
          continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
          return 0;                 /* errno from send: SSL_ERROR_SYSCALL */
        break;
      }
      sent += (size_t) k;
    }
    if (sent > 0 && cfg.idle_timeout)
      c->t_active = now_ns ();      /* the client is reading */
    t->out_off = t->out_len = 0;
    memcpy (t->out, data + sent, len - sent);
    t->out_len = len - sent;
    *written = len;
    return 1;
  }
  if (len > TLS_OUT_CAP - t->out_len) {
    if (out_drain (c, t) == -1)
      return 0;                     /* errno from send: SSL_ERROR_SYSCALL */
    if (t->out_off > 0) {
      memmove (t->out, t->out + t->out_off, t->out_len - t->out_off);
      t->out_len -= t->out_off;
      t->out_off = 0;
    }
    if (len > TLS_OUT_CAP - t->out_len) {
      BIO_set_retry_write (b);
      return 0;
    }
  }
  memcpy (t->out + t->out_len, data, len);
  t->out_len += len;
  *written = len;
  return 1;
}

/* A flush from OpenSSL (after an alert or a handshake message) is left to
 * the loop: tls_flushed sends out once the queued replies are sealed, so
 * a KeyUpdate goes out together with the record behind it. */
static long
collect_ctrl (BIO *b, int cmd, long num, void *ptr)
{
  struct conn *c = BIO_get_data (b);
  struct tls_conn *t = c ? c->tls : NULL;
  switch (cmd) {
  case BIO_CTRL_FLUSH:
    return 1;
  case BIO_CTRL_WPENDING:
    return t ? (long) (t->out_len - t->out_off) : 0;
  default:
    return 0;                       /* no kTLS, no ctrl we implement */
  }
}

/* The SSL_write path after the handshake: OpenSSL keeps framing, keying
 * and sealing every record; only where its output goes changes.  Returns
 * the log's name for the path.  Without memory the socket BIO stays (one
 * write per record, as before). */
static void
collect_takeover (struct conn *c, struct tls_conn *t)
{
  BIO *b = collect_method ? BIO_new (collect_method) : NULL;
  t->out = b ? malloc (TLS_OUT_CAP) : NULL;
  if (!t->out) {
    BIO_free (b);
    log_warn ("TLS: no memory for the record buffer: one write per record");
    return;
  }
  t->out_len = t->out_off = 0;
  BIO_set_data (b, c);
  BIO_set_init (b, 1);
  SSL_set0_wbio (t->ssl, b);
}

bool
tls_unsent (struct conn *c)
{
  struct tls_conn *t = c->tls;
  return t && t->out_off < t->out_len;
}

int
tls_setup (void)
{
  const char *env = getenv ("BLKD_TLS_REKEY_RECORDS");
  if (env) {
#ifdef BLKD_TEST_HOOKS
    if (strtoull (env, NULL, 10) > 0)
      rekey_records = strtoull (env, NULL, 10);
    fprintf (stderr, "blkd: TLS: test build: a key update every %" PRIu64 " records\n",
             rekey_records);
#else
    fprintf (stderr, "blkd: warning: BLKD_TLS_REKEY_RECORDS ignored: only test builds "
             "(make check) honour it\n");
#endif
  }
  collect_method = BIO_meth_new (BIO_get_new_index () | BIO_TYPE_SOURCE_SINK,
                                 "blkd TLS records");
  if (!collect_method || !BIO_meth_set_write_ex (collect_method, collect_write)
      || !BIO_meth_set_ctrl (collect_method, collect_ctrl)) {
    fprintf (stderr, "blkd: TLS: cannot make the record BIO: %s\n", tls_error_text ());
    return -1;
  }
  return tlsctx_setup ();
}

void
tls_cleanup (void)
{
  BIO_meth_free (collect_method);
  collect_method = NULL;
  tlsctx_cleanup ();
}

/* ---- per connection -------------------------------------------------- */

int
tls_start (struct conn *c)
{
  struct tls_conn *t = calloc (1, sizeof *t);
  if (!t)
    return -1;
  t->ssl = tlsctx_new_session (&t->psk);
  if (!t->ssl || SSL_set_fd (t->ssl, c->fd) != 1) {
    log_error ("TLS: cannot create a session: %s", tls_error_text ());
    SSL_free (t->ssl);
    free (t);
    return -1;
  }
  SSL_set_app_data (t->ssl, c);
  SSL_set_accept_state (t->ssl);
  c->tls = t;
  return 0;
}

void
tls_free (struct conn *c)
{
  struct tls_conn *t = c->tls;
  if (!t)
    return;
  /* close_notify, best effort: never wait for the socket. */
  if (t->up && c->fd >= 0) {
    ERR_clear_error ();
    /* Our own KeyUpdate may still be due (ossl_rekey_policy: OpenSSL
     * writes it ahead of the next record, and none came); OpenSSL is "in
     * init" until then and SSL_shutdown would refuse to send close_notify.
     * Write it now, then the alert follows under the new key. */
    if (SSL_in_init (t->ssl))
      SSL_do_handshake (t->ssl);
    SSL_shutdown (t->ssl);          /* the alert lands in out (unless kTLS) */
    if (t->out && !t->broken)
      out_drain (c, t);
  }
  SSL_free (t->ssl);
  free (t->out);
  ERR_clear_error ();
  OPENSSL_cleanse (t->stage, sizeof t->stage);
  free (t);
  c->tls = NULL;
}

/* Why a handshake failed, in words an operator can act on. */
static void
log_handshake_failure (struct conn *c, int sslerr)
{
  struct tls_conn *t = c->tls;
  unsigned long e = ERR_peek_last_error ();
  int reason = ERR_GET_REASON (e);
  char what[256] = "";

  if (e)
    ERR_error_string_n (e, what, sizeof what);
  ERR_clear_error ();

  if (t->psk.unknown && !t->psk.identity) {
    log_error ("TLS handshake failed: unknown PSK identity \"%s\"", t->psk.unknown_id);
    return;
  }
  if (sslerr == SSL_ERROR_SYSCALL && e == 0) {
    if (errno == 0 || errno == ECONNRESET || errno == EPIPE)
      log_error ("TLS handshake failed: client closed the connection%s",
                 cfg.tls_certificates ? " (did it reject our certificate?)" : "");
    else
      log_error ("TLS handshake failed: %m");
    return;
  }
  switch (reason) {
  case SSL_R_WRONG_VERSION_NUMBER:
  case SSL_R_HTTP_REQUEST:
  case SSL_R_UNKNOWN_PROTOCOL:
  case SSL_R_PACKET_LENGTH_TOO_LONG:
  case SSL_R_RECORD_LENGTH_MISMATCH:
  case SSL_R_UNEXPECTED_RECORD:
  case SSL_R_UNEXPECTED_EOF_WHILE_READING:
    if (reason == SSL_R_UNEXPECTED_EOF_WHILE_READING)
      log_error ("TLS handshake failed: client closed the connection%s",
                 cfg.tls_certificates ? " (did it reject our certificate?)" : "");
    else
      log_error ("TLS handshake failed: client did not send TLS after STARTTLS "
                 "(plaintext?): %s", what);
    return;
  case SSL_R_UNSUPPORTED_PROTOCOL:
  case SSL_R_VERSION_TOO_LOW:
    log_error ("TLS handshake failed: the client's TLS version is too old "
               "(TLS 1.2 or 1.3 needed): %s", what);
    return;
  case SSL_R_BINDER_DOES_NOT_VERIFY:
    log_error ("TLS handshake failed: wrong pre-shared key for PSK identity \"%s\"",
               t->psk.identity ? t->psk.identity : "?");
    return;
  case SSL_R_DECRYPTION_FAILED_OR_BAD_RECORD_MAC:
    if (t->psk.identity) {
      log_error ("TLS handshake failed: wrong pre-shared key for PSK identity \"%s\"",
                 t->psk.identity);
      return;
    }
    break;
  case SSL_R_PSK_IDENTITY_NOT_FOUND:
    log_error ("TLS handshake failed: unknown PSK identity");
    return;
  case SSL_R_CERTIFICATE_VERIFY_FAILED: {
    long v = SSL_get_verify_result (t->ssl);
    log_error ("TLS handshake failed: client certificate rejected: %s",
               X509_verify_cert_error_string (v));
    return;
  }
  case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
    log_error ("TLS handshake failed: client sent no certificate "
               "(--tls-verify-peer requires one)");
    return;
  case SSL_R_NO_SHARED_CIPHER:
  case SSL_R_NO_SUITABLE_SIGNATURE_ALGORITHM:
    log_error ("TLS handshake failed: no cipher suite in common%s: %s",
               t->psk.unknown ? " (the client's PSK identity is unknown here)"
               : !cfg.tls_certificates ? " (PSK only here: the client offered no PSK)" : "", what);
    return;
  default:
    break;
  }
  /* The client's own complaint arrives as an alert. */
  if (reason >= SSL_AD_REASON_OFFSET && reason < SSL_AD_REASON_OFFSET + 256) {
    int alert = reason - SSL_AD_REASON_OFFSET;
    const char *hint = "";
    if (alert == SSL_AD_UNKNOWN_CA || alert == SSL_AD_BAD_CERTIFICATE
        || alert == SSL_AD_CERTIFICATE_EXPIRED || alert == SSL_AD_CERTIFICATE_UNKNOWN
        || alert == SSL_AD_UNSUPPORTED_CERTIFICATE || alert == SSL_AD_CERTIFICATE_REVOKED)
      hint = ": the client rejected our certificate";
    else if (alert == SSL_AD_DECRYPT_ERROR && t->psk.identity)
      hint = ": wrong pre-shared key?";
    else if (alert == SSL_AD_UNKNOWN_PSK_IDENTITY)
      hint = ": the client does not know our PSK identity";
    log_error ("TLS handshake failed: client sent alert \"%s\"%s",
               SSL_alert_desc_string_long (alert), hint);
    return;
  }
  log_error ("TLS handshake failed: %s%s", what[0] ? what : "unknown error",
             t->psk.unknown ? " (the client's PSK identity is unknown here)" : "");
}

static void
handshake_done (struct conn *c)
{
  struct tls_conn *t = c->tls;
  t->up = true;
  c->phase = CONN_HS_OPTIONS;
  c->pc.ctx.is_tls = true;
  bool ktls_send = BIO_get_ktls_send (SSL_get_wbio (t->ssl));
  if (!ktls_send)
    collect_takeover (c, t);
  if (log_verbose) {
    X509 *peer = SSL_get0_peer_certificate (t->ssl);
    char subject[256] = "";
    if (peer)
      X509_NAME_oneline (X509_get_subject_name (peer), subject, sizeof subject);
    bool kr = BIO_get_ktls_recv (SSL_get_rbio (t->ssl));
    log_debug ("TLS up: %s %s%s%s%s%s; records: sent sealed by %s, received by %s",
               SSL_get_version (t->ssl), SSL_get_cipher_name (t->ssl),
               t->psk.identity ? ", PSK identity " : "",
               t->psk.identity ? t->psk.identity : "",
               peer ? ", client certificate " : "", subject,
               ktls_send ? "kernel" : "OpenSSL", kr ? "kernel" : "OpenSSL");
  }
  /* The client may have sent options right behind its Finished, already
   * read into OpenSSL's buffer where the socket will not announce them. */
  event_active (c->ev_read, EV_READ, 1);
}

/* Drive SSL_accept: 1 done, 0 waiting for the socket, -1 failed (logged). */
static int
tls_handshake_step (struct conn *c)
{
  struct tls_conn *t = c->tls;
  if (c->read_block & CONN_READ_STARTTLS)
    return 0;                       /* the ACK is not out yet */
  ERR_clear_error ();
  errno = 0;
  int r = SSL_accept (t->ssl);
  if (r == 1) {
    handshake_done (c);
    return 1;
  }
  int e = SSL_get_error (t->ssl, r);
  if (e == SSL_ERROR_WANT_READ)
    return 0;
  if (e == SSL_ERROR_WANT_WRITE) {
    event_add (c->ev_write, NULL);
    return 0;
  }
  log_handshake_failure (c, e);
  return -1;
}

/* The clear-text output (STARTTLS's ACK, or everything) has been sent. */
int
tls_flushed (struct conn *c)
{
  struct tls_conn *t = c->tls;
  if (t->out) {
    int r = out_drain (c, t);
    if (r == -1 || t->broken)
      return -1;                    /* whatever could go out went */
    if (r == 1)
      return 1;
  }
  if (c->read_block & CONN_READ_STARTTLS) {
    c->read_block &= ~CONN_READ_STARTTLS;
    if (!(c->read_block & CONN_READ_PAUSED))
      event_add (c->ev_read, NULL);
    log_debug ("STARTTLS acknowledged: TLS handshake");
  }
  if (t->read_wants_write) {
    t->read_wants_write = false;
    event_active (c->ev_read, EV_READ, 1);
  }
  if (c->phase == CONN_TLS_HANDSHAKE) {
    int r = tls_handshake_step (c);
    if (r == -1)
      return -1;
    /* WANT_WRITE already armed ev_write; conn_flush must not disarm it. */
    if (r == 0 && SSL_want_write (t->ssl))
      return 1;
  }
  return 0;
}

bool
tls_pending (struct conn *c)
{
  struct tls_conn *t = c->tls;
  return t && SSL_has_pending (t->ssl);
}

ssize_t
tls_recv (struct conn *c, void *buf, size_t len)
{
  struct tls_conn *t = c->tls;
  size_t got;

  if (c->phase == CONN_TLS_HANDSHAKE) {
    if (c->read_block & CONN_READ_STARTTLS) {
      /* The ACK is still queued: the next bytes belong to the handshake,
       * so leave them in the socket (and stop epoll reporting them). */
      event_del (c->ev_read);
      errno = EAGAIN;
      return -1;
    }
    int r = tls_handshake_step (c);
    if (r <= 0) {
      errno = r == 0 ? EAGAIN : EPROTO;
      return -1;
    }
  }
  ERR_clear_error ();
  errno = 0;
  if (SSL_read_ex (t->ssl, buf, len, &got) == 1) {
    /* SSL_read returns one record at a time (a 28-byte request header is
     * a record of its own); take every whole record read-ahead already
     * holds, so conn.c parses a batch per call as it does in clear.  An
     * error here is sticky and reported by the next call. */
    size_t more;
    while (got < len && SSL_has_pending (t->ssl)
           && SSL_read_ex (t->ssl, (char *) buf + got, len - got, &more) == 1)
      got += more;
    ERR_clear_error ();
    answer_key_update (c, t);
    return got;
  }
  int e = SSL_get_error (t->ssl, 0);
  switch (e) {
  case SSL_ERROR_WANT_READ:         /* maybe after a KeyUpdate alone */
    answer_key_update (c, t);
    errno = EAGAIN;
    return -1;
  case SSL_ERROR_WANT_WRITE:        /* e.g. answering a KeyUpdate */
    t->read_wants_write = true;
    event_add (c->ev_write, NULL);
    errno = EAGAIN;
    return -1;
  case SSL_ERROR_ZERO_RETURN:
    return 0;
  case SSL_ERROR_SYSCALL:
    if (errno == 0)
      return 0;
    return -1;
  default: {
    char what[256] = "";
    ERR_error_string_n (ERR_peek_last_error (), what, sizeof what);
    ERR_clear_error ();
    log_error ("TLS receive failed: %s", what);
    errno = EPROTO;
    return -1;
  }
  }
}

/* After rekey_records records under one TLS 1.3 key, a KeyUpdate
 * (OpenSSL sends it ahead of the next record it writes).  Partial writes return after a
 * record or a few, so counting whole 16 KiB records in what was written
 * never counts more records than were sealed.  Kernel TLS never gets
 * here for TLS 1.3 (see ktls_client_hello). */
static void
ossl_rekey_policy (struct tls_conn *t, size_t written)
{
  t->records += (written + TLS_RECORD - 1) / TLS_RECORD;
  if (t->records < rekey_records || SSL_version (t->ssl) != TLS1_3_VERSION)
    return;
  log_debug ("TLS: %" PRIu64 " records under this key: key update", t->records);
  if (SSL_key_update (t->ssl, SSL_KEY_UPDATE_NOT_REQUESTED) == 1)
    t->records = 0;
  else
    log_debug ("TLS: OpenSSL is busy with another post-handshake message: "
               "key update after the next record");
  ERR_clear_error ();
}

/* Write what iov[0..n) holds as TLS records; returns the plaintext bytes
 * consumed (sealed: they may still wait in out, which tls_unsent reports
 * and tls_flushed sends), or -1 with errno (EAGAIN: nothing could be
 * written).
 *
 * After WANT_WRITE OpenSSL holds a sealed record and must be called again
 * with the same plaintext from the same position.  That holds because we
 * report those bytes as not consumed, so the next call starts at the same
 * place, and the choice between staging and writing in place depends only
 * on the bytes from that place onwards (later calls may have more queued
 * behind them, which only makes the retry longer, as OpenSSL allows). */
static ssize_t
ossl_sendv (struct conn *c, struct tls_conn *t, const struct iovec *iov, int n)
{
  size_t total = 0, off = 0;
  int i = 0;

  /* SSL_get_error needs an empty error queue before the call it explains;
   * a successful SSL_write leaves it empty, so once per batch is enough
   * (once per record showed in profiles of large replies). */
  ERR_clear_error ();
  for (;;) {
    while (i < n && off == iov[i].iov_len) {
      i++;
      off = 0;
    }
    if (i == n)
      return total;                 /* tls_flushed sends what out holds */
    /* Room in out for the next record (and a KeyUpdate OpenSSL may put
     * ahead of it), or send what is there first. */
    if (t->out && TLS_OUT_CAP - t->out_len < TLS_RECORD_MAX + TLS_OUT_RESERVE) {
      int r = out_drain (c, t);
      if (r != 0) {
        if (total > 0)
          return total;
        if (r == 1)
          errno = EAGAIN;
        return -1;
      }
    }

    const void *p;
    size_t len;
    if (iov[i].iov_len - off >= TLS_RECORD) {
      /* A large payload: seal it in place, one full record per call. */
      p = (const char *) iov[i].iov_base + off;
      len = iov[i].iov_len - off;
    }
    else {
      /* Gather small pieces into one record.  A payload that fills a
       * record by itself is not pulled in: it may be a plugin's lent
       * memory, sealed in place by the next call, so a reply header goes
       * out as its own small record (22 bytes of overhead) rather than
       * as a 16 KiB copy of the payload's start. */
      size_t s = 0, o = off;
      for (int j = i; j < n && s < TLS_RECORD && (j == i || iov[j].iov_len < TLS_RECORD);
           j++, o = 0) {
        size_t k = iov[j].iov_len - o;
        if (k > TLS_RECORD - s)
          k = TLS_RECORD - s;
        memcpy (t->stage + s, (const char *) iov[j].iov_base + o, k);
        s += k;
      }
      p = t->stage;
      len = s;
    }

    size_t w;
    errno = 0;
    if (SSL_write_ex (t->ssl, p, len, &w) != 1) {
      int e = SSL_get_error (t->ssl, 0);
      if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
        t->write_retry = true;
        t->write_wants_read = e == SSL_ERROR_WANT_READ;
        if (total > 0)
          return total;
        errno = EAGAIN;
        return -1;
      }
      if (e == SSL_ERROR_SYSCALL && errno != 0)
        return -1;                  /* EPIPE, ECONNRESET: conn.c decides */
      char what[256] = "";
      ERR_error_string_n (ERR_peek_last_error (), what, sizeof what);
      ERR_clear_error ();
      log_error ("TLS send failed: %s", what[0] ? what : "connection closed");
      errno = EPIPE;
      return -1;
    }
    t->write_retry = false;
    total += w;
    ossl_rekey_policy (t, w);
    /* Advance (i, off) past the w bytes just sealed. */
    while (w > 0) {
      size_t k = iov[i].iov_len - off;
      if (w < k) {
        off += w;
        w = 0;
      }
      else {
        w -= k;
        i++;
        off = 0;
      }
    }
  }
}

/* The send path for a TLS connection.  A client may send part of a
 * post-handshake message (a KeyUpdate split across records) and stop;
 * OpenSSL then writes no application data until the rest arrives:
 * SSL_write asks for input.  The socket is writable, so waiting for
 * writability would spin: tls_send_waits_input tells conn.c to wait for
 * input instead.  The read event that brings it ends with a flush that
 * calls us again; while reading is paused, conn_flush watches for input
 * with a one-shot event of its own, and SSL_write reads the rest. */
ssize_t
tls_sendv (struct conn *c, const struct iovec *iov, int n)
{
  struct tls_conn *t = c->tls;
  /* Mid-message, SSL_write reads the socket itself: it may take the rest
   * of the message and records behind it, which the socket will not
   * announce again. */
  bool may_read = SSL_in_init (t->ssl);
  t->write_wants_read = false;
  ssize_t r = ossl_sendv (c, t, iov, n);
  if (may_read && SSL_has_pending (t->ssl) && !(c->read_block & CONN_READ_PAUSED))
    event_active (c->ev_read, EV_READ, 1);
  return r;
}

bool
tls_send_waits_input (struct conn *c)
{
  struct tls_conn *t = c->tls;
  return t && t->write_wants_read;
}
