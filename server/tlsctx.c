/* The TLS context new sessions start from: credentials (an X.509
 * directory, a psktool key file), protocol versions and suites, the
 * kernel-TLS decision; built at start-up and rebuilt on SIGHUP
 * (tls_reload).  tls.c makes each session from it. */
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

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "internal.h"
#include "tlsctx.h"
#include "vector.h"

/* With read-ahead, OpenSSL reads this much per read(2), several records. */
#define TLS_READ_BUF (4 * (SSL3_RT_MAX_PLAIN_LENGTH + SSL3_RT_MAX_ENCRYPTED_OVERHEAD \
                           + SSL3_RT_HEADER_LENGTH))
/* Shorter pre-shared keys are accepted with a warning (RFC 9257 asks for
 * at least 128 bits of entropy). */
#define TLS_PSK_MIN_BYTES 16

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
 * threads take a reference under the same lock in tlsctx_new_session.  A context is
 * freed by whoever drops its last reference: the reload for an idle one,
 * else the SSL_free of the last session begun on it. */
static int note_index = -1;       /* SSL ex_data: the session's tls_psk_note */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static SSL_CTX *ctx;
static int psk_index = -1;
static bool ktls_kernel;          /* the kernel accepted TCP_ULP "tls" */
#define TLS_SUITES_DEFAULT \
  "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"

/* The TLS 1.3 suites offered, in the server's order of preference. */
static const char *
tls13_suites (void)
{
  return cfg.tls_suites ? cfg.tls_suites : TLS_SUITES_DEFAULT;
}

/* --tls-suites: names OpenSSL would silently skip if unknown, so they are
 * checked here; only OpenSSL's default three (the AEAD suites every TLS
 * 1.3 client has), each at most once.  With pre-shared keys the first must
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
const char *
tls_error_text (void)
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
  size_t npsks = 0, psks_cap = 0;
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
    struct psk_entry *nv = vec_grow (psks, &psks_cap, npsks + 1, sizeof *psks, 8);
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
note_unknown (SSL *ssl, const void *id, size_t len)
{
  struct tls_psk_note *note = SSL_get_ex_data (ssl, note_index);
  const unsigned char *p = id;
  size_t n = len < sizeof note->unknown_id - 1 ? len : sizeof note->unknown_id - 1;
  for (size_t i = 0; i < n; i++)
    note->unknown_id[i] = p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' ? p[i] : '?';
  note->unknown_id[n] = '\0';
  note->unknown = true;
}

static void
note_known (SSL *ssl, const struct psk_entry *p)
{
  struct tls_psk_note *note = SSL_get_ex_data (ssl, note_index);
  note->identity = p->identity;
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
  const struct psk_entry *p = psk_lookup (ssl, id, idlen);

  *sess = NULL;
  if (!p) {
    note_unknown (ssl, id, idlen);
    return 1;                       /* no PSK: a certificate handshake may follow */
  }
  SSL_SESSION *s = psk_session (ssl, p);
  if (!s)
    return 0;
  note_known (ssl, p);
  *sess = s;
  return 1;
}

