/* A TLS 1.3 NBD client (OpenSSL) that asks the server for key updates
 * while it writes and reads back data: the test of blkd's own record
 * sealing against KeyUpdate, which libnbd and Python cannot send.
 *
 *   tls-keyupdate PORT CA-FILE ROUNDS UPDATE-EVERY [FLOOD]
 *
 * Each round writes 64 KiB of a round-specific pattern and reads it back;
 * every UPDATE-EVERY rounds (0: never) the client sends KeyUpdate with
 * update_requested, so the server must answer with its own and move its
 * sending key on.  FLOOD: first send that many KeyUpdates back to back
 * without reading (the server may answer them with fewer, RFC 8446 4.6.3).
 * Prints how many KeyUpdates it sent and received; exits 1 on any error or
 * wrong byte.  TLS_KU_MFL=512|1024|2048|4096 in the environment asks for
 * that max_fragment_length (RFC 6066): records must not be larger.
 * TLS_KU_SUITES limits the TLS 1.3 suites offered (OpenSSL's names).
 * TLS_KU_CAPTURE=PREFIX records what tests/test-tls-decrypt.py checks:
 * PREFIX.raw, every byte read from the socket once TLS starts;
 * PREFIX.keylog, the session's secrets (SSLKEYLOGFILE format);
 * PREFIX.plain, every byte of plaintext OpenSSL returned.  The client then
 * reads to the server's close_notify before it closes.
 *
 * Large replies under a slow reader: TLS_KU_BIG=MIB (a multiple of 4)
 * writes MIB MiB after the rounds, then sends all MIB/4 READs of 4 MiB at
 * once, so the server has MIB MiB of replies queued against a full socket,
 * and reads them back 64 KiB at a time; with UPDATE-EVERY > 0 a KeyUpdate
 * request goes out after every UPDATE-EVERY MiB read, in the middle of a
 * reply.  TLS_KU_RCVBUF=BYTES shrinks the socket's receive buffer (before
 * connect, so the window stays small); TLS_KU_PAUSE_MS=N sleeps N ms after
 * each MiB read.  A last 4 KiB READ follows, so every KeyUpdate the
 * server owes arrives before the end.  Rounds printed are the rounds plus
 * the READs of this phase.
 *
 * TLS_KU_NO_DISC=1: the client does not disconnect but waits for the
 * server to close (with TLS_KU_CAPTURE it must send close_notify). */
#include <arpa/inet.h>
#include <endian.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#define CHUNK (64 * 1024)

static unsigned updates_received;
static FILE *cap_raw, *cap_keylog, *cap_plain;

static void
die (const char *what)
{
  fprintf (stderr, "tls-keyupdate: %s\n", what);
  ERR_print_errors_fp (stderr);
  exit (1);
}

static void
msg_cb (int write_p, int version, int type, const void *buf, size_t len, SSL *ssl, void *arg)
{
  const uint8_t *m = buf;
  if (!write_p && type == SSL3_RT_HANDSHAKE && len >= 1 && m[0] == SSL3_MT_KEY_UPDATE)
    updates_received++;
}

static FILE *
cap_open (const char *prefix, const char *ext)
{
  char path[4096];
  snprintf (path, sizeof path, "%s.%s", prefix, ext);
  FILE *f = fopen (path, "wb");
  if (!f)
    die ("cannot create a capture file");
  return f;
}

static void
keylog_cb (const SSL *ssl, const char *line)
{
  fprintf (cap_keylog, "%s\n", line);
  fflush (cap_keylog);
}

/* Every byte OpenSSL reads from the socket, before it decrypts it. */
static long
raw_cb (BIO *b, int oper, const char *argp, size_t len, int argi, long argl, int ret,
        size_t *processed)
{
  if (oper == (BIO_CB_READ | BIO_CB_RETURN) && ret > 0 && processed && *processed > 0)
    fwrite (argp, 1, *processed, cap_raw);
  return ret;
}

static void
fd_read (int fd, void *buf, size_t len)
{
  for (size_t got = 0; got < len;) {
    ssize_t k = read (fd, (char *) buf + got, len - got);
    if (k <= 0)
      die ("read from the server failed in clear");
    got += k;
  }
}

