/* blkd's entry point: command line, start-up order, signals, --run, and the
 * orderly shutdown that drains every connection. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "internal.h"
#include "affinity.h"
#include "delayacct.h"
#include "metrics.h"


static struct event_base *main_base;
static int stop_fd = -1;              /* eventfd: stop from any thread/signal */
static pid_t run_pid;
static int run_status;
static char *run_tmpdir;

/* Async-signal-safe and thread-safe: a flag and an eventfd write. */
void
server_request_stop (void)
{
  atomic_store (&server_stopping, true);
  if (stop_fd >= 0) {
    uint64_t one = 1;
    if (write (stop_fd, &one, sizeof one) < 0) {
      /* Nothing to do: the counter is already non-zero. */
    }
  }
}

static void
on_signal (int sig)
{
  public_begin_shutdown ();
  server_request_stop ();
}

/* SIGHUP, on the main loop (not in the handler: reading files and
 * building an OpenSSL context are not async-signal-safe). */
static void
on_sighup (evutil_socket_t fd, short what, void *arg)
{
  if (cfg.tls == TLS_OFF)
    log_info ("SIGHUP: TLS is off, no credentials to reload");
  else
    tls_reload ();
}

/* SIGUSR2: live restart (restart.c), on the main loop. */
static void
on_sigusr2 (evutil_socket_t fd, short what, void *arg)
{
  if (cfg.run_cmd || cfg.single || run_tmpdir)
    log_warn ("SIGUSR2: no live restart with --run, -s or -U -: nothing would take "
              "the connections over");
  else
    restart_begin (main_base, false);
}

/* SIGTERM under systemd with --fdstore: the connections go to the unit's
 * file descriptor store instead of closing (restart.c); systemd closes
 * them if the unit stops for good.  Where that cannot be, a plain stop. */
static void
on_sigterm_store (evutil_socket_t fd, short what, void *arg)
{
  if (cfg.run_cmd || cfg.single || run_tmpdir || restart_begin (main_base, true) == -1)
    on_signal (SIGTERM);
}

static void
on_stop (evutil_socket_t fd, short what, void *arg)
{
  event_base_loopbreak (main_base);
}

static void
on_sigchld (evutil_socket_t fd, short what, void *arg)
{
  int status;
  if (run_pid > 0 && waitpid (run_pid, &status, WNOHANG) == run_pid) {
    run_status = WIFEXITED (status) ? WEXITSTATUS (status)
                                    : 128 + (WIFSIGNALED (status) ? WTERMSIG (status) : 0);
    run_pid = 0;
    server_request_stop ();
  }
}

