/* Unit tests for server/public.c: the nbdkit plugin API as plugins see it. */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <nbdkit-filter.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "../server/log.h"
#include "../server/public.h"

static int failures;
static const char *group;

#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf (stdout, "FAIL [%s] %s:%d: %s\n", group, __FILE__,        \
               __LINE__, #cond);                                        \
      failures++;                                                       \
    }                                                                   \
  } while (0)

static void
begin_group (const char *name)
{
  group = name;
}

static void
end_group (int before)
{
  printf ("%s: %s\n", failures == before ? "ok  " : "FAIL", group);
  fflush (stdout);
}

/* ---- Capturing what the API logs to stderr ----------------------------- */

static int saved_stderr = -1;
static FILE *capture_fp;
static char captured[8192];

static void
capture_start (void)
{
  fflush (stderr);
  capture_fp = tmpfile ();
  if (!capture_fp) { perror ("tmpfile"); exit (2); }
  saved_stderr = dup (STDERR_FILENO);
  dup2 (fileno (capture_fp), STDERR_FILENO);
}

/* Returns everything logged since capture_start (errno untouched, so
 * callers can check errno after reading the log). */
static const char *
capture_end (void)
{
  int err = errno;
  size_t n;

  fflush (stderr);
  dup2 (saved_stderr, STDERR_FILENO);
  close (saved_stderr);
  rewind (capture_fp);
  n = fread (captured, 1, sizeof captured - 1, capture_fp);
  captured[n] = '\0';
  fclose (capture_fp);
  errno = err;
  return captured;
}

static bool
contains (const char *hay, const char *needle)
{
  return strstr (hay, needle) != NULL;
}

/* ---- Parsers ----------------------------------------------------------- */

static void
test_parse_size (void)
{
  static const struct { const char *s; int64_t v; } good[] = {
    { "0", 0 }, { "1", 1 }, { "512", 512 }, { "1b", 1 }, { "1B", 1 },
    { "1k", 1024 }, { "1K", 1024 }, { "2M", 2 << 20 }, { "3g", 3LL << 30 },
    { "1T", 1LL << 40 }, { "1p", 1LL << 50 }, { "7E", 7LL << 60 },
    { "1s", 512 }, { "4S", 2048 }, { " 12", 12 }, { "+12", 12 },
    { "007", 7 }, { "9223372036854775807", INT64_MAX },
    { "8191P", 8191LL << 50 },
    { "9007199254740991k", 9007199254740991LL << 10 },
  };
  static const struct { const char *s; const char *msg; } bad[] = {
    { "", "could not parse size string ()" },
    { "abc", "could not parse size string (abc)" },
    { "-1", "size cannot be negative (-1)" },
    { "-0x", NULL },              /* "-0" is not negative: fails on suffix */
    { "9223372036854775808", "size (9223372036854775808) exceeds maximum" },
    { "99999999999999999999k", "exceeds maximum value" },
    { "8E", "overflow computing size (8E)" },
    { "8192P", "overflow computing size (8192P)" },
    { "9007199254740992k", "overflow computing size" },
    { "1.5G", "could not parse size: unknown suffix '.5G'" },
    { "1MiB", "could not parse size: unknown suffix 'MiB'" },
    { "1MB", "unknown suffix 'MB'" },
    { "0x10", "unknown suffix 'x10'" },
    { "1 ", "unknown suffix ' '" },
    { "1x", "unknown suffix 'x'" },
    { "1kk", "unknown suffix 'kk'" },
  };
  int before = failures;

  begin_group ("nbdkit_parse_size");
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    int64_t v = nbdkit_parse_size (good[i].s);
    if (v != good[i].v)
      printf ("  %s -> %" PRId64 " want %" PRId64 "\n",
              good[i].s, v, good[i].v);
    CHECK (v == good[i].v);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *log;
    int64_t v;

    capture_start ();
    v = nbdkit_parse_size (bad[i].s);
    log = capture_end ();
    if (v != -1)
      printf ("  [%s] accepted as %" PRId64 "\n", bad[i].s, v);
    CHECK (v == -1);
    if (bad[i].msg && !contains (log, bad[i].msg))
      printf ("  [%s] logged: %s  want: %s\n", bad[i].s, log, bad[i].msg);
    CHECK (bad[i].msg == NULL || contains (log, bad[i].msg));
    CHECK (contains (log, "error"));
  }
  end_group (before);
}

static void
test_parse_bool (void)
{
  static const char *yes[] = { "1", "true", "TRUE", "True", "t", "T", "yes",
                               "YES", "y", "Y", "on", "ON", "oN" };
  static const char *no[] = { "0", "false", "FALSE", "f", "F", "no", "No",
                              "n", "N", "off", "OFF" };
  static const char *bad[] = { "", "2", "01", "yess", " yes", "yes ", "of",
                               "enable", "-1", "nope" };
  int before = failures;

  begin_group ("nbdkit_parse_bool");
  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
    CHECK (nbdkit_parse_bool (yes[i]) == 1);
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
    CHECK (nbdkit_parse_bool (no[i]) == 0);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *log;
    capture_start ();
    CHECK (nbdkit_parse_bool (bad[i]) == -1);
    log = capture_end ();
    CHECK (contains (log, "could not decipher boolean"));
  }
  end_group (before);
}

