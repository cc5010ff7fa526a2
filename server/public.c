/* The nbdkit plugin API (nbdkit 1.32 semantics) blkd exports to plugins:
 * messages, paths, number parsers, configuration-time helpers, shutdown
 * and sleeping, per-connection information and interned strings.  The
 * extents and exports containers are extents.c's and exports.c's, the
 * context calls for filters (nbdkit_next_context_open...) filter.c's, as
 * in nbdkit's server/.
 *
 * Exported to dlopen'ed plugins (PUBLIC_API: default visibility, listed
 * in server/blkd.syms):
 *   nbdkit_error nbdkit_verror nbdkit_debug nbdkit_vdebug nbdkit_set_error
 *   nbdkit_absolute_path nbdkit_realpath
 *   nbdkit_parse_size nbdkit_parse_bool nbdkit_parse_int nbdkit_parse_unsigned
 *   nbdkit_parse_int8_t nbdkit_parse_uint8_t nbdkit_parse_int16_t
 *   nbdkit_parse_uint16_t nbdkit_parse_int32_t nbdkit_parse_uint32_t
 *   nbdkit_parse_int64_t nbdkit_parse_uint64_t
 *   nbdkit_stdio_safe nbdkit_read_password nbdkit_nanosleep nbdkit_shutdown
 *   nbdkit_peer_name nbdkit_peer_pid nbdkit_peer_uid nbdkit_peer_gid
 *   nbdkit_export_name nbdkit_is_tls
 *   nbdkit_strdup_intern nbdkit_strndup_intern nbdkit_printf_intern
 *   nbdkit_vprintf_intern
 * For the core only (server/public.h): public_current, public_config_done,
 * public_shutdown_hook, public_last_error, public_take_error,
 * public_begin_shutdown, public_shutdown_requested, public_conn_ctx_release,
 * public_release_global.
 */

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
/* The extents/exports helpers filters call, and nbdkit_extents_free/
 * nbdkit_exports_free, which plugins import too. */
#include <nbdkit-filter.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "monotime.h"
#include "public.h"
#include "size.h"
#include "vector.h"


/* Defined here rather than in the core so that unit tests linking every
 * server object but main.o still resolve them. */
__thread struct public_conn_ctx *public_current;
__thread int public_last_error;
bool public_config_done;
void (*public_shutdown_hook) (void);

/* ---- Messages ---------------------------------------------------------- */

PUBLIC_API __attribute__((format (printf, 1, 0))) void
nbdkit_verror (const char *fs, va_list args)
{
  /* Plugins log and then return -1 expecting errno to survive (they set
   * errno_is_preserved), so logging must not disturb it. */
  int err = errno;
  log_vmsg (LOG_LVL_ERROR, NULL, fs, args);
  errno = err;
}

PUBLIC_API __attribute__((format (printf, 1, 2))) void
nbdkit_error (const char *fs, ...)
{
  int err = errno;
  va_list ap;

  va_start (ap, fs);
  errno = err;
  nbdkit_verror (fs, ap);
  va_end (ap);
  errno = err;
}

PUBLIC_API __attribute__((format (printf, 1, 0))) void
nbdkit_vdebug (const char *fs, va_list args)
{
  int err = errno;
  if (log_verbose)
    log_vmsg (LOG_LVL_DEBUG, NULL, fs, args);
  errno = err;
}

PUBLIC_API __attribute__((format (printf, 1, 2))) void
nbdkit_debug (const char *fs, ...)
{
  int err = errno;
  va_list ap;

  if (!log_verbose)
    return;
  va_start (ap, fs);
  nbdkit_vdebug (fs, ap);
  va_end (ap);
  errno = err;
}

PUBLIC_API void
nbdkit_set_error (int err)
{
  public_last_error = err;
}

int
public_take_error (void)
{
  int err = public_last_error;
  public_last_error = 0;
  return err;
}

/* ---- Paths ------------------------------------------------------------- */

PUBLIC_API char *
nbdkit_absolute_path (const char *path)
{
  char *cwd, *ret;

  if (path == NULL || *path == '\0') {
    nbdkit_error ("cannot convert null or empty path to an absolute path");
    return NULL;
  }
  if (*path == '/') {
    ret = strdup (path);
    if (ret == NULL)
      nbdkit_error ("strdup: %m");
    return ret;
  }
  /* Plugins call this during config, before we might chdir("/") when
   * daemonizing, so the relative path is resolved against the user's cwd. */
  cwd = get_current_dir_name ();
  if (cwd == NULL) {
    nbdkit_error ("get_current_dir_name: %m");
    return NULL;
  }
  if (asprintf (&ret, "%s/%s", cwd, path) == -1) {
    nbdkit_error ("asprintf: %m");
    ret = NULL;
  }
  free (cwd);
  return ret;
}

