/* Listeners: TCP (IPv4/IPv6), Unix sockets and systemd socket activation;
 * accepts on the main loop and hands each connection to a shard. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "internal.h"

#define MAX_LISTENERS 16

static int listen_fds[MAX_LISTENERS];
static int nlisten;
static struct event *listen_evs[MAX_LISTENERS];
static struct event *retry_ev;          /* accept paused: EMFILE or model 0 */
static bool created_unix_socket;
static char bound_port[16];
static char uri[512];

const char *listen_port (void) { return bound_port; }
const char *listen_unix_path (void) { return cfg.unix_path; }
const char *listen_uri (void) { return uri; }

static int
add_fd (int fd)
{
  if (nlisten == MAX_LISTENERS) {
    close (fd);
    errno = EMFILE;
    return -1;
  }
  listen_fds[nlisten++] = fd;
  return 0;
}

/* LISTEN_PID/LISTEN_FDS from systemd (or systemd-socket-activate). */
static int
setup_socket_activation (void)
{
  const char *pid = getenv ("LISTEN_PID"), *fds = getenv ("LISTEN_FDS");
  if (!pid || !fds || atol (pid) != getpid ())
    return 0;
  int n = atoi (fds);
  if (n <= 0)
    return 0;
  for (int i = 0; i < n; i++) {
    int fd = 3 + i;
    if (add_fd (fd) == -1)
      return -1;
  }
  unsetenv ("LISTEN_PID");
  unsetenv ("LISTEN_FDS");
  unsetenv ("LISTEN_FDNAMES");
  cfg.socket_activated = true;
  return n;
}

static int
setup_unix (const char *path)
{
  struct sockaddr_un sa = { .sun_family = AF_UNIX };
  if (strlen (path) >= sizeof sa.sun_path) {
    fprintf (stderr, "blkd: Unix socket path too long: %s\n", path);
    return -1;
  }
  strcpy (sa.sun_path, path);
  int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1) {
    fprintf (stderr, "blkd: socket: %m\n");
    return -1;
  }
  unlink (path);                        /* a stale socket from a crash */
  if (bind (fd, (struct sockaddr *) &sa, sizeof sa) == -1 || listen (fd, SOMAXCONN) == -1) {
    fprintf (stderr, "blkd: cannot listen on %s: %m\n", path);
    close (fd);
    return -1;
  }
  created_unix_socket = true;
  return add_fd (fd);
}

static int
setup_tcp (const char *ip, const char *port)
{
  struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                            .ai_flags = AI_PASSIVE | AI_ADDRCONFIG };
  struct addrinfo *ai;
  int err = getaddrinfo (ip, port, &hints, &ai);
  if (err) {
    fprintf (stderr, "blkd: cannot resolve %s:%s: %s\n", ip ? ip : "*", port,
             gai_strerror (err));
    return -1;
  }
  int bound = 0, saved = 0;
  for (struct addrinfo *a = ai; a; a = a->ai_next) {
    int fd = socket (a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd == -1) {
      saved = errno;
      continue;
    }
    int one = 1;
    setsockopt (fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6)
      setsockopt (fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind (fd, a->ai_addr, a->ai_addrlen) == -1 || listen (fd, SOMAXCONN) == -1) {
      saved = errno;
      close (fd);
      continue;
    }
    if (add_fd (fd) == -1) {
      saved = errno;
      break;
    }
    bound++;
  }
  freeaddrinfo (ai);
  if (!bound) {
    errno = saved;
    fprintf (stderr, "blkd: cannot listen on %s:%s: %m\n", ip ? ip : "*", port);
    return -1;
  }
  return 0;
}