static void
fd_write (int fd, const void *buf, size_t len)
{
  if (write (fd, buf, len) != (ssize_t) len)
    die ("write to the server failed in clear");
}

static void
tls_read (SSL *ssl, void *buf, size_t len)
{
  size_t got;
  for (size_t have = 0; have < len; have += got)
    if (SSL_read_ex (ssl, (char *) buf + have, len - have, &got) != 1)
      die ("TLS read failed");
  if (cap_plain)
    fwrite (buf, 1, len, cap_plain);
}

static void
tls_write (SSL *ssl, const void *buf, size_t len)
{
  size_t put;
  if (SSL_write_ex (ssl, buf, len, &put) != 1 || put != len)
    die ("TLS write failed");
}

/* Option header: IHAVEOPT, option, length. */
static void
send_option (int fd, SSL *ssl, uint32_t opt, const void *data, uint32_t len)
{
  uint8_t h[16];
  uint64_t magic = htobe64 (0x49484156454F5054ULL);
  uint32_t o = htobe32 (opt), l = htobe32 (len);
  memcpy (h, &magic, 8);
  memcpy (h + 8, &o, 4);
  memcpy (h + 12, &l, 4);
  if (ssl) {
    tls_write (ssl, h, sizeof h);
    if (len)
      tls_write (ssl, data, len);
  }
  else
    fd_write (fd, h, sizeof h);
}

/* Option reply header: magic, option, type, length. Returns the type. */
static uint32_t
read_reply (int fd, SSL *ssl, uint32_t *len)
{
  uint8_t h[20];
  uint32_t type;
  if (ssl)
    tls_read (ssl, h, sizeof h);
  else
    fd_read (fd, h, sizeof h);
  memcpy (&type, h + 12, 4);
  memcpy (len, h + 16, 4);
  *len = be32toh (*len);
  return be32toh (type);
}

static void
request (SSL *ssl, uint16_t type, uint64_t cookie, uint64_t offset, uint32_t count)
{
  uint8_t h[28];
  uint32_t magic = htobe32 (0x25609513);
  uint16_t flags = 0, t = htobe16 (type);
  uint64_t c = htobe64 (cookie), o = htobe64 (offset);
  uint32_t n = htobe32 (count);
  memcpy (h, &magic, 4);
  memcpy (h + 4, &flags, 2);
  memcpy (h + 6, &t, 2);
  memcpy (h + 8, &c, 8);
  memcpy (h + 16, &o, 8);
  memcpy (h + 24, &n, 4);
  tls_write (ssl, h, sizeof h);
}

static void
simple_reply (SSL *ssl, uint64_t cookie)
{
  uint8_t h[16];
  uint32_t magic, err;
  uint64_t c;
  tls_read (ssl, h, sizeof h);
  memcpy (&magic, h, 4);
  memcpy (&err, h + 4, 4);
  memcpy (&c, h + 8, 8);
  if (be32toh (magic) != 0x67446698 || be64toh (c) != cookie)
    die ("bad reply header");
  if (err)
    die ("the server answered with an error");
}

/* The byte at offset off of the big-mode disk. */
static uint8_t
big_byte (uint64_t off)
{
  return (uint8_t) (off * 13 + (off >> 12) * 7 + (off >> 20));
}

