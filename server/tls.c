/* TLS: the OpenSSL context built at start-up (X.509 certificates and/or
 * psktool pre-shared keys), the STARTTLS switch of one connection, and the
 * record layer that conn.c's reads and gathered writes go through once a
 * session is up.
 *
 * conn.c knows only c->tls (NULL in clear: one pointer test on the hot
 * path), CONN_READ_STARTTLS in c->read_block and the CONN_TLS_HANDSHAKE
 * phase; everything OpenSSL is here.  All of it runs on the connection's shard thread.
 *
 * Writes, three ways:
 * - kernel TLS (TLS 1.2 only), when the kernel has the tls module: OpenSSL
 *   hands the keys to the socket and SSL_write is a plain write.
 * - blkd seals (TLS 1.3, --tls-seal=blkd, an opt-in that a start-up
 *   self-test must pass): OpenSSL runs the
 *   handshake and all reading; the send direction's traffic secret comes
 *   from OpenSSL's key log callback and tlsrec.c seals replies straight
 *   from the pool buffers into `out`, several records per send(2).  What
 *   OpenSSL itself still writes after that (alerts, a KeyUpdate answering
 *   the client's) goes to a null BIO and is re-sealed here from the
 *   plaintext the message callback shows us, so there is one sequence of
 *   records under one key schedule.
 * - SSL_write (--tls-seal=openssl, the default; TLS 1.2): OpenSSL frames,
 *   keys and seals every record; small pieces (reply headers, short
 *   payloads, several small replies in a row) are copied into a 16 KiB
 *   staging buffer and sealed as one record, and large payload spans are
 *   written straight from the pooled (or lent) buffer, one full record per
 *   SSL_write.  Once the handshake is done OpenSSL's write BIO is ours
 *   (collect_bio): it appends each record to `out` instead of writing it,
 *   and `out` goes to the socket in one send(2) when full or when the
 *   queued replies are all sealed, so a 256 KiB reply costs two sends
 *   rather than seventeen writes.  Whatever else OpenSSL writes (alerts,
 *   KeyUpdates, close_notify) lands in the same buffer in its order. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "internal.h"
#include "tlsrec.h"

#define TLS_RECORD   SSL3_RT_MAX_PLAIN_LENGTH   /* 16 KiB of plaintext */
/* With read-ahead, OpenSSL reads this much per read(2), several records. */
#define TLS_READ_BUF (4 * (SSL3_RT_MAX_PLAIN_LENGTH + SSL3_RT_MAX_ENCRYPTED_OVERHEAD \
                           + SSL3_RT_HEADER_LENGTH))

/* Sealed records per send(2), and room kept for the short records
 * OpenSSL may still want sent (alerts, KeyUpdate) whenever it likes. */
#define TLS_OUT_RECORDS 8
#define TLS_OUT_RESERVE 1024
#define TLS_OUT_CAP     (TLS_OUT_RECORDS * TLSREC_MAX_RECORD + TLS_OUT_RESERVE)
/* The largest record SSL_write makes: TLS 1.2 AES-GCM adds 29 bytes (an
 * explicit nonce), more than TLS 1.3's 22; rounded up. */
#define TLS_OSSL_RECORD_MAX (TLS_RECORD + 64)
/* RFC 8446 5.5: AES-GCM keys are good for about 2^24.5 full records; we
 * send a KeyUpdate after 2^24 (256 GiB), on both sealing paths.  In test
 * builds (BLKD_TEST_HOOKS) BLKD_TLS_REKEY_RECORDS lowers it. */
#define TLS_REKEY_RECORDS (UINT64_C (1) << 24)
#define SEND_PIECES_MAX 64
/* Shorter pre-shared keys are accepted with a warning (RFC 9257 asks for
 * at least 128 bits of entropy). */
#define TLS_PSK_MIN_BYTES 16

/* One connection's session.  c->tls points here. */
struct tls_conn {
  SSL *ssl;
  /* blkd-sealed sending (NULL: SSL_write does it). */
  struct tlsrec *rec;
  uint8_t *out;                   /* sealed records the socket has not taken
                                   * (blkd's, or OpenSSL's through collect_bio) */
  size_t out_len, out_off;
  size_t max_content;             /* per record: 16 KiB, or the client's
                                   * max_fragment_length (RFC 6066) */
  bool rec_broken;                /* sealing failed: nothing more goes out */
  /* The send direction's first application traffic secret, from the key
   * log, until the handshake ends; and how much OpenSSL had written then. */
  uint8_t secret[EVP_MAX_MD_SIZE];
  size_t secret_len;
  uint64_t written_at_secret;
  const char *psk_identity;       /* the PSK identity the client used, if any */
  bool psk_unknown;               /* the client offered an identity we lack */
  char unknown_id[64];            /* ... this one (printable, truncated) */
  bool up;                        /* handshake finished */
  bool read_wants_write;          /* SSL_read needs the socket writable */
  bool write_retry;               /* SSL_write holds a record to write again */
  bool write_wants_read;          /* SSL_write waits for the rest of a handshake
                                   * message the client sent part of */
  uint64_t ossl_records;          /* SSL_write path: records under this key */
  uint8_t stage[TLS_RECORD];      /* small pieces gathered into one record */
};

struct psk_entry {
  char *identity;
  unsigned char *key;
  size_t keylen;
};

/* One reading of the --tls-psk file.  It hangs off the SSL_CTX built with
 * it (ex_data slot psk_index), so a session finds the keys of the context
 * it was created from, and the psk_identity it points into lives as long
 * as that context: SSL_new holds a reference until SSL_free. */
struct psk_table {
  struct psk_entry *v;
  size_t n;
};

/* The context new handshakes start from.  tls_reload (SIGHUP, main thread)
 * builds a complete new one and swaps the pointer under ctx_lock; shard
 * threads take a reference under the same lock in tls_start.  A context is
 * freed by whoever drops its last reference: the reload for an idle one,
 * else the SSL_free of the last session begun on it. */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static SSL_CTX *ctx;
static int psk_index = -1;
static bool have_certs;           /* --tls-certificates given (fixed at start-up) */
static bool ktls_kernel;          /* the kernel accepted TCP_ULP "tls" */
static uint64_t rekey_records = TLS_REKEY_RECORDS;
static BIO_METHOD *collect_method;  /* collect_bio's, made in tls_setup */

/* ---- start-up -------------------------------------------------------- */

#define TLS_SUITES_DEFAULT \
  "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"

/* The TLS 1.3 suites offered, in the server's order of preference. */
static const char *
tls13_suites (void)
{
  return cfg.tls_suites ? cfg.tls_suites : TLS_SUITES_DEFAULT;
}

/* --tls-suites: names OpenSSL would silently skip if unknown, so they are
 * checked here; only the three suites blkd can also seal (OpenSSL's
 * default set), each at most once.  With pre-shared keys the first must
 * be a SHA-256 suite (see ctx_build).  0, or -1 after printing why. */
