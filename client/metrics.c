/* Remote measurements: a tiny HTTP/1.0 client for the server's /metrics and a Prometheus text parser. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "blkperf.h"
#include "vector.h"

#define BP_HTTP_MAX (8u << 20)       /* a /metrics page larger than this is not ours */
#define BP_HTTP_CONNECT_MS 2000
#define BP_HTTP_IO_MS 5000

static void
bp_seterr (char *err, size_t len, const char *fmt, ...)
{
  if (!err || !len)
    return;
  va_list ap;
  va_start (ap, fmt);
  vsnprintf (err, len, fmt, ap);
  va_end (ap);
}

/* Splits http://host[:port][/path]; host may be a [v6] literal.  A URL
 * without a path means /metrics, the only thing blkperf ever asks for. */
static int
bp_url_split (const char *url, char *host, size_t hlen, char *port, size_t plen,
              const char **path)
{
  if (strncasecmp (url, "http://", 7) != 0)
    return -1;
  const char *p = url + 7, *end = p + strcspn (p, "/?#");
  const char *hs = p, *he, *ps = NULL;
  if (*p == '[') {
    hs = p + 1;
    he = memchr (hs, ']', (size_t) (end - hs));
    if (!he)
      return -1;
    if (he + 1 < end && he[1] == ':')
      ps = he + 2;
  }
  else {
    he = memchr (p, ':', (size_t) (end - p));
    if (he)
      ps = he + 1;
    else
      he = end;
  }
  if (he == hs || (size_t) (he - hs) >= hlen)
    return -1;
  memcpy (host, hs, (size_t) (he - hs));
  host[he - hs] = '\0';
  if (ps && ps < end) {
    if ((size_t) (end - ps) >= plen)
      return -1;
    memcpy (port, ps, (size_t) (end - ps));
    port[end - ps] = '\0';
  }
  else
    snprintf (port, plen, "80");
  *path = *end == '/' ? end : "/metrics";
  return 0;
}

static int
bp_wait_fd (int fd, short events, int ms)
{
  struct pollfd pfd = { .fd = fd, .events = events };
  int r;
  do
    r = poll (&pfd, 1, ms);
  while (r == -1 && errno == EINTR);
  if (r == 0)
    errno = ETIMEDOUT;
  return r > 0 ? 0 : -1;
}