static void
test_parse_signed (void)
{
  int before = failures;
  int i; int8_t i8; int16_t i16; int32_t i32; int64_t i64;
  const char *log;

  begin_group ("nbdkit_parse_int*");
  CHECK (nbdkit_parse_int ("x", "0", &i) == 0 && i == 0);
  CHECK (nbdkit_parse_int ("x", "-42", &i) == 0 && i == -42);
  CHECK (nbdkit_parse_int ("x", "0x1f", &i) == 0 && i == 31);
  CHECK (nbdkit_parse_int ("x", "010", &i) == 0 && i == 8);    /* octal */
  CHECK (nbdkit_parse_int ("x", "  +7", &i) == 0 && i == 7);
  CHECK (nbdkit_parse_int ("x", "2147483647", &i) == 0 && i == INT_MAX);
  CHECK (nbdkit_parse_int ("x", "-2147483648", &i) == 0 && i == INT_MIN);
  CHECK (nbdkit_parse_int ("x", "123", NULL) == 0);   /* validate only */

  i = 99;
  capture_start ();
  CHECK (nbdkit_parse_int ("x", "2147483648", &i) == -1);
  log = capture_end ();
  CHECK (errno == ERANGE);
  CHECK (i == 99);                      /* untouched on failure */
  CHECK (contains (log, "x: could not parse number: \"2147483648\": "
                   "Numerical result out of range"));

  capture_start ();
  CHECK (nbdkit_parse_int ("x", "-2147483649", &i) == -1);
  CHECK (nbdkit_parse_int ("x", "99999999999999999999", &i) == -1);
  log = capture_end ();
  CHECK (contains (log, "out of range"));

  capture_start ();
  CHECK (nbdkit_parse_int ("what", "", &i) == -1);
  log = capture_end ();
  CHECK (contains (log, "what: empty string where we expected a number"));

  capture_start ();
  CHECK (nbdkit_parse_int ("what", "abc", &i) == -1);
  log = capture_end ();
  CHECK (contains (log, "what: empty string where we expected a number"));

  capture_start ();
  CHECK (nbdkit_parse_int ("what", "12abc", &i) == -1);
  CHECK (nbdkit_parse_int ("what", "12 ", &i) == -1);
  CHECK (nbdkit_parse_int ("what", "0x", &i) == -1);
  CHECK (nbdkit_parse_int ("what", "08", &i) == -1);       /* bad octal */
  log = capture_end ();
  CHECK (contains (log, "what: could not parse number: \"12abc\": "
                   "trailing garbage"));

  CHECK (nbdkit_parse_int8_t ("x", "127", &i8) == 0 && i8 == 127);
  CHECK (nbdkit_parse_int8_t ("x", "-128", &i8) == 0 && i8 == -128);
  CHECK (nbdkit_parse_int8_t ("x", "-0x80", &i8) == 0 && i8 == -128);
  capture_start ();
  CHECK (nbdkit_parse_int8_t ("x", "128", &i8) == -1);
  CHECK (nbdkit_parse_int8_t ("x", "-129", &i8) == -1);
  CHECK (nbdkit_parse_int16_t ("x", "32768", &i16) == -1);
  CHECK (nbdkit_parse_int16_t ("x", "-32769", &i16) == -1);
  CHECK (nbdkit_parse_int32_t ("x", "2147483648", &i32) == -1);
  CHECK (nbdkit_parse_int32_t ("x", "-2147483649", &i32) == -1);
  CHECK (nbdkit_parse_int64_t ("x", "9223372036854775808", &i64) == -1);
  CHECK (nbdkit_parse_int64_t ("x", "-9223372036854775809", &i64) == -1);
  capture_end ();
  CHECK (nbdkit_parse_int16_t ("x", "32767", &i16) == 0 && i16 == 32767);
  CHECK (nbdkit_parse_int16_t ("x", "-32768", &i16) == 0 && i16 == -32768);
  CHECK (nbdkit_parse_int32_t ("x", "-2147483648", &i32) == 0
         && i32 == INT32_MIN);
  CHECK (nbdkit_parse_int64_t ("x", "9223372036854775807", &i64) == 0
         && i64 == INT64_MAX);
  CHECK (nbdkit_parse_int64_t ("x", "-9223372036854775808", &i64) == 0
         && i64 == INT64_MIN);
  CHECK (nbdkit_parse_int64_t ("x", "0x7fffffffffffffff", &i64) == 0
         && i64 == INT64_MAX);
  end_group (before);
}

static void
test_parse_unsigned (void)
{
  int before = failures;
  unsigned u; uint8_t u8; uint16_t u16; uint32_t u32; uint64_t u64;
  const char *log;

  begin_group ("nbdkit_parse_unsigned/uint*");
  CHECK (nbdkit_parse_unsigned ("x", "4294967295", &u) == 0 && u == UINT_MAX);
  CHECK (nbdkit_parse_unsigned ("x", "0xffffffff", &u) == 0 && u == UINT_MAX);
  CHECK (nbdkit_parse_unsigned ("x", " +5", &u) == 0 && u == 5);
  CHECK (nbdkit_parse_uint8_t ("x", "255", &u8) == 0 && u8 == 255);
  CHECK (nbdkit_parse_uint8_t ("x", "0", &u8) == 0 && u8 == 0);
  CHECK (nbdkit_parse_uint16_t ("x", "65535", &u16) == 0 && u16 == 65535);
  CHECK (nbdkit_parse_uint16_t ("x", "0177777", &u16) == 0 && u16 == 65535);
  CHECK (nbdkit_parse_uint32_t ("x", "4294967295", &u32) == 0
         && u32 == UINT32_MAX);
  CHECK (nbdkit_parse_uint64_t ("x", "18446744073709551615", &u64) == 0
         && u64 == UINT64_MAX);
  CHECK (nbdkit_parse_uint64_t ("x", "0xffffffffffffffff", &u64) == 0
         && u64 == UINT64_MAX);

  capture_start ();
  CHECK (nbdkit_parse_unsigned ("neg", "-1", &u) == -1);
  CHECK (nbdkit_parse_uint64_t ("neg", "  -0", &u64) == -1);
  CHECK (nbdkit_parse_uint8_t ("neg", "\t-5", &u8) == -1);
  log = capture_end ();
  CHECK (contains (log, "neg: negative numbers are not allowed"));

  capture_start ();
  CHECK (nbdkit_parse_unsigned ("x", "4294967296", &u) == -1);
  CHECK (nbdkit_parse_uint8_t ("x", "256", &u8) == -1);
  CHECK (nbdkit_parse_uint16_t ("x", "65536", &u16) == -1);
  CHECK (nbdkit_parse_uint32_t ("x", "4294967296", &u32) == -1);
  CHECK (nbdkit_parse_uint64_t ("x", "18446744073709551616", &u64) == -1);
  log = capture_end ();
  CHECK (contains (log, "x: could not parse number: \"256\": "
                   "Numerical result out of range"));
  CHECK (contains (log, "\"18446744073709551616\""));

  capture_start ();
  CHECK (nbdkit_parse_uint32_t ("x", "", &u32) == -1);
  CHECK (nbdkit_parse_uint32_t ("x", "1k", &u32) == -1);
  CHECK (nbdkit_parse_uint32_t ("x", "0x", &u32) == -1);
  log = capture_end ();
  CHECK (contains (log, "empty string"));
  CHECK (contains (log, "trailing garbage"));
  end_group (before);
}