static int
check_suites (const char *list)
{
  static const char *const known[] = {
    "TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256",
  };
  bool seen[3] = { false, false, false };
  const char *p = list;
  int n = 0;
  do {
    size_t len = strcspn (p, ":");
    size_t k = 0;
    while (k < 3 && !(strlen (known[k]) == len && strncmp (known[k], p, len) == 0))
      k++;
    if (k == 3 || seen[k]) {
      fprintf (stderr, "blkd: --tls-suites: \"%.*s\" is %s (known: %s, %s, %s)\n",
               (int) len, p, k == 3 ? "not a TLS 1.3 suite blkd offers" : "listed twice",
               known[0], known[1], known[2]);
      return -1;
    }
    if (n++ == 0 && cfg.tls_psk && k == 1) {
      fprintf (stderr, "blkd: --tls-suites: with --tls-psk the first suite must be a "
               "SHA-256 one: GnuTLS clients bind their keys to SHA-256 and OpenSSL "
               "would drop them\n");
      return -1;
    }
    seen[k] = true;
    p += len;
  } while (*p++ == ':');
  return 0;
}

/* The first queued OpenSSL error as text (for start-up messages). */
static const char *
ssl_error_text (void)
{
  static __thread char buf[256];  /* shards, and the main thread on SIGHUP */
  unsigned long e = ERR_get_error ();
  if (e == 0)
    return "unknown error";
  ERR_error_string_n (e, buf, sizeof buf);
  ERR_clear_error ();
  return buf;
}