/* TLS_KU_BIG: see the top.  Returns the READs made. */
static int
big_run (SSL *ssl, unsigned mib, int every, unsigned pause_ms, unsigned *updates_sent)
{
  const uint32_t mb = 1024 * 1024, rd = 4 * mb;
  static uint8_t buf[CHUNK];
  uint8_t *w = malloc (mb);
  if (!w)
    die ("out of memory");
  for (unsigned m = 0; m < mib; m++) {
    for (uint32_t i = 0; i < mb; i++)
      w[i] = big_byte ((uint64_t) m * mb + i);
    request (ssl, 1 /* WRITE */, 1000000 + m, (uint64_t) m * mb, mb);
    tls_write (ssl, w, mb);
    simple_reply (ssl, 1000000 + m);
  }
  free (w);

  unsigned reads = mib / 4;
  for (unsigned r = 0; r < reads; r++)
    request (ssl, 0 /* READ */, 2000000 + r, (uint64_t) r * rd, rd);
  uint64_t done = 0;
  for (unsigned r = 0; r < reads; r++) {
    simple_reply (ssl, 2000000 + r);
    for (uint32_t got = 0; got < rd; got += CHUNK) {
      tls_read (ssl, buf, CHUNK);
      for (uint32_t i = 0; i < CHUNK; i++)
        if (buf[i] != big_byte (done + i)) {
          fprintf (stderr, "tls-keyupdate: big read: wrong byte at offset %llu\n",
                   (unsigned long long) (done + i));
          exit (1);
        }
      done += CHUNK;
      if (done % mb == 0) {
        if (every > 0 && (done / mb) % every == 0 && done < (uint64_t) mib * mb) {
          if (SSL_key_update (ssl, SSL_KEY_UPDATE_REQUESTED) != 1 || SSL_do_handshake (ssl) != 1)
            die ("SSL_key_update in the middle of a reply");
          (*updates_sent)++;
        }
        if (pause_ms) {
          struct timespec ts = { pause_ms / 1000, (pause_ms % 1000) * 1000000L };
          nanosleep (&ts, NULL);
        }
      }
    }
  }
  /* One more round trip: the server owes the answer to our last request
   * before this reply's record (RFC 8446 4.6.3), so it is counted. */
  request (ssl, 0 /* READ */, 3000000, 0, 4096);
  simple_reply (ssl, 3000000);
  tls_read (ssl, buf, 4096);
  for (uint32_t i = 0; i < 4096; i++)
    if (buf[i] != big_byte (i))
      die ("big read: wrong data in the last reply");
  return reads + 1;
}