/* ---- Messages ---------------------------------------------------------- */

static void
test_messages (void)
{
  int before = failures;
  const char *log;

  begin_group ("nbdkit_error/debug: errno, %m, verbosity");
  capture_start ();
  errno = ENOENT;
  nbdkit_error ("open %s: %m", "foo");
  CHECK (errno == ENOENT);
  errno = EACCES;
  nbdkit_error ("second %d", 2);
  CHECK (errno == EACCES);
  log = capture_end ();
  CHECK (contains (log, "error"));
  CHECK (contains (log, "open foo: No such file or directory"));
  CHECK (contains (log, "second 2"));

  log_verbose = false;
  capture_start ();
  errno = EBUSY;
  nbdkit_debug ("hidden %m");
  CHECK (errno == EBUSY);
  log = capture_end ();
  CHECK (strcmp (log, "") == 0);

  log_verbose = true;
  capture_start ();
  errno = EBUSY;
  nbdkit_debug ("shown %m");
  CHECK (errno == EBUSY);
  log = capture_end ();
  CHECK (contains (log, "shown Device or resource busy"));
  CHECK (contains (log, "debug"));
  log_verbose = false;

  /* set_error is per thread and cleared when taken. */
  CHECK (public_take_error () == 0);
  nbdkit_set_error (ENOSPC);
  CHECK (public_last_error == ENOSPC);
  CHECK (public_take_error () == ENOSPC);
  CHECK (public_take_error () == 0);
  end_group (before);
}

/* ---- Paths, stdio, passwords ------------------------------------------- */

static void
test_paths_and_passwords (void)
{
  int before = failures;
  char tmpl[] = "/tmp/unit-public-XXXXXX";
  char cwd[PATH_MAX], file[PATH_MAX + 32], *p;
  const char *log;
  int fd, pfd[2];

  begin_group ("paths, stdio_safe, read_password");
  CHECK (getcwd (cwd, sizeof cwd) != NULL);
  p = nbdkit_absolute_path ("/abs/x");
  CHECK (p && strcmp (p, "/abs/x") == 0);
  free (p);
  p = nbdkit_absolute_path ("rel/y");
  snprintf (file, sizeof file, "%s/rel/y", cwd);
  CHECK (p && strcmp (p, file) == 0);
  free (p);
  capture_start ();
  CHECK (nbdkit_absolute_path ("") == NULL);
  CHECK (nbdkit_absolute_path (NULL) == NULL);
  CHECK (nbdkit_realpath ("") == NULL);
  CHECK (nbdkit_realpath ("/nonexistent/really/not") == NULL);
  log = capture_end ();
  CHECK (contains (log, "realpath: /nonexistent/really/not: No such file"));
  p = nbdkit_realpath ("/tmp/../tmp/.");
  CHECK (p && strcmp (p, "/tmp") == 0);
  free (p);

  public_config_done = false;
  CHECK (nbdkit_stdio_safe () == 1);

  p = NULL;
  CHECK (nbdkit_read_password ("secret", &p) == 0 && strcmp (p, "secret") == 0);
  free (p);

  fd = mkstemp (tmpl);
  CHECK (fd >= 0);
  CHECK (write (fd, "filepw\nsecond line\n", 19) == 19);
  close (fd);
  snprintf (file, sizeof file, "+%s", tmpl);
  CHECK (nbdkit_read_password (file, &p) == 0 && strcmp (p, "filepw") == 0);
  free (p);
  /* No trailing newline, and an empty file meaning an empty password. */
  fd = open (tmpl, O_WRONLY | O_TRUNC);
  CHECK (write (fd, "nonl", 4) == 4);
  close (fd);
  CHECK (nbdkit_read_password (file, &p) == 0 && strcmp (p, "nonl") == 0);
  free (p);
  fd = open (tmpl, O_WRONLY | O_TRUNC);
  close (fd);
  CHECK (nbdkit_read_password (file, &p) == 0 && p && strcmp (p, "") == 0);
  free (p);
  unlink (tmpl);
  capture_start ();
  CHECK (nbdkit_read_password ("+/nonexistent/pw", &p) == -1 && p == NULL);
  log = capture_end ();
  CHECK (contains (log, "open /nonexistent/pw: No such file"));

  /* -FD reads and closes the descriptor. */
  CHECK (pipe (pfd) == 0);
  CHECK (write (pfd[1], "fdpw\n", 5) == 5);
  close (pfd[1]);
  snprintf (file, sizeof file, "-%d", pfd[0]);
  CHECK (nbdkit_read_password (file, &p) == 0 && strcmp (p, "fdpw") == 0);
  free (p);
  CHECK (fcntl (pfd[0], F_GETFD) == -1 && errno == EBADF);

  capture_start ();
  CHECK (nbdkit_read_password ("-1", &p) == -1);
  CHECK (nbdkit_read_password ("-0", &p) == -1);
  CHECK (nbdkit_read_password ("-x", &p) == -1);
  log = capture_end ();
  CHECK (contains (log, "cannot use password -FD for stdin/stdout/stderr"));
  CHECK (contains (log, "password file descriptor"));

  /* "-" needs the configuration phase and a tty. */
  capture_start ();
  if (!isatty (STDIN_FILENO))
    CHECK (nbdkit_read_password ("-", &p) == -1);
  public_config_done = true;
  CHECK (nbdkit_stdio_safe () == 0);
  CHECK (nbdkit_read_password ("-", &p) == -1);
  log = capture_end ();
  CHECK (contains (log, "stdin is not available for reading password"));
  public_config_done = false;
  end_group (before);
}

