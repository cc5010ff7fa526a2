/* The TLS context (tlsctx.c) that tls.c makes each session from. */
#ifndef BLKD_TLSCTX_H
#define BLKD_TLSCTX_H

#include <stdbool.h>
#include <openssl/ssl.h>

/* What the PSK callbacks learnt about one session, for its log lines. */
struct tls_psk_note {
  const char *identity;           /* the PSK identity the client used, if any;
                                   * lives as long as the session's context */
  bool unknown;                   /* the client offered an identity we lack */
  char unknown_id[64];            /* ... this one (printable, truncated) */
};

/* Start-up: checks the TLS options and builds the first context; -1 after
 * printing why.  tls_reload (internal.h) rebuilds it. */
int tlsctx_setup (void);
void tlsctx_cleanup (void);
/* A new server session on the current context; NULL if OpenSSL fails. */
SSL *tlsctx_new_session (struct tls_psk_note *note);
/* The first queued OpenSSL error as text, and the queue cleared. */
const char *tls_error_text (void);

#endif