static void
usage (FILE *f)
{
  fprintf (f,
"Usage: blkd [OPTIONS] [PLUGIN [key=value ...]] [OPTIONS]\n"
"Serve a block device over NBD from an nbdkit-API plugin.\n"
"With no PLUGIN, serves the in-tree 'ram' plugin with size=1G.\n"
"Options may follow the plugin's arguments, as with nbdkit; '--' ends them.\n"
"\n"
"Where to listen (nbdkit's options):\n"
"  -i, --ipaddr ADDR      listen on ADDR only (default: all addresses)\n"
"                         (also --ip-addr)\n"
"  -p, --port PORT        TCP port (default 10809; 0 picks a free one)\n"
"  -4, --ipv4-only        without -i, listen on 0.0.0.0 only; with a name,\n"
"  -6, --ipv6-only        resolve it to IPv4 (-4) or IPv6 (-6) only; last wins\n"
"  -U, --unix PATH        listen on a Unix socket instead of TCP\n"
"                         (systemd socket activation is used when LISTEN_FDS is set)\n"
"  -U -                   a private socket in a private directory, both removed\n"
"                         at exit (for --run)\n"
"      --vsock            listen on AF_VSOCK (port from -p, default 10809)\n"
"  -s, --single, --stdin  serve one client on stdin/stdout (one socket), no\n"
"                         listener; exit when it leaves (implies -f)\n"
"      --selinux-label=LABEL  SELinux label for the listening sockets\n"
"  -e, --exportname NAME  export name shown by LIST and used in --run's $uri\n"
"                         (also --export-name, --export)\n"
"  -r, --readonly         refuse writes (the plugin is opened read-only)\n"
"                         (also --read-only)\n"
"      --mask-handshake=MASK  clear global handshake flags not in MASK\n"
"                         (bit 0 FIXED_NEWSTYLE, bit 1 NO_ZEROES; default 3)\n"
"      --no-sr            do not offer structured replies (nor extended headers)\n"
"      --ext-headers=on|off|require  extended headers (64-bit lengths): offer\n"
"                         them (default), refuse them, or serve only clients\n"
"                         that negotiate them\n"
"\n"
"Process:\n"
"  -f, --foreground       do not fork into the background (also --no-fork)\n"
"  -P, --pidfile FILE     write the server's PID to FILE\n"
"  -u, --user USER        change to USER (name or uid) once the sockets are\n"
"  -g, --group GROUP      bound, before any client; GROUP likewise\n"
"      --exit-with-parent exit (cleanly) when the parent process exits (implies -f)\n"
"  -v, --verbose          debug messages (and nbdkit_debug from plugins)\n"
"      --log DEST         stderr, syslog or null (default: stderr in the\n"
"                         foreground, syslog once forked into the background)\n"
"  -D, --debug NAME.FLAG=N  set the plugin's (or a filter's) NAME_debug_FLAG\n"
"                         variable to N (nbdkit.* flags are accepted and have\n"
"                         no effect)\n"
"      --run CMD          run CMD with $uri, $nbd, $port, $unixsocket,\n"
"                         $exportname and $tls set, then stop the server and\n"
"                         exit with CMD's status (implies -f)\n"
"      --print-uri        print the URI clients connect to on stdout\n"
"      --filter NAME      stack an nbdkit filter over the plugin (repeatable; the\n"
"                         first named is outermost), by name or path\n"
"      --dump-plugin      print what the plugin and filters provide and exit\n"
"  -h, --help             this text; with a PLUGIN, its parameters too\n"
"  -V, --version          print the version and exit\n"
"\n"
"Engine:\n"
"      --shards N         event-loop threads, one per core (default: the CPUs it may run on,\n"
"                         as many as --iobuf-mem holds)\n"
"      --poll-us N        while requests come closer together than N us, look\n"
"                         for the next one that long before sleeping in epoll\n"
"                         (default 50; 0: always sleep at once)\n"
"  -t, --threads N        plugin worker threads per shard (default 16)\n"
"      --max-request SIZE largest READ/WRITE accepted and advertised (default 32M)\n"
"      --max-inflight N   requests in flight per connection before reading\n"
"                         pauses (default 512)\n"
"      --reply-batch N    send a clear-text connection's replies once N wait,\n"
"                         not only when its batch of requests is parsed\n"
"                         (default 8; 0: only at the end of the batch)\n"
"      --tcp-congestion NAME\n"
"                         TCP congestion control of client connections\n"
"                         (e.g. reno; default: the system's)\n"
"      --dispatch MODE    auto (default): call in-memory plugins on the shard\n"
"                         thread, others on workers; inline; worker.  The\n"
"                         handshake's .open and .list_exports go the same way\n"
"      --iobuf MODE       pool (default): recycle buffers without memset;\n"
"                         calloc: zero every buffer and request on allocation\n"
"      --iobuf-mem SIZE   bound on request buffer memory, all shards (default 1G)\n"
"      --queue MODE       split (default): a queue and lock per shard;\n"
"                         global: one global queue, lock and worker pool\n"
"      --sparse-reads B   send holes in structured reads as OFFSET_HOLE chunks:\n"
"                         yes, no, or auto (default: for in-memory plugins,\n"
"                         whose extents are cheap; a file's SEEK_HOLE is not)\n"
"\n"
"Limits:\n"
"      --max-connections N  close connections beyond N at once (default: no limit)\n"
"      --handshake-timeout S  drop clients still negotiating after S seconds\n"
"                         (default 10; 0: never)\n"
"      --idle-timeout S   drop clients with nothing in flight for S seconds\n"
"                         (default 0: never)\n"
"      --restart-timeout S  live restart (SIGUSR2): how long a connection's\n"
"                         half-received request may take to arrive before the\n"
"                         connection is closed instead of handed over (default 10)\n"
"      --fdstore          under systemd (a unit with FileDescriptorStoreMax=):\n"
"                         SIGTERM hands every clear-text connection to the\n"
"                         unit's file descriptor store, so that `systemctl\n"
"                         restart` keeps it open; the next start serves it\n"
"\n"
"TLS (nbdkit's options):\n"
"      --tls MODE         off (default), on (clients may use TLS), require\n"
"      --tls-certificates DIR  ca-cert.pem, server-cert.pem, server-key.pem\n"
"      --tls-verify-peer  client certificates must chain to the CA\n"
"      --tls-psk FILE     pre-shared keys, psktool's username:hexkey format\n"
"      --tls-seal WHO     ignored (older command lines): OpenSSL seals every record\n"
"      --tls-suites LIST  TLS 1.3 suites in order of preference (OpenSSL's\n"
"                         names joined by ':'; default AES-128-GCM first)\n"
"\n"
"Observability:\n"
"      --metrics ADDR:PORT  serve /metrics (Prometheus), /stats (JSON), /healthz\n"
"      --delayacct MODE   compact (default: lock-free per-shard counters),\n"
"                         locked (a mutex and timestamps per counter), off\n"
"\n"
"Block cache:\n"
"      --cache SIZE       cache between the filters and the plugin, SIZE bytes in\n"
"                         all (default 0: off); shared per export only where\n"
"                         the plugin is multi-conn, else one per connection\n"
"      --cache-block SIZE cache block size (default 64K)\n"
"      --cache-mode MODE  writethrough (default) or writeback\n"
"      --cache-ctor B     keep freed entries constructed for reuse (default no:\n"
"                         initialise each entry when it is allocated)\n");
}

/* Sizes on our command line use the same parser plugins use. */
static uint64_t
parse_size_opt (const char *opt, const char *arg, uint64_t min, uint64_t max)
{
  int64_t v = nbdkit_parse_size (arg);
  if (v < 0 || (uint64_t) v < min || (uint64_t) v > max) {
    fprintf (stderr, "blkd: %s: '%s' is not a size between %llu and %llu\n", opt, arg,
             (unsigned long long) min, (unsigned long long) max);
    exit (EXIT_FAILURE);
  }
  return v;
}

static int
parse_int_opt (const char *opt, const char *arg, int min, int max)
{
  int v;
  if (nbdkit_parse_int (opt, arg, &v) == -1 || v < min || v > max) {
    fprintf (stderr, "blkd: %s: '%s' is not a number between %d and %d\n", opt, arg, min, max);
    exit (EXIT_FAILURE);
  }
  return v;
}

static bool
parse_bool_opt (const char *arg)
{
  int b = nbdkit_parse_bool (arg);
  if (b == -1)
    exit (EXIT_FAILURE);
  return b;
}

/* --tcp-congestion: refused at start unless a TCP socket takes it (a
 * name the kernel lacks, or one an unprivileged process may not use), so
 * a typo never leaves every connection on the default unannounced.
 * Asked while parsing (a typo fails before anything is bound) and again
 * once -u/-g took effect: the kernel checks the caller's rights on each
 * connection's setsockopt, and root may pick what USER may not.  as: how
 * the message names the rights.  -1 after printing why. */
