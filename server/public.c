/* The nbdkit plugin API (nbdkit 1.32 semantics) blkd exports to plugins. */

/* Exported to dlopen'ed plugins (default visibility, resolved through the
 * executable's dynamic symbol table, which needs -rdynamic):
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
 *   nbdkit_add_extent nbdkit_extents_free
 *   nbdkit_add_export nbdkit_use_default_export nbdkit_exports_free
 * and, for filters (nbdkit-filter.h):
 *   nbdkit_extents_new nbdkit_extents_count nbdkit_get_extent
 *   nbdkit_extents_full nbdkit_extents_aligned
 *   nbdkit_exports_new nbdkit_exports_count nbdkit_get_export
 * For the core only (server/public.h): public_current, public_config_done,
 * public_shutdown_hook, public_last_error, public_take_error,
 * public_begin_shutdown, public_shutdown_requested, public_conn_ctx_release,
 * public_release_global, public_extents_new/free, public_exports_new/free,
 * public_exports_add_name.
 * Also for filters: nbdkit_next_context_open nbdkit_next_context_close
 *   nbdkit_context_get_backend nbdkit_context_set_next (thin: the layer
 *   stack in backend.c does the work).
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
#include "public.h"

#define API __attribute__((visibility ("default")))

/* nbdkit's caps (server/extents.c, server/exports.c): they bound the reply
 * size and the memory a misbehaving plugin can make us hold. */
#define MAX_EXTENTS (1024 * 1024)
#define MAX_EXPORTS 10000
#define MAX_STRING 4096             /* NBD protocol's limit on a string */

/* Defined here rather than in the core so that unit tests linking every
 * server object but main.o still resolve them. */
__thread struct public_conn_ctx *public_current;
__thread int public_last_error;
bool public_config_done;
void (*public_shutdown_hook) (void);

/* ---- Messages ---------------------------------------------------------- */

API __attribute__((format (printf, 1, 0))) void
nbdkit_verror (const char *fs, va_list args)
{
  /* Plugins log and then return -1 expecting errno to survive (they set
   * errno_is_preserved), so logging must not disturb it. */
  int err = errno;
  log_vmsg (LOG_LVL_ERROR, NULL, fs, args);
  errno = err;
}

API __attribute__((format (printf, 1, 2))) void
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

API __attribute__((format (printf, 1, 0))) void
nbdkit_vdebug (const char *fs, va_list args)
{
  int err = errno;
  if (log_verbose)
    log_vmsg (LOG_LVL_DEBUG, NULL, fs, args);
  errno = err;
}

API __attribute__((format (printf, 1, 2))) void
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

API void
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

API char *
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

