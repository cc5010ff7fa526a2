/* Listeners: TCP (IPv4/IPv6), Unix sockets, AF_VSOCK, systemd socket
 * activation and -s's one client on stdin/stdout; accepts on the main
 * loop and hands each connection to a shard. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/vm_sockets.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
static int single_fd = -1;              /* -s: our dup of stdin until handed over */
static bool accept_held;                /* a live restart is quiescing */

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
  struct addrinfo hints = { .ai_family = cfg.ip_family ? cfg.ip_family : AF_UNSPEC,
                            .ai_socktype = SOCK_STREAM,
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

static int
setup_vsock (const char *port)
{
  /* -p 0 asks for any port, as it does for TCP. */
  unsigned p;
  if (nbdkit_parse_unsigned ("--vsock -p", port, &p) == -1)
    return -1;
  struct sockaddr_vm sa = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY,
                            .svm_port = p ? p : VMADDR_PORT_ANY };
  int fd = socket (AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1) {
    fprintf (stderr, "blkd: --vsock: socket: %m (is the vsock module loaded?)\n");
    return -1;
  }
  if (bind (fd, (struct sockaddr *) &sa, sizeof sa) == -1 || listen (fd, SOMAXCONN) == -1) {
    fprintf (stderr, "blkd: --vsock: cannot listen on port %s: %m\n", port);
    close (fd);
    return -1;
  }
  return add_fd (fd);
}

static void
vsock_bound_port (int fd)
{
  struct sockaddr_vm sa;
  socklen_t sl = sizeof sa;
  if (getsockname (fd, (struct sockaddr *) &sa, &sl) == 0)
    snprintf (bound_port, sizeof bound_port, "%u", sa.svm_port);
}

/* -s: fd 0 and fd 1 must be one socket (libnbd's connect_command, inetd's
 * nowait, systemd's Accept=yes all give that).  A pair of pipes is
 * refused: the connection code speaks to one socket with recv/sendmsg. */
static int
setup_single (void)
{
  struct stat in, out;
  if (fstat (STDIN_FILENO, &in) == -1 || fstat (STDOUT_FILENO, &out) == -1) {
    fprintf (stderr, "blkd: -s: stdin/stdout: %m\n");
    return -1;
  }
  if (!S_ISSOCK (in.st_mode) || in.st_dev != out.st_dev || in.st_ino != out.st_ino) {
    fprintf (stderr, "blkd: -s: stdin and stdout must be the same socket "
             "(blkd does not serve over a pair of pipes)\n");
    errno = ENOTSOCK;
    return -1;
  }
  single_fd = fcntl (STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
  int null = open ("/dev/null", O_RDWR | O_CLOEXEC);
  if (single_fd == -1 || null == -1) {
    fprintf (stderr, "blkd: -s: %m\n");
    if (null >= 0)
      close (null);
    return -1;
  }
  /* Nothing printed to stdout may land in the NBD stream. */
  dup2 (null, STDIN_FILENO);
  dup2 (null, STDOUT_FILENO);
  close (null);
  return 0;
}

/* --selinux-label: sockets created from now on get LABEL (NULL: back to
 * the default).  libselinux is opened at run time so blkd needs neither
 * its headers to build nor the library where the option is not used. */
static int
selinux_socket_label (const char *label)
{
  static int (*set_label) (const char *);
  if (!set_label) {
    void *lib = dlopen ("libselinux.so.1", RTLD_NOW);
    if (!lib) {
      fprintf (stderr, "blkd: --selinux-label: libselinux is not available (%s); "
               "cannot label sockets\n", dlerror ());
      return -1;
    }
    set_label = (int (*) (const char *)) dlsym (lib, "setsockcreatecon_raw");
    if (!set_label) {
      fprintf (stderr, "blkd: --selinux-label: libselinux has no setsockcreatecon_raw\n");
      return -1;
    }
  }
  if (set_label (label) == -1) {
    fprintf (stderr, "blkd: --selinux-label: setsockcreatecon_raw: %m "
             "(SELinux is not enabled on this host?)\n");
    return -1;
  }
  return 0;
}

static int listen_bind (listen_inherited_fn *inherited);

int
listen_setup (listen_inherited_fn *inherited)
{
  if (cfg.single)
    return setup_single ();
  if (cfg.selinux_label && selinux_socket_label (cfg.selinux_label) == -1)
    return -1;
  int r = listen_bind (inherited);
  if (cfg.selinux_label && selinux_socket_label (NULL) == -1)
    r = -1;
  return r;
}

/* Binds what the command line asks for and writes the URI --run and
 * --print-uri give: nbds:// when TLS is required, as nbdkit does. */
static int
listen_bind (listen_inherited_fn *inherited)
{
  /* A live restart's sockets, else systemd's; n > 0 skips binding. */
  int n = inherited ? inherited (add_fd, &created_unix_socket) : 0;
  if (n == 0)
    n = setup_socket_activation ();
  if (n < 0)
    return -1;
  const char *export = cfg.export_name ? cfg.export_name : "";
  if (n > 0 && cfg.socket_activated) {
    snprintf (uri, sizeof uri, "nbd://localhost/%s", export);
    return 0;
  }
  const char *s = cfg.tls == TLS_REQUIRE ? "s" : "";
  if (cfg.unix_path) {
    if (n == 0 && setup_unix (cfg.unix_path) == -1)
      return -1;
    snprintf (uri, sizeof uri, "nbd%s+unix:///%s?socket=%s", s, export, cfg.unix_path);
    return 0;
  }
  const char *port = cfg.port ? cfg.port : "10809";
  if (cfg.vsock) {
    if (n == 0 && setup_vsock (port) == -1)
      return -1;
    vsock_bound_port (listen_fds[0]);
    /* CID 1 is this host (VMADDR_CID_LOCAL); a guest uses our CID. */
    snprintf (uri, sizeof uri, "nbd%s+vsock://1:%s/%s", s, bound_port, export);
    return 0;
  }
  if (n == 0 && setup_tcp (cfg.ip, port) == -1)
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
  snprintf (uri, sizeof uri, "nbd%s://%s%s%s:%s/%s", s, v6 ? "[" : "", host,
            v6 ? "]" : "", bound_port, export);
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
  else if (ss->ss_family == AF_VSOCK) {
    const struct sockaddr_vm *vm = (const struct sockaddr_vm *) ss;
    snprintf (out, n, "vsock:%u:%u", vm->svm_cid, vm->svm_port);
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
  if (atomic_load (&server_stopping) || accept_held)
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
  if (single_fd >= 0) {
    /* The shard owns it now; when it goes, -s's server stops (shard.c). */
    shard_handoff (single_fd, "stdin");
    single_fd = -1;
    return 0;
  }
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

/* A live restart: connections wait in the kernel's backlog, for this
 * image if the restart is called off, else for the next. */
void
listen_hold (bool hold)
{
  accept_held = hold;
  if (retry_ev)
    evtimer_del (retry_ev);
  for (int i = 0; i < nlisten; i++)
    if (listen_evs[i]) {
      if (hold)
        event_del (listen_evs[i]);
      else
        event_add (listen_evs[i], NULL);
    }
}

const int *
listen_fds_get (int *n)
{
  *n = nlisten;
  return listen_fds;
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
  if (single_fd >= 0) {
    close (single_fd);
    single_fd = -1;
  }
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