/* ---- Connection information -------------------------------------------- */

static void
test_connection_info (void)
{
  int before = failures;
  struct public_conn_ctx ctx = { .export_name = "exp", .is_tls = true,
                                 .peer_fd = -1 };
  struct sockaddr_storage ss;
  socklen_t sslen = sizeof ss;
  const char *log;
  int sv[2];

  begin_group ("export_name, is_tls, peer_*");
  public_current = NULL;
  capture_start ();
  CHECK (nbdkit_export_name () == NULL);
  CHECK (nbdkit_is_tls () == -1);
  CHECK (nbdkit_peer_name ((struct sockaddr *) &ss, &sslen) == -1);
  CHECK (nbdkit_peer_pid () == -1);
  CHECK (nbdkit_peer_uid () == -1);
  CHECK (nbdkit_peer_gid () == -1);
  log = capture_end ();
  CHECK (contains (log, "no connection in this thread"));

  public_current = &ctx;
  CHECK (strcmp (nbdkit_export_name (), "exp") == 0);
  CHECK (nbdkit_is_tls () == 1);
  ctx.is_tls = false;
  CHECK (nbdkit_is_tls () == 0);
  capture_start ();
  CHECK (nbdkit_peer_pid () == -1);
  log = capture_end ();
  CHECK (contains (log, "socket not open"));

  /* Unix socket: credentials are ours, since we are the peer. */
  CHECK (socketpair (AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  ctx.peer_fd = sv[0];
  CHECK (nbdkit_peer_pid () == getpid ());
  CHECK (nbdkit_peer_uid () == getuid ());
  CHECK (nbdkit_peer_gid () == getgid ());
  sslen = sizeof ss;
  CHECK (nbdkit_peer_name ((struct sockaddr *) &ss, &sslen) == 0);
  CHECK (ss.ss_family == AF_UNIX);
  close (sv[0]); close (sv[1]);

  /* TCP over loopback: a peer name but no credentials. */
  {
    int l = socket (AF_INET, SOCK_STREAM, 0), c, a;
    struct sockaddr_in sin = { .sin_family = AF_INET,
                               .sin_addr.s_addr = htonl (INADDR_LOOPBACK) };
    socklen_t len = sizeof sin;

    CHECK (l >= 0);
    CHECK (bind (l, (struct sockaddr *) &sin, sizeof sin) == 0);
    CHECK (listen (l, 1) == 0);
    CHECK (getsockname (l, (struct sockaddr *) &sin, &len) == 0);
    c = socket (AF_INET, SOCK_STREAM, 0);
    CHECK (connect (c, (struct sockaddr *) &sin, sizeof sin) == 0);
    a = accept (l, NULL, NULL);
    CHECK (a >= 0);
    ctx.peer_fd = a;
    sslen = sizeof ss;
    CHECK (nbdkit_peer_name ((struct sockaddr *) &ss, &sslen) == 0);
    CHECK (ss.ss_family == AF_INET);
    CHECK (((struct sockaddr_in *) &ss)->sin_addr.s_addr
           == htonl (INADDR_LOOPBACK));
    capture_start ();
    CHECK (nbdkit_peer_pid () == -1);
    CHECK (nbdkit_peer_uid () == -1);
    log = capture_end ();
    CHECK (contains (log, "only available on Unix domain sockets"));
    close (a); close (c); close (l);
  }
  public_current = NULL;
  end_group (before);
}

/* ---- Interns ----------------------------------------------------------- */

static void *
intern_worker (void *arg)
{
  struct public_conn_ctx *ctx = arg;

  public_current = ctx;
  for (int i = 0; i < 1000; i++)
    if (nbdkit_printf_intern ("w%d", i) == NULL)
      return (void *) 1;
  return NULL;
}

static size_t
intern_count (struct public_intern *in)
{
  /* The list type is private to public.c; its first member is the link. */
  size_t n = 0;
  while (in) {
    n++;
    in = *(struct public_intern **) in;
  }
  return n;
}

static void
test_interns (void)
{
  int before = failures;
  struct public_conn_ctx ctx = { .peer_fd = -1 };
  const char *a, *b, *c, *g;
  pthread_t th[4];
  const char *log;

  begin_group ("*_intern lifetimes");
  public_current = &ctx;
  a = nbdkit_strdup_intern ("hello");
  b = nbdkit_strndup_intern ("hello world", 5);
  c = nbdkit_strndup_intern ("hi", 100);
  errno = EPERM;
  g = nbdkit_printf_intern ("%s-%d-%m", "x", 42);
  CHECK (errno == EPERM);
  CHECK (a && strcmp (a, "hello") == 0);
  CHECK (b && strcmp (b, "hello") == 0 && a != b);
  CHECK (c && strcmp (c, "hi") == 0);
  CHECK (g && strcmp (g, "x-42-Operation not permitted") == 0);
  CHECK (intern_count (ctx.interns) == 4);
  capture_start ();
  CHECK (nbdkit_strdup_intern (NULL) == NULL && errno == EINVAL);
  CHECK (nbdkit_strndup_intern (NULL, 3) == NULL);
  log = capture_end ();
  CHECK (contains (log, "no string given"));

  /* Several workers of one connection interning at once. */
  for (int i = 0; i < 4; i++)
    CHECK (pthread_create (&th[i], NULL, intern_worker, &ctx) == 0);
  for (int i = 0; i < 4; i++) {
    void *ret;
    pthread_join (th[i], &ret);
    CHECK (ret == NULL);
  }
  CHECK (intern_count (ctx.interns) == 4 + 4000);
  /* Strings are still valid until release (ASan would flag otherwise). */
  CHECK (strcmp (a, "hello") == 0);
  public_conn_ctx_release (&ctx);
  CHECK (ctx.interns == NULL);
  public_conn_ctx_release (&ctx);       /* idempotent */
  public_conn_ctx_release (NULL);

  /* Outside a connection: global until public_release_global. */
  public_current = NULL;
  g = nbdkit_strdup_intern ("global");
  CHECK (g && strcmp (g, "global") == 0);
  public_current = &ctx;
  public_conn_ctx_release (&ctx);       /* must not touch the global one */
  CHECK (strcmp (g, "global") == 0);
  public_current = NULL;
  public_release_global ();
  public_release_global ();
  end_group (before);
}

/* ---- Extents ----------------------------------------------------------- */

static bool
ext_is (const struct nbdkit_extents *e, size_t i,
        uint64_t off, uint64_t len, uint32_t type)
{
  if (i >= e->len)
    return false;
  return e->v[i].offset == off && e->v[i].length == len && e->v[i].type == type;
}

static void
test_extents (void)
{
  int before = failures;
  struct nbdkit_extents *e;
  const char *log;

  begin_group ("nbdkit_add_extent rules");

  /* Merging adjacent same-type extents; zero-length ignored. */
  e = public_extents_new (0, 1000);
  CHECK (nbdkit_add_extent (e, 0, 100, 0) == 0);
  CHECK (nbdkit_add_extent (e, 100, 0, 3) == 0);
  CHECK (nbdkit_add_extent (e, 100, 100, 0) == 0);
  CHECK (nbdkit_add_extent (e, 200, 50,
                            NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO) == 0);
  CHECK (nbdkit_add_extent (e, 250, 50, 3) == 0);
  CHECK (nbdkit_add_extent (e, 300, 10, NBDKIT_EXTENT_ZERO) == 0);
  CHECK (e->len == 3);
  CHECK (ext_is (e, 0, 0, 200, 0));
  CHECK (ext_is (e, 1, 200, 100, 3));
  CHECK (ext_is (e, 2, 300, 10, 2));

  /* Not contiguous (gap, overlap, going back): ERANGE. */
  capture_start ();
  errno = 0;
  CHECK (nbdkit_add_extent (e, 311, 10, 0) == -1);
  CHECK (errno == ERANGE);
  CHECK (nbdkit_add_extent (e, 305, 10, 0) == -1);
  CHECK (nbdkit_add_extent (e, 0, 10, 0) == -1);
  /* ...even when zero-length. */
  CHECK (nbdkit_add_extent (e, 500, 0, 0) == -1);
  log = capture_end ();
  CHECK (contains (log, "extents must be added in ascending order and "
                   "must be contiguous"));
  CHECK (e->len == 3);
  CHECK (nbdkit_add_extent (e, 310, 10, 0) == 0);

  /* Clipped at the end, then ignored past it (still must be contiguous). */
  CHECK (nbdkit_add_extent (e, 320, 1000, 1) == 0);
  CHECK (ext_is (e, 4, 320, 680, 1));
  CHECK (nbdkit_add_extent (e, 1320, 5, 0) == 0);
  CHECK (e->len == 5);
  capture_start ();
  CHECK (nbdkit_add_extent (e, 2000, 5, 0) == -1 && errno == ERANGE);
  capture_end ();
  nbdkit_extents_free (e);

  /* Before the start: dropped, then clipped. */
  e = public_extents_new (1000, 5000);
  CHECK (nbdkit_add_extent (e, 0, 500, 0) == 0);
  CHECK (nbdkit_add_extent (e, 500, 500, 1) == 0);    /* ends at start */
  CHECK (e->len == 0);
  CHECK (nbdkit_add_extent (e, 1000, 0, 0) == 0);      /* zero-length */
  CHECK (e->len == 0);
  public_extents_free (e);

  e = public_extents_new (1000, 5000);
  CHECK (nbdkit_add_extent (e, 512, 1024, 3) == 0);
  CHECK (ext_is (e, 0, 1000, 536, 3));
  public_extents_free (e);

  /* First extent after start: ERANGE, unless past the end (ignored). */
  e = public_extents_new (1000, 5000);
  capture_start ();
  CHECK (nbdkit_add_extent (e, 1001, 10, 0) == -1 && errno == ERANGE);
  log = capture_end ();
  CHECK (contains (log, "first extent must not be > start (1000)"));
  CHECK (e->len == 0);
  public_extents_free (e);
  e = public_extents_new (1000, 5000);
  CHECK (nbdkit_add_extent (e, 6000, 10, 0) == 0);
  CHECK (e->len == 0);
  public_extents_free (e);

  /* Empty window (start == end) is valid; everything is past the end. */
  e = public_extents_new (100, 100);
  CHECK (e != NULL);
  CHECK (nbdkit_add_extent (e, 0, 200, 0) == 0 && e->len == 0);
  public_extents_free (e);

  /* Invalid windows. */
  capture_start ();
  CHECK (public_extents_new (10, 5) == NULL && errno == ERANGE);
  CHECK (public_extents_new (0, (uint64_t) INT64_MAX + 1) == NULL);
  capture_end ();

  /* Alternating types up to the 1M cap, then silently dropped. */
  e = public_extents_new (0, INT64_MAX);
  for (uint64_t i = 0; i < 1024 * 1024 + 10; i++)
    if (nbdkit_add_extent (e, i, 1, i & 1) == -1) {
      CHECK (!"add_extent failed under the cap");
      break;
    }
  CHECK (e->len == 1024 * 1024);
  CHECK (ext_is (e, e->len - 1, 1024 * 1024 - 1, 1, 1));
  /* Even a same-type, mergeable extent is dropped once full (nbdkit). */
  CHECK (nbdkit_add_extent (e, 1024 * 1024 + 10, 1, 1) == 0);
  CHECK (ext_is (e, e->len - 1, 1024 * 1024 - 1, 1, 1));
  nbdkit_extents_free (e);
  nbdkit_extents_free (NULL);
  end_group (before);
}

/* ---- Extents helpers for filters --------------------------------------- */

/* The layer below a filter, as nbdkit_extents_full/aligned see it: a
 * struct nbdkit_next_ops whose .extents answers from a fixed map, at most
 * `per_call` extents per call (a plugin may answer only a prefix). */
struct map_ext { uint64_t off, len; uint32_t type; };
struct test_next {
  struct nbdkit_next_ops ops;           /* first: filters get &ops */
  const struct map_ext *map;
  size_t n, per_call;
  int calls, fail_call, fail_err;
  uint32_t flags[8];                    /* flags of the first calls */
  uint64_t offsets[8];
};

static int
test_next_extents (nbdkit_next *next, uint32_t count, uint64_t offset,
                   uint32_t flags, struct nbdkit_extents *e, int *err)
{
  struct test_next *t = (struct test_next *) next;
  size_t added = 0;

  if (t->calls < 8) {
    t->flags[t->calls] = flags;
    t->offsets[t->calls] = offset;
  }
  if (++t->calls == t->fail_call) {
    *err = t->fail_err;
    return -1;
  }
  for (size_t i = 0; i < t->n && added < t->per_call; i++) {
    const struct map_ext *m = &t->map[i];
    if (m->off + m->len <= offset)
      continue;
    if (m->off >= offset + count)
      break;
    if (nbdkit_add_extent (e, m->off, m->len, m->type) == -1) {
      *err = errno;
      return -1;
    }
    added++;
  }
  return 0;
}

static void
test_next_init (struct test_next *t, const struct map_ext *map, size_t n,
                size_t per_call)
{
  memset (t, 0, sizeof *t);
  t->ops.extents = test_next_extents;
  t->map = map;
  t->n = n;
  t->per_call = per_call;
}

static bool
get_is (const struct nbdkit_extents *e, size_t i,
        uint64_t off, uint64_t len, uint32_t type)
{
  struct nbdkit_extent x;

  if (i >= nbdkit_extents_count (e))
    return false;
  x = nbdkit_get_extent (e, i);
  return x.offset == off && x.length == len && x.type == type;
}

/* Runs fn in a child and says whether it died of SIGABRT. */
static bool
aborts (void (*fn) (void *), void *arg)
{
  int status;
  pid_t pid;

  fflush (stdout);
  pid = fork ();
  if (pid == 0) {
    int devnull = open ("/dev/null", O_WRONLY);
    dup2 (devnull, STDERR_FILENO);
    fn (arg);
    _exit (0);
  }
  if (pid == -1 || waitpid (pid, &status, 0) != pid)
    return false;
  return WIFSIGNALED (status) && WTERMSIG (status) == SIGABRT;
}

static void
get_extent_past_end (void *e)
{
  nbdkit_get_extent (e, nbdkit_extents_count (e));
}

static void
test_extents_filter (void)
{
  int before = failures;
  struct nbdkit_extents *e;
  struct test_next t;
  const char *log;
  int err;
  static const struct map_ext three[] = {
    { 0, 100, 0 }, { 100, 200, 3 }, { 300, 700, 0 },
  };

  begin_group ("nbdkit_extents_new/count/get_extent");
  e = nbdkit_extents_new (10, 20);
  CHECK (e && nbdkit_extents_count (e) == 0);
  CHECK (nbdkit_add_extent (e, 0, 15, 1) == 0);
  CHECK (nbdkit_add_extent (e, 15, 100, 2) == 0);
  CHECK (nbdkit_extents_count (e) == 2);
  CHECK (get_is (e, 0, 10, 5, 1) && get_is (e, 1, 15, 5, 2));
  CHECK (aborts (get_extent_past_end, e));
  nbdkit_extents_free (e);
  capture_start ();
  CHECK (nbdkit_extents_new (2, 1) == NULL && errno == ERANGE);
  capture_end ();
  end_group (before);

  before = failures;
  begin_group ("nbdkit_extents_full");
  /* One extent per call: three calls, REQ_ONE never passed down. */
  test_next_init (&t, three, 3, 1);
  err = 0;
  e = nbdkit_extents_full (&t.ops, 1000, 0, NBDKIT_FLAG_REQ_ONE, &err);
  CHECK (e && nbdkit_extents_count (e) == 3);
  CHECK (get_is (e, 0, 0, 100, 0) && get_is (e, 1, 100, 200, 3)
         && get_is (e, 2, 300, 700, 0));
  CHECK (t.calls == 3);
  CHECK (t.offsets[0] == 0 && t.offsets[1] == 100 && t.offsets[2] == 300);
  for (int i = 0; i < 3; i++)
    CHECK ((t.flags[i] & NBDKIT_FLAG_REQ_ONE) == 0);
  nbdkit_extents_free (e);

  /* A window inside the map is clipped at both ends. */
  test_next_init (&t, three, 3, 2);
  e = nbdkit_extents_full (&t.ops, 500, 50, 0, &err);
  CHECK (e && nbdkit_extents_count (e) == 3);
  CHECK (get_is (e, 0, 50, 50, 0) && get_is (e, 1, 100, 200, 3)
         && get_is (e, 2, 300, 250, 0));
  CHECK (t.calls == 2);
  nbdkit_extents_free (e);

  /* Nothing to ask. */
  test_next_init (&t, three, 3, 1);
  e = nbdkit_extents_full (&t.ops, 0, 40, 0, &err);
  CHECK (e && nbdkit_extents_count (e) == 0 && t.calls == 0);
  nbdkit_extents_free (e);

  /* The layer below fails on its second call: its errno comes back. */
  test_next_init (&t, three, 3, 1);
  t.fail_call = 2;
  t.fail_err = ENOSPC;
  err = 0;
  CHECK (nbdkit_extents_full (&t.ops, 1000, 0, 0, &err) == NULL);
  CHECK (err == ENOSPC);

  /* ...or answers nothing: EIO rather than looping forever. */
  test_next_init (&t, three, 3, 1);
  err = 0;
  capture_start ();
  CHECK (nbdkit_extents_full (&t.ops, 100, 1000, 0, &err) == NULL);
  log = capture_end ();
  CHECK (err == EIO && contains (log, "returned no extent at offset 1000"));
  CHECK (t.calls == 1);
  end_group (before);

  before = failures;
  begin_group ("nbdkit_extents_aligned");
  /* Aligned already: untouched. */
  {
    static const struct map_ext m[] = { { 0, 512, 0 }, { 512, 1536, 3 } };
    test_next_init (&t, m, 2, 10);
    e = nbdkit_extents_new (0, 2048);
    CHECK (nbdkit_extents_aligned (&t.ops, 2048, 0, 0, 512, e, &err) == 0);
    CHECK (nbdkit_extents_count (e) == 2 && get_is (e, 0, 0, 512, 0)
           && get_is (e, 1, 512, 1536, 3));
    nbdkit_extents_free (e);
  }
  /* An unaligned extent past the first block is rounded down and ends the
   * list; rounded down to nothing, it disappears. */
  {
    static const struct map_ext m[] = {
      { 0, 512, 0 }, { 512, 1188, 3 }, { 1700, 348, 0 },
    };
    test_next_init (&t, m, 3, 10);
    e = nbdkit_extents_new (0, 2048);
    CHECK (nbdkit_extents_aligned (&t.ops, 2048, 0, 0, 512, e, &err) == 0);
    CHECK (nbdkit_extents_count (e) == 2 && get_is (e, 0, 0, 512, 0)
           && get_is (e, 1, 512, 1024, 3));
    /* What follows must start where the list now ends. */
    CHECK (nbdkit_add_extent (e, 1536, 512, 0) == 0);
    CHECK (nbdkit_extents_count (e) == 3);
    nbdkit_extents_free (e);
  }
  {
    static const struct map_ext m[] = {
      { 0, 512, 0 }, { 512, 488, 3 }, { 1000, 1048, 0 },
    };
    test_next_init (&t, m, 3, 10);
    e = nbdkit_extents_new (0, 2048);
    CHECK (nbdkit_extents_aligned (&t.ops, 2048, 0, 0, 512, e, &err) == 0);
    CHECK (nbdkit_extents_count (e) == 1 && get_is (e, 0, 0, 512, 0));
    nbdkit_extents_free (e);
  }
  /* An unaligned first block merges what the list holds: its type is the
   * AND of the parts, and the answer is that one block. */
  {
    static const struct map_ext m[] = {
      { 0, 100, 3 }, { 100, 412, 1 }, { 512, 1536, 3 },
    };
    test_next_init (&t, m, 3, 10);
    e = nbdkit_extents_new (0, 2048);
    CHECK (nbdkit_extents_aligned (&t.ops, 2048, 0, 0, 512, e, &err) == 0);
    CHECK (nbdkit_extents_count (e) == 1 && get_is (e, 0, 0, 512, 1));
    CHECK (t.calls == 1);
    nbdkit_extents_free (e);
  }
  /* ...asking the layer below again (without REQ_ONE) when the list runs
   * out before the block is covered. */
  {
    static const struct map_ext m[] = {
      { 0, 100, 3 }, { 100, 200, 1 }, { 300, 1748, 3 },
    };
    test_next_init (&t, m, 3, 1);
    e = nbdkit_extents_new (0, 2048);
    CHECK (nbdkit_extents_aligned (&t.ops, 2048, 0, NBDKIT_FLAG_REQ_ONE,
                                   512, e, &err) == 0);
    CHECK (nbdkit_extents_count (e) == 1 && get_is (e, 0, 0, 512, 1));
    CHECK (t.calls == 3);
    CHECK (t.offsets[1] == 100 && t.offsets[2] == 300);
    CHECK ((t.flags[0] & NBDKIT_FLAG_REQ_ONE) != 0);
    CHECK ((t.flags[1] & NBDKIT_FLAG_REQ_ONE) == 0
           && (t.flags[2] & NBDKIT_FLAG_REQ_ONE) == 0);
    nbdkit_extents_free (e);

    /* A failure while refilling is the caller's failure. */
    test_next_init (&t, m, 3, 1);
    t.fail_call = 3;
    t.fail_err = EPERM;
    e = nbdkit_extents_new (0, 2048);
    err = 0;
    CHECK (nbdkit_extents_aligned (&t.ops, 2048, 0, 0, 512, e, &err) == -1);
    CHECK (err == EPERM);
    nbdkit_extents_free (e);
  }
  /* Unaligned requests and bad alignments are refused, nothing asked. */
  test_next_init (&t, three, 3, 1);
  e = nbdkit_extents_new (0, 2048);
  capture_start ();
  err = 0;
  CHECK (nbdkit_extents_aligned (&t.ops, 1000, 0, 0, 512, e, &err) == -1);
  CHECK (err == EINVAL);
  CHECK (nbdkit_extents_aligned (&t.ops, 1024, 100, 0, 512, e, &err) == -1);
  CHECK (nbdkit_extents_aligned (&t.ops, 1024, 0, 0, 384, e, &err) == -1);
  CHECK (nbdkit_extents_aligned (&t.ops, 1024, 0, 0, 0, e, &err) == -1);
  log = capture_end ();
  CHECK (contains (log, "not aligned"));
  CHECK (t.calls == 0);
  nbdkit_extents_free (e);
  end_group (before);
}

/* ---- Exports ----------------------------------------------------------- */

static void
get_export_past_end (void *x)
{
  nbdkit_get_export (x, nbdkit_exports_count (x));
}

static void
test_exports (void)
{
  int before = failures;
  struct nbdkit_exports *x = public_exports_new ();
  char *big;
  const char *log;

  begin_group ("nbdkit_add_export, use_default_export");
  CHECK (x && x->len == 0 && !x->use_default);
  CHECK (nbdkit_add_export (x, "", NULL) == 0);
  CHECK (nbdkit_add_export (x, "a", "desc a") == 0);
  for (int i = 0; i < 20; i++)
    CHECK (nbdkit_add_export (x, "many", NULL) == 0);
  CHECK (x->len == 22);
  CHECK (strcmp (x->v[0].name, "") == 0 && x->v[0].description == NULL);
  CHECK (strcmp (x->v[1].name, "a") == 0
         && strcmp (x->v[1].description, "desc a") == 0);
  CHECK (nbdkit_use_default_export (x) == 0 && x->use_default);
  CHECK (public_exports_add_name (x, "def") == 0);
  CHECK (!x->use_default && x->len == 23);
  CHECK (strcmp (x->v[22].name, "def") == 0 && x->v[22].description == NULL);

  big = malloc (4098);
  memset (big, 'n', 4097);
  big[4097] = '\0';
  capture_start ();
  CHECK (nbdkit_add_export (x, big, NULL) == -1 && errno == EINVAL);
  CHECK (nbdkit_add_export (x, "ok", big) == -1);
  log = capture_end ();
  CHECK (contains (log, "string too long"));
  big[4096] = '\0';                     /* exactly the limit is fine */
  CHECK (nbdkit_add_export (x, big, big) == 0);
  free (big);
  nbdkit_exports_free (x);

  x = public_exports_new ();
  for (int i = 0; i < 10000; i++)
    if (nbdkit_add_export (x, "e", NULL) == -1) {
      CHECK (!"add_export failed under the cap");
      break;
    }
  capture_start ();
  CHECK (nbdkit_add_export (x, "e", NULL) == -1 && errno == EINVAL);
  log = capture_end ();
  CHECK (contains (log, "too many exports"));
  public_exports_free (x);
  nbdkit_exports_free (NULL);
  end_group (before);

  before = failures;
  begin_group ("nbdkit_exports_new/count/get_export");
  x = nbdkit_exports_new ();
  CHECK (x && nbdkit_exports_count (x) == 0);
  CHECK (nbdkit_add_export (x, "a", NULL) == 0);
  CHECK (nbdkit_add_export (x, "b", "the b") == 0);
  CHECK (nbdkit_exports_count (x) == 2);
  {
    struct nbdkit_export a = nbdkit_get_export (x, 0);
    struct nbdkit_export b = nbdkit_get_export (x, 1);
    CHECK (strcmp (a.name, "a") == 0 && a.description == NULL);
    CHECK (strcmp (b.name, "b") == 0 && strcmp (b.description, "the b") == 0);
  }
  CHECK (aborts (get_export_past_end, x));
  nbdkit_exports_free (x);
  end_group (before);
}

/* ---- Sleep and shutdown (last: shutdown is permanent) ------------------ */

static int hook_calls;
static void
hook (void)
{
  hook_calls++;
}

static void *
shutdown_later (void *arg)
{
  struct timespec ts = { 0, 100 * 1000 * 1000 };
  nanosleep (&ts, NULL);
  nbdkit_shutdown ();
  return NULL;
}

static double
now_s (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
test_sleep_shutdown (void)
{
  int before = failures;
  struct public_conn_ctx ctx = { .peer_fd = -1 };
  pthread_t th;
  double t;
  const char *log;
  int sv[2];

  begin_group ("nbdkit_nanosleep, nbdkit_shutdown");
  t = now_s ();
  CHECK (nbdkit_nanosleep (0, 50 * 1000 * 1000) == 0);
  t = now_s () - t;
  CHECK (t >= 0.049 && t < 1.0);
  CHECK (nbdkit_nanosleep (0, 0) == 0);
  capture_start ();
  CHECK (nbdkit_nanosleep (INT_MAX, 0) == -1 && errno == EINVAL);
  log = capture_end ();
  CHECK (contains (log, "sleep request is too long"));

  /* The client hanging up ends the sleep. */
  CHECK (socketpair (AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  ctx.peer_fd = sv[0];
  public_current = &ctx;
  close (sv[1]);
  capture_start ();
  t = now_s ();
  CHECK (nbdkit_nanosleep (10, 0) == -1 && errno == ESHUTDOWN);
  t = now_s () - t;
  log = capture_end ();
  CHECK (t < 1.0);
  CHECK (contains (log, "connection close"));
  close (sv[0]);
  public_current = NULL;

  /* Shutdown from another thread wakes a sleeper and calls the hook. */
  CHECK (!public_shutdown_requested ());
  public_shutdown_hook = hook;
  CHECK (pthread_create (&th, NULL, shutdown_later, NULL) == 0);
  capture_start ();
  t = now_s ();
  CHECK (nbdkit_nanosleep (10, 0) == -1 && errno == ESHUTDOWN);
  t = now_s () - t;
  log = capture_end ();
  pthread_join (th, NULL);
  CHECK (t < 2.0);
  CHECK (hook_calls == 1);
  CHECK (public_shutdown_requested ());
  CHECK (contains (log, "server shut down"));
  /* ...and every later sleep ends at once. */
  capture_start ();
  CHECK (nbdkit_nanosleep (10, 0) == -1 && errno == ESHUTDOWN);
  capture_end ();
  public_shutdown_hook = NULL;
  nbdkit_shutdown ();                   /* no hook: must not crash */
  end_group (before);
}

int
main (void)
{
  test_parse_size ();
  test_parse_bool ();
  test_parse_signed ();
  test_parse_unsigned ();
  test_messages ();
  test_paths_and_passwords ();
  test_connection_info ();
  test_interns ();
  test_extents ();
  test_extents_filter ();
  test_exports ();
  test_sleep_shutdown ();

  if (failures) {
    printf ("unit-public: %d check(s) failed\n", failures);
    return 1;
  }
  printf ("unit-public: all checks passed\n");
  return 0;
}