PUBLIC_API char *
nbdkit_realpath (const char *path)
{
  char *ret;

  if (path == NULL || *path == '\0') {
    nbdkit_error ("cannot resolve a null or empty path");
    return NULL;
  }
  ret = realpath (path, NULL);
  if (ret == NULL)
    nbdkit_error ("realpath: %s: %m", path);
  return ret;
}

/* ---- Number parsers ---------------------------------------------------- */

/* The shared tail of every integer parser, with nbdkit's messages and
 * their order (a range error wins over trailing garbage). */
static int
parse_finish (const char *what, const char *str, const char *end, int err)
{
  if (err != 0) {
    errno = err;
    nbdkit_error ("%s: could not parse number: \"%s\": %m", what, str);
    return -1;
  }
  if (end == str) {
    nbdkit_error ("%s: empty string where we expected a number", what);
    errno = EINVAL;
    return -1;
  }
  if (*end != '\0') {
    nbdkit_error ("%s: could not parse number: \"%s\": trailing garbage",
                  what, str);
    errno = EINVAL;
    return -1;
  }
  return 0;
}

/* strtoll with base 0 (so 0x.. and 0.. work), checked against [min, max]. */
static int
parse_signed (const char *what, const char *str, long long min, long long max,
              long long *out)
{
  char *end;
  long long r;
  int err;

  errno = 0;
  r = strtoll (str, &end, 0);
  err = errno;
  if (err == 0 && (r < min || r > max))
    err = ERANGE;
  if (parse_finish (what, str, end, err) == -1)
    return -1;
  *out = r;
  return 0;
}

/* strtoull silently negates "-1" into a huge value, so a leading '-' (after
 * the whitespace strtoull would skip) is rejected first, as nbdkit does. */
static int
parse_unsigned (const char *what, const char *str, unsigned long long max,
                unsigned long long *out)
{
  char *end;
  unsigned long long r;
  int err;

  while (*str == ' ' || (*str >= '\t' && *str <= '\r'))
    str++;
  if (*str == '-') {
    nbdkit_error ("%s: negative numbers are not allowed", what);
    errno = ERANGE;
    return -1;
  }
  errno = 0;
  r = strtoull (str, &end, 0);
  err = errno;
  if (err == 0 && r > max)
    err = ERANGE;
  if (parse_finish (what, str, end, err) == -1)
    return -1;
  *out = r;
  return 0;
}

/* The result pointer may be NULL (nbdkit allows it: "just validate"). */
#define DEFINE_PARSE_SIGNED(fn, type, min, max)                         \
  PUBLIC_API int                                                        \
  fn (const char *what, const char *str, type *rp)                      \
  {                                                                     \
    long long r;                                                        \
    if (parse_signed (what, str, (min), (max), &r) == -1)               \
      return -1;                                                        \
    if (rp)                                                             \
      *rp = (type) r;                                                   \
    return 0;                                                           \
  }
#define DEFINE_PARSE_UNSIGNED(fn, type, max)                            \
  PUBLIC_API int                                                        \
  fn (const char *what, const char *str, type *rp)                      \
  {                                                                     \
    unsigned long long r;                                               \
    if (parse_unsigned (what, str, (max), &r) == -1)                    \
      return -1;                                                        \
    if (rp)                                                             \
      *rp = (type) r;                                                   \
    return 0;                                                           \
  }

DEFINE_PARSE_SIGNED (nbdkit_parse_int, int, INT_MIN, INT_MAX)
DEFINE_PARSE_SIGNED (nbdkit_parse_int8_t, int8_t, INT8_MIN, INT8_MAX)
DEFINE_PARSE_SIGNED (nbdkit_parse_int16_t, int16_t, INT16_MIN, INT16_MAX)
DEFINE_PARSE_SIGNED (nbdkit_parse_int32_t, int32_t, INT32_MIN, INT32_MAX)
DEFINE_PARSE_SIGNED (nbdkit_parse_int64_t, int64_t, INT64_MIN, INT64_MAX)
DEFINE_PARSE_UNSIGNED (nbdkit_parse_unsigned, unsigned, UINT_MAX)
DEFINE_PARSE_UNSIGNED (nbdkit_parse_uint8_t, uint8_t, UINT8_MAX)
DEFINE_PARSE_UNSIGNED (nbdkit_parse_uint16_t, uint16_t, UINT16_MAX)
DEFINE_PARSE_UNSIGNED (nbdkit_parse_uint32_t, uint32_t, UINT32_MAX)
DEFINE_PARSE_UNSIGNED (nbdkit_parse_uint64_t, uint64_t, UINT64_MAX)

