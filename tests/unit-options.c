/* Unit tests for blkd's command line: main.c is compiled in with main()
 * renamed, each case runs it in a child (bad options exit the process)
 * up to --dump-plugin, and the child hands back the configuration it
 * parsed through shared memory. */
#define main blkd_main
#include "../server/main.c"
#undef main

#include <sys/mman.h>
#include <sys/wait.h>

#include "unit.h"

/* The in-tree plugin: tests/run.sh runs us from the top of the tree. */
#define PLUGIN "plugins/ram/nbdkit-ram-plugin.so"

struct outcome {
  int status;                           /* exit status, or -1 on a signal */
  struct blkd_config cfg;
  char err[512];                        /* the start of stderr */
};

static struct outcome *shared;

/* run (args..., NULL): blkd ARGS --dump-plugin PLUGIN in a child. */
static const struct outcome *
run (const char *first, ...)
{
  const char *argv[32] = { "blkd" };
  int argc = 1;
  va_list ap;
  va_start (ap, first);
  for (const char *a = first; a && argc < 28; a = va_arg (ap, const char *))
    argv[argc++] = a;
  va_end (ap);
  argv[argc++] = "--dump-plugin";
  argv[argc++] = PLUGIN;
  argv[argc] = NULL;

  memset (shared, 0, sizeof *shared);
  char errpath[] = "/tmp/unit-options.XXXXXX";
  int errfd = mkstemp (errpath);
  if (errfd == -1) {
    perror ("mkstemp");
    exit (2);
  }
  unlink (errpath);
  fflush (stdout);
  pid_t pid = fork ();
  if (pid == -1) {
    perror ("fork");
    exit (2);
  }
  if (pid == 0) {
    int null = open ("/dev/null", O_WRONLY);
    dup2 (null, STDOUT_FILENO);
    dup2 (errfd, STDERR_FILENO);
    int rc = blkd_main (argc, (char **) argv);
    shared->cfg = cfg;
    fflush (NULL);
    _exit (rc);
  }
  int st;
  waitpid (pid, &st, 0);
  shared->status = WIFEXITED (st) ? WEXITSTATUS (st) : -1;
  ssize_t n = pread (errfd, shared->err, sizeof shared->err - 1, 0);
  shared->err[n > 0 ? n : 0] = '\0';
  close (errfd);
  return shared;
}

static void
test_defaults (void)
{
  int before = unit_begin ("defaults");
  const struct outcome *o = run (NULL);
  CHECK_INT (o->status, 0);
  CHECK_INT (o->cfg.max_request, 32 * 1024 * 1024);
  CHECK_INT (o->cfg.workers, 16);
  CHECK_INT (o->cfg.dispatch, DISPATCH_AUTO);
  CHECK_INT (o->cfg.tls, TLS_OFF);
  CHECK_INT (o->cfg.handshake_timeout, 10);
  CHECK_INT (o->cfg.readonly, false);
  unit_end (before);
}

static void
test_values (void)
{
  int before = unit_begin ("options set what they say");
  const struct outcome *o;
  o = run ("-t", "8", "--shards", "3", "-r", "-f", NULL);
  CHECK_INT (o->status, 0);
  CHECK_INT (o->cfg.workers, 8);
  CHECK_INT (o->cfg.shards, 3);
  CHECK_INT (o->cfg.readonly, true);
  CHECK_INT (o->cfg.foreground, true);
  o = run ("--max-request", "1M", "--max-inflight", "7", "--cache", "64M",
           "--cache-block", "128K", NULL);
  CHECK_INT (o->status, 0);
  CHECK_INT (o->cfg.max_request, 1024 * 1024);
  CHECK_INT (o->cfg.max_inflight, 7);
  CHECK_INT (o->cfg.cache_size, 64 * 1024 * 1024);
  CHECK_INT (o->cfg.cache_block, 128 * 1024);
  o = run ("--dispatch=worker", "--iobuf=calloc", "--queue=global", NULL);
  CHECK_INT (o->status, 0);
  CHECK_INT (o->cfg.dispatch, DISPATCH_WORKER);
  CHECK_INT (o->cfg.iobuf, IOBUF_CALLOC);
  CHECK_INT (o->cfg.queue, QUEUE_GLOBAL);
  o = run ("--cache-mode", "writeback", "--cache-ctor", "true", "--delayacct", "off", NULL);
  CHECK_INT (o->status, 0);
  CHECK_INT (o->cfg.cache_mode, CACHE_WRITEBACK);
  CHECK_INT (o->cfg.cache_ctor, true);
  CHECK_INT (o->cfg.delayacct, DELAYACCT_OFF);
  o = run ("--handshake-timeout", "0", "--idle-timeout", "30", "--max-connections", "5", NULL);
  CHECK_INT (o->status, 0);
  CHECK_INT (o->cfg.handshake_timeout, 0);
  CHECK_INT (o->cfg.idle_timeout, 30);
  CHECK_INT (o->cfg.max_connections, 5);
  /* --tls takes nbdkit's spellings too. */
  CHECK_INT (run ("--tls", "yes", NULL)->cfg.tls, TLS_ON);
  CHECK_INT (run ("--tls", "false", NULL)->cfg.tls, TLS_OFF);
  CHECK_INT (run ("--tls", "require", NULL)->cfg.tls, TLS_REQUIRE);
  /* --sparse-reads: a boolean, or auto. */
  CHECK_INT (run ("--sparse-reads", "no", NULL)->cfg.sparse_reads, 0);
  CHECK_INT (run ("--sparse-reads", "on", NULL)->cfg.sparse_reads, 1);
  CHECK_INT (run ("--sparse-reads", "auto", NULL)->cfg.sparse_reads, 2);
  unit_end (before);
}

/* bad (WANT, args..., NULL): blkd must exit 1 and say WANT on stderr. */
#define bad(want, ...)                                                  \
  do {                                                                  \
    const struct outcome *o_ = run (__VA_ARGS__, NULL);                 \
    CHECK_INT (o_->status, 1);                                          \
    if (!strstr (o_->err, want)) {                                      \
      printf ("FAIL [%s] %s:%d: stderr lacks '%s': %s\n", unit_group,   \
              __FILE__, __LINE__, want, o_->err);                       \
      unit_failures++;                                                  \
    }                                                                   \
  } while (0)

static void
test_errors (void)
{
  int before = unit_begin ("bad values: exit 1 with a message naming the option");
  bad ("--threads", "-t", "0");
  bad ("--threads", "-t", "many");
  bad ("--shards", "--shards", "2000");
  bad ("--max-request", "--max-request", "100");
  bad ("--max-request", "--max-request", "2G");
  bad ("--max-inflight", "--max-inflight", "0");
  bad ("--dispatch", "--dispatch", "sometimes");
  bad ("--tls", "--tls", "maybe");
  bad ("--cache-block", "--cache-block", "12K");      /* not a power of two */
  bad ("--cache-mode", "--cache-mode", "writearound");
  bad ("--idle-timeout", "--idle-timeout", "-1");
  bad ("Usage:", "--no-such-option");
  unit_end (before);
}

int
main (void)
{
  shared = mmap (NULL, sizeof *shared, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    perror ("mmap");
    return 2;
  }
  if (access (PLUGIN, R_OK) == -1) {
    printf ("skipped: %s not built (make all)\n", PLUGIN);
    return 77;
  }
  test_defaults ();
  test_values ();
  test_errors ();
  return unit_exit ("unit-options");
}