static int
hexval (int ch)
{
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

static void
psk_table_free (struct psk_table *tab)
{
  if (!tab)
    return;
  for (size_t i = 0; i < tab->n; i++) {
    OPENSSL_cleanse (tab->v[i].key, tab->v[i].keylen);
    free (tab->v[i].key);
    free (tab->v[i].identity);
  }
  free (tab->v);
  free (tab);
}

/* ex_data destructor: the context holding the table is being freed. */
static void
psk_table_ex_free (void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                   void *argp)
{
  psk_table_free (ptr);
}

/* psktool's format: one "identity:hexkey" per line, into tab.  Messages go
 * through the log: on SIGHUP this runs in a daemon whose stderr may lead
 * nowhere. */
static int
load_psk_file (const char *path, struct psk_table *tab)
{
  struct psk_entry *psks = NULL;
  size_t npsks = 0;
  FILE *f = fopen (path, "r");
  if (!f) {
    log_error ("--tls-psk: cannot open %s: %m", path);
    return -1;
  }
  struct stat st;
  if (fstat (fileno (f), &st) == 0 && (st.st_mode & 077))
    log_warn ("--tls-psk: %s is readable by group or others "
              "(mode %03o); the keys in it are secrets", path, st.st_mode & 0777);

  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  unsigned lineno = 0;
  int r = 0;
  while (r == 0 && (len = getline (&line, &cap, f)) != -1) {
    lineno++;
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
      line[--len] = '\0';
    if (len == 0 || line[0] == '#')
      continue;
    char *colon = strchr (line, ':');
    if (!colon || colon == line) {
      log_error ("--tls-psk: %s:%u: expected \"username:hexkey\"", path, lineno);
      r = -1;
      break;
    }
    *colon = '\0';
    const char *hex = colon + 1;
    size_t hl = strlen (hex);
    if (hl == 0 || hl % 2 || hl / 2 > PSK_MAX_PSK_LEN) {
      log_error ("--tls-psk: %s:%u: key for \"%s\" must be 1 to %d bytes "
                 "of hex digits", path, lineno, line, PSK_MAX_PSK_LEN);
      r = -1;
      break;
    }
    struct psk_entry e = { .identity = strdup (line), .key = malloc (hl / 2), .keylen = hl / 2 };
    struct psk_entry *nv = realloc (psks, (npsks + 1) * sizeof *psks);
    if (!e.identity || !e.key || !nv) {
      free (e.identity);
      free (e.key);
      if (nv)
        psks = nv;
      log_error ("--tls-psk: out of memory");
      r = -1;
      break;
    }
    psks = nv;
    for (size_t i = 0; i < e.keylen; i++) {
      int hi = hexval (hex[2 * i]), lo = hexval (hex[2 * i + 1]);
      if (hi < 0 || lo < 0) {
        log_error ("--tls-psk: %s:%u: key for \"%s\" is not hex", path, lineno, line);
        r = -1;
        break;
      }
      e.key[i] = hi << 4 | lo;
    }
    psks[npsks++] = e;            /* freed with the table even on error */
    if (r == 0 && e.keylen < TLS_PSK_MIN_BYTES)
      log_warn ("--tls-psk: %s:%u: the key for \"%s\" has %zu bits; "
                "use at least %d (psktool makes 256)", path, lineno, line,
                e.keylen * 8, TLS_PSK_MIN_BYTES * 8);
  }
  /* The buffer held the last key read in hex (getline reuses it, so only
   * the last line is still there, but the whole capacity is wiped). */
  if (line)
    OPENSSL_cleanse (line, cap);
  free (line);
  fclose (f);
  tab->v = psks;
  tab->n = npsks;
  if (r == 0 && npsks == 0) {
    log_error ("--tls-psk: %s has no keys", path);
    r = -1;
  }
  return r;
}

/* Remember an identity we do not know, for the failure log line. */
static void
note_unknown (struct tls_conn *t, const void *id, size_t len)
{
  const unsigned char *p = id;
  size_t n = len < sizeof t->unknown_id - 1 ? len : sizeof t->unknown_id - 1;
  for (size_t i = 0; i < n; i++)
    t->unknown_id[i] = p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' ? p[i] : '?';
  t->unknown_id[n] = '\0';
  t->psk_unknown = true;
}

/* The keys of the context this session was created from. */
static const struct psk_entry *
psk_lookup (SSL *ssl, const void *id, size_t len)
{
  const struct psk_table *tab = SSL_CTX_get_ex_data (SSL_get_SSL_CTX (ssl), psk_index);
  for (size_t i = 0; tab && i < tab->n; i++)
    if (strlen (tab->v[i].identity) == len && memcmp (tab->v[i].identity, id, len) == 0)
      return &tab->v[i];
  return NULL;
}

/* TLS 1.3 external PSK.  GnuTLS clients (libnbd, qemu) send the psktool
 * username as the identity and compute the binder with SHA-256, so the
 * session we hand back is tied to a SHA-256 suite; OpenSSL then picks
 * TLS_AES_128_GCM_SHA256 or TLS_CHACHA20_POLY1305_SHA256, with (EC)DHE
 * when the client offers psk_dhe_ke (GnuTLS does by default). */
static SSL_SESSION *
psk_session (SSL *ssl, const struct psk_entry *p)
{
  static const unsigned char aes128gcmsha256[] = { 0x13, 0x01 };
  const SSL_CIPHER *cipher = SSL_CIPHER_find (ssl, aes128gcmsha256);
  SSL_SESSION *s = SSL_SESSION_new ();
  if (!cipher || !s || !SSL_SESSION_set1_master_key (s, p->key, p->keylen)
      || !SSL_SESSION_set_cipher (s, cipher)
      || !SSL_SESSION_set_protocol_version (s, TLS1_3_VERSION)) {
    SSL_SESSION_free (s);
    return NULL;
  }
  return s;
}

static int
psk_find_session (SSL *ssl, const unsigned char *id, size_t idlen, SSL_SESSION **sess)
{
  struct conn *c = SSL_get_app_data (ssl);
  struct tls_conn *t = c->tls;
  const struct psk_entry *p = psk_lookup (ssl, id, idlen);

  *sess = NULL;
  if (!p) {
    note_unknown (t, id, idlen);
    return 1;                       /* no PSK: a certificate handshake may follow */
  }
  SSL_SESSION *s = psk_session (ssl, p);
  if (!s)
    return 0;
  t->psk_identity = p->identity;
  *sess = s;
  return 1;
}

/* TLS 1.2 PSK suites (PSK, DHE-PSK, ECDHE-PSK). */
static unsigned int
psk_server_cb (SSL *ssl, const char *identity, unsigned char *psk, unsigned int max)
{
  struct conn *c = SSL_get_app_data (ssl);
  struct tls_conn *t = c->tls;
  const struct psk_entry *p = identity ? psk_lookup (ssl, identity, strlen (identity)) : NULL;
  if (!p || p->keylen > max) {
    note_unknown (t, identity ? identity : "", identity ? strlen (identity) : 0);
    return 0;
  }
  memcpy (psk, p->key, p->keylen);
  t->psk_identity = p->identity;
  return p->keylen;
}

static int
need_file (const char *dir, const char *name, char *path, size_t size, bool required)
{
  snprintf (path, size, "%s/%s", dir, name);
  if (access (path, R_OK) == 0)
    return 1;
  if (required || errno != ENOENT) {
    log_error ("--tls-certificates: cannot read %s: %m", path);
    return -1;
  }
  return 0;
}

static void
warn_validity (X509 *cert, const char *path)
{
  const ASN1_TIME *na = X509_get0_notAfter (cert), *nb = X509_get0_notBefore (cert);
  char when[64] = "?";
  BIO *b = BIO_new (BIO_s_mem ());
  if (X509_cmp_current_time (na) < 0) {
    int k = b && ASN1_TIME_print (b, na) > 0 ? BIO_read (b, when, sizeof when - 1) : 0;
    if (k > 0)
      when[k] = '\0';
    log_warn ("server certificate %s expired (not after %s): "
              "clients that check certificates will refuse it", path, when);
  }
  else if (X509_cmp_current_time (nb) > 0)
    log_warn ("server certificate %s is not valid yet: "
              "clients that check certificates will refuse it", path);
  BIO_free (b);
}

static int
load_certificates (SSL_CTX *c, const char *dir)
{
  char path[4096];
  int r;

  if ((r = need_file (dir, "server-cert.pem", path, sizeof path, true)) < 0)
    return -1;
  if (SSL_CTX_use_certificate_chain_file (c, path) != 1) {
    log_error ("--tls-certificates: %s: %s", path, ssl_error_text ());
    return -1;
  }
  warn_validity (SSL_CTX_get0_certificate (c), path);

  if ((r = need_file (dir, "server-key.pem", path, sizeof path, true)) < 0)
    return -1;
  if (SSL_CTX_use_PrivateKey_file (c, path, SSL_FILETYPE_PEM) != 1) {
    unsigned long e = ERR_peek_last_error ();
    if (ERR_GET_LIB (e) == ERR_LIB_X509 && (ERR_GET_REASON (e) == X509_R_KEY_VALUES_MISMATCH
                                            || ERR_GET_REASON (e) == X509_R_KEY_TYPE_MISMATCH))
      log_error ("--tls-certificates: %s does not match server-cert.pem: %s",
                 path, ssl_error_text ());
    else
      log_error ("--tls-certificates: %s: %s", path, ssl_error_text ());
    return -1;
  }
  if (SSL_CTX_check_private_key (c) != 1) {
    log_error ("--tls-certificates: %s does not match server-cert.pem: %s",
               path, ssl_error_text ());
    return -1;
  }

  /* ca-cert.pem: the CA client certificates must chain to.  Needed only
   * with --tls-verify-peer (nbdkit's layout always has it). */
  if ((r = need_file (dir, "ca-cert.pem", path, sizeof path, cfg.tls_verify_peer)) < 0)
    return -1;
  if (r == 1 && cfg.tls_verify_peer) {
    STACK_OF (X509_NAME) *names = SSL_load_client_CA_file (path);
    if (SSL_CTX_load_verify_locations (c, path, NULL) != 1 || !names) {
      log_error ("--tls-certificates: %s: %s", path, ssl_error_text ());
      sk_X509_NAME_pop_free (names, X509_NAME_free);
      return -1;
    }
    SSL_CTX_set_client_CA_list (c, names);
  }
  /* ca-crl.pem (optional, as in nbdkit): revoked client certificates. */
  if (cfg.tls_verify_peer
      && (r = need_file (dir, "ca-crl.pem", path, sizeof path, false)) != 0) {
    X509_STORE *store = SSL_CTX_get_cert_store (c);
    if (r < 0 || X509_STORE_load_file (store, path) != 1) {
      log_error ("--tls-certificates: %s: %s", path,
                 r < 0 ? "unreadable" : ssl_error_text ());
      return -1;
    }
    X509_STORE_set_flags (store, X509_V_FLAG_CRL_CHECK);
  }
  return 0;
}

/* Can this kernel do TLS records itself?  TCP_ULP "tls" on a connected
 * loopback socket is the real test (tcp_available_ulp only lists loaded
 * modules, and the module may load on demand). */
static bool
probe_ktls (void)
{
#ifdef TCP_ULP
  struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl (INADDR_LOOPBACK) };
  socklen_t al = sizeof a;
  bool ok = false;
  int l = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int s = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l >= 0 && s >= 0 && bind (l, (struct sockaddr *) &a, sizeof a) == 0
      && listen (l, 1) == 0 && getsockname (l, (struct sockaddr *) &a, &al) == 0
      && connect (s, (struct sockaddr *) &a, sizeof a) == 0)
    ok = setsockopt (s, SOL_TCP, TCP_ULP, "tls", sizeof "tls") == 0;
  if (l >= 0)
    close (l);
  if (s >= 0)
    close (s);
  return ok;
#else
  return false;
#endif
}

/* OpenSSL 3.0 cannot move a kernel TLS 1.3 session to a new key: its
 * KeyUpdate code changes the user-space cipher, never the kernel's
 * (openssl/openssl#16307), so a client's KeyUpdate, or our own after
 * rekey_records, would end the session.  kTLS is therefore kept to TLS
 * 1.2, which has no KeyUpdate.  The server picks TLS 1.3 whenever the
 * client lists it in supported_versions, so that decides it here, before
 * any key exists.  A TLS 1.2 session on kTLS also reads record by record:
 * OpenSSL hands the receive side to the kernel only when what it has read
 * ends on a record boundary, which read-ahead rarely leaves.  Untested
 * here: the machines this was written on have no tls module. */
