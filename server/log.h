/* Logging: one line per event to stderr, syslog or nowhere, naming the connection and peer. */
#ifndef BLKD_LOG_H
#define BLKD_LOG_H

#include <stdarg.h>
#include <stdbool.h>

enum log_level { LOG_LVL_ERROR, LOG_LVL_WARN, LOG_LVL_INFO, LOG_LVL_DEBUG };

/* --log, in the order of its choices; LOG_TO_DEFAULT means stderr in the
 * foreground and syslog once log_daemonized has run, as in nbdkit. */
enum log_dest { LOG_TO_STDERR, LOG_TO_SYSLOG, LOG_TO_NULL, LOG_TO_DEFAULT };

extern bool log_verbose;          /* -v: debug lines (and nbdkit_debug) print */

/* The connection this thread is working for, so every line can name it.
 * Set by the shard/worker around each piece of per-connection work. */
struct log_ctx {
  unsigned long long conn_id;
  const char *peer;               /* "127.0.0.1:40312", "unix", ... */
};
extern __thread const struct log_ctx *log_current;

void log_set_dest (enum log_dest dest);   /* --log; before any thread starts */
/* In the daemon child, before any thread starts: the default becomes
 * syslog, and fd 2 leaves the terminal (see log.c). */
void log_daemonized (void);

void log_msg (enum log_level level, const char *fmt, ...)
  __attribute__((format (printf, 2, 3)));
void log_vmsg (enum log_level level, const char *prefix, const char *fmt, va_list ap)
  __attribute__((format (printf, 3, 0)));

#define log_error(...) log_msg (LOG_LVL_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg (LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...)  log_msg (LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) do { if (log_verbose) log_msg (LOG_LVL_DEBUG, __VA_ARGS__); } while (0)

#endif
