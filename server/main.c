/* blkd's entry point: command line, start-up order, signals, --run, and the
 * orderly shutdown that drains every connection. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "internal.h"
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
"Usage: blkd [OPTIONS] [PLUGIN [key=value ...]]\n"
"Serve a block device over NBD from an nbdkit-API plugin.\n"
"With no PLUGIN, serves the in-tree 'ram' plugin with size=1G.\n"
"\n"
"Where to listen (nbdkit's options):\n"
"  -i, --ipaddr ADDR      listen on ADDR only (default: all addresses)\n"
"  -p, --port PORT        TCP port (default 10809; 0 picks a free one)\n"
"  -U, --unix PATH        listen on a Unix socket instead of TCP\n"
"                         (systemd socket activation is used when LISTEN_FDS is set)\n"
"  -e, --exportname NAME  export name shown by LIST and used in --run's $uri\n"
"  -r, --readonly         refuse writes (the plugin is opened read-only)\n"
"\n"
"Process:\n"
"  -f, --foreground       do not fork into the background\n"
"  -P, --pidfile FILE     write the server's PID to FILE\n"
"  -v, --verbose          debug messages (and nbdkit_debug from plugins)\n"
"      --run CMD          run CMD with $uri, $nbd, $port, $unixsocket set, then\n"
"                         stop the server and exit with CMD's status\n"
"      --filter NAME      stack an nbdkit filter over the plugin (repeatable; the\n"
"                         first named is outermost), by name or path\n"
"      --dump-plugin      print what the plugin and filters provide and exit\n"
"  -h, --help             this text\n"
"  -V, --version          print the version and exit\n"
"\n"
"Engine:\n"
"      --shards N         event-loop threads, one per core (default: online CPUs)\n"
"  -t, --threads N        plugin worker threads per shard (default 16)\n"
"      --max-request SIZE largest READ/WRITE accepted and advertised (default 32M)\n"
"      --max-inflight N   requests in flight per connection before reading\n"
"                         pauses (default 512)\n"
"      --dispatch MODE    auto (default): call in-memory plugins on the shard\n"
"                         thread, others on workers; inline; worker\n"
"      --iobuf MODE       pool (default): recycle buffers without memset;\n"
"                         calloc: allocate and zero each request (seed 000 A/B)\n"
"      --iobuf-mem SIZE   bound on request buffer memory, all shards (default 1G)\n"
"      --queue MODE       split (default): a queue and lock per shard;\n"
"                         global: one queue, lock and worker pool (seed 002 A/B)\n"
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
"\n"
"TLS (nbdkit's options):\n"
"      --tls MODE         off (default), on (clients may use TLS), require\n"
"      --tls-certificates DIR  ca-cert.pem, server-cert.pem, server-key.pem\n"
"      --tls-verify-peer  client certificates must chain to the CA\n"
"      --tls-psk FILE     pre-shared keys, psktool's username:hexkey format\n"
"      --tls-seal WHO     blkd (default: TLS 1.3 records we send are sealed by\n"
"                         blkd, several per send) or openssl (SSL_write)\n"
"\n"
"Observability:\n"
"      --metrics ADDR:PORT  serve /metrics (Prometheus), /stats (JSON), /healthz\n"
"      --delayacct MODE   compact (default), locked (seed 001 A/B), off\n"
"\n"
"Block cache:\n"
"      --cache SIZE       cache between the filters and the plugin, SIZE bytes in\n"
"                         all (default 0: off); shared per export only where\n"
"                         the plugin is multi-conn, else one per connection\n"
"      --cache-block SIZE cache block size (default 64K)\n"
"      --cache-mode MODE  writethrough (default) or writeback\n"
"      --cache-ctor B     keep freed entries constructed (seed 004 A/B; default no)\n");
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
  OPT_RUN = 256, OPT_DUMP_PLUGIN, OPT_SHARDS, OPT_MAX_REQUEST, OPT_MAX_INFLIGHT,
  OPT_DISPATCH, OPT_IOBUF, OPT_IOBUF_MEM, OPT_QUEUE, OPT_SPARSE_READS,
  OPT_MAX_CONNECTIONS, OPT_HANDSHAKE_TIMEOUT, OPT_IDLE_TIMEOUT, OPT_TLS,
  OPT_TLS_CERTIFICATES, OPT_TLS_VERIFY_PEER, OPT_TLS_PSK, OPT_TLS_SEAL, OPT_METRICS, OPT_DELAYACCT,
  OPT_CACHE, OPT_CACHE_BLOCK, OPT_CACHE_MODE, OPT_CACHE_CTOR, OPT_FILTER,
};

static const struct option long_opts[] = {
  { "ipaddr", required_argument, NULL, 'i' },
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
  { "max-request", required_argument, NULL, OPT_MAX_REQUEST },
  { "max-inflight", required_argument, NULL, OPT_MAX_INFLIGHT },
  { "dispatch", required_argument, NULL, OPT_DISPATCH },
  { "iobuf", required_argument, NULL, OPT_IOBUF },
  { "iobuf-mem", required_argument, NULL, OPT_IOBUF_MEM },
  { "queue", required_argument, NULL, OPT_QUEUE },
  { "sparse-reads", required_argument, NULL, OPT_SPARSE_READS },
  { "max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS },
  { "handshake-timeout", required_argument, NULL, OPT_HANDSHAKE_TIMEOUT },
  { "idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT },
  { "tls", required_argument, NULL, OPT_TLS },
  { "tls-certificates", required_argument, NULL, OPT_TLS_CERTIFICATES },
  { "tls-verify-peer", no_argument, NULL, OPT_TLS_VERIFY_PEER },
  { "tls-psk", required_argument, NULL, OPT_TLS_PSK },
  { "tls-seal", required_argument, NULL, OPT_TLS_SEAL },
  { "metrics", required_argument, NULL, OPT_METRICS },
  { "delayacct", required_argument, NULL, OPT_DELAYACCT },
  { "cache", required_argument, NULL, OPT_CACHE },
  { "cache-block", required_argument, NULL, OPT_CACHE_BLOCK },
  { "cache-mode", required_argument, NULL, OPT_CACHE_MODE },
  { "cache-ctor", required_argument, NULL, OPT_CACHE_CTOR },
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
    execl ("/bin/sh", "sh", "-c", cfg.run_cmd, (char *) NULL);
    perror ("blkd: /bin/sh");
    _exit (127);
  }
  return 0;
}

int
main (int argc, char **argv)
{
  bool dump = false;
  int c, exit_code = EXIT_SUCCESS;
  struct event *ev_stop = NULL, *ev_chld = NULL;
  long ncpu = sysconf (_SC_NPROCESSORS_ONLN);
  uint64_t iobuf_mem = 1024ull * 1024 * 1024;
  enum { MAX_FILTERS = 64 };
  const char *filters[MAX_FILTERS];
  int nfilters = 0;

  cfg.shards = ncpu > 0 ? (int) ncpu : 1;
  while ((c = getopt_long (argc, argv, "+i:p:U:e:rfP:vt:hV", long_opts, NULL)) != -1) {
    switch (c) {
    case 'i': cfg.ip = optarg; break;
    case 'p': cfg.port = optarg; break;
    case 'U': cfg.unix_path = optarg; break;
    case 'e': cfg.export_name = optarg; break;
    case 'r': cfg.readonly = true; break;
    case 'f': cfg.foreground = true; break;
    case 'P': cfg.pidfile = optarg; break;
    case 'v': log_verbose = true; break;
    case 't': cfg.workers = parse_int_opt ("--threads", optarg, 1, 1024); break;
    case 'h': usage (stdout); return EXIT_SUCCESS;
    case 'V': printf ("blkd %s\n", BLKD_VERSION); return EXIT_SUCCESS;
    case OPT_RUN: cfg.run_cmd = optarg; cfg.foreground = true; break;
    case OPT_DUMP_PLUGIN: dump = true; break;
    case OPT_SHARDS: cfg.shards = parse_int_opt ("--shards", optarg, 1, 1024); break;
    case OPT_MAX_REQUEST:
      cfg.max_request = parse_size_opt ("--max-request", optarg, 512, 1u << 30);
      break;
    case OPT_MAX_INFLIGHT:
      cfg.max_inflight = parse_int_opt ("--max-inflight", optarg, 1, 65536);
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
      cfg.sparse_reads = strcmp (optarg, "auto") == 0 ? 2 : parse_bool_opt (optarg);
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
      cfg.tls_seal = parse_choice ("--tls-seal", optarg,
                                   (const char *const[]) { "blkd", "openssl", NULL });
      break;
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

  if (dump)
    return backend_stack_dump (plugin, filters, nfilters) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;

  /* Every buffer must fit a shard's share, twice over, or one request
   * could wait forever for memory held by nobody. */
  if (iobuf_mem / cfg.shards < 2ull * cfg.max_request) {
    fprintf (stderr, "blkd: --iobuf-mem must be at least 2 x --max-request per shard "
             "(%llu bytes here)\n", 2ull * cfg.max_request * cfg.shards);
    return EXIT_FAILURE;
  }
  cfg.iobuf_mem = iobuf_mem;

  signal (SIGPIPE, SIG_IGN);
  if (backend_stack_load (plugin, filters, nfilters, pargc, pargv) == -1) {
    backend_stack_unload ();
    return EXIT_FAILURE;
  }
  /* TLS files are checked before we bind or fork: a bad key is a loud
   * start-up error, not a handshake failure on every connection. */
  if (cfg.tls != TLS_OFF && tls_setup () == -1) {
    tls_cleanup ();
    backend_stack_unload ();
    return EXIT_FAILURE;
  }

  /* --run without an address: a private Unix socket, as nbdkit does. */
  if (cfg.run_cmd && !cfg.port && !cfg.unix_path && !cfg.ip && !getenv ("LISTEN_FDS")) {
    char tmpl[] = "/tmp/blkdXXXXXX";
    if (!mkdtemp (tmpl)) {
      fprintf (stderr, "blkd: mkdtemp: %m\n");
      return EXIT_FAILURE;
    }
    run_tmpdir = strdup (tmpl);
    static char sock[64];
    snprintf (sock, sizeof sock, "%s/socket", tmpl);
    cfg.unix_path = sock;
  }
  if (listen_setup () == -1) {
    backend_stack_unload ();
    return EXIT_FAILURE;
  }
  if (!cfg.foreground && !cfg.socket_activated && daemonize () == -1)
    return EXIT_FAILURE;
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
  struct sigaction sa = { .sa_handler = on_signal };
  sigemptyset (&sa.sa_mask);
  sigaction (SIGINT, &sa, NULL);
  sigaction (SIGTERM, &sa, NULL);

  /* Shard threads inherit this mask: signals land on the main thread. */
  sigset_t block, old;
  sigemptyset (&block);
  sigaddset (&block, SIGINT);
  sigaddset (&block, SIGTERM);
  sigaddset (&block, SIGCHLD);
  pthread_sigmask (SIG_BLOCK, &block, &old);
  int r = shard_start_all ();
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (r == -1) {
    exit_code = EXIT_FAILURE;
    goto out_shards;
  }

  ev_stop = event_new (main_base, stop_fd, EV_READ | EV_PERSIST, on_stop, NULL);
  ev_chld = evsignal_new (main_base, SIGCHLD, on_sigchld, NULL);
  if (!ev_stop || event_add (ev_stop, NULL) == -1 || !ev_chld
      || event_add (ev_chld, NULL) == -1 || listen_start (main_base) == -1) {
    fprintf (stderr, "blkd: cannot start listening: %m\n");
    exit_code = EXIT_FAILURE;
    goto out_events;
  }
  if (metrics_start () == -1) {
    exit_code = EXIT_FAILURE;
    goto out_events;
  }
  if (cfg.foreground && !cfg.run_cmd)
    fprintf (stderr, "blkd: serving %s on %s (%d shards)\n", plugin_name (), listen_uri (),
             cfg.shards);
  if (daemon_ready_fd >= 0) {
    if (write (daemon_ready_fd, "", 1) != 1)
      log_warn ("could not tell the parent we are ready: %m");
    close (daemon_ready_fd);
    daemon_ready_fd = -1;
  }
  if (cfg.run_cmd && start_run_command () == -1) {
    exit_code = EXIT_FAILURE;
    goto out_events;
  }
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
out_shards:
  atomic_store (&server_stopping, true);
  shard_stop_all ();
  if (run_pid > 0) {
    kill (run_pid, SIGTERM);
    waitpid (run_pid, NULL, 0);
  }
  if (main_base)
    event_base_free (main_base);
  if (stop_fd >= 0)
    close (stop_fd);
out_listen:
  listen_stop ();
  listen_cleanup ();
  metrics_stop ();                /* it answered 503 while the shards drained */
  stats_free ();
  backend_stack_unload ();        /* writeback: dirty blocks reach the plugin */
  tls_cleanup ();
  if (cfg.pidfile && exit_code == EXIT_SUCCESS)
    unlink (cfg.pidfile);
  if (run_tmpdir) {
    rmdir (run_tmpdir);
    free (run_tmpdir);
  }
  return exit_code;
}