static int
ktls_client_hello (SSL *ssl, int *alert, void *arg)
{
  const unsigned char *v;
  size_t len;
  if (SSL_client_hello_get0_ext (ssl, TLSEXT_TYPE_supported_versions, &v, &len) == 1
      && len >= 1)
    for (size_t i = 1; i + 1 < len && i + 1 <= v[0]; i += 2)
      if (v[i] == 3 && v[i + 1] == 4) {
        SSL_clear_options (ssl, SSL_OP_ENABLE_KTLS);
        log_debug ("TLS: the client offers TLS 1.3: no kernel TLS for this session "
                   "(OpenSSL 3.0 cannot update its keys)");
        return SSL_CLIENT_HELLO_SUCCESS;
      }
  SSL_set_read_ahead (ssl, 0);
  log_debug ("TLS: a TLS 1.2 client: kernel TLS where the suite allows, no read-ahead");
  return SSL_CLIENT_HELLO_SUCCESS;
}

/* ---- records sealed by blkd (tlsrec.c) ------------------------------- */

/* OpenSSL's key log: we keep SERVER_TRAFFIC_SECRET_0, the secret of the
 * direction we will seal, and nothing else. */
static void
keylog_cb (const SSL *ssl, const char *line)
{
  static const char label[] = "SERVER_TRAFFIC_SECRET_0 ";
  struct conn *c = SSL_get_app_data (ssl);
  struct tls_conn *t = c ? c->tls : NULL;
  if (!t || strncmp (line, label, sizeof label - 1) != 0)
    return;
  const char *hex = strchr (line + sizeof label - 1, ' ');   /* past client random */
  if (!hex)
    return;
  hex++;
  size_t n = 0;
  while (n < sizeof t->secret && hexval (hex[2 * n]) >= 0 && hexval (hex[2 * n + 1]) >= 0) {
    t->secret[n] = hexval (hex[2 * n]) << 4 | hexval (hex[2 * n + 1]);
    n++;
  }
  t->secret_len = hex[2 * n] == '\0' ? n : 0;
  t->written_at_secret = BIO_number_written (SSL_get_wbio (ssl));
}

static int out_drain (struct conn *c, struct tls_conn *t);

/* Seal one short record OpenSSL or we want sent in the room kept at the
 * end of out (TLS_OUT_RESERVE: a few alerts and KeyUpdates); when a client
 * has used that up without reading, try the socket once before giving up
 * on the session. */
static int
seal_control (struct conn *c, struct tls_conn *t, uint8_t type, const void *msg, size_t len)
{
  struct iovec piece = { (void *) msg, len };
  size_t k = 0;
  if (t->out_len + len + TLSREC_OVERHEAD > TLS_OUT_CAP && out_drain (c, t) == 1) {
    /* Part went out: move the rest to the front to make room. */
    memmove (t->out, t->out + t->out_off, t->out_len - t->out_off);
    t->out_len -= t->out_off;
    t->out_off = 0;
  }
  if (t->out_len + len + TLSREC_OVERHEAD <= TLS_OUT_CAP)
    k = tlsrec_seal (t->rec, type, &piece, 1, t->out + t->out_len);
  if (k == 0) {
    t->rec_broken = true;
    return -1;
  }
  t->out_len += k;
  return 0;
}

/* Our own KeyUpdate (update_not_requested), then the next key. */
static int
key_update (struct conn *c, struct tls_conn *t)
{
  static const uint8_t msg[] = { SSL3_MT_KEY_UPDATE, 0, 0, 1, SSL_KEY_UPDATE_NOT_REQUESTED };
  if (seal_control (c, t, TLSREC_HANDSHAKE, msg, sizeof msg) == -1
      || tlsrec_next_key (t->rec) == -1) {
    t->rec_broken = true;
    return -1;
  }
  return 0;
}

/* Once blkd seals, what OpenSSL writes goes to a null BIO; this callback
 * sees the plaintext of each such message and seals it in sequence.  A
 * KeyUpdate (OpenSSL answering a client's update_requested) moves our
 * key on, as it moved OpenSSL's. */
static void
msg_cb (int write_p, int version, int type, const void *buf, size_t len,
        SSL *ssl, void *arg)
{
  struct conn *c = SSL_get_app_data (ssl);
  struct tls_conn *t = c ? c->tls : NULL;
  if (!write_p || !t || !t->rec || t->rec_broken
      || (type != SSL3_RT_ALERT && type != SSL3_RT_HANDSHAKE))
    return;
  const uint8_t *m = buf;
  if (type == SSL3_RT_HANDSHAKE && len >= 1 && m[0] == SSL3_MT_KEY_UPDATE) {
    log_debug ("TLS: client asked for a key update: sending ours");
    if (key_update (c, t) == -1)
      log_error ("TLS: cannot send our key update (the client is not reading?); closing");
    return;
  }
  if (len > TLS_OUT_RESERVE - TLSREC_OVERHEAD || seal_control (c, t, type, buf, len) == -1) {
    log_error ("TLS: cannot send OpenSSL's %s message of %zu bytes; closing",
               type == SSL3_RT_ALERT ? "alert" : "handshake", len);
    t->rec_broken = true;
  }
}

/* A client's KeyUpdate with update_requested leaves OpenSSL owing one of
 * its own, which it would send at the next SSL_write, and blkd never calls
 * that once it seals: have it written now (into the null BIO; msg_cb seals
 * it and moves our key on).  Then tell the loop there is something to send.
 * The SSL_write path does the same (OpenSSL writes it into out), so a
 * client that has all its data gets the answer without waiting for more;
 * but not while OpenSSL holds a record for a retry, nor without room in
 * out: then the next SSL_write sends it ahead of its record, which is all
 * RFC 8446 4.6.3 asks. */
static void
seal_owed_key_update (struct tls_conn *t)
{
  if (!t->out || (!t->rec && (t->write_retry || TLS_OUT_CAP - t->out_len < TLS_OUT_RESERVE)))
    return;
  /* Mid-way through another post-handshake message OpenSSL refuses
   * (still in init): the next tls_recv tries again. */
  if (SSL_is_init_finished (t->ssl)
      && SSL_get_key_update_type (t->ssl) != SSL_KEY_UPDATE_NONE) {
    if (SSL_key_update (t->ssl, SSL_KEY_UPDATE_NOT_REQUESTED) != 1
        || SSL_do_handshake (t->ssl) != 1) {
      log_error ("TLS: cannot answer the client's key update; closing");
      t->rec_broken = true;
    }
    ERR_clear_error ();
  }
}

static void
answer_key_update (struct conn *c, struct tls_conn *t)
{
  seal_owed_key_update (t);
  if (tls_unsent (c) || t->rec_broken)
    event_add (c->ev_write, NULL);
}

/* Handshake done: take the send direction over from OpenSSL if we can.
 * Only when OpenSSL has written nothing under the application key (no
 * session tickets: num_tickets is 0), so our first record is number 0. */
/* Set (once, main thread) when a self-test fails, read by shard threads
 * at each hand-over: an atomic rather than a write to cfg that they read. */
static atomic_bool sealer_failed;

static bool
sealer_on (void)
{
  return cfg.tls_seal == TLS_SEAL_BLKD && !atomic_load_explicit (&sealer_failed,
                                                                  memory_order_relaxed);
}