/* Decimal only (hex digits would collide with the suffixes), one optional
 * suffix, no fractions: nbdkit 1.32.5 rejects "1.5G" and "1MiB" with
 * "unknown suffix", and so do we, with its exact messages. */
PUBLIC_API int64_t
nbdkit_parse_size (const char *str)
{
  int64_t size;
  const char *suffix;

  switch (size_parse (str, 0, &size, &suffix)) {
  case SIZE_OK:
    return size;
  case SIZE_NO_NUMBER:
    nbdkit_error ("could not parse size string (%s)", str);
    errno = EINVAL;
    return -1;
  case SIZE_NEGATIVE:
    nbdkit_error ("size cannot be negative (%s)", str);
    errno = ERANGE;
    return -1;
  case SIZE_TOO_BIG:
    nbdkit_error ("size (%s) exceeds maximum value", str);
    errno = ERANGE;
    return -1;
  case SIZE_OVERFLOW:
    nbdkit_error ("overflow computing size (%s)", str);
    errno = ERANGE;
    return -1;
  case SIZE_BAD_SUFFIX:
  default:
    nbdkit_error ("could not parse size: unknown suffix '%s'", suffix);
    errno = EINVAL;
    return -1;
  }
}

/* ASCII-only case folding on purpose: strcasecmp follows the locale, and
 * a Turkish locale would make "ON" fail to match "on". */
static bool
ascii_streq_nocase (const char *a, const char *b)
{
  for (;; a++, b++) {
    char x = *a, y = *b;
    if (x >= 'A' && x <= 'Z') x += 'a' - 'A';
    if (y >= 'A' && y <= 'Z') y += 'a' - 'A';
    if (x != y)
      return false;
    if (x == '\0')
      return true;
  }
}

PUBLIC_API int
nbdkit_parse_bool (const char *str)
{
  static const char *const yes[] = { "1", "true", "t", "yes", "y", "on" };
  static const char *const no[] = { "0", "false", "f", "no", "n", "off" };

  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
    if (ascii_streq_nocase (str, yes[i]))
      return 1;
    if (ascii_streq_nocase (str, no[i]))
      return 0;
  }
  nbdkit_error ("could not decipher boolean (%s)", str);
  errno = EINVAL;
  return -1;
}

/* ---- Configuration-time helpers ---------------------------------------- */

/* blkd never serves over stdin (no -s), so stdin belongs to the plugin
 * exactly until the configuration phase ends. */
PUBLIC_API int
nbdkit_stdio_safe (void)
{
  return !public_config_done;
}

/* Reads one line from fp into *password (EOF before any byte is an empty
 * password, as in nbdkit), dropping the trailing newline. */
static int
read_password_line (FILE *fp, const char *what, char **password)
{
  size_t n = 0;
  ssize_t r;
  int err;

  errno = 0;
  r = getline (password, &n, fp);
  err = errno;
  if (r == -1) {
    free (*password);
    *password = NULL;
    if (err != 0) {
      errno = err;
      nbdkit_error ("could not read password from %s: %m", what);
      return -1;
    }
    *password = strdup ("");
    if (*password == NULL) {
      nbdkit_error ("strdup: %m");
      return -1;
    }
    return 0;
  }
  if (r > 0 && (*password)[r - 1] == '\n')
    (*password)[r - 1] = '\0';
  return 0;
}

static int
read_password_interactive (char **password)
{
  struct termios orig, noecho;
  bool restore;
  int r, err;

  if (!nbdkit_stdio_safe ()) {
    nbdkit_error ("stdin is not available for reading password");
    return -1;
  }
  if (!isatty (STDIN_FILENO)) {
    nbdkit_error ("stdin is not a tty, cannot read password interactively");
    return -1;
  }

  printf ("password: ");
  fflush (stdout);
  /* Echo off is best effort: failing to hide the password is not a reason
   * to refuse reading it. */
  restore = tcgetattr (STDIN_FILENO, &orig) == 0;
  if (restore) {
    noecho = orig;
    noecho.c_lflag &= ~ECHO;
    tcsetattr (STDIN_FILENO, TCSAFLUSH, &noecho);
  }
  r = read_password_line (stdin, "stdin", password);
  err = errno;
  if (restore)
    tcsetattr (STDIN_FILENO, TCSAFLUSH, &orig);
  printf ("\n");            /* the user's Enter was not echoed */
  fflush (stdout);
  errno = err;
  return r;
}