API char *
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
  API int                                                               \
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
  API int                                                               \
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
API int64_t
nbdkit_parse_size (const char *str)
{
  char *end;
  intmax_t size;
  int64_t scale = 1;

  errno = 0;
  size = strtoimax (str, &end, 10);
  if (end == str) {
    nbdkit_error ("could not parse size string (%s)", str);
    errno = EINVAL;
    return -1;
  }
  if (size < 0) {
    nbdkit_error ("size cannot be negative (%s)", str);
    errno = ERANGE;
    return -1;
  }
  if (errno != 0) {
    nbdkit_error ("size (%s) exceeds maximum value", str);
    errno = ERANGE;
    return -1;
  }

  if (*end != '\0') {
    static const char units[] = "bkmgtpe";
    const char *u;
    char c = *end;

    if (c >= 'A' && c <= 'Z')
      c += 'a' - 'A';
    if (c == 's')
      scale = 512;              /* "sectors", whatever the real sector size */
    else if ((u = strchr (units, c)) != NULL) {
      for (const char *p = units; p < u; p++)
        scale *= 1024;
    }
    else
      goto bad_suffix;
    if (end[1] != '\0')
      goto bad_suffix;
  }

  if (INT64_MAX / scale < size) {
    nbdkit_error ("overflow computing size (%s)", str);
    errno = ERANGE;
    return -1;
  }
  return (int64_t) size * scale;

 bad_suffix:
  nbdkit_error ("could not parse size: unknown suffix '%s'", end);
  errno = EINVAL;
  return -1;
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

API int
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
API int
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

API int
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

API void
nbdkit_shutdown (void)
{
  void (*hook) (void) = public_shutdown_hook;

  public_begin_shutdown ();
  if (hook)
    hook ();
}

static int64_t
monotonic_ns (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Like nbdkit: the sleep ends early with ESHUTDOWN when the server shuts
 * down or the client hangs up (POLLRDHUP on the connection's socket), so
 * a plugin sleeping for rate limiting cannot hold up either.  Signals are
 * not blocked (a signal may be how the core learns of shutdown); EINTR
 * just resumes the sleep for the remaining time. */
API int
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
  deadline = monotonic_ns () + (int64_t) sec * 1000000000 + nsec;

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
    left = deadline - monotonic_ns ();
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

API const char *
nbdkit_export_name (void)
{
  if (public_current == NULL) {
    nbdkit_error ("no connection in this thread");
    errno = EINVAL;
    return NULL;
  }
  return public_current->export_name;
}

API int
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

API int
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

API int64_t
nbdkit_peer_pid (void)
{
  return peer_cred (CRED_PID);
}

API int64_t
nbdkit_peer_uid (void)
{
  return peer_cred (CRED_UID);
}

API int64_t
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

API const char *
nbdkit_strndup_intern (const char *str, size_t n)
{
  if (str == NULL) {
    nbdkit_error ("nbdkit_strndup_intern: no string given");
    errno = EINVAL;
    return NULL;
  }
  return intern_bytes (str, strnlen (str, n));
}

API const char *
nbdkit_strdup_intern (const char *str)
{
  if (str == NULL) {
    nbdkit_error ("nbdkit_strdup_intern: no string given");
    errno = EINVAL;
    return NULL;
  }
  return intern_bytes (str, strlen (str));
}

API __attribute__((format (printf, 1, 0))) const char *
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

API __attribute__((format (printf, 1, 2))) const char *
nbdkit_printf_intern (const char *fmt, ...)
{
  va_list ap;
  const char *ret;

  va_start (ap, fmt);
  ret = nbdkit_vprintf_intern (fmt, ap);
  va_end (ap);
  return ret;
}

/* ---- Extents ----------------------------------------------------------- */

/* e->next holds offset+length of the previous call.  nbdkit keeps it in an
 * int64_t with -1 meaning "no call yet", so any value above INT64_MAX
 * skips the contiguity check; UINT64_MAX as "no call yet" and the same
 * test reproduce that exactly. */
#define EXTENTS_NO_CALL_YET UINT64_MAX

struct nbdkit_extents *
public_extents_new (uint64_t start, uint64_t end)
{
  struct nbdkit_extents *e;

  if (start > INT64_MAX || end > INT64_MAX) {
    nbdkit_error ("nbdkit_extents_new: start (%" PRIu64 ") or end (%" PRIu64
                  ") > INT64_MAX", start, end);
    errno = ERANGE;
    return NULL;
  }
  if (start > end) {            /* start == end is a valid empty window */
    nbdkit_error ("nbdkit_extents_new: start (%" PRIu64 ") >= end (%" PRIu64
                  ")", start, end);
    errno = ERANGE;
    return NULL;
  }
  e = calloc (1, sizeof *e);
  if (e == NULL) {
    nbdkit_error ("nbdkit_extents_new: malloc: %m");
    return NULL;
  }
  e->start = start;
  e->end = end;
  e->next = EXTENTS_NO_CALL_YET;
  return e;
}

void
public_extents_free (struct nbdkit_extents *e)
{
  if (e) {
    free (e->v);
    free (e);
  }
}

API void
nbdkit_extents_free (struct nbdkit_extents *e)
{
  public_extents_free (e);
}

API int
nbdkit_add_extent (struct nbdkit_extents *e,
                   uint64_t offset, uint64_t length, uint32_t type)
{
  /* The order of these checks is nbdkit's, and it is observable: e.g. a
   * non-contiguous zero-length extent is an error, and the first extent
   * starting after `start` is only an error if it is inside the window. */
  if (e->next <= INT64_MAX && e->next != offset) {
    nbdkit_error ("nbdkit_add_extent: "
                  "extents must be added in ascending order and "
                  "must be contiguous");
    errno = ERANGE;
    return -1;
  }
  e->next = offset + length;

  if (length == 0)
    return 0;
  /* Past the window, or full: dropped silently; the client just gets a
   * shorter answer and asks again. */
  if (offset >= e->end || e->len >= MAX_EXTENTS)
    return 0;
  if (offset + length > e->end)
    length = e->end - offset;

  if (e->len == 0) {
    if (offset + length <= e->start)
      return 0;
    if (offset > e->start) {
      nbdkit_error ("nbdkit_add_extent: first extent must not be > start (%"
                    PRIu64 ")", e->start);
      errno = ERANGE;
      return -1;
    }
    length -= e->start - offset;
    offset = e->start;
  }

  if (e->len > 0 && e->v[e->len - 1].type == type) {
    e->v[e->len - 1].length += length;
    return 0;
  }
  if (e->len == e->cap) {
    size_t ncap = e->cap ? e->cap * 2 : 16;
    struct public_extent *nv = realloc (e->v, ncap * sizeof *nv);

    if (nv == NULL) {
      nbdkit_error ("nbdkit_add_extent: realloc: %m");
      return -1;
    }
    e->v = nv;
    e->cap = ncap;
  }
  e->v[e->len].offset = offset;
  e->v[e->len].length = length;
  e->v[e->len].type = type;
  e->len++;
  return 0;
}

API struct nbdkit_extents *
nbdkit_extents_new (uint64_t start, uint64_t end)
{
  return public_extents_new (start, end);
}

API size_t
nbdkit_extents_count (const struct nbdkit_extents *e)
{
  return e->len;
}

/* nbdkit asserts on an index past the count; a filter that does it is
 * broken, and carrying on would hand it memory past the array. */
static void __attribute__((noreturn))
public_index_abort (const char *fn, size_t i, size_t len)
{
  log_error ("%s: index %zu out of range (count %zu): "
             "filter bug, aborting", fn, i, len);
  abort ();
}

API struct nbdkit_extent
nbdkit_get_extent (const struct nbdkit_extents *e, size_t i)
{
  if (i >= e->len)
    public_index_abort ("nbdkit_get_extent", i, e->len);
  return (struct nbdkit_extent) {
    .offset = e->v[i].offset, .length = e->v[i].length, .type = e->v[i].type,
  };
}

/* Asks `next` for one extents list, failing with EIO when it answered
 * nothing: the caller would otherwise loop without progress (nbdkit
 * asserts there instead). */
static int
extents_ask (nbdkit_next *next, uint32_t count, uint64_t offset,
             uint32_t flags, struct nbdkit_extents *e, int *err)
{
  if (next->extents (next, count, offset, flags, e, err) == -1)
    return -1;
  if (e->len == 0) {
    nbdkit_error ("extents: the layer below returned no extent at offset %"
                  PRIu64, offset);
    *err = EIO;
    return -1;
  }
  return 0;
}

/* Every extent of [offset, offset+count), asking `next` as many times as
 * it takes (a plugin may answer only a prefix).  REQ_ONE is cleared so the
 * layer below answers as much as it is willing to per call. */
API struct nbdkit_extents *
nbdkit_extents_full (nbdkit_next *next, uint32_t count, uint64_t offset,
                     uint32_t flags, int *err)
{
  struct nbdkit_extents *ret, *t = NULL;

  flags &= ~NBDKIT_FLAG_REQ_ONE;
  ret = public_extents_new (offset, offset + count);
  if (ret == NULL)
    goto err_errno;
  while (count > 0) {
    t = public_extents_new (offset, offset + count);
    if (t == NULL)
      goto err_errno;
    if (extents_ask (next, count, offset, flags, t, err) == -1)
      goto err;
    /* t is clipped to [offset, offset+count), so each extent fits. */
    for (size_t i = 0; i < t->len; i++) {
      if (nbdkit_add_extent (ret, t->v[i].offset, t->v[i].length,
                             t->v[i].type) == -1)
        goto err_errno;
      offset += t->v[i].length;
      count -= t->v[i].length;
    }
    public_extents_free (t);
    t = NULL;
  }
  return ret;

 err_errno:
  *err = errno;
 err:
  public_extents_free (t);
  public_extents_free (ret);
  return NULL;
}

/* Fills `e` for [offset, offset+count) with extents whose lengths are all
 * multiples of `align`, for a filter whose own granularity is `align`
 * (blocksize, cacheextents...).  nbdkit's rule: an unaligned extent past
 * the first block is rounded down and the list ends there; an unaligned
 * first block is merged with what follows until it covers `align` bytes,
 * its type being the AND of the merged types (a block is a hole or zero
 * only if all of it is), asking `next` again if the list runs out. */
API int
nbdkit_extents_aligned (nbdkit_next *next, uint32_t count, uint64_t offset,
                        uint32_t flags, uint32_t align,
                        struct nbdkit_extents *e, int *err)
{
  /* nbdkit asserts these; a bad filter gets EINVAL here instead. */
  if (align == 0 || (align & (align - 1)) != 0 ||
      ((count | offset) & (align - 1)) != 0) {
    nbdkit_error ("nbdkit_extents_aligned: count %" PRIu32 " offset %"
                  PRIu64 " not aligned to %" PRIu32 " (or not a power of 2)",
                  count, offset, align);
    *err = EINVAL;
    return -1;
  }
  if (next->extents (next, count, offset, flags, e, err) == -1)
    return -1;

  for (size_t i = 0; i < e->len; i++) {
    struct public_extent *x = &e->v[i];

    if ((x->length & (align - 1)) == 0)
      continue;
    if (x->offset + x->length > offset + align) {
      /* Keep the aligned part; the client asks again for the rest. */
      x->length &= ~(uint64_t) (align - 1);
      e->len = i + (x->length != 0);
      e->next = x->offset + x->length;
      return 0;
    }
    /* Only the first extent can end inside the first block: every later
     * one starts at or past offset + align. */
    while (x->length < align) {
      if (e->len > 1) {
        x->length += e->v[1].length;
        x->type &= e->v[1].type;
        memmove (&e->v[1], &e->v[2], (e->len - 2) * sizeof e->v[0]);
        e->len--;
      }
      else {
        /* The layer below needs a fresh container; its answer becomes
         * ours, with our partial first extent folded into its first. */
        struct nbdkit_extents *t;
        struct public_extent *tv;
        size_t tlen, tcap;

        t = public_extents_new (x->offset + x->length, offset + align);
        if (t == NULL) {
          *err = errno;
          return -1;
        }
        if (extents_ask (next, align - x->length, x->offset + x->length,
                         flags & ~NBDKIT_FLAG_REQ_ONE, t, err) == -1) {
          public_extents_free (t);
          return -1;
        }
        t->v[0].offset = x->offset;
        t->v[0].length += x->length;
        t->v[0].type &= x->type;
        tv = t->v, tlen = t->len, tcap = t->cap;
        t->v = e->v, t->len = e->len, t->cap = e->cap;
        e->v = tv, e->len = tlen, e->cap = tcap;
        public_extents_free (t);
        x = &e->v[0];
      }
    }
    x->length = align;
    e->len = 1;
    e->next = x->offset + x->length;
    return 0;
  }
  return 0;
}

/* ---- Exports ----------------------------------------------------------- */

struct nbdkit_exports *
public_exports_new (void)
{
  struct nbdkit_exports *x = calloc (1, sizeof *x);

  if (x == NULL)
    nbdkit_error ("nbdkit_exports_new: malloc: %m");
  return x;
}

void
public_exports_free (struct nbdkit_exports *x)
{
  if (x) {
    for (size_t i = 0; i < x->len; i++) {
      free (x->v[i].name);
      free (x->v[i].description);
    }
    free (x->v);
    free (x);
  }
}

API void
nbdkit_exports_free (struct nbdkit_exports *x)
{
  public_exports_free (x);
}

API struct nbdkit_exports *
nbdkit_exports_new (void)
{
  return public_exports_new ();
}

API size_t
nbdkit_exports_count (const struct nbdkit_exports *x)
{
  return x->len;
}

API struct nbdkit_export
nbdkit_get_export (const struct nbdkit_exports *x, size_t i)
{
  if (i >= x->len)
    public_index_abort ("nbdkit_get_export", i, x->len);
  return (struct nbdkit_export) {
    .name = x->v[i].name, .description = x->v[i].description,
  };
}

API int
nbdkit_add_export (struct nbdkit_exports *x,
                   const char *name, const char *description)
{
  char *n = NULL, *d = NULL;

  if (x->len >= MAX_EXPORTS) {
    nbdkit_error ("nbdkit_add_export: too many exports");
    errno = EINVAL;
    return -1;
  }
  /* NBD_OPT_LIST replies carry these as protocol strings. */
  if (name == NULL) {
    nbdkit_error ("nbdkit_add_export: no export name given");
    errno = EINVAL;
    return -1;
  }
  if (strlen (name) > MAX_STRING ||
      (description && strlen (description) > MAX_STRING)) {
    nbdkit_error ("nbdkit_add_export: string too long");
    errno = EINVAL;
    return -1;
  }
  if (x->len == x->cap) {
    size_t ncap = x->cap ? x->cap * 2 : 8;
    struct public_export *nv = realloc (x->v, ncap * sizeof *nv);

    if (nv == NULL)
      goto nomem;
    x->v = nv;
    x->cap = ncap;
  }
  n = strdup (name);
  if (n == NULL)
    goto nomem;
  if (description) {
    d = strdup (description);
    if (d == NULL)
      goto nomem;
  }
  x->v[x->len].name = n;
  x->v[x->len].description = d;
  x->len++;
  return 0;

 nomem:
  nbdkit_error ("nbdkit_add_export: %m");
  free (n);
  errno = ENOMEM;
  return -1;
}

int
public_exports_add_name (struct nbdkit_exports *x, const char *name)
{
  x->use_default = false;
  return nbdkit_add_export (x, name, NULL);
}

API int
nbdkit_use_default_export (struct nbdkit_exports *x)
{
  x->use_default = true;
  return 0;
}

/* ---- contexts, for filters (the work is in backend.c) ---------------- */

/* backend.h cannot be included here: it makes nbdkit_next our struct
 * context, while this file sees nbdkit's opaque types. */
struct backend;
struct context;
struct context *backend_next_context_open (struct backend *b, int readonly,
                                           const char *exportname, int shared);
void backend_close (struct context *c);
struct backend *backend_context_below (struct context *c);
struct context *backend_context_swap_next (struct context *c, struct context *next);

API nbdkit_next *
nbdkit_next_context_open (nbdkit_backend *backend, int readonly,
                          const char *exportname, int shared)
{
  return (nbdkit_next *) backend_next_context_open ((struct backend *) backend, readonly,
                                                    exportname, shared);
}

API void
nbdkit_next_context_close (nbdkit_next *next)
{
  if (next)
    backend_close ((struct context *) next);
}

API nbdkit_backend *
nbdkit_context_get_backend (nbdkit_context *context)
{
  return (nbdkit_backend *) backend_context_below ((struct context *) context);
}

API nbdkit_next *
nbdkit_context_set_next (nbdkit_context *context, nbdkit_next *next)
{
  return (nbdkit_next *) backend_context_swap_next ((struct context *) context,
                                                    (struct context *) next);
}