/* TLS 1.2 PSK suites (PSK, DHE-PSK, ECDHE-PSK). */
static unsigned int
psk_server_cb (SSL *ssl, const char *identity, unsigned char *psk, unsigned int max)
{
  const struct psk_entry *p = identity ? psk_lookup (ssl, identity, strlen (identity)) : NULL;
  if (!p || p->keylen > max) {
    note_unknown (ssl, identity ? identity : "", identity ? strlen (identity) : 0);
    return 0;
  }
  memcpy (psk, p->key, p->keylen);
  note_known (ssl, p);
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
    log_error ("--tls-certificates: %s: %s", path, tls_error_text ());
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
                 path, tls_error_text ());
    else
      log_error ("--tls-certificates: %s: %s", path, tls_error_text ());
    return -1;
  }
  if (SSL_CTX_check_private_key (c) != 1) {
    log_error ("--tls-certificates: %s does not match server-cert.pem: %s",
               path, tls_error_text ());
    return -1;
  }

  /* ca-cert.pem: the CA client certificates must chain to.  Needed only
   * with --tls-verify-peer (nbdkit's layout always has it). */
  if ((r = need_file (dir, "ca-cert.pem", path, sizeof path, cfg.tls_verify_peer)) < 0)
    return -1;
  if (r == 1 && cfg.tls_verify_peer) {
    STACK_OF (X509_NAME) *names = SSL_load_client_CA_file (path);
    if (SSL_CTX_load_verify_locations (c, path, NULL) != 1 || !names) {
      log_error ("--tls-certificates: %s: %s", path, tls_error_text ());
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
                 r < 0 ? "unreadable" : tls_error_text ());
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

/* A complete context from the files named on the command line: settings,
 * certificates, CA, CRL, pre-shared keys.  NULL after logging which file
 * was wrong and why.  Start-up and every SIGHUP build one the same way, so a reload
 * cannot drift from what start-up would have made. */
static SSL_CTX *
ctx_build (size_t *npsks)
{
  const struct psk_table *tab = NULL;
  SSL_CTX *c = SSL_CTX_new (TLS_server_method ());
  if (!c) {
    log_error ("TLS: cannot create the OpenSSL context: %s", tls_error_text ());
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
    log_error ("TLS: cipher list: %s", tls_error_text ());
    goto err;
  }
  SSL_CTX_set_dh_auto (c, 1);
  /* TLS 1.3: AES-128-GCM first (as Mozilla's server configurations and
   * Go do; AES-256-GCM costs more per byte, on both ends), AES-GCM
   * ahead of ChaCha20 (AES-NI).  It also has to be a SHA-256 suite first
   * for PSK: OpenSSL picks the suite before it looks at the client's PSK
   * and drops a PSK whose hash differs; GnuTLS binds external PSKs to
   * SHA-256, so a SHA-384 suite first would push PSK clients onto the
   * certificate path (GnuTLS: "Insufficient credentials").  --tls-suites
   * replaces the order (checked in tls_setup). */
  if (SSL_CTX_set_ciphersuites (c, tls13_suites ()) != 1) {
    log_error ("TLS: cipher suites: %s", tls_error_text ());
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

  return c;

err:
  SSL_CTX_free (c);               /* and the PSK table with it */
  return NULL;
}

/* Checks the options, then builds the first context; -1 after printing
 * why. */
int
tlsctx_setup (void)
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
  psk_index = SSL_CTX_get_ex_new_index (0, NULL, NULL, NULL, psk_table_ex_free);
  if (psk_index < 0) {
    fprintf (stderr, "blkd: TLS: cannot register the PSK table: %s\n", tls_error_text ());
    return -1;
  }
  ktls_kernel = probe_ktls ();
  note_index = SSL_get_ex_new_index (0, NULL, NULL, NULL, NULL);
  if (note_index < 0) {
    fprintf (stderr, "blkd: TLS: cannot register the PSK note: %s\n", tls_error_text ());
    return -1;
  }
  ctx = ctx_build (&npsks);
  if (!ctx)
    return -1;

  if (cfg.quiet)
    return 0;
  fprintf (stderr, "blkd: TLS %s: TLS 1.2-1.3 with %s%s%s%s; %s\n",
           cfg.tls == TLS_REQUIRE ? "required" : "offered",
           cfg.tls_certificates ? "X.509 certificates from " : "",
           cfg.tls_certificates ? cfg.tls_certificates : "",
           cfg.tls_certificates && npsks ? " and " : "",
           npsks ? "pre-shared keys" : "",
           ktls_kernel ? "kernel TLS available (for TLS 1.2 sessions)"
                       : "kernel TLS unavailable (no tls ULP): records sealed in user space");
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
            cfg.tls_certificates ? "the certificates in " : "", cfg.tls_certificates ? cfg.tls_certificates : "",
            cfg.tls_certificates && npsks ? " and " : "", npsks ? "the pre-shared keys in " : "",
            npsks ? cfg.tls_psk : "", cfg.tls_verify_peer ? " (client CA and CRL too)" : "");
  return 0;
}

void
tlsctx_cleanup (void)
{
  SSL_CTX_free (ctx);             /* the PSK table goes with it */
  ctx = NULL;
}

/* A session on the current context, noting its PSK identity in *note.
 * Takes a reference of its own first, so a reload may swap and free the
 * shared one between the unlock and SSL_new (which takes the session's). */
SSL *
tlsctx_new_session (struct tls_psk_note *note)
{
  pthread_mutex_lock (&ctx_lock);
  SSL_CTX *cur = ctx;
  SSL_CTX_up_ref (cur);
  pthread_mutex_unlock (&ctx_lock);
  SSL *ssl = SSL_new (cur);
  SSL_CTX_free (cur);
  if (ssl && !SSL_set_ex_data (ssl, note_index, note)) {
    SSL_free (ssl);
    ssl = NULL;
  }
  return ssl;
}