/* Consumes (closes) fd, like nbdkit 1.32. */
static int
read_password_from_fd (const char *what, int fd, char **password)
{
  FILE *fp = fdopen (fd, "r");
  int r, err;

  if (fp == NULL) {
    nbdkit_error ("fdopen %s: %m", what);
    close (fd);
    return -1;
  }
  r = read_password_line (fp, what, password);
  err = errno;
  fclose (fp);
  errno = err;
  return r;
}

PUBLIC_API int
nbdkit_read_password (const char *value, char **password)
{
  *password = NULL;

  if (strcmp (value, "-") == 0)
    return read_password_interactive (password);

  if (value[0] == '-') {
    int fd;

    if (nbdkit_parse_int ("password file descriptor", &value[1], &fd) == -1)
      return -1;
    /* Reading would close the fd, and 0-2 are not ours to close. */
    if (fd == STDIN_FILENO || fd == STDOUT_FILENO || fd == STDERR_FILENO) {
      nbdkit_error ("cannot use password -FD for stdin/stdout/stderr");
      errno = EINVAL;
      return -1;
    }
    return read_password_from_fd (&value[1], fd, password);
  }

  if (value[0] == '+') {
    int fd = open (&value[1], O_RDONLY | O_CLOEXEC);

    if (fd == -1) {
      nbdkit_error ("open %s: %m", &value[1]);
      return -1;
    }
    return read_password_from_fd (&value[1], fd, password);
  }

  *password = strdup (value);
  if (*password == NULL) {
    nbdkit_error ("strdup: %m");
    return -1;
  }
  return 0;
}

/* ---- Shutdown and sleeping --------------------------------------------- */

/* Sleepers poll an eventfd that shutdown makes readable for good (it is
 * never read), so every current and future sleep ends at once. */
static atomic_bool shutdown_flag;
static atomic_int wake_fd = -1;
static pthread_once_t wake_once = PTHREAD_ONCE_INIT;

static void
wake_fd_init (void)
{
  atomic_store (&wake_fd, eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK));
}

/* Only an atomic store and write(2): callable from a signal handler.  The
 * flag is stored before wake_fd is read and sleepers publish wake_fd before
 * reading the flag, so (seq_cst) no sleeper misses both. */
void
public_begin_shutdown (void)
{
  int fd;

  atomic_store (&shutdown_flag, true);
  fd = atomic_load (&wake_fd);
  if (fd >= 0) {
    int err = errno;
    uint64_t one = 1;
    ssize_t r = write (fd, &one, sizeof one);
    (void) r;                   /* EAGAIN: counter already nonzero */
    errno = err;
  }
}

bool
public_shutdown_requested (void)
{
  return atomic_load (&shutdown_flag);
}

PUBLIC_API void
nbdkit_shutdown (void)
{
  void (*hook) (void) = public_shutdown_hook;

  public_begin_shutdown ();
  if (hook)
    hook ();
}

/* Like nbdkit: the sleep ends early with ESHUTDOWN when the server shuts
 * down or the client hangs up (POLLRDHUP on the connection's socket), so
 * a plugin sleeping for rate limiting cannot hold up either.  Signals are
 * not blocked (a signal may be how the core learns of shutdown); EINTR
 * just resumes the sleep for the remaining time. */