static const char *
seal_takeover (struct tls_conn *t)
{
  BIO *wbio = SSL_get_wbio (t->ssl);
  const char *why = NULL;

  if (!sealer_on ())
    why = "OpenSSL";
  else if (BIO_get_ktls_send (wbio))
    why = "kernel";
  else if (SSL_version (t->ssl) != TLS1_3_VERSION)
    why = "OpenSSL (TLS 1.2)";
  else if (t->secret_len == 0 || BIO_number_written (wbio) != t->written_at_secret)
    why = "OpenSSL (no clean key hand-over)";
  else {
    const SSL_CIPHER *cipher = SSL_get_current_cipher (t->ssl);
    uint8_t mfl = SSL_SESSION_get_max_fragment_length (SSL_get0_session (t->ssl));
    t->max_content = TLSREC_MAX_CONTENT;
    if (mfl >= TLSEXT_max_fragment_length_512 && mfl <= TLSEXT_max_fragment_length_4096)
      t->max_content = 512u << (mfl - TLSEXT_max_fragment_length_512);
    t->rec = tlsrec_new (SSL_CIPHER_get_protocol_id (cipher),
                         SSL_CIPHER_get_handshake_digest (cipher), t->secret, t->secret_len);
    if (!t->rec)
      why = errno == ENOTSUP ? "OpenSSL (a suite blkd does not seal)"
                             : "OpenSSL (could not set up our sealing)";
    t->out = t->rec ? malloc (TLS_OUT_CAP) : NULL;
    /* From here OpenSSL writes only into the null BIO: its own records
     * reuse our nonces under the same key, so they must never reach the
     * socket; msg_cb re-seals what it meant to send. */
    BIO *sink = t->out ? BIO_new (BIO_s_null ()) : NULL;
    if (sink) {
      SSL_set0_wbio (t->ssl, sink);
      why = "blkd";
    }
    else {
      tlsrec_free (t->rec);
      t->rec = NULL;
      free (t->out);
      t->out = NULL;
      if (!why)
        why = "OpenSSL (no memory to seal ourselves)";
    }
  }
  OPENSSL_cleanse (t->secret, sizeof t->secret);
  t->secret_len = 0;
  return why;
}

/* Send sealed records: 0 all out, 1 the socket is full, -1 error (errno). */
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

/* ---- OpenSSL's records, collected (the default path) ----------------- */

/* collect_bio's write: append the record OpenSSL just sealed to out.  When
 * out has no room, send what it holds first; if the socket will not take
 * enough, refuse with a retry, as a full socket BIO would (OpenSSL keeps
 * the record and writes it again on the next call).  Never reorders:
 * out is sent from its front, appended at its end. */
