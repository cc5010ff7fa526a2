/* Logging: formats each line with level, connection and peer, preserving
 * errno, and sends it where --log says (stderr, syslog or nowhere). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

bool log_verbose;
__thread const struct log_ctx *log_current;

/* Written only before threads start (option parsing, the daemon child). */
static enum log_dest log_dest = LOG_TO_DEFAULT;

static const char *level_name[] = { "error", "warning", "info", "debug" };
static const int level_prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };

void
log_set_dest (enum log_dest dest)
{
  log_dest = dest;
  if (dest == LOG_TO_SYSLOG)
    openlog ("blkd", LOG_PID, LOG_DAEMON);
}

/* What start-up code and plugins still print with stdio once we are a
 * daemon (start-up failures after the fork, a plugin's own fprintf) would
 * go to /dev/null; this stream hands each line to syslog instead.  It is
 * line buffered, so glibc calls us at each newline, under the stream's
 * lock.  Limit: a line longer than the stdio buffer arrives in pieces,
 * and the priority is a guess from the text. */
static ssize_t
stderr_to_syslog (void *cookie, const char *buf, size_t len)
{
  size_t off = 0;
  while (off < len) {
    const char *nl = memchr (buf + off, '\n', len - off);
    size_t n = nl ? (size_t) (nl - (buf + off)) : len - off;
    const char *line = buf + off;
    if (n >= 6 && memcmp (line, "blkd: ", 6) == 0) {      /* syslog names us */
      line += 6;
      n -= 6;
    }
    if (n > 0)
      syslog (memmem (line, n, "warning", 7) ? LOG_WARNING : LOG_ERR, "%.*s", (int) n, line);
    off += (nl ? (size_t) (nl - (buf + off)) + 1 : len - off);
  }
  return len;
}

void
log_daemonized (void)
{
  if (log_dest == LOG_TO_DEFAULT)
    log_set_dest (LOG_TO_SYSLOG);
  if (log_dest == LOG_TO_STDERR)
    return;                       /* asked for: keep the inherited stderr */

  /* Nothing may write to the terminal we were started from: fd 2 becomes
   * /dev/null (children, plugins using write(2)); with syslog the stdio
   * stream becomes one that logs. */
  int fd = open ("/dev/null", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    dup2 (fd, STDERR_FILENO);     /* dup2 clears O_CLOEXEC on fd 2 */
    close (fd);
  }
  if (log_dest == LOG_TO_SYSLOG) {
    FILE *f = fopencookie (NULL, "w", (cookie_io_functions_t) { .write = stderr_to_syslog });
    if (f && setvbuf (f, NULL, _IOLBF, BUFSIZ) == 0)
      stderr = f;
    else if (f)
      fclose (f);
  }
}

/* One fprintf (or syslog) per line so lines from different threads do not
 * interleave (stdio locks the stream for the duration of one call, syslog
 * sends one datagram).  %m works because glibc's printf expands it from
 * errno, which we restore first.  Limit: syslog(3) blocks when the
 * receiver's queue is full, stalling the thread that logs. */
void
log_vmsg (enum log_level level, const char *prefix, const char *fmt, va_list ap)
{
  int saved_errno = errno;
  char body[2048];
  char where[96] = "";

  if (log_dest == LOG_TO_NULL)
    return;
  errno = saved_errno;
  vsnprintf (body, sizeof body, fmt, ap);
  if (log_current)
    snprintf (where, sizeof where, " conn %llu peer %s:", log_current->conn_id,
              log_current->peer ? log_current->peer : "?");
  if (log_dest == LOG_TO_SYSLOG)
    syslog (level_prio[level], "%s:%s%s %s", level_name[level], where,
            prefix ? prefix : "", body);
  else
    fprintf (stderr, "blkd: %s:%s%s %s\n", level_name[level], where,
             prefix ? prefix : "", body);
  errno = saved_errno;
}

void
log_msg (enum log_level level, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  log_vmsg (level, NULL, fmt, ap);
  va_end (ap);
}