int
listen_setup (void)
{
  int n = setup_socket_activation ();
  if (n < 0)
    return -1;
  const char *export = cfg.export_name ? cfg.export_name : "";
  if (n > 0) {
    snprintf (uri, sizeof uri, "nbd://localhost/%s", export);
    return 0;
  }
  if (cfg.unix_path) {
    if (setup_unix (cfg.unix_path) == -1)
      return -1;
    snprintf (uri, sizeof uri, "nbd+unix:///%s?socket=%s", export, cfg.unix_path);
    return 0;
  }
  const char *port = cfg.port ? cfg.port : "10809";
  if (setup_tcp (cfg.ip, port) == -1)
    return -1;
  /* Port 0 means "any": report the one the kernel chose. */
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname (listen_fds[0], (struct sockaddr *) &ss, &sl) == 0) {
    int p = ss.ss_family == AF_INET6 ? ntohs (((struct sockaddr_in6 *) &ss)->sin6_port)
                                     : ntohs (((struct sockaddr_in *) &ss)->sin_port);
    snprintf (bound_port, sizeof bound_port, "%d", p);
  }
  const char *host = cfg.ip ? cfg.ip : "localhost";
  bool v6 = strchr (host, ':') != NULL;
  snprintf (uri, sizeof uri, "nbd://%s%s%s:%s/%s", v6 ? "[" : "", host, v6 ? "]" : "",
            bound_port, export);
  return 0;
}

static void
peer_string (const struct sockaddr_storage *ss, char *out, size_t n)
{
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *) ss;
    inet_ntop (AF_INET, &in->sin_addr, host, sizeof host);
    snprintf (out, n, "%s:%d", host, ntohs (in->sin_port));
  }
  else if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *) ss;
    inet_ntop (AF_INET6, &in6->sin6_addr, host, sizeof host);
    snprintf (out, n, "[%s]:%d", host, ntohs (in6->sin6_port));
  }
  else
    snprintf (out, n, "unix");
}

static void
pause_accepting (double seconds)
{
  for (int i = 0; i < nlisten; i++)
    event_del (listen_evs[i]);
  struct timeval tv = { .tv_sec = (time_t) seconds,
                        .tv_usec = (suseconds_t) ((seconds - (time_t) seconds) * 1e6) };
  evtimer_add (retry_ev, &tv);
}

static void
resume_accepting (evutil_socket_t fd, short what, void *arg)
{
  if (atomic_load (&server_stopping))
    return;
  for (int i = 0; i < nlisten; i++)
    event_add (listen_evs[i], NULL);
}

static void
on_accept (evutil_socket_t lfd, short what, void *arg)
{
  /* SERIALIZE_CONNECTIONS: one client at a time; the rest wait in the
   * kernel's backlog until the current one leaves. */
  bool one_at_a_time = backend_thread_model () == NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS;

  for (int i = 0; i < 64; i++) {
    if (one_at_a_time && shard_total_conns () > 0) {
      pause_accepting (0.02);
      return;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4 (lfd, (struct sockaddr *) &ss, &sl, SOCK_CLOEXEC);
    if (fd == -1) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR
          || errno == ECONNABORTED)
        return;
      if (errno == EMFILE || errno == ENFILE) {
        log_error ("accept: %m; pausing new connections for 100 ms");
        pause_accepting (0.1);
        return;
      }
      log_error ("accept: %m");
      return;
    }
    char peer[64];
    peer_string (&ss, peer, sizeof peer);
    if (cfg.max_connections && shard_total_conns () >= cfg.max_connections) {
      /* Closing at once tells the client more than a silent backlog. */
      log_warn ("peer %s: %u connections already (--max-connections); closing",
                peer, cfg.max_connections);
      close (fd);
      continue;
    }
    shard_handoff (fd, peer);
  }
}

int
listen_start (struct event_base *main_base)
{
  retry_ev = evtimer_new (main_base, resume_accepting, NULL);
  if (!retry_ev)
    return -1;
  for (int i = 0; i < nlisten; i++) {
    evutil_make_socket_nonblocking (listen_fds[i]);
    listen_evs[i] = event_new (main_base, listen_fds[i], EV_READ | EV_PERSIST, on_accept, NULL);
    if (!listen_evs[i] || event_add (listen_evs[i], NULL) == -1)
      return -1;
  }
  return 0;
}

void
listen_stop (void)
{
  for (int i = 0; i < nlisten; i++) {
    if (listen_evs[i]) {
      event_free (listen_evs[i]);
      listen_evs[i] = NULL;
    }
    close (listen_fds[i]);
  }
  nlisten = 0;
  if (retry_ev) {
    event_free (retry_ev);
    retry_ev = NULL;
  }
}

void
listen_cleanup (void)
{
  if (created_unix_socket && cfg.unix_path)
    unlink (cfg.unix_path);
}
