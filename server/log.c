/* Logging: formats each line with level, connection and peer, preserving errno. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"

bool log_verbose;
__thread const struct log_ctx *log_current;

static const char *level_name[] = { "error", "warning", "info", "debug" };

/* One fprintf per line so lines from different threads do not interleave
 * (stdio locks the stream for the duration of one call).  %m works because
 * glibc's printf expands it from errno, which we restore first. */
void
log_vmsg (enum log_level level, const char *prefix, const char *fmt, va_list ap)
{
  int saved_errno = errno;
  char body[2048];
  char where[96] = "";

  errno = saved_errno;
  vsnprintf (body, sizeof body, fmt, ap);
  if (log_current)
    snprintf (where, sizeof where, " conn %llu peer %s:", log_current->conn_id,
              log_current->peer ? log_current->peer : "?");
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