static int
collect_write (BIO *b, const char *data, size_t len, size_t *written)
{
  struct conn *c = BIO_get_data (b);
  struct tls_conn *t = c->tls;

  BIO_clear_retry_flags (b);
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
static const char *
collect_takeover (struct conn *c, struct tls_conn *t, const char *why)
{
  BIO *b = collect_method ? BIO_new (collect_method) : NULL;
  t->out = b ? malloc (TLS_OUT_CAP) : NULL;
  if (!t->out) {
    BIO_free (b);
    log_warn ("TLS: no memory for the record buffer: one write per record");
    return why;
  }
  t->out_len = t->out_off = 0;
  BIO_set_data (b, c);
  BIO_set_init (b, 1);
  SSL_set0_wbio (t->ssl, b);
  return why;
}

bool
tls_unsent (struct conn *c)
{
  struct tls_conn *t = c->tls;
  return t && t->out_off < t->out_len;
}

/* tls_sendv when blkd seals: gather up to 16 KiB per record from iov,
 * TLS_OUT_RECORDS records per send(2).  Bytes sealed count as consumed;
 * tls_unsent keeps the connection waiting until the socket took them. */
static ssize_t
sealed_sendv (struct conn *c, struct tls_conn *t, const struct iovec *iov, int n)
{
  size_t total = 0, off = 0;
  int i = 0;

  for (;;) {
    if (t->rec_broken) {
      errno = EPROTO;
      return -1;
    }
    int r = out_drain (c, t);
    if (r != 0) {
      if (total > 0)
        return total;               /* the next call meets it again */
      if (r == 1)
        errno = EAGAIN;
      return -1;
    }
    while (i < n && off == iov[i].iov_len) {
      i++;
      off = 0;
    }
    if (i == n)
      return total;

    while (i < n && TLS_OUT_CAP - t->out_len >= TLSREC_MAX_RECORD + TLS_OUT_RESERVE) {
      struct iovec piece[SEND_PIECES_MAX];
      int np = 0;
      size_t len = 0;
      while (i < n && len < t->max_content && np < SEND_PIECES_MAX) {
        size_t k = iov[i].iov_len - off;
        if (k > t->max_content - len)
          k = t->max_content - len;
        if (k > 0)
          piece[np++] = (struct iovec) { (char *) iov[i].iov_base + off, k };
        len += k;
        off += k;
        if (off == iov[i].iov_len) {
          i++;
          off = 0;
        }
      }
      if (len == 0)
        break;
      size_t k = tlsrec_seal (t->rec, TLSREC_APPDATA, piece, np, t->out + t->out_len);
      t->out_len += k;
      total += len;
      if (k > 0 && tlsrec_records (t->rec) >= rekey_records)
        log_debug ("TLS: %" PRIu64 " records under this key: key update",
                   tlsrec_records (t->rec));
      if (k == 0 || (tlsrec_records (t->rec) >= rekey_records && key_update (c, t) == -1)) {
        t->rec_broken = true;
        log_error ("TLS: sealing a record failed; closing");
        errno = EPROTO;
        return -1;
      }
    }
  }
}

/* ---- the sealer's start-up self-test --------------------------------- */

/* blkd's sealer rests on how OpenSSL reports its keys and writes its
 * post-handshake messages; a new OpenSSL could change either without a
 * build error.  So --tls-seal=blkd first proves itself: a TLS 1.3
 * handshake with the configured credentials over an in-memory BIO pair,
 * records and key updates (ours, and OpenSSL's answer to a client's
 * request, re-sealed by msg_cb) sealed by blkd, read by an OpenSSL client.
 * Limits: it proves this OpenSSL build with these suites, not every
 * client; tests/test-tls-decrypt.py checks the records with a key
 * schedule of its own. */

#define SELFTEST_BYTES (2 * TLSREC_MAX_CONTENT + 1000)

/* PSK-only servers: the client offers one of the server's identities
 * (the client SSL's app data) with SHA-256, as GnuTLS clients do. */
static int
selftest_psk_use (SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                  SSL_SESSION **sess)
{
  const struct psk_entry *p = SSL_get_app_data (ssl);
  SSL_SESSION *s = psk_session (ssl, p);
  if (!s)
    return 0;
  *id = (const unsigned char *) p->identity;
  *idlen = strlen (p->identity);
  *sess = s;
  return 1;
}

/* Step both ends until the handshake is done: 0, or -1. */
static int
selftest_handshake (SSL *srv, SSL *cli)
{
  for (int i = 0; i < 16; i++) {
    int rs = SSL_do_handshake (srv), rc = SSL_do_handshake (cli);
    if (rs == 1 && rc == 1)
      return 0;
    int es = SSL_get_error (srv, rs), ec = SSL_get_error (cli, rc);
    if ((rs != 1 && es != SSL_ERROR_WANT_READ && es != SSL_ERROR_WANT_WRITE)
        || (rc != 1 && ec != SSL_ERROR_WANT_READ && ec != SSL_ERROR_WANT_WRITE))
      return -1;
  }
  return -1;
}

/* One suite against the server context sctx (with a PSK client when psk
 * is set, else a certificate handshake): NULL when blkd's records read
 * back exact, else why not. */
static const char *
selftest_suite (SSL_CTX *sctx, const struct psk_entry *psk, const char *suite)
{
  const char *why = NULL;
  struct conn *c = calloc (1, sizeof *c);
  struct tls_conn *t = calloc (1, sizeof *t);
  SSL_CTX *cctx = SSL_CTX_new (TLS_client_method ());
  SSL *cli = NULL;
  BIO *sbio = NULL, *cbio = NULL;
  uint8_t *sent = malloc (SELFTEST_BYTES), *got = malloc (SELFTEST_BYTES);

  if (!c || !t || !cctx || !sent || !got) {
    why = "out of memory";
    goto out;
  }
  c->fd = -1;
  c->tls = t;
  SSL_CTX_set_min_proto_version (cctx, TLS1_3_VERSION);
  SSL_CTX_set_verify (cctx, SSL_VERIFY_NONE, NULL);
  if (psk)
    SSL_CTX_set_psk_use_session_callback (cctx, selftest_psk_use);
  t->ssl = SSL_new (sctx);
  cli = SSL_new (cctx);
  if (SSL_CTX_set_ciphersuites (cctx, suite) != 1 || !t->ssl || !cli
      || BIO_new_bio_pair (&sbio, 4 * TLS_OUT_CAP, &cbio, 4 * TLS_OUT_CAP) != 1) {
    why = "cannot set up the loopback session";
    goto out;
  }
  SSL_set_app_data (t->ssl, c);
  SSL_set_verify (t->ssl, SSL_VERIFY_NONE, NULL);   /* the client has no certificate */
  SSL_set_accept_state (t->ssl);
  SSL_set_bio (t->ssl, sbio, sbio);
  SSL_set_app_data (cli, (void *) psk);
  SSL_set_connect_state (cli);
  SSL_set_bio (cli, cbio, cbio);
  if (selftest_handshake (t->ssl, cli) == -1) {
    why = "the loopback handshake failed";
    goto out;
  }
#ifdef BLKD_TEST_HOOKS
  if (getenv ("BLKD_TLS_SELFTEST_CORRUPT"))
    t->secret[0] ^= 1;              /* what a changed key log would do */
#endif
  const char *sealer = seal_takeover (t);
  if (strcmp (sealer, "blkd") != 0) {
    why = sealer;
    goto out;
  }

  /* Three records: the first under the first key, then a client's request
   * for a key update answered through OpenSSL and msg_cb, the second, our
   * own key update, the third. */
  for (size_t i = 0; i < SELFTEST_BYTES; i++)
    sent[i] = (uint8_t) (i * 7 + (i >> 8));
  size_t off = 0, n;
  for (int r = 0; r < 3 && !t->rec_broken; r++) {
    if (r == 1) {
      uint8_t b;
      size_t k;
      if (SSL_key_update (cli, SSL_KEY_UPDATE_REQUESTED) != 1 || SSL_do_handshake (cli) != 1
          || SSL_read_ex (t->ssl, &b, 1, &k) == 1) {
        why = "the client's key update request did not reach OpenSSL";
        goto out;
      }
      size_t before = t->out_len;
      seal_owed_key_update (t);
      if (t->out_len == before) {
        why = "OpenSSL's answer to a key update request did not reach msg_cb";
        goto out;
      }
    }
    else if (r == 2 && key_update (c, t) == -1)
      break;
    size_t len = r < 2 ? t->max_content : SELFTEST_BYTES - off;
    struct iovec piece = { sent + off, len };
    n = tlsrec_seal (t->rec, TLSREC_APPDATA, &piece, 1, t->out + t->out_len);
    if (n == 0)
      t->rec_broken = true;
    t->out_len += n;
    off += len;
  }
  if (t->rec_broken || BIO_write (sbio, t->out, t->out_len) != (int) t->out_len) {
    why = "sealing failed";
    goto out;
  }
  for (off = 0; off < SELFTEST_BYTES; off += n)
    if (SSL_read_ex (cli, got + off, SELFTEST_BYTES - off, &n) != 1) {
      why = "OpenSSL could not read the records blkd sealed";
      goto out;
    }
  if (memcmp (sent, got, SELFTEST_BYTES) != 0)
    why = "OpenSSL read other bytes than blkd sealed";

out:
  ERR_clear_error ();
  SSL_free (cli);
  if (t) {
    SSL_free (t->ssl);
    tlsrec_free (t->rec);
    free (t->out);
    OPENSSL_cleanse (t->secret, sizeof t->secret);
  }
  free (t);
  free (c);
  SSL_CTX_free (cctx);
  free (sent);
  free (got);
  return why;
}

/* Every suite blkd offers (the SHA-256 ones only for PSK: psk is one of
 * the server's keys for a PSK-only server, NULL when it has certificates):
 * on any failure the sealer is turned off for the life of the server, and
 * sctx loses the callbacks it needed (contexts built later must not set
 * them: they look at sealer_on()). */
static void
seal_selftest (SSL_CTX *sctx, const struct psk_entry *psk)
{
  static const char *const suites[] = {
    "TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_256_GCM_SHA384",
  };
  for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++) {
    if ((psk && strstr (suites[i], "SHA384")) || !strstr (tls13_suites (), suites[i]))
      continue;                     /* not offered */
    const char *why = selftest_suite (sctx, psk, suites[i]);
    if (why) {
      log_warn ("TLS: the --tls-seal=blkd self-test failed with %s: "
                "%s; OpenSSL seals every record instead", suites[i], why);
      atomic_store (&sealer_failed, true);
      SSL_CTX_set_keylog_callback (sctx, NULL);
      SSL_CTX_set_msg_callback (sctx, NULL);
      return;
    }
  }
}

/* A complete context from the files named on the command line: settings,
 * certificates, CA, CRL, pre-shared keys, and (--tls-seal=blkd) the
 * sealer's self-test against it.  NULL after logging which file was wrong
 * and why.  Start-up and every SIGHUP build one the same way, so a reload
 * cannot drift from what start-up would have made. */