PUBLIC_API int
nbdkit_nanosleep (unsigned sec, unsigned nsec)
{
  struct public_conn_ctx *ctx = public_current;
  int64_t deadline;
  struct pollfd fds[2];

  if (sec >= INT_MAX - nsec / 1000000000) {
    nbdkit_error ("sleep request is too long");
    errno = EINVAL;
    return -1;
  }
  deadline = (int64_t) now_ns () + (int64_t) sec * 1000000000 + nsec;

  pthread_once (&wake_once, wake_fd_init);
  fds[0].fd = atomic_load (&wake_fd);
  fds[0].events = POLLIN;
  fds[1].fd = ctx ? ctx->peer_fd : -1;
  fds[1].events = POLLRDHUP;

  for (;;) {
    int64_t left;
    struct timespec ts;
    int r;

    if (atomic_load (&shutdown_flag))
      goto shut_down;
    left = deadline - (int64_t) now_ns ();
    if (left <= 0)
      return 0;
    /* Without an eventfd (out of fds), wake every 100ms to check the flag. */
    if (fds[0].fd < 0 && left > 100000000)
      left = 100000000;
    ts.tv_sec = left / 1000000000;
    ts.tv_nsec = left % 1000000000;
    fds[0].revents = fds[1].revents = 0;
    r = ppoll (fds, 2, &ts, NULL);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      nbdkit_error ("poll: %m");
      return -1;
    }
    if (r == 0)
      continue;                 /* loop re-checks the flag and the clock */
    if (fds[0].revents)
      goto shut_down;
    if (fds[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
      nbdkit_error ("aborting sleep because of connection close or error");
      errno = ESHUTDOWN;
      return -1;
    }
  }

 shut_down:
  nbdkit_error ("aborting sleep because of server shut down");
  errno = ESHUTDOWN;
  return -1;
}

/* ---- Per-connection information ---------------------------------------- */

PUBLIC_API const char *
nbdkit_export_name (void)
{
  if (public_current == NULL) {
    nbdkit_error ("no connection in this thread");
    errno = EINVAL;
    return NULL;
  }
  return public_current->export_name;
}

PUBLIC_API int
nbdkit_is_tls (void)
{
  if (public_current == NULL) {
    nbdkit_error ("no connection in this thread");
    errno = EINVAL;
    return -1;
  }
  return public_current->is_tls;
}

/* The connection's socket, or -1 after reporting why there is none. */
static int
current_socket (void)
{
  if (public_current == NULL) {
    nbdkit_error ("no connection in this thread");
    errno = EINVAL;
    return -1;
  }
  if (public_current->peer_fd < 0) {
    nbdkit_error ("socket not open");
    errno = EBADF;
    return -1;
  }
  return public_current->peer_fd;
}

PUBLIC_API int
nbdkit_peer_name (struct sockaddr *addr, socklen_t *addrlen)
{
  int s = current_socket ();

  if (s == -1)
    return -1;
  if (getpeername (s, addr, addrlen) == -1) {
    nbdkit_error ("peername: %m");
    return -1;
  }
  return 0;
}

enum cred_field { CRED_PID, CRED_UID, CRED_GID };

/* SO_PEERCRED only means something on a Unix socket: on TCP Linux answers
 * pid 0 and the overflow uid/gid (65534), which nbdkit passes on for uid
 * and gid; we report an error instead of a made-up identity. */
static int64_t
peer_cred (enum cred_field which)
{
  static const char *const name[] = { "pid", "uid", "gid" };
  struct sockaddr_storage ss;
  socklen_t sslen = sizeof ss;
  struct ucred cred;
  socklen_t n = sizeof cred;
  int s = current_socket ();

  if (s == -1)
    return -1;
  if (getsockname (s, (struct sockaddr *) &ss, &sslen) == -1) {
    nbdkit_error ("getsockname: %m");
    return -1;
  }
  if (ss.ss_family != AF_UNIX) {
    nbdkit_error ("nbdkit_peer_%s: peer credentials are only available "
                  "on Unix domain sockets", name[which]);
    errno = ENOTSUP;
    return -1;
  }
  if (getsockopt (s, SOL_SOCKET, SO_PEERCRED, &cred, &n) == -1) {
    nbdkit_error ("getsockopt: SO_PEERCRED: %m");
    return -1;
  }
  switch (which) {
  case CRED_PID:
    if (cred.pid >= 1)
      return cred.pid;
    break;
  case CRED_UID:
    return cred.uid;
  case CRED_GID:
    return cred.gid;
  }
  nbdkit_error ("nbdkit_peer_%s: not known for this peer", name[which]);
  errno = ENOTSUP;
  return -1;
}

PUBLIC_API int64_t
nbdkit_peer_pid (void)
{
  return peer_cred (CRED_PID);
}

PUBLIC_API int64_t
nbdkit_peer_uid (void)
{
  return peer_cred (CRED_UID);
}

PUBLIC_API int64_t
nbdkit_peer_gid (void)
{
  return peer_cred (CRED_GID);
}

/* ---- Interned strings -------------------------------------------------- */