static int
check_tcp_congestion (const char *name, const char *as)
{
  int fd = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    fd = socket (AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1) {
    fprintf (stderr, "blkd: --tcp-congestion: socket: %m\n");
    return -1;
  }
  if (setsockopt (fd, IPPROTO_TCP, TCP_CONGESTION, name, strlen (name)) == -1) {
    fprintf (stderr, "blkd: --tcp-congestion: '%s'%s: %m (available: "
             "/proc/sys/net/ipv4/tcp_available_congestion_control; without "
             "CAP_NET_ADMIN only tcp_allowed_congestion_control)\n", name, as);
    goto err;
  }
  close (fd);
  return 0;

err:;
  int e = errno;
  close (fd);
  errno = e;
  return -1;
}

static int
parse_choice (const char *opt, const char *arg, const char *const *choices)
{
  for (int i = 0; choices[i]; i++)
    if (strcmp (arg, choices[i]) == 0)
      return i;
  fprintf (stderr, "blkd: %s: unknown value '%s'\n", opt, arg);
  exit (EXIT_FAILURE);
}

enum {
  OPT_RUN = 256, OPT_DUMP_PLUGIN, OPT_SHARDS, OPT_POLL_US, OPT_MAX_REQUEST, OPT_MAX_INFLIGHT, OPT_REPLY_BATCH,
  OPT_TCP_CONGESTION,
  OPT_DISPATCH, OPT_IOBUF, OPT_IOBUF_MEM, OPT_QUEUE, OPT_SPARSE_READS,
  OPT_MAX_CONNECTIONS, OPT_HANDSHAKE_TIMEOUT, OPT_IDLE_TIMEOUT, OPT_RESTART_TIMEOUT, OPT_TLS,
  OPT_TLS_CERTIFICATES, OPT_TLS_VERIFY_PEER, OPT_TLS_PSK, OPT_TLS_SEAL, OPT_TLS_SUITES, OPT_METRICS, OPT_DELAYACCT,
  OPT_CACHE, OPT_CACHE_BLOCK, OPT_CACHE_MODE, OPT_CACHE_CTOR,
  OPT_EXIT_WITH_PARENT, OPT_MASK_HANDSHAKE, OPT_NO_SR, OPT_EXT_HEADERS, OPT_PRINT_URI, OPT_SELINUX_LABEL,
  OPT_VSOCK, OPT_LOG, OPT_FILTER, OPT_FDSTORE,
};