static SSL_CTX *
ctx_build (size_t *npsks)
{
  const struct psk_table *tab = NULL;
  SSL_CTX *c = SSL_CTX_new (TLS_server_method ());
  if (!c) {
    log_error ("TLS: cannot create the OpenSSL context: %s", ssl_error_text ());
    return NULL;
  }
  SSL_CTX_set_min_proto_version (c, TLS1_2_VERSION);
  SSL_CTX_set_max_proto_version (c, TLS1_3_VERSION);
  /* No renegotiation (TLS 1.2), no resumption state kept between
   * connections (NBD clients connect once per use), and a client that
   * hangs up without close_notify is an ordinary EOF, as in clear.  Our
   * suite order (below) decides, except for a client that lists ChaCha20
   * first (one without AES hardware): it gets ChaCha20. */
  SSL_CTX_set_options (c, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE
                       | SSL_OP_PRIORITIZE_CHACHA
                       | SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF
                       | SSL_OP_NO_COMPRESSION);
  SSL_CTX_set_session_cache_mode (c, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets (c, 0);
  static const unsigned char sid_ctx[] = "blkd";
  SSL_CTX_set_session_id_context (c, sid_ctx, sizeof sid_ctx - 1);
  /* Partial writes: SSL_write returns after each record, so conn.c learns
   * exactly how many plaintext bytes were sealed.  Moving buffer: a retry
   * after WANT_WRITE may come from the staging buffer or the pool buffer
   * holding the same bytes. */
  SSL_CTX_set_mode (c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);

  /* AEAD suites only.  TLS 1.2 also gets the PSK suites GnuTLS offers
   * (ECDHE-PSK with ChaCha20, DHE-PSK and plain PSK with AES-GCM). */
  if (SSL_CTX_set_cipher_list (c,
        "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256"
        ":ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20"
        ":ECDHE-PSK-CHACHA20-POLY1305:DHE-PSK-AES128-GCM-SHA256:DHE-PSK-AES256-GCM-SHA384"
        ":DHE-PSK-CHACHA20-POLY1305:PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384"
        ":PSK-CHACHA20-POLY1305:!aNULL:!eNULL") != 1) {
    log_error ("TLS: cipher list: %s", ssl_error_text ());
    goto err;
  }
  SSL_CTX_set_dh_auto (c, 1);
  /* TLS 1.3: AES-128-GCM first (as Mozilla's server configurations and
   * Go do; AES-256-GCM costs ~30% more per byte, on both ends), AES-GCM
   * ahead of ChaCha20 (AES-NI).  It also has to be a SHA-256 suite first
   * for PSK: OpenSSL picks the suite before it looks at the client's PSK
   * and drops a PSK whose hash differs; GnuTLS binds external PSKs to
   * SHA-256, so a SHA-384 suite first would push PSK clients onto the
   * certificate path (GnuTLS: "Insufficient credentials").  --tls-suites
   * replaces the order (checked in tls_setup). */
  if (SSL_CTX_set_ciphersuites (c, tls13_suites ()) != 1) {
    log_error ("TLS: cipher suites: %s", ssl_error_text ());
    goto err;
  }

  if (cfg.tls_certificates && load_certificates (c, cfg.tls_certificates) == -1)
    goto err;
  *npsks = 0;
  if (cfg.tls_psk) {
    /* Attached before it is filled: freeing the context frees it. */
    struct psk_table *fill = calloc (1, sizeof *fill);
    if (!fill || !SSL_CTX_set_ex_data (c, psk_index, fill)) {
      free (fill);
      log_error ("--tls-psk: out of memory");
      goto err;
    }
    if (load_psk_file (cfg.tls_psk, fill) == -1)
      goto err;
    tab = fill;
    *npsks = tab->n;
    SSL_CTX_set_psk_find_session_callback (c, psk_find_session);
    SSL_CTX_set_psk_server_callback (c, psk_server_cb);
  }
  if (cfg.tls_verify_peer)
    SSL_CTX_set_verify (c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);

  /* Read several records per read(2) (read-ahead); kernel TLS, when the
   * kernel has it, for TLS 1.2 sessions only (ktls_client_hello turns
   * read-ahead off for those). */
  SSL_CTX_set_read_ahead (c, 1);
  SSL_CTX_set_default_read_buffer_len (c, TLS_READ_BUF);
  bool ktls_decide = ktls_kernel;
#ifdef BLKD_TEST_HOOKS
  /* Make the per-session decision without a tls module (OpenSSL's own
   * attempt then fails quietly and the session stays in user space). */
  if (getenv ("BLKD_TLS_TEST_KTLS"))
    ktls_decide = true;
#endif
  if (ktls_decide) {
    SSL_CTX_set_options (c, SSL_OP_ENABLE_KTLS);
    SSL_CTX_set_client_hello_cb (c, ktls_client_hello, NULL);
  }

  /* Once a self-test has failed, sealer_on() says so, and no later
   * context asks for the sealer again. */
  if (sealer_on ()) {
    SSL_CTX_set_keylog_callback (c, keylog_cb);
    SSL_CTX_set_msg_callback (c, msg_cb);
    seal_selftest (c, have_certs ? NULL : &tab->v[0]);
#ifdef BLKD_TEST_HOOKS
    /* A ticket is a message OpenSSL writes under the application key
     * before blkd could take over: the hand-over must see it and leave
     * the session with SSL_write. */
    if (getenv ("BLKD_TLS_TEST_TICKETS"))
      SSL_CTX_set_num_tickets (c, 1);
#endif
  }
  return c;

err:
  SSL_CTX_free (c);               /* and the PSK table with it */
  return NULL;
}

int
tls_setup (void)
{
  size_t npsks;

  if (!cfg.tls_certificates && !cfg.tls_psk) {
    fprintf (stderr, "blkd: --tls=%s needs --tls-certificates=DIR or --tls-psk=FILE\n",
             cfg.tls == TLS_REQUIRE ? "require" : "on");
    return -1;
  }
  if (cfg.tls_verify_peer && !cfg.tls_certificates) {
    fprintf (stderr, "blkd: --tls-verify-peer needs --tls-certificates=DIR (the CA)\n");
    return -1;
  }
  /* A PSK client shows no certificate (TLS 1.3 forbids a certificate
   * request in a PSK handshake), so "client certificates required" could
   * not hold for it. */
  if (cfg.tls_verify_peer && cfg.tls_psk) {
    fprintf (stderr, "blkd: --tls-verify-peer cannot be combined with --tls-psk: PSK "
             "clients present no certificate; use one or the other\n");
    return -1;
  }
  if (cfg.tls_suites && check_suites (cfg.tls_suites) == -1)
    return -1;
  have_certs = cfg.tls_certificates != NULL;
  psk_index = SSL_CTX_get_ex_new_index (0, NULL, NULL, NULL, psk_table_ex_free);
  if (psk_index < 0) {
    fprintf (stderr, "blkd: TLS: cannot register the PSK table: %s\n", ssl_error_text ());
    return -1;
  }
  ktls_kernel = probe_ktls ();
  collect_method = BIO_meth_new (BIO_get_new_index () | BIO_TYPE_SOURCE_SINK,
                                 "blkd TLS records");
  if (!collect_method || !BIO_meth_set_write_ex (collect_method, collect_write)
      || !BIO_meth_set_ctrl (collect_method, collect_ctrl)) {
    fprintf (stderr, "blkd: TLS: cannot make the record BIO: %s\n", ssl_error_text ());
    return -1;
  }

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
  ctx = ctx_build (&npsks);
  if (!ctx)
    return -1;

  fprintf (stderr, "blkd: TLS %s: TLS 1.2-1.3 with %s%s%s%s; %s; %s\n",
           cfg.tls == TLS_REQUIRE ? "required" : "offered",
           have_certs ? "X.509 certificates from " : "",
           have_certs ? cfg.tls_certificates : "",
           have_certs && npsks ? " and " : "",
           npsks ? "pre-shared keys" : "",
           ktls_kernel ? "kernel TLS available (for TLS 1.2 sessions)"
                       : "kernel TLS unavailable (no tls ULP): records sealed in user space",
           sealer_on () ? "TLS 1.3 records we send sealed by blkd "
                                           "(--tls-seal=blkd, self-test passed)"
                                         : "records sealed by OpenSSL");
  if (cfg.tls_verify_peer)
    fprintf (stderr, "blkd: TLS: client certificates must chain to %s/ca-cert.pem\n",
             cfg.tls_certificates);
  return 0;
}

/* SIGHUP: read every credential file again; new handshakes use the result.
 * All or nothing: one bad file (or a certificate rotated before its key)
 * keeps the whole old set, so a half-finished rotation never mixes the two.
 * Sessions up or mid-handshake hold a reference to the context they began
 * with and never see the change. */
int
tls_reload (void)
{
  size_t npsks;
  SSL_CTX *fresh = ctx_build (&npsks);
  if (!fresh) {
    log_error ("TLS reload failed: new handshakes keep the credentials loaded before");
    errno = EINVAL;
    return -1;
  }
  pthread_mutex_lock (&ctx_lock);
  SSL_CTX *old = ctx;
  ctx = fresh;
  pthread_mutex_unlock (&ctx_lock);
  SSL_CTX_free (old);
  log_info ("TLS reloaded: new handshakes use %s%s%s%s%s%s",
            have_certs ? "the certificates in " : "", have_certs ? cfg.tls_certificates : "",
            have_certs && npsks ? " and " : "", npsks ? "the pre-shared keys in " : "",
            npsks ? cfg.tls_psk : "", cfg.tls_verify_peer ? " (client CA and CRL too)" : "");
  return 0;
}

void
tls_cleanup (void)
{
  BIO_meth_free (collect_method);
  collect_method = NULL;
  SSL_CTX_free (ctx);             /* the PSK table goes with it */
  ctx = NULL;
}

/* ---- per connection -------------------------------------------------- */

int
tls_start (struct conn *c)
{
  struct tls_conn *t = calloc (1, sizeof *t);
  if (!t)
    return -1;
  /* A reference of our own, so a reload may swap and free the shared one
   * between the unlock and SSL_new (which takes the session's own). */
  pthread_mutex_lock (&ctx_lock);
  SSL_CTX *cur = ctx;
  SSL_CTX_up_ref (cur);
  pthread_mutex_unlock (&ctx_lock);
  t->ssl = SSL_new (cur);
  SSL_CTX_free (cur);
  if (!t->ssl || SSL_set_fd (t->ssl, c->fd) != 1) {
    log_error ("TLS: cannot create a session: %s", ssl_error_text ());
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
    if (t->out && !t->rec_broken)
      out_drain (c, t);
  }
  SSL_free (t->ssl);
  tlsrec_free (t->rec);
  free (t->out);
  OPENSSL_cleanse (t->secret, sizeof t->secret);   /* handshake failed after the key log */
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

  if (t->psk_unknown && !t->psk_identity) {
    log_error ("TLS handshake failed: unknown PSK identity \"%s\"", t->unknown_id);
    return;
  }
  if (sslerr == SSL_ERROR_SYSCALL && e == 0) {
    if (errno == 0 || errno == ECONNRESET || errno == EPIPE)
      log_error ("TLS handshake failed: client closed the connection%s",
                 have_certs ? " (did it reject our certificate?)" : "");
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
                 have_certs ? " (did it reject our certificate?)" : "");
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
               t->psk_identity ? t->psk_identity : "?");
    return;
  case SSL_R_DECRYPTION_FAILED_OR_BAD_RECORD_MAC:
    if (t->psk_identity) {
      log_error ("TLS handshake failed: wrong pre-shared key for PSK identity \"%s\"",
                 t->psk_identity);
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
               t->psk_unknown ? " (the client's PSK identity is unknown here)"
               : !have_certs ? " (PSK only here: the client offered no PSK)" : "", what);
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
    else if (alert == SSL_AD_DECRYPT_ERROR && t->psk_identity)
      hint = ": wrong pre-shared key?";
    else if (alert == SSL_AD_UNKNOWN_PSK_IDENTITY)
      hint = ": the client does not know our PSK identity";
    log_error ("TLS handshake failed: client sent alert \"%s\"%s",
               SSL_alert_desc_string_long (alert), hint);
    return;
  }
  log_error ("TLS handshake failed: %s%s", what[0] ? what : "unknown error",
             t->psk_unknown ? " (the client's PSK identity is unknown here)" : "");
}