static int
bp_http_connect (const char *host, const char *port, char *err, size_t errlen)
{
  struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
  int r = getaddrinfo (host, port, &hints, &res);
  if (r != 0) {
    bp_seterr (err, errlen, "%s:%s: %s", host, port, gai_strerror (r));
    return -1;
  }
  int fd = -1, saved = 0;
  for (ai = res; ai; ai = ai->ai_next) {
    fd = socket (ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                 ai->ai_protocol);
    if (fd == -1) {
      saved = errno;
      continue;
    }
    if (connect (fd, ai->ai_addr, ai->ai_addrlen) == 0)
      break;
    if (errno == EINPROGRESS && bp_wait_fd (fd, POLLOUT, BP_HTTP_CONNECT_MS) == 0) {
      int soerr = 0;
      socklen_t sl = sizeof soerr;
      if (getsockopt (fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
        break;
      errno = soerr ? soerr : errno;
    }
    saved = errno;
    close (fd);
    fd = -1;
  }
  freeaddrinfo (res);
  if (fd == -1)
    bp_seterr (err, errlen, "connect %s:%s: %s", host, port, strerror (saved));
  return fd;
}

/* Decodes a chunked body in place.  HTTP/1.0 replies should not be chunked,
 * but a server that ignores the request version should not break us. */
static size_t
bp_dechunk (char *body, size_t len)
{
  size_t in = 0, out = 0;
  while (in < len) {
    char *eol = memchr (body + in, '\n', len - in);
    if (!eol)
      break;
    unsigned long n = strtoul (body + in, NULL, 16);
    in = (size_t) (eol - body) + 1;
    if (n == 0 || n > len - in)
      break;
    memmove (body + out, body + in, n);
    out += n;
    in += n;
    while (in < len && (body[in] == '\r' || body[in] == '\n'))
      in++;
  }
  return out;
}

/* GETs url; returns a malloc'd body (NUL-terminated) or NULL. */
static char *
bp_http_get (const char *url, size_t *blen, char *err, size_t errlen)
{
  char host[256], port[16], req[1024];
  const char *path;
  if (bp_url_split (url, host, sizeof host, port, sizeof port, &path) == -1) {
    bp_seterr (err, errlen, "not an http://host[:port]/path URL: %s", url);
    return NULL;
  }
  int fd = bp_http_connect (host, port, err, errlen);
  if (fd == -1)
    return NULL;
  int n = snprintf (req, sizeof req,
                    "GET %s HTTP/1.0\r\nHost: %s:%s\r\nAccept: text/plain\r\n"
                    "User-Agent: blkperf\r\nConnection: close\r\n\r\n",
                    path, host, port);
  if (n < 0 || (size_t) n >= sizeof req) {
    bp_seterr (err, errlen, "URL too long");
    close (fd);
    return NULL;
  }
  for (size_t off = 0; off < (size_t) n;) {
    ssize_t w = send (fd, req + off, (size_t) n - off, MSG_NOSIGNAL);
    if (w > 0) { off += (size_t) w; continue; }
    if (w == -1 && (errno == EAGAIN || errno == EINTR)
        && bp_wait_fd (fd, POLLOUT, BP_HTTP_IO_MS) == 0)
      continue;
    bp_seterr (err, errlen, "send to %s: %s", url, strerror (errno));
    close (fd);
    return NULL;
  }
  /* cap counts the byte kept for the terminating NUL. */
  size_t cap = 0, len = 0;
  char *buf = NULL;
  for (;;) {
    if (len + 1 >= cap) {
      if (len >= BP_HTTP_MAX) {
        bp_seterr (err, errlen, "reply from %s larger than %u bytes", url, BP_HTTP_MAX);
        goto fail;
      }
      char *nb = vec_grow (buf, &cap, len + 2, 1, 65536 + 1);
      if (!nb) {
        bp_seterr (err, errlen, "out of memory");
        goto fail;
      }
      buf = nb;
    }
    ssize_t r = recv (fd, buf + len, cap - 1 - len, 0);
    if (r > 0) { len += (size_t) r; continue; }
    if (r == 0)
      break;
    if ((errno == EAGAIN || errno == EINTR) && bp_wait_fd (fd, POLLIN, BP_HTTP_IO_MS) == 0)
      continue;
    bp_seterr (err, errlen, "read from %s: %s", url, strerror (errno));
    goto fail;
  }
  close (fd);
  fd = -1;
  buf[len] = '\0';

  int status = 0;
  if (sscanf (buf, "HTTP/%*d.%*d %d", &status) != 1) {
    bp_seterr (err, errlen, "%s: not an HTTP reply", url);
    goto fail;
  }
  if (status != 200) {
    char *eol = strpbrk (buf, "\r\n");
    bp_seterr (err, errlen, "%s: %.*s", url, eol ? (int) (eol - buf) : 60, buf);
    goto fail;
  }
  char *body = strstr (buf, "\r\n\r\n");
  size_t skip = 4;
  if (!body) { body = strstr (buf, "\n\n"); skip = 2; }
  if (!body) {
    bp_seterr (err, errlen, "%s: reply has no body", url);
    goto fail;
  }
  *body = '\0';                   /* headers end here, for the search below */
  bool chunked = strcasestr (buf, "transfer-encoding: chunked") != NULL;
  body += skip;
  size_t bl = len - (size_t) (body - buf);
  memmove (buf, body, bl);
  if (chunked)
    bl = bp_dechunk (buf, bl);
  buf[bl] = '\0';
  *blen = bl;
  return buf;

 fail:
  if (fd != -1)
    close (fd);
  free (buf);
  return NULL;
}

/* Adds v to *acc, where NAN means "not seen yet". */
static void
bp_add (double *acc, double v)
{
  if (isnan (v))
    return;
  *acc = isnan (*acc) ? v : *acc + v;
}

/* Finds label `name` in a "{a="x",b="y"}" block; copies its value. */
static bool
bp_label (const char *lb, size_t lblen, const char *name, char *out, size_t outlen)
{
  size_t nl = strlen (name), i = 0;
  while (i < lblen) {
    while (i < lblen && (lb[i] == ' ' || lb[i] == ',' || lb[i] == '{')) i++;
    size_t ks = i;
    while (i < lblen && lb[i] != '=' && lb[i] != '}') i++;
    if (i >= lblen || lb[i] != '=')
      return false;
    bool match = i - ks == nl && memcmp (lb + ks, name, nl) == 0;
    i++;
    if (i >= lblen || lb[i] != '"')
      return false;
    i++;
    size_t o = 0;
    while (i < lblen && lb[i] != '"') {
      if (lb[i] == '\\' && i + 1 < lblen) i++;
      if (match && o + 1 < outlen) out[o++] = lb[i];
      i++;
    }
    i++;
    if (match) {
      out[o] = '\0';
      return true;
    }
  }
  return false;
}

/* Prometheus text exposition: `name{labels} value [timestamp]` lines,
 * `#` comments.  Only the series blkperf reads are kept, each summed over
 * its label sets (blkd labels its delay sums by command). */
static void
bp_metrics_parse (const char *text, size_t len, struct bp_metrics *m)
{
  m->proc_cpu_s = m->blkd_user_s = m->blkd_sys_s = NAN;
  m->node_user_s = m->node_sys_s = m->node_idle_s = m->node_total_s = NAN;
  m->delay_queued_s = m->delay_plugin_s = m->delay_send_s = NAN;
  m->requests = NAN;
  m->delay_mode[0] = '\0';

  const char *p = text, *end = text + len;
  while (p < end) {
    const char *eol = memchr (p, '\n', (size_t) (end - p));
    if (!eol) eol = end;
    const char *s = p;
    p = eol + 1;
    while (s < eol && (*s == ' ' || *s == '\t')) s++;
    if (s == eol || *s == '#')
      continue;
    const char *ns = s;
    while (s < eol && *s != '{' && *s != ' ' && *s != '\t') s++;
    size_t nlen = (size_t) (s - ns);
    const char *lb = NULL;
    size_t lblen = 0;
    if (s < eol && *s == '{') {
      lb = s;
      bool inq = false;
      while (s < eol && (inq || *s != '}')) {
        if (*s == '\\' && inq) s++;
        else if (*s == '"') inq = !inq;
        s++;
      }
      if (s >= eol)
        continue;                 /* malformed: unterminated labels */
      s++;
      lblen = (size_t) (s - lb);
    }
    char num[64];
    while (s < eol && (*s == ' ' || *s == '\t')) s++;
    size_t vl = strcspn (s, " \t\r\n");
    if (vl == 0 || vl >= sizeof num || s + vl > eol)
      continue;
    memcpy (num, s, vl);
    num[vl] = '\0';
    char *ep;
    double v = strtod (num, &ep);
    if (*ep != '\0')
      continue;

#define BP_IS(lit) (nlen == sizeof (lit) - 1 && memcmp (ns, lit, nlen) == 0)
    if (BP_IS ("process_cpu_seconds_total"))
      bp_add (&m->proc_cpu_s, v);
    else if (BP_IS ("blkd_process_cpu_user_seconds_total"))
      bp_add (&m->blkd_user_s, v);
    else if (BP_IS ("blkd_process_cpu_system_seconds_total"))
      bp_add (&m->blkd_sys_s, v);
    else if (BP_IS ("blkd_delay_queued_seconds_total"))
      bp_add (&m->delay_queued_s, v);
    else if (BP_IS ("blkd_delay_plugin_seconds_total"))
      bp_add (&m->delay_plugin_s, v);
    else if (BP_IS ("blkd_delay_send_seconds_total"))
      bp_add (&m->delay_send_s, v);
    else if (BP_IS ("blkd_requests_total"))
      bp_add (&m->requests, v);
    else if (BP_IS ("blkd_delayacct_info") && lb && v == 1)
      bp_label (lb, lblen, "mode", m->delay_mode, sizeof m->delay_mode);
    else if (BP_IS ("node_cpu_seconds_total") && lb) {
      /* node_exporter's machine-wide split, one series per CPU and mode. */
      char mode[32];
      if (!bp_label (lb, lblen, "mode", mode, sizeof mode))
        continue;
      bp_add (&m->node_total_s, v);
      if (!strcmp (mode, "user") || !strcmp (mode, "nice"))
        bp_add (&m->node_user_s, v);
      else if (!strcmp (mode, "system") || !strcmp (mode, "irq")
               || !strcmp (mode, "softirq"))
        bp_add (&m->node_sys_s, v);
      else if (!strcmp (mode, "idle") || !strcmp (mode, "iowait"))
        bp_add (&m->node_idle_s, v);
    }
#undef BP_IS
  }
}

void
bp_metrics_fetch (const char *url, struct bp_metrics *m, char *err, size_t errlen)
{
  memset (m, 0, sizeof *m);
  size_t len = 0;
  char *body = bp_http_get (url, &len, err, errlen);
  m->mono_ns = now_ns ();
  if (!body) {
    bp_metrics_parse ("", 0, m);
    return;
  }
  bp_metrics_parse (body, len, m);
  free (body);
  m->ok = true;
}

/* Deltas of counters between two scrapes.  A counter that went backwards
 * means the server restarted in between: that window is skipped. */
bool
bp_remote_accumulate (struct bp_remote_acc *acc, const struct bp_metrics *a,
                      const struct bp_metrics *b)
{
  if (!a->ok || !b->ok)
    return false;
  acc->windows++;
  acc->wall_s += (double) (b->mono_ns - a->mono_ns) / 1e9;
#define BP_D(f) (b->f - a->f)
#define BP_OK(f) (!isnan (a->f) && !isnan (b->f) && b->f >= a->f)
  if (BP_OK (blkd_user_s) && BP_OK (blkd_sys_s)) {
    acc->user_s += BP_D (blkd_user_s);
    acc->sys_s += BP_D (blkd_sys_s);
    acc->split_n++;
    acc->cpu_s += BP_D (blkd_user_s) + BP_D (blkd_sys_s);
    acc->cpu_n++;
    acc->cpu_source = "blkd_process_cpu_{user,system}_seconds_total";
  }
  else if (BP_OK (proc_cpu_s)) {
    acc->cpu_s += BP_D (proc_cpu_s);
    acc->cpu_n++;
    if (!acc->cpu_source)
      acc->cpu_source = "process_cpu_seconds_total";
  }
  if (BP_OK (node_total_s) && BP_OK (node_user_s) && BP_OK (node_sys_s)
      && BP_OK (node_idle_s)) {
    acc->node_user_s += BP_D (node_user_s);
    acc->node_sys_s += BP_D (node_sys_s);
    acc->node_idle_s += BP_D (node_idle_s);
    acc->node_total_s += BP_D (node_total_s);
    acc->node_n++;
  }
  /* blkd exports a delay sum only once it is non-zero, so a sum missing
   * from the first scrape but present in the second started at zero. */
#define BP_OKZ(f) (!isnan (b->f) && (isnan (a->f) || b->f >= a->f))
#define BP_DZ(f) (b->f - (isnan (a->f) ? 0 : a->f))
  if (BP_OKZ (delay_queued_s) || BP_OKZ (delay_plugin_s) || BP_OKZ (delay_send_s)) {
    /* Each sum stands alone; one missing from any window turns NAN and
     * stays NAN, so the report says n/a rather than a partial sum. */
    acc->queued_s += BP_OKZ (delay_queued_s) ? BP_DZ (delay_queued_s) : NAN;
    acc->plugin_s += BP_OKZ (delay_plugin_s) ? BP_DZ (delay_plugin_s) : NAN;
    acc->send_s += BP_OKZ (delay_send_s) ? BP_DZ (delay_send_s) : NAN;
    acc->delay_n++;
    /* The server's own request count is the right divisor for its sums:
     * it covers exactly the requests the sums do, ours only nearly. */
    if (BP_OKZ (requests)) {
      acc->srv_requests += BP_DZ (requests);
      acc->srv_req_n++;
    }
  }
#undef BP_OKZ
#undef BP_DZ
  if (b->delay_mode[0])
    snprintf (acc->delay_mode, sizeof acc->delay_mode, "%s", b->delay_mode);
#undef BP_D
#undef BP_OK
  return true;
}