int
main (int argc, char **argv)
{
  if (argc != 5 && argc != 6) {
    fprintf (stderr, "usage: tls-keyupdate PORT CA-FILE ROUNDS UPDATE-EVERY [FLOOD]\n");
    return 2;
  }
  int rounds = atoi (argv[3]), every = atoi (argv[4]);
  int flood = argc == 6 ? atoi (argv[5]) : 0;
  unsigned updates_sent = 0;

  struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons (atoi (argv[1])) };
  a.sin_addr.s_addr = htonl (INADDR_LOOPBACK);
  int fd = socket (AF_INET, SOCK_STREAM, 0);
  const char *rcvbuf = getenv ("TLS_KU_RCVBUF");
  int rb = rcvbuf ? atoi (rcvbuf) : 0;
  if (fd >= 0 && rb > 0 && setsockopt (fd, SOL_SOCKET, SO_RCVBUF, &rb, sizeof rb) != 0)
    die ("SO_RCVBUF");
  if (fd < 0 || connect (fd, (struct sockaddr *) &a, sizeof a) != 0)
    die ("cannot connect");

  /* Fixed newstyle greeting; our flags: FIXED_NEWSTYLE | NO_ZEROES. */
  uint8_t greet[18];
  fd_read (fd, greet, sizeof greet);
  if (memcmp (greet, "NBDMAGIC", 8) != 0)
    die ("not an NBD server");
  uint32_t cflags = htobe32 (3);
  fd_write (fd, &cflags, 4);

  uint32_t len;
  send_option (fd, NULL, 5 /* STARTTLS */, NULL, 0);
  if (read_reply (fd, NULL, &len) != 1 || len != 0)
    die ("STARTTLS was not acknowledged");

  SSL_CTX *ctx = SSL_CTX_new (TLS_client_method ());
  if (!ctx)
    die ("SSL_CTX_new");
  SSL_CTX_set_min_proto_version (ctx, TLS1_3_VERSION);
  SSL_CTX_set_verify (ctx, SSL_VERIFY_PEER, NULL);
  if (SSL_CTX_load_verify_locations (ctx, argv[2], NULL) != 1)
    die ("cannot load the CA");
  SSL_CTX_set_msg_callback (ctx, msg_cb);
  const char *mfl = getenv ("TLS_KU_MFL");
  if (mfl) {
    int v = atoi (mfl), code = v == 512 ? 1 : v == 1024 ? 2 : v == 2048 ? 3 : v == 4096 ? 4 : 0;
    if (!code || SSL_CTX_set_tlsext_max_fragment_length (ctx, code) != 1)
      die ("TLS_KU_MFL must be 512, 1024, 2048 or 4096");
  }
  const char *suites = getenv ("TLS_KU_SUITES");
  if (suites && SSL_CTX_set_ciphersuites (ctx, suites) != 1)
    die ("TLS_KU_SUITES: not a TLS 1.3 suite list");
  const char *cap = getenv ("TLS_KU_CAPTURE");
  if (cap) {
    cap_raw = cap_open (cap, "raw");
    cap_keylog = cap_open (cap, "keylog");
    cap_plain = cap_open (cap, "plain");
    SSL_CTX_set_keylog_callback (ctx, keylog_cb);
  }
  SSL *ssl = SSL_new (ctx);
  if (!ssl || SSL_set_fd (ssl, fd) != 1 || !SSL_set1_host (ssl, "localhost"))
    die ("TLS set-up failed");
  if (cap)
    BIO_set_callback_ex (SSL_get_rbio (ssl), raw_cb);
  if (SSL_connect (ssl) != 1)
    die ("TLS handshake failed");

  /* NBD_OPT_GO, default export, no info requests. */
  uint8_t go[6] = { 0 };
  send_option (fd, ssl, 7, go, sizeof go);
  for (;;) {
    uint32_t type = read_reply (fd, ssl, &len);
    uint8_t skip[1024];
    if (len > sizeof skip)
      die ("option reply too long");
    tls_read (ssl, skip, len);
    if (type == 1)
      break;
    if (type != 3)
      die ("NBD_OPT_GO refused");
  }

  for (int i = 0; i < flood; i++) {
    if (SSL_key_update (ssl, SSL_KEY_UPDATE_REQUESTED) != 1 || SSL_do_handshake (ssl) != 1)
      die ("flooding key updates");
    updates_sent++;
  }

  static uint8_t out[CHUNK], in[CHUNK];
  for (int r = 0; r < rounds; r++) {
    if (every > 0 && r > 0 && r % every == 0) {
      if (SSL_key_update (ssl, SSL_KEY_UPDATE_REQUESTED) != 1)
        die ("SSL_key_update");
      updates_sent++;
    }
    for (size_t i = 0; i < CHUNK; i++)
      out[i] = (uint8_t) (r * 131 + i * 7 + (i >> 9));
    uint64_t off = (uint64_t) (r % 64) * CHUNK;
    request (ssl, 1 /* WRITE */, 2 * r, off, CHUNK);
    tls_write (ssl, out, CHUNK);
    simple_reply (ssl, 2 * r);
    request (ssl, 0 /* READ */, 2 * r + 1, off, CHUNK);
    simple_reply (ssl, 2 * r + 1);
    tls_read (ssl, in, CHUNK);
    if (memcmp (in, out, CHUNK) != 0) {
      fprintf (stderr, "tls-keyupdate: round %d read back wrong data\n", r);
      return 1;
    }
  }
  const char *big = getenv ("TLS_KU_BIG"), *pause = getenv ("TLS_KU_PAUSE_MS");
  if (big) {
    int mib = atoi (big);
    if (mib < 4 || mib % 4)
      die ("TLS_KU_BIG must be a multiple of 4 (MiB)");
    rounds += big_run (ssl, mib, every, pause ? atoi (pause) : 0, &updates_sent);
  }
  /* TLS_KU_NO_DISC: no NBD_CMD_DISC; the server ends the session (its
   * --idle-timeout, a stop), and with TLS_KU_CAPTURE must still send its
   * close_notify. */
  if (!getenv ("TLS_KU_NO_DISC"))
    request (ssl, 2 /* DISC */, 0, 0, 0);
  if (cap) {
    /* The server closes with close_notify: an alert OpenSSL writes after
     * the hand-over, which blkd must seal in sequence. */
    uint8_t rest[256];
    size_t got;
    while (SSL_read_ex (ssl, rest, sizeof rest, &got) == 1)
      fwrite (rest, 1, got, cap_plain);
    if (SSL_get_error (ssl, 0) != SSL_ERROR_ZERO_RETURN)
      die ("the server closed without close_notify");
    fclose (cap_raw);
    fclose (cap_keylog);
    fclose (cap_plain);
  }
  SSL_shutdown (ssl);
  printf ("rounds %d, key updates sent %u, received %u\n", rounds, updates_sent,
          updates_received);
  SSL_free (ssl);
  SSL_CTX_free (ctx);
  close (fd);
  return 0;
}