static void
handshake_done (struct conn *c)
{
  struct tls_conn *t = c->tls;
  t->up = true;
  c->phase = CONN_HS_OPTIONS;
  c->pc.ctx.is_tls = true;
  const char *sealer = seal_takeover (t);
  if (!t->rec && !BIO_get_ktls_send (SSL_get_wbio (t->ssl)))
    sealer = collect_takeover (c, t, sealer);
  if (log_verbose) {
    X509 *peer = SSL_get0_peer_certificate (t->ssl);
    char subject[256] = "";
    if (peer)
      X509_NAME_oneline (X509_get_subject_name (peer), subject, sizeof subject);
    bool kr = BIO_get_ktls_recv (SSL_get_rbio (t->ssl));
    log_debug ("TLS up: %s %s%s%s%s%s; records: sent sealed by %s, received by %s",
               SSL_get_version (t->ssl), SSL_get_cipher_name (t->ssl),
               t->psk_identity ? ", PSK identity " : "",
               t->psk_identity ? t->psk_identity : "",
               peer ? ", client certificate " : "", subject,
               sealer, kr ? "kernel" : "OpenSSL");
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
    if (r == -1 || t->rec_broken)
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

/* The SSL_write path keeps the sealer's record policy: after
 * rekey_records records under one TLS 1.3 key, a KeyUpdate (OpenSSL sends
 * it ahead of the next record it writes).  Partial writes return after a
 * record or a few, so counting whole 16 KiB records in what was written
 * never counts more records than were sealed.  Kernel TLS never gets
 * here for TLS 1.3 (see ktls_client_hello). */
static void
ossl_rekey_policy (struct tls_conn *t, size_t written)
{
  t->ossl_records += (written + TLS_RECORD - 1) / TLS_RECORD;
  if (t->ossl_records < rekey_records || SSL_version (t->ssl) != TLS1_3_VERSION)
    return;
  log_debug ("TLS: %" PRIu64 " records under this key: key update", t->ossl_records);
  if (SSL_key_update (t->ssl, SSL_KEY_UPDATE_NOT_REQUESTED) == 1)
    t->ossl_records = 0;
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
   * (per record it cost about 1% of the CPU at 256 KiB). */
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
    if (t->out && TLS_OUT_CAP - t->out_len < TLS_OSSL_RECORD_MAX + TLS_OUT_RESERVE) {
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
  if (t->rec)
    return sealed_sendv (c, t, iov, n);
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
  return t && !t->rec && t->write_wants_read;
}