static const struct option long_opts[] = {
  { "ipaddr", required_argument, NULL, 'i' },
  { "ip-addr", required_argument, NULL, 'i' },
  { "ipv4-only", no_argument, NULL, '4' },
  { "ipv6-only", no_argument, NULL, '6' },
  { "debug", required_argument, NULL, 'D' },
  { "exit-with-parent", no_argument, NULL, OPT_EXIT_WITH_PARENT },
  { "group", required_argument, NULL, 'g' },
  { "user", required_argument, NULL, 'u' },
  { "single", no_argument, NULL, 's' },
  { "stdin", no_argument, NULL, 's' },
  { "mask-handshake", required_argument, NULL, OPT_MASK_HANDSHAKE },
  { "no-sr", no_argument, NULL, OPT_NO_SR },
  { "ext-headers", required_argument, NULL, OPT_EXT_HEADERS },
  { "print-uri", no_argument, NULL, OPT_PRINT_URI },
  { "selinux-label", required_argument, NULL, OPT_SELINUX_LABEL },
  { "vsock", no_argument, NULL, OPT_VSOCK },
  { "export", required_argument, NULL, 'e' },
  { "port", required_argument, NULL, 'p' },
  { "unix", required_argument, NULL, 'U' },
  { "exportname", required_argument, NULL, 'e' },
  { "export-name", required_argument, NULL, 'e' },
  { "readonly", no_argument, NULL, 'r' },
  { "read-only", no_argument, NULL, 'r' },
  { "foreground", no_argument, NULL, 'f' },
  { "no-fork", no_argument, NULL, 'f' },
  { "pidfile", required_argument, NULL, 'P' },
  { "verbose", no_argument, NULL, 'v' },
  { "threads", required_argument, NULL, 't' },
  { "help", no_argument, NULL, 'h' },
  { "version", no_argument, NULL, 'V' },
  { "run", required_argument, NULL, OPT_RUN },
  { "dump-plugin", no_argument, NULL, OPT_DUMP_PLUGIN },
  { "shards", required_argument, NULL, OPT_SHARDS },
  { "poll-us", required_argument, NULL, OPT_POLL_US },
  { "max-request", required_argument, NULL, OPT_MAX_REQUEST },
  { "max-inflight", required_argument, NULL, OPT_MAX_INFLIGHT },
  { "reply-batch", required_argument, NULL, OPT_REPLY_BATCH },
  { "tcp-congestion", required_argument, NULL, OPT_TCP_CONGESTION },
  { "dispatch", required_argument, NULL, OPT_DISPATCH },
  { "iobuf", required_argument, NULL, OPT_IOBUF },
  { "iobuf-mem", required_argument, NULL, OPT_IOBUF_MEM },
  { "queue", required_argument, NULL, OPT_QUEUE },
  { "sparse-reads", required_argument, NULL, OPT_SPARSE_READS },
  { "max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS },
  { "handshake-timeout", required_argument, NULL, OPT_HANDSHAKE_TIMEOUT },
  { "idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT },
  { "restart-timeout", required_argument, NULL, OPT_RESTART_TIMEOUT },
  { "fdstore", no_argument, NULL, OPT_FDSTORE },
  { "tls", required_argument, NULL, OPT_TLS },
  { "tls-certificates", required_argument, NULL, OPT_TLS_CERTIFICATES },
  { "tls-verify-peer", no_argument, NULL, OPT_TLS_VERIFY_PEER },
  { "tls-psk", required_argument, NULL, OPT_TLS_PSK },
  { "tls-seal", required_argument, NULL, OPT_TLS_SEAL },
  { "tls-suites", required_argument, NULL, OPT_TLS_SUITES },
  { "metrics", required_argument, NULL, OPT_METRICS },
  { "delayacct", required_argument, NULL, OPT_DELAYACCT },
  { "cache", required_argument, NULL, OPT_CACHE },
  { "cache-block", required_argument, NULL, OPT_CACHE_BLOCK },
  { "cache-mode", required_argument, NULL, OPT_CACHE_MODE },
  { "cache-ctor", required_argument, NULL, OPT_CACHE_CTOR },
  { "log", required_argument, NULL, OPT_LOG },
  { "filter", required_argument, NULL, OPT_FILTER },
  { NULL, 0, NULL, 0 },
};

static int
write_pidfile (void)
{
  if (!cfg.pidfile)
    return 0;
  FILE *f = fopen (cfg.pidfile, "w");
  if (!f || fprintf (f, "%d\n", getpid ()) < 0 || fclose (f) == EOF) {
    fprintf (stderr, "blkd: cannot write pidfile %s: %m\n", cfg.pidfile);
    return -1;
  }
  return 0;
}

/* Fork into the background like nbdkit: the parent exits once the
 * sockets are bound, so "blkd ... && client" works. */
static int daemon_ready_fd = -1;

static int
daemonize (void)
{
  /* The parent waits until the child is really serving (pidfile written,
   * plugin ready, listening), so a script can use the server at once. */
  int ready[2];
  if (pipe2 (ready, O_CLOEXEC) == -1) {
    fprintf (stderr, "blkd: pipe: %m\n");
    return -1;
  }
  pid_t pid = fork ();
  if (pid == -1) {
    fprintf (stderr, "blkd: fork: %m\n");
    return -1;
  }
  if (pid > 0) {
    char b;
    close (ready[1]);
    _exit (read (ready[0], &b, 1) == 1 ? EXIT_SUCCESS : EXIT_FAILURE);
  }
  close (ready[0]);
  daemon_ready_fd = ready[1];
  setsid ();
  int fd = open ("/dev/null", O_RDWR);
  if (fd >= 0) {
    dup2 (fd, STDIN_FILENO);
    dup2 (fd, STDOUT_FILENO);
    if (fd > STDERR_FILENO)
      close (fd);
  }
  log_daemonized ();
  return 0;
}

/* -U - (and --run with no address): a socket in a private directory
 * that only we can enter, both removed at exit, as nbdkit does. */
static int
make_private_socket (void)
{
  static char sock[64];
  char tmpl[] = "/tmp/blkdXXXXXX";
  if (!mkdtemp (tmpl)) {
    fprintf (stderr, "blkd: mkdtemp: %m\n");
    return -1;
  }
  run_tmpdir = strdup (tmpl);
  if (!run_tmpdir) {
    rmdir (tmpl);
    fprintf (stderr, "blkd: out of memory\n");
    return -1;
  }
  snprintf (sock, sizeof sock, "%s/socket", tmpl);
  cfg.unix_path = sock;
  return 0;
}

/* -u/-g take a name or a number, as nbdkit's do.  -1 + message. */
static int
resolve_id (const char *opt, const char *name, bool is_group, unsigned *id)
{
  struct group *gr = is_group ? getgrnam (name) : NULL;
  struct passwd *pw = is_group ? NULL : getpwnam (name);
  char *end;
  unsigned long n = strtoul (name, &end, 10);
  if (gr)
    *id = gr->gr_gid;
  else if (pw)
    *id = pw->pw_uid;
  else if (*name && !*end)
    *id = n;
  else {
    fprintf (stderr, "blkd: %s: unknown %s '%s'\n", opt, is_group ? "group" : "user", name);
    return -1;
  }
  return 0;
}

/* After the sockets are bound and before any client is served: the
 * plugin's load, config and get_ready ran as the starting user; its open
 * (where plugins such as file open their files) runs as USER, as under
 * nbdkit.  The private -U - directory and the socket are handed over
 * first so that the server can still remove them at exit. */
static int
drop_privileges (const char *user, unsigned uid, const char *group, unsigned gid)
{
  if (!user && !group)
    return 0;
  /* The socket too, so that USER can remove it at exit where the
   * directory lets it (a sticky /tmp does; nbdkit never removes it). */
  const char *paths[] = { run_tmpdir, cfg.socket_activated ? NULL : listen_unix_path () };
  for (int i = 0; i < 2; i++)
    if (paths[i] && chown (paths[i], uid, gid) == -1) {
      fprintf (stderr, "blkd: chown %s: %m\n", paths[i]);
      return -1;
    }
  if (group && (setgroups (1, &gid) == -1 || setgid (gid) == -1)) {
    fprintf (stderr, "blkd: -g %s: %m\n", group);
    return -1;
  }
  if (user && setuid (uid) == -1) {
    fprintf (stderr, "blkd: -u %s: %m\n", user);
    return -1;
  }
  log_debug ("running as uid %d gid %d", (int) getuid (), (int) getgid ());
  return 0;
}

/* --exit-with-parent: the kernel sends SIGTERM when the parent goes,
 * which stops us as cleanly as a kill would.  A parent that went before
 * prctl took effect is caught by comparing parent ids. */
static int
set_exit_with_parent (pid_t parent)
{
  if (prctl (PR_SET_PDEATHSIG, SIGTERM) == -1) {
    fprintf (stderr, "blkd: --exit-with-parent: prctl: %m\n");
    return -1;
  }
  if (getppid () != parent)
    on_signal (SIGTERM);
  return 0;
}

static int
start_run_command (void)
{
  run_pid = fork ();
  if (run_pid == -1) {
    fprintf (stderr, "blkd: fork: %m\n");
    return -1;
  }
  if (run_pid == 0) {
    setenv ("uri", listen_uri (), 1);
    setenv ("nbd", listen_uri (), 1);
    setenv ("port", listen_port (), 1);
    setenv ("unixsocket", listen_unix_path () ? listen_unix_path () : "", 1);
    setenv ("exportname", cfg.export_name ? cfg.export_name : "", 1);
    /* nbdkit's $tls: unset when off, 1 for on, 2 for require. */
    if (cfg.tls == TLS_OFF)
      unsetenv ("tls");
    else
      setenv ("tls", cfg.tls == TLS_ON ? "1" : "2", 1);
    execl ("/bin/sh", "sh", "-c", cfg.run_cmd, (char *) NULL);
    perror ("blkd: /bin/sh");
    _exit (127);
  }
  return 0;
}

enum { MAX_SHARDS = 1024 };             /* --shards' bound */

/* One event loop per CPU this process may run on: under taskset, systemd's
 * CPUAffinity= or a container's cpuset (Kubernetes' static CPU manager)
 * that is fewer than the machine's online CPUs, and a second loop on the
 * same CPU would only add wake-ups.  A CPU quota (cgroup cpu.max) is not
 * an affinity and is not read here: --shards says it. */
static int
default_shards (void)
{
  long n = affinity_cpu_count ();
  if (n < 1)
    n = sysconf (_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > MAX_SHARDS ? MAX_SHARDS : (int) n;
}

int
main (int argc, char **argv)
{
  bool dump = false, help = false, print_uri = false, exit_with_parent = false;
  bool shards_given = false;
  const char *user = NULL, *group = NULL;
  pid_t parent = getppid ();
  int c, exit_code = EXIT_SUCCESS;
  struct event *ev_stop = NULL, *ev_chld = NULL, *ev_hup = NULL, *ev_usr2 = NULL;
  struct event *ev_term = NULL;
  uint64_t iobuf_mem = 1024ull * 1024 * 1024;
  enum { MAX_FILTERS = 64 };
  const char *filters[MAX_FILTERS];
  int nfilters = 0;

  restart_save_argv (argc, argv);
  cfg.shards = default_shards ();
  /* GNU order, as nbdkit: options may follow the plugin and its arguments. */
  while ((c = getopt_long (argc, argv, "46D:e:fg:i:p:P:rst:u:U:vVh", long_opts, NULL)) != -1) {
    switch (c) {
    case '4': cfg.ip_family = AF_INET; break;
    case '6': cfg.ip_family = AF_INET6; break;
    case 'D':
      if (debug_flag_add (optarg) == -1)
        return EXIT_FAILURE;
      break;
    case 'g': group = optarg; break;
    case 'u': user = optarg; break;
    case 's': cfg.single = true; cfg.foreground = true; break;
    case OPT_EXIT_WITH_PARENT: exit_with_parent = true; cfg.foreground = true; break;
    case OPT_MASK_HANDSHAKE: {
      unsigned mask;
      if (nbdkit_parse_unsigned ("--mask-handshake", optarg, &mask) == -1)
        return EXIT_FAILURE;
      cfg.gflags_masked = (uint16_t) ~mask;
      break;
    }
    case OPT_NO_SR: cfg.no_sr = true; break;
    case OPT_EXT_HEADERS:
      cfg.ext_headers = strcmp (optarg, "require") == 0 ? EXT_HEADERS_REQUIRE
        : parse_bool_opt (optarg) ? EXT_HEADERS_ON : EXT_HEADERS_OFF;
      break;
    case OPT_PRINT_URI: print_uri = true; break;
    case OPT_SELINUX_LABEL: cfg.selinux_label = optarg; break;
    case OPT_VSOCK: cfg.vsock = true; break;
    case 'i': cfg.ip = optarg; break;
    case 'p': cfg.port = optarg; break;
    case 'U': cfg.unix_path = optarg; break;
    case 'e': cfg.export_name = optarg; break;
    case 'r': cfg.readonly = true; break;
    case 'f': cfg.foreground = true; break;
    case 'P': cfg.pidfile = optarg; break;
    case 'v': log_verbose = true; break;
    case 't': cfg.workers = parse_int_opt ("--threads", optarg, 1, 1024); break;
    case 'h': help = true; break;
    case 'V': printf ("blkd %s\n", BLKD_VERSION); return EXIT_SUCCESS;
    case OPT_RUN: cfg.run_cmd = optarg; cfg.foreground = true; break;
    case OPT_DUMP_PLUGIN: dump = true; break;
    case OPT_SHARDS:
      cfg.shards = parse_int_opt ("--shards", optarg, 1, MAX_SHARDS);
      shards_given = true;
      break;
    case OPT_POLL_US: cfg.poll_us = parse_int_opt ("--poll-us", optarg, 0, 1000000); break;
    case OPT_MAX_REQUEST:
      cfg.max_request = parse_size_opt ("--max-request", optarg, 512, 1u << 30);
      break;
    case OPT_MAX_INFLIGHT:
      cfg.max_inflight = parse_int_opt ("--max-inflight", optarg, 1, 65536);
      break;
    case OPT_REPLY_BATCH:
      cfg.reply_batch = parse_int_opt ("--reply-batch", optarg, 0, 65536);
      break;
    case OPT_TCP_CONGESTION:
      if (check_tcp_congestion (optarg, "") == -1)
        exit (EXIT_FAILURE);
      cfg.tcp_congestion = optarg;
      break;
    case OPT_DISPATCH:
      cfg.dispatch = parse_choice ("--dispatch", optarg,
                                   (const char *const[]) { "auto", "inline", "worker", NULL });
      break;
    case OPT_IOBUF:
      cfg.iobuf = parse_choice ("--iobuf", optarg,
                                (const char *const[]) { "pool", "calloc", NULL });
      break;
    case OPT_IOBUF_MEM:
      iobuf_mem = parse_size_opt ("--iobuf-mem", optarg, 1024 * 1024, UINT64_C(1) << 40);
      break;
    case OPT_QUEUE:
      cfg.queue = parse_choice ("--queue", optarg,
                                (const char *const[]) { "split", "global", NULL });
      break;
    case OPT_SPARSE_READS:
      cfg.sparse_reads = strcmp (optarg, "auto") == 0 ? SPARSE_READS_AUTO
        : parse_bool_opt (optarg) ? SPARSE_READS_YES : SPARSE_READS_NO;
      break;
    case OPT_MAX_CONNECTIONS:
      cfg.max_connections = parse_int_opt ("--max-connections", optarg, 0, 1000000);
      break;
    case OPT_HANDSHAKE_TIMEOUT:
      cfg.handshake_timeout = parse_int_opt ("--handshake-timeout", optarg, 0, 86400);
      break;
    case OPT_IDLE_TIMEOUT:
      cfg.idle_timeout = parse_int_opt ("--idle-timeout", optarg, 0, 86400 * 365);
      break;
    case OPT_RESTART_TIMEOUT:
      cfg.restart_timeout = parse_int_opt ("--restart-timeout", optarg, 1, 3600);
      break;
    case OPT_FDSTORE: cfg.fdstore = true; break;
    case OPT_TLS: {
      /* nbdkit also spells "on" yes/true and "off" no/false. */
      static const enum tls_mode modes[] = { TLS_OFF, TLS_ON, TLS_REQUIRE, TLS_OFF,
                                             TLS_ON, TLS_OFF, TLS_ON };
      cfg.tls = modes[parse_choice ("--tls", optarg, (const char *const[]) {
          "off", "on", "require", "no", "yes", "false", "true", NULL })];
      break;
    }
    case OPT_TLS_CERTIFICATES: cfg.tls_certificates = optarg; break;
    case OPT_TLS_VERIFY_PEER: cfg.tls_verify_peer = true; break;
    case OPT_TLS_PSK: cfg.tls_psk = optarg; break;
    case OPT_TLS_SEAL:
      /* OpenSSL seals every record; blkd's own TLS 1.3 sealer is gone.
       * An older command line still starts (the client sees the same
       * records either way): "openssl" quietly, "blkd" with a warning. */
      if (parse_choice ("--tls-seal", optarg,
                        (const char *const[]) { "openssl", "blkd", NULL }) == 1)
        fprintf (stderr, "blkd: warning: --tls-seal=blkd is no longer available: "
                 "OpenSSL seals every record (docs/TLS.md)\n");
      break;
    case OPT_TLS_SUITES: cfg.tls_suites = optarg; break;
    case OPT_METRICS: cfg.metrics_addr = optarg; break;
    case OPT_DELAYACCT:
      cfg.delayacct = parse_choice ("--delayacct", optarg,
                                    (const char *const[]) { "compact", "locked", "off", NULL });
      break;
    case OPT_CACHE:
      cfg.cache_size = parse_size_opt ("--cache", optarg, 0, UINT64_C(1) << 44);
      break;
    case OPT_CACHE_BLOCK:
      cfg.cache_block = parse_size_opt ("--cache-block", optarg, 4096, 16 * 1024 * 1024);
      if (cfg.cache_block & (cfg.cache_block - 1)) {
        fprintf (stderr, "blkd: --cache-block must be a power of two\n");
        return EXIT_FAILURE;
      }
      break;
    case OPT_CACHE_MODE:
      cfg.cache_mode = parse_choice ("--cache-mode", optarg, (const char *const[]) {
          "writethrough", "writeback", NULL });
      break;
    case OPT_CACHE_CTOR:
      cfg.cache_ctor = parse_bool_opt (optarg);
      break;
    case OPT_LOG:
      log_set_dest (parse_choice ("--log", optarg, (const char *const[]) {
          "stderr", "syslog", "null", NULL }));
      break;
    case OPT_FILTER:
      if (nfilters == MAX_FILTERS) {
        fprintf (stderr, "blkd: at most %d --filter options\n", MAX_FILTERS);
        return EXIT_FAILURE;
      }
      filters[nfilters++] = optarg;
      break;
    default:
      usage (stderr);
      return EXIT_FAILURE;
    }
  }

  /* No plugin named: the embedded default, a 1 GiB RAM disk. */
  static char default_size[] = "size=1G";  /* writable: split in place */
  static char *default_args[] = { default_size };
  const char *plugin = "ram";
  char **pargv = default_args;
  int pargc = 1;
  if (optind < argc) {
    plugin = argv[optind];
    pargv = argv + optind + 1;
    pargc = argc - optind - 1;
  }

  if (help) {
    usage (stdout);
    /* Filters (--filter=F) print their help here, before the plugin's,
     * once a filter host exists: nbdkit's order. */
    if (optind < argc) {
      printf ("\n");
      fflush (stdout);
      return plugin_help (plugin) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
    }
    return EXIT_SUCCESS;
  }
  if (dump)
    return backend_stack_dump (plugin, filters, nfilters) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
  /* --fdstore: a SIGTERM that comes while we start (a second `systemctl
   * restart` right after the first) waits, blocked, until the main loop
   * can hand the connections over (ev_term), instead of closing them.
   * Not with --run or -s, whose stop it is; their child must not inherit
   * the mask. */
  bool term_deferred = cfg.fdstore && sdnotify_available () && !cfg.run_cmd && !cfg.single;
  sigset_t term_set;
  sigemptyset (&term_set);
  sigaddset (&term_set, SIGTERM);
  if (term_deferred)
    pthread_sigmask (SIG_BLOCK, &term_set, NULL);
  /* Before anything opens a file: a live restart's state names our fds. */
  restart_init ();

  if (cfg.single && (cfg.run_cmd || cfg.unix_path || cfg.port || cfg.ip || cfg.vsock)) {
    fprintf (stderr, "blkd: -s cannot be used with --run, -U, -p, -i or --vsock\n");
    return EXIT_FAILURE;
  }
  /* Names are resolved now: a typo fails before anything is bound. */
  unsigned uid = (uid_t) -1, gid = (gid_t) -1;
  if ((group && resolve_id ("-g", group, true, &gid) == -1)
      || (user && resolve_id ("-u", user, false, &uid) == -1))
    return EXIT_FAILURE;
  if (cfg.unix_path && (cfg.vsock || cfg.port)) {
    fprintf (stderr, "blkd: -U cannot be used with -p or --vsock\n");
    return EXIT_FAILURE;
  }
  /* Extended headers carry structured replies with them. */
  if (cfg.no_sr && cfg.ext_headers == EXT_HEADERS_REQUIRE) {
    fprintf (stderr, "blkd: --no-sr cannot be used with --ext-headers=require\n");
    return EXIT_FAILURE;
  }

  /* Every buffer must fit a shard's share, twice over, or one request
   * could wait forever for memory held by nobody.  A default shard count
   * gives way to that (1G holds 16 shards of 32M requests; a larger
   * machine would otherwise not start); one the user gave does not. */
  uint64_t shards_fit = iobuf_mem / (2ull * cfg.max_request);
  if (!shards_given && shards_fit >= 1 && (uint64_t) cfg.shards > shards_fit) {
    log_info ("--iobuf-mem %llu holds 2 x --max-request for %llu shards: starting "
              "that many, not one per CPU (%d); a larger --iobuf-mem runs more",
              (unsigned long long) iobuf_mem, (unsigned long long) shards_fit, cfg.shards);
    cfg.shards = (int) shards_fit;
  }
  if (iobuf_mem / cfg.shards < 2ull * cfg.max_request) {
    fprintf (stderr, "blkd: --iobuf-mem must be at least 2 x --max-request per shard "
             "(%llu bytes here)\n", 2ull * cfg.max_request * cfg.shards);
    return EXIT_FAILURE;
  }
  cfg.iobuf_mem = iobuf_mem;

  signal (SIGPIPE, SIG_IGN);
  /* Handlers first: a signal from here on stops us through the normal
   * exit path, which removes sockets and temporary directories. */
  struct sigaction sa = { .sa_handler = on_signal };
  sigemptyset (&sa.sa_mask);
  sigaction (SIGINT, &sa, NULL);
  sigaction (SIGTERM, &sa, NULL);
  sigaction (SIGQUIT, &sa, NULL);
  if (exit_with_parent && set_exit_with_parent (parent) == -1)
    return EXIT_FAILURE;
  if (backend_stack_load (plugin, filters, nfilters, pargc, pargv) == -1) {
    backend_stack_unload ();
    debug_flags_free ();
    return EXIT_FAILURE;
  }
  debug_flags_warn_unused ();
  /* Quiet like nbdkit: started by another program (--run's command, a
   * client over -s, socket activation, which is how `nbdinfo -- [ blkd
   * ... ]` runs us, a private -U - socket), a start-up line on stderr
   * only lands in that program's output.  Warnings and errors still
   * print; -v brings the start-up lines back. */
  const char *listen_pid = getenv ("LISTEN_PID");
  cfg.quiet = !log_verbose
    && (cfg.run_cmd || cfg.single || (cfg.unix_path && strcmp (cfg.unix_path, "-") == 0)
        || (listen_pid && getenv ("LISTEN_FDS") && atol (listen_pid) == getpid ())
        /* a restarted socket-activated server (live, or through systemd's
         * store): only restart_init sets this before listen_setup */
        || cfg.socket_activated);
  /* TLS files are checked before we bind or fork: a bad key is a loud
   * start-up error, not a handshake failure on every connection. */
  if (cfg.tls != TLS_OFF && tls_setup () == -1) {
    tls_cleanup ();
    backend_stack_unload ();
    return EXIT_FAILURE;
  }

  /* --run without an address: a private Unix socket, as nbdkit does. */
  bool private_socket = cfg.unix_path && strcmp (cfg.unix_path, "-") == 0;
  if (cfg.run_cmd && !cfg.port && !cfg.unix_path && !cfg.ip && !cfg.vsock
      && !getenv ("LISTEN_FDS"))
    private_socket = true;
  if (private_socket && make_private_socket () == -1) {
    exit_code = EXIT_FAILURE;
    goto out_listen;
  }
  if (listen_setup (restart_listeners) == -1) {
    exit_code = EXIT_FAILURE;
    goto out_listen;
  }
  /* --run's command starts now, as nbdkit's does: as the starting user
   * (before -u/-g), its first connection waiting in the backlog until
   * the shards serve it. */
  if (cfg.run_cmd && start_run_command () == -1) {
    exit_code = EXIT_FAILURE;
    goto out_listen;
  }
  /* After a live restart we run as USER already. */
  if (!restart_adopting () && drop_privileges (user, uid, group, gid) == -1) {
    exit_code = EXIT_FAILURE;
    goto out_listen;
  }
  if (cfg.tcp_congestion && (user || group)
      && check_tcp_congestion (cfg.tcp_congestion, " as -u/-g's user") == -1) {
    exit_code = EXIT_FAILURE;
    goto out_listen;
  }
  if (print_uri && !cfg.single) {
    printf ("%s\n", listen_uri ());
    fflush (stdout);
  }
  if (!cfg.foreground && !cfg.socket_activated && restart_adopting ())
    log_daemonized ();            /* the first image forked; we keep its PID */
  else if (!cfg.foreground && !cfg.socket_activated && daemonize () == -1)
    return EXIT_FAILURE;
  /* SIGHUP reloads (on_sighup); until that handler is in place, one that
   * comes early is dropped rather than killing us half started.  Not
   * before this: --run's command, started above, must not inherit it. */
  signal (SIGHUP, SIG_IGN);
  /* SIGUSR2 (live restart, on_sigusr2) likewise; after a restart it is
   * ignored from the exec on (restart_exec). */
  signal (SIGUSR2, SIG_IGN);
  if (write_pidfile () == -1 || backend_stack_after_fork () == -1) {
    exit_code = EXIT_FAILURE;
    goto out_listen;
  }

  stop_fd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
  main_base = event_base_new ();
  if (stop_fd < 0 || !main_base) {
    fprintf (stderr, "blkd: cannot create the main loop: %m\n");
    exit_code = EXIT_FAILURE;
    goto out_listen;
  }
  public_shutdown_hook = server_request_stop;

  /* Shard threads inherit this mask: signals land on the main thread. */
  sigset_t block, old;
  sigemptyset (&block);
  sigaddset (&block, SIGINT);
  sigaddset (&block, SIGTERM);
  sigaddset (&block, SIGQUIT);
  sigaddset (&block, SIGHUP);
  sigaddset (&block, SIGCHLD);
  sigaddset (&block, SIGUSR2);
  pthread_sigmask (SIG_BLOCK, &block, &old);
  int r = shard_start_all (&conn_shard_ops);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (r == -1) {
    exit_code = EXIT_FAILURE;
    goto out_shards;
  }

  ev_stop = event_new (main_base, stop_fd, EV_READ | EV_PERSIST, on_stop, NULL);
  ev_chld = evsignal_new (main_base, SIGCHLD, on_sigchld, NULL);
  ev_hup = evsignal_new (main_base, SIGHUP, on_sighup, NULL);
  ev_usr2 = evsignal_new (main_base, SIGUSR2, on_sigusr2, NULL);
  if (!ev_stop || event_add (ev_stop, NULL) == -1 || !ev_chld
      || event_add (ev_chld, NULL) == -1 || !ev_hup || event_add (ev_hup, NULL) == -1
      || !ev_usr2 || event_add (ev_usr2, NULL) == -1 || listen_start (main_base) == -1) {
    fprintf (stderr, "blkd: cannot start listening: %m\n");
    exit_code = EXIT_FAILURE;
    goto out_events;
  }
  if (metrics_start () == -1) {
    exit_code = EXIT_FAILURE;
    goto out_events;
  }
  /* --fdstore: SIGTERM on the main loop (libevent takes over on_signal's
   * handler, and gives it back when the event is freed). */
  if (cfg.fdstore && !sdnotify_available ())
    log_warn ("--fdstore: no $NOTIFY_SOCKET (not started by systemd with NotifyAccess=); "
              "SIGTERM stops as usual");
  else if (cfg.fdstore && (!(ev_term = evsignal_new (main_base, SIGTERM, on_sigterm_store, NULL))
                           || event_add (ev_term, NULL) == -1)) {
    fprintf (stderr, "blkd: --fdstore: cannot watch SIGTERM: %m\n");
    exit_code = EXIT_FAILURE;
    goto out_events;
  }
  if (term_deferred)              /* one that came meanwhile is delivered now */
    pthread_sigmask (SIG_UNBLOCK, &term_set, NULL);
  if (!cfg.quiet)
    log_info ("serving %s on %s (%d shards)", plugin_name (),
              cfg.single ? "stdin/stdout" : listen_uri (), cfg.shards);
  restart_adopt_conns ();
  restart_ready ();
  if (daemon_ready_fd >= 0) {
    if (write (daemon_ready_fd, "", 1) != 1)
      log_warn ("could not tell the parent we are ready: %m");
    close (daemon_ready_fd);
    daemon_ready_fd = -1;
  }
  /* The command may have ended before SIGCHLD was watched. */
  if (cfg.run_cmd)
    on_sigchld (-1, 0, NULL);
  if (public_shutdown_requested ())
    server_request_stop ();

  if (!atomic_load (&server_stopping))
    event_base_dispatch (main_base);

  log_debug ("stopping: draining connections");
  if (cfg.run_cmd)
    exit_code = run_status;
out_events:
  atomic_store (&server_stopping, true);
  listen_stop ();
  if (ev_stop)
    event_free (ev_stop);
  if (ev_chld)
    event_free (ev_chld);
  if (ev_hup)
    event_free (ev_hup);
  if (ev_usr2)
    event_free (ev_usr2);
  if (ev_term)
    event_free (ev_term);
out_shards:
  atomic_store (&server_stopping, true);
  shard_stop_all ();
  restart_cleanup ();
  if (main_base)
    event_base_free (main_base);
  if (stop_fd >= 0)
    close (stop_fd);
out_listen:
  if (run_pid > 0) {
    kill (run_pid, SIGTERM);
    waitpid (run_pid, NULL, 0);
  }
  listen_stop ();
  if (!restart_exec_pending ())   /* the next image serves the socket on */
    listen_cleanup ();
  metrics_stop ();                /* it answered 503 while the shards drained */
  stats_free ();
  backend_stack_unload ();        /* writeback: dirty blocks reach the plugin */
  debug_flags_free ();
  tls_cleanup ();
  if (cfg.pidfile && exit_code == EXIT_SUCCESS
      && (!restart_exec_pending () || restart_to_store ()))
    unlink (cfg.pidfile);
  if (run_tmpdir) {
    rmdir (run_tmpdir);
    free (run_tmpdir);
  }
  /* An exec returns only if no image could start; the store, once
   * everything is in it (exit 0: systemd's stop succeeded). */
  if (restart_exec_pending () && restart_exec () == -1)
    exit_code = EXIT_FAILURE;
  return exit_code;
}