/* One allocation per string: the list link and the characters. */
struct public_intern {
  struct public_intern *next;
  char str[];
};

/* Strings interned outside a connection (load, config, get_ready...):
 * they must live until exit.  A mutex because plugins may intern from
 * background threads started in after_fork. */
static struct public_intern *global_interns;
static pthread_mutex_t global_interns_lock = PTHREAD_MUTEX_INITIALIZER;

/* Per-connection lists are pushed lock-free: PARALLEL plugins may intern
 * from several workers of one connection at once, and a push-only list
 * needs nothing more than a CAS on the head.  Release runs after the
 * last call for the connection, so it needs no synchronisation. */
static const char *
add_intern (struct public_intern *in)
{
  struct public_conn_ctx *ctx = public_current;

  if (ctx) {
    struct public_intern *head =
      __atomic_load_n (&ctx->interns, __ATOMIC_RELAXED);
    do
      in->next = head;
    while (!__atomic_compare_exchange_n (&ctx->interns, &head, in, true,
                                         __ATOMIC_RELEASE, __ATOMIC_RELAXED));
  }
  else {
    pthread_mutex_lock (&global_interns_lock);
    in->next = global_interns;
    global_interns = in;
    pthread_mutex_unlock (&global_interns_lock);
  }
  return in->str;
}

static void
free_interns (struct public_intern *in)
{
  while (in) {
    struct public_intern *next = in->next;
    free (in);
    in = next;
  }
}

void
public_conn_ctx_release (struct public_conn_ctx *ctx)
{
  if (ctx) {
    free_interns (ctx->interns);
    ctx->interns = NULL;
  }
}

void
public_release_global (void)
{
  struct public_intern *list;

  pthread_mutex_lock (&global_interns_lock);
  list = global_interns;
  global_interns = NULL;
  pthread_mutex_unlock (&global_interns_lock);
  free_interns (list);
}

/* Copies the first len bytes of str into a new interned string. */
static const char *
intern_bytes (const char *str, size_t len)
{
  struct public_intern *in = malloc (sizeof *in + len + 1);

  if (in == NULL) {
    nbdkit_error ("strndup: %m");
    return NULL;
  }
  memcpy (in->str, str, len);
  in->str[len] = '\0';
  return add_intern (in);
}

PUBLIC_API const char *
nbdkit_strndup_intern (const char *str, size_t n)
{
  if (str == NULL) {
    nbdkit_error ("nbdkit_strndup_intern: no string given");
    errno = EINVAL;
    return NULL;
  }
  return intern_bytes (str, strnlen (str, n));
}

PUBLIC_API const char *
nbdkit_strdup_intern (const char *str)
{
  if (str == NULL) {
    nbdkit_error ("nbdkit_strdup_intern: no string given");
    errno = EINVAL;
    return NULL;
  }
  return intern_bytes (str, strlen (str));
}

PUBLIC_API __attribute__((format (printf, 1, 0))) const char *
nbdkit_vprintf_intern (const char *fmt, va_list ap)
{
  /* %m must see the caller's errno on both passes, and malloc may not
   * leave errno alone. */
  int err = errno;
  struct public_intern *in;
  va_list ap2;
  int len;

  va_copy (ap2, ap);
  len = vsnprintf (NULL, 0, fmt, ap2);
  va_end (ap2);
  if (len < 0) {
    nbdkit_error ("vsnprintf: %m");
    return NULL;
  }
  in = malloc (sizeof *in + (size_t) len + 1);
  if (in == NULL) {
    nbdkit_error ("asprintf: %m");
    return NULL;
  }
  errno = err;
  vsnprintf (in->str, (size_t) len + 1, fmt, ap);
  errno = err;
  return add_intern (in);
}

PUBLIC_API __attribute__((format (printf, 1, 2))) const char *
nbdkit_printf_intern (const char *fmt, ...)
{
  va_list ap;
  const char *ret;

  va_start (ap, fmt);
  ret = nbdkit_vprintf_intern (fmt, ap);
  va_end (ap);
  return ret;
}

/* ---- For extents.c and exports.c -------------------------------------- */

/* nbdkit asserts on an index past the count; a filter that does it is
 * broken, and carrying on would hand it memory past the array. */
void
public_index_abort (const char *fn, size_t i, size_t len)
{
  log_error ("%s: index %zu out of range (count %zu): "
             "filter bug, aborting", fn, i, len);
  abort ();
}
