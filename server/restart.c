/* Live restart (SIGUSR2): quiesce every connection, pass the listening
 * sockets and each idle clear-text connection to a new image of the binary
 * (execv: same PID) in a memfd, and adopt them there without a handshake.
 *
 * The steps, and who runs them:
 *   restart_begin (main)   stop accepting; every shard quiesces: TLS and
 *                          handshaking connections drain and close as on
 *                          SIGTERM, the others take no new request and
 *                          finish what is in flight (shard_quiesce)
 *   on_done (main)         every shard is quiet: each one detaches its
 *                          connections (shard_detach: a dup of the socket
 *                          is kept, the plugin's .close runs); then the
 *                          main loop ends
 *   main's exit path       shards stop, the plugin unloads (.unload)
 *   restart_exec (main)    the state goes into a memfd; execv
 *   restart_init (new)     reads and checks the state, before anything
 *   listen.c, restart_adopt_conns (new)
 *                          the listeners, then each connection reopened
 *                          through the layer stack (.preconnect, .open)
 *                          and put in the transmission phase.
 * Limits: TLS sessions cannot be handed over (OpenSSL's state does not
 * survive an exec); --run, -s and -U - have nothing to hand over to.
 *
 * A second transport for the same state: systemd's file descriptor store
 * (--fdstore, under a unit with FileDescriptorStoreMax=).  SIGTERM then
 * quiesces and detaches exactly as above, but instead of execv the state
 * memfd, the listeners blkd bound itself and every connection go to
 * systemd (sd_notify FDSTORE=1, one FDNAME= each: sdnotify.c) and the
 * process exits 0.  systemd keeps the store across `systemctl restart`
 * and closes it when the unit stops for good, so the connections end
 * exactly when the service really stops.  The next process finds them in
 * LISTEN_FDS/LISTEN_FDNAMES after the socket unit's listeners
 * (store_init), adopts them through the same path, and only once it
 * serves removes them from the store (restart_ready): a copy left there
 * would keep a connection open after blkd closed it.  The state's fd
 * fields then hold slot numbers, resolved by name: a connection whose
 * client hung up while stored (systemd drops it on EPOLLHUP) or that the
 * store had no room for is skipped, not fatal. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "internal.h"

/* The state's wire form.  Native byte order: only this host reads it.
 *   preamble magic[8] nlisten:u32 flags:u32 fd:i32[nlisten]
 *   header   version:u32 nconns:u32 restarts:u64 handed:u64
 *            exe_len:u32 exe[exe_len]
 *   conn     fd:i32 cflags:u32 size:u64 old_id:u64 eflags:u32
 *            block_min:u32 block_pref:u32 block_max:u32
 *            peer_len:u32 name_len:u32 peer[peer_len] name[name_len]
 *                                                    (nconns times)
 * The preamble never changes, so that any later binary can keep the
 * listening sockets; a new version number for any change after it.  An
 * image reading a version it does not know keeps the listeners and closes
 * the connections; one that cannot read the preamble closes every socket
 * it inherited and binds afresh. */
#define STATE_MAGIC     "BLKDRST\n"
#define STATE_VERSION   1u
#define STATE_MAX       (64u << 20)
#define MAX_LISTEN      16
#define MAX_CONNS       (1u << 20)

/* Names in the file descriptor store: STORE_PREFIX GEN "-state", "-lI"
 * (a listener blkd bound itself), "-cI" (connection record I); GEN is the
 * restart count, so that a copy some earlier process failed to remove is
 * never mistaken for the latest. */
#define STORE_PREFIX    "blkdstore-"
#define STORE_BARRIER_MS 5000

#define SF_SOCKET_ACTIVATED 1u      /* header flags */
#define SF_UNIX_CREATED     2u
#define CF_STRUCTURED       1u      /* conn flags */
#define CF_META_BASE_ALLOC  2u
#define CF_NO_ZEROES        4u
#define CF_EXTENDED         8u      /* 32-byte requests, extended replies */
#define CF_ALL              15u

/* One connection passed between images: what the handshake agreed. */
struct handed {
  struct handed *next;
  int fd;
  uint32_t cflags;
  uint64_t size, old_id;
  uint16_t eflags;
  uint32_t bs[3];                 /* min, pref, max as advertised */
  char peer[64];
  char *name;                     /* the export's name (resolved) */
};

static char **saved_argv;
static char *exe_path;            /* resolved at start-up */
static atomic_ullong restarts, handed_total;

/* Inherited (new image). */
static bool adopting;
static uint32_t in_flags;
static int in_listen[MAX_LISTEN], n_in_listen;
static void restart_conn_progress (struct conn *c);
static void restart_shard_conn_gone (struct shard *s);
static struct handed *in_conns;
static unsigned n_in_conns;

/* Found in systemd's file descriptor store (new process). */
enum store_kind { SK_STATE, SK_LISTENER, SK_CONN };
struct stored {
  enum store_kind kind;
  uint64_t gen;
  uint32_t idx;
  int fd;
  bool used;                      /* taken: not closed with the rest */
};
static bool from_store;
static struct stored *st_fds;     /* sorted by kind, gen, idx */
static int st_n;
static uint64_t st_gen;           /* the generation adopted: the latest state's */
static char **st_names;           /* every name of ours passed: removed once serving */
static int st_nnames;

/* A restart in progress (old image).  The main thread drives the phases;
 * shards report through done_fd. */
enum rphase { R_IDLE, R_QUIESCE, R_DETACH, R_EXEC };
static enum rphase rphase;
static bool to_store;             /* SIGTERM with --fdstore: hand over to systemd */
static struct event_base *mbase;
static int done_fd = -1;
static struct event *ev_done, *ev_bound, *ev_giveup;
static atomic_int shards_done;

enum rs_state { RS_NONE, RS_QUIESCING, RS_QUIET };
struct rs_shard {
  enum rs_state state;            /* shard thread only */
  struct handed *out;             /* detached connections (main reads once reported) */
  unsigned nout;
};
/* Set once by the main thread; every shard's connection close looks. */
static struct rs_shard *_Atomic rs;
static int rs_n;

static int out_listen[MAX_LISTEN], n_out_listen;
static uint32_t out_flags;

uint64_t restart_count (void) { return atomic_load (&restarts); }
uint64_t restart_handed_total (void) { return atomic_load (&handed_total); }
bool restart_adopting (void) { return adopting; }
bool restart_exec_pending (void) { return rphase == R_EXEC; }
bool restart_to_store (void) { return to_store; }

static void
handed_free_list (struct handed *h, bool close_fds)
{
  while (h) {
    struct handed *next = h->next;
    if (close_fds && h->fd >= 0)
      close (h->fd);
    free (h->name);
    free (h);
    h = next;
  }
}

/* ---- start-up ------------------------------------------------------- */

/* The binary's path as it was named, made absolute: an upgrade that
 * replaces the file (or a symlink to it) is what the next exec runs.
 * /proc/self/exe is the fallback, and it names the running file. */
static char *
resolve_exe (const char *argv0)
{
  char buf[PATH_MAX];
  if (argv0 && strchr (argv0, '/')) {
    if (argv0[0] == '/')
      return strdup (argv0);
    while (argv0[0] == '.' && argv0[1] == '/')
      argv0 += 2;                 /* "./blkd": the log names DIR/blkd */
    if (getcwd (buf, sizeof buf) && strlen (buf) + 1 + strlen (argv0) < sizeof buf) {
      strcat (buf, "/");
      strcat (buf, argv0);
      return strdup (buf);
    }
  }
  else if (argv0 && *argv0) {
    const char *path = getenv ("PATH");
    for (const char *p = path; p && *p; ) {
      const char *e = strchrnul (p, ':');
      int n = snprintf (buf, sizeof buf, "%.*s/%s", (int) (e - p), p, argv0);
      if (n > 0 && (size_t) n < sizeof buf && e > p && buf[0] == '/'
          && access (buf, X_OK) == 0)
        return strdup (buf);
      p = *e ? e + 1 : e;
    }
  }
  ssize_t n = readlink ("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    return NULL;
  buf[n] = '\0';
  return strdup (buf);
}

/* A state that does not parse: close every socket it may have passed us
 * (any inherited socket but stdin/out/err and the listeners in keep), so
 * that no client waits on a connection nobody serves, and so that the
 * listeners can be bound again if they are not kept. */
static void
close_inherited_sockets (const int *keep, int nkeep)
{
  DIR *d = opendir ("/proc/self/fd");
  if (!d)
    return;
  int dfd = dirfd (d), n = 0;
  struct dirent *e;
  while ((e = readdir (d))) {
    int fd = atoi (e->d_name), k = 0;
    struct stat st;
    while (k < nkeep && keep[k] != fd)
      k++;
    if (k == nkeep && fd > STDERR_FILENO && fd != dfd && fstat (fd, &st) == 0
        && S_ISSOCK (st.st_mode)) {
      close (fd);
      n++;
    }
  }
  closedir (d);
  log_error ("live restart: closed %d inherited socket(s)%s; their clients must reconnect",
             n, nkeep ? " (listeners kept)" : "");
}

/* A socket we were passed: listening (want_listen) or connected. */
static bool
valid_socket (int fd, bool want_listen)
{
  struct stat st;
  int acc = 0;
  socklen_t sl = sizeof acc;
  if (fd <= STDERR_FILENO || fstat (fd, &st) == -1 || !S_ISSOCK (st.st_mode)
      || getsockopt (fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &sl) == -1)
    return false;
  return (acc != 0) == want_listen;
}

struct reader {
  const uint8_t *p, *end;
  bool bad;
};

static void
rd (struct reader *r, void *out, size_t n)
{
  if (r->bad || (size_t) (r->end - r->p) < n) {
    r->bad = true;
    memset (out, 0, n);
    return;
  }
  memcpy (out, r->p, n);
  r->p += n;
}

static uint32_t rd32 (struct reader *r) { uint32_t v; rd (r, &v, 4); return v; }
static uint64_t rd64 (struct reader *r) { uint64_t v; rd (r, &v, 8); return v; }

static int
cmp_int (const void *a, const void *b)
{
  return *(const int *) a - *(const int *) b;
}

/* The preamble: magic and listeners.  0, or -1 with nothing kept.  From
 * the store the listeners are not taken from it (store_listeners): the
 * socket unit passes its own again, and the fd fields are slots. */
static int
parse_preamble (struct reader *r)
{
  char magic[8];
  rd (r, magic, sizeof magic);
  if (r->bad || memcmp (magic, STATE_MAGIC, sizeof magic) != 0) {
    log_error ("live restart: the state has no valid magic");
    return -1;
  }
  uint32_t nlisten = rd32 (r), flags = rd32 (r);
  if (r->bad || nlisten == 0 || nlisten > MAX_LISTEN
      || (flags & ~(SF_SOCKET_ACTIVATED | SF_UNIX_CREATED))) {
    log_error ("live restart: state out of bounds (%u listeners, flags 0x%x)", nlisten, flags);
    return -1;
  }
  in_flags = flags;
  for (uint32_t i = 0; i < nlisten; i++) {
    int32_t fd;
    rd (r, &fd, 4);
    if (from_store)
      continue;
    for (uint32_t k = 0; k < i; k++)
      if (in_listen[k] == fd)
        fd = -1;                  /* named twice */
    if (r->bad || !valid_socket (fd, true)) {
      log_error ("live restart: listener %u (fd %d) is not a listening socket", i, fd);
      return -1;
    }
    in_listen[i] = fd;
  }
  if (r->bad)
    return -1;
  if (!from_store)
    n_in_listen = nlisten;
  return 0;
}

static int store_conn_fd (int32_t slot);

/* The rest, as untrusted input: every count and length bounded, every fd
 * a connected socket, named once and not a listener.  0, or -1 with no
 * connection kept. */
static int
parse_conns (struct reader *r)
{
  uint32_t version = rd32 (r), nconns = rd32 (r);
  uint64_t nrestarts = rd64 (r), nhanded = rd64 (r);
  uint32_t exe_len = rd32 (r);
  if (r->bad || version != STATE_VERSION) {
    log_error ("live restart: state version %u, this binary reads %u", version, STATE_VERSION);
    return -1;
  }
  if (nconns > MAX_CONNS || exe_len == 0 || exe_len >= PATH_MAX) {
    log_error ("live restart: state out of bounds (%u connections, a path of %u bytes)",
               nconns, exe_len);
    return -1;
  }
  char exe[PATH_MAX];
  rd (r, exe, exe_len);
  exe[exe_len] = '\0';
  if (r->bad || exe[0] != '/' || strlen (exe) != exe_len) {
    log_error ("live restart: the binary's path in the state is not an absolute path");
    return -1;
  }
  int *fds = malloc ((n_in_listen + (size_t) nconns) * sizeof *fds);
  if (!fds) {
    log_error ("live restart: out of memory reading the state");
    return -1;
  }
  size_t nfds = 0;
  for (int i = 0; i < n_in_listen; i++)
    fds[nfds++] = in_listen[i];
  struct handed **tail = &in_conns;
  uint32_t kept = 0;
  for (uint32_t i = 0; i < nconns; i++) {
    struct handed h = { .next = NULL };
    int32_t fd;
    rd (r, &fd, 4);
    h.fd = fd;
    h.cflags = rd32 (r);
    h.size = rd64 (r);
    h.old_id = rd64 (r);
    uint32_t eflags = rd32 (r);
    for (int k = 0; k < 3; k++)
      h.bs[k] = rd32 (r);
    uint32_t peer_len = rd32 (r), name_len = rd32 (r);
    if (r->bad || peer_len >= sizeof h.peer || name_len > NBD_MAX_STRING
        || (h.cflags & ~CF_ALL) || eflags > UINT16_MAX
        || ((h.cflags & CF_EXTENDED) && !(h.cflags & CF_STRUCTURED)) || !(eflags & NBD_FLAG_HAS_FLAGS)
        || h.size > INT64_MAX) {
      log_error ("live restart: connection record %u is malformed", i);
      goto bad;
    }
    h.eflags = eflags;
    rd (r, h.peer, peer_len);
    h.peer[peer_len] = '\0';
    h.name = malloc (name_len + 1);
    if (!h.name) {
      log_error ("live restart: out of memory reading the state");
      goto bad;
    }
    rd (r, h.name, name_len);
    h.name[name_len] = '\0';
    if (from_store && !r->bad && (fd = h.fd = store_conn_fd (fd)) == -1) {
      log_info ("restart: peer %s (connection %llu before) was not in the file descriptor "
                "store: its client hung up, or FileDescriptorStoreMax= is too small",
                h.peer, (unsigned long long) h.old_id);
      free (h.name);
      continue;
    }
    struct handed *p = malloc (sizeof *p);
    if (r->bad || !p || strlen (h.name) != name_len || strlen (h.peer) != peer_len
        || !valid_socket (fd, false)) {
      log_error ("live restart: connection record %u (fd %d) is malformed", i, fd);
      free (h.name);
      free (p);
      goto bad;
    }
    *p = h;
    *tail = p;
    tail = &p->next;
    fds[nfds++] = fd;
    kept++;
  }
  if (r->p != r->end) {
    log_error ("live restart: %zu bytes after the last record", (size_t) (r->end - r->p));
    goto bad;
  }
  qsort (fds, nfds, sizeof *fds, cmp_int);
  for (size_t i = 1; i < nfds; i++)
    if (fds[i] == fds[i - 1]) {
      log_error ("live restart: fd %d is named twice", fds[i]);
      goto bad;
    }
  free (fds);
  /* The path the first image resolved; a process systemd started resolved
   * its own. */
  char *path = from_store ? NULL : strdup (exe);
  if (path) {
    free (exe_path);
    exe_path = path;
  }
  n_in_conns = kept;
  atomic_store (&restarts, nrestarts);
  atomic_store (&handed_total, nhanded);
  return 0;

bad:
  free (fds);
  handed_free_list (in_conns, false);
  in_conns = NULL;
  return -1;
}

static void
free_argv (void)
{
  for (int i = 0; saved_argv && saved_argv[i]; i++)
    free (saved_argv[i]);
  free (saved_argv);
  saved_argv = NULL;
}

/* A copy: option parsing reorders argv and plugins split key=value in
 * place. */
void
restart_save_argv (int argc, char **argv)
{
  saved_argv = calloc (argc + 1, sizeof *saved_argv);
  for (int i = 0; saved_argv && i < argc; i++)
    if (!(saved_argv[i] = strdup (argv[i]))) {
      free_argv ();
      break;
    }
  exe_path = resolve_exe (argv[0]);
}

/* The whole state from its memfd, or NULL. */
static uint8_t *
state_read (int fd, size_t *len)
{
  struct stat st;
  if (fstat (fd, &st) == -1 || !S_ISREG (st.st_mode) || st.st_size <= 0
      || st.st_size > STATE_MAX)
    return NULL;
  uint8_t *buf = malloc (st.st_size);
  size_t got = 0;
  while (buf && got < (size_t) st.st_size) {
    ssize_t n = pread (fd, buf + got, st.st_size - got, got);
    if (n <= 0)
      break;
    got += n;
  }
  if (buf && got != (size_t) st.st_size) {
    free (buf);
    buf = NULL;
  }
  *len = got;
  return buf;
}

/* Listeners and connections are ours now: no plugin's child may inherit
 * them. */
static void
inherit_done (void)
{
  for (int i = 0; i < n_in_listen; i++)
    fcntl (in_listen[i], F_SETFD, FD_CLOEXEC);
  /* Known before start-up decides how quiet to be (main.c). */
  if (n_in_listen > 0 && (in_flags & SF_SOCKET_ACTIVATED))
    cfg.socket_activated = true;
  for (struct handed *h = in_conns; h; h = h->next)
    fcntl (h->fd, F_SETFD, FD_CLOEXEC);
}

/* ---- the file descriptor store (new process) -------------------------- */

/* NAME as STORE_PREFIX GEN "-state" | "-l" IDX | "-c" IDX; -1 if not. */
static int
store_name_parse (const char *name, struct stored *e)
{
  size_t pl = strlen (STORE_PREFIX);
  if (strncmp (name, STORE_PREFIX, pl) != 0 || name[pl] < '0' || name[pl] > '9')
    return -1;
  char *end;
  errno = 0;
  e->gen = strtoull (name + pl, &end, 10);
  if (errno || *end != '-')
    return -1;
  end++;
  e->idx = 0;
  if (strcmp (end, "state") == 0) {
    e->kind = SK_STATE;
    return 0;
  }
  if ((*end != 'l' && *end != 'c') || end[1] < '0' || end[1] > '9')
    return -1;
  e->kind = *end == 'l' ? SK_LISTENER : SK_CONN;
  char *tail;
  unsigned long idx = strtoul (end + 1, &tail, 10);
  if (*tail || idx >= MAX_CONNS)
    return -1;
  e->idx = idx;
  return 0;
}

static int
cmp_stored (const void *a, const void *b)
{
  const struct stored *x = a, *y = b;
  if (x->kind != y->kind)
    return x->kind < y->kind ? -1 : 1;
  if (x->gen != y->gen)
    return x->gen < y->gen ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static struct stored *
store_find (enum store_kind kind, uint64_t gen, uint32_t idx)
{
  struct stored key = { .kind = kind, .gen = gen, .idx = idx };
  return st_n ? bsearch (&key, st_fds, st_n, sizeof *st_fds, cmp_stored) : NULL;
}

/* parse_conns: record SLOT's socket, taken once; -1 if it is not there. */
static int
store_conn_fd (int32_t slot)
{
  struct stored *e = slot >= 0 ? store_find (SK_CONN, st_gen, slot) : NULL;
  if (!e || e->used)
    return -1;
  e->used = true;
  return e->fd;
}

static void
store_close_unused (void)
{
  for (int i = 0; i < st_n; i++)
    if (!st_fds[i].used && st_fds[i].fd >= 0) {
      close (st_fds[i].fd);
      st_fds[i].fd = -1;
    }
}

/* The fds systemd passed that are ours: every one named STORE_PREFIX...
 * (the socket unit's come first, under their own names).  Returns how
 * many socket-unit fds lead, or -1 when nothing of ours was passed (the
 * environment is then left to listen.c's socket activation). */
static int
store_scan (char ***names_out)
{
  const char *pid = getenv ("LISTEN_PID"), *nfds = getenv ("LISTEN_FDS");
  const char *names = getenv ("LISTEN_FDNAMES");
  if (!pid || !nfds || !names || atol (pid) != getpid ()
      || !strstr (names, STORE_PREFIX))
    return -1;
  char *end;
  long n = strtol (nfds, &end, 10);
  if (*nfds == '\0' || *end || n <= 0 || n > MAX_CONNS)
    return -1;
  char *copy = strdup (names);
  char **name = calloc (n, sizeof *name);
  st_fds = calloc (n, sizeof *st_fds);
  st_names = calloc (n, sizeof *st_names);
  if (!copy || !name || !st_fds || !st_names) {
    log_error ("restart: out of memory reading systemd's file descriptor store");
    goto fail;
  }
  /* One name per fd, or we cannot tell which is which. */
  char *p = copy;
  long k = 0;
  for (char *tok; k < n && (tok = strsep (&p, ":")); k++)
    name[k] = tok;
  if (k != n || p) {
    log_error ("restart: LISTEN_FDNAMES names %s fds than LISTEN_FDS=%ld; "
               "not using the file descriptor store", k < n ? "fewer" : "more", n);
    goto fail;
  }
  int nsock = -1;
  for (long i = 0; i < n; i++) {
    int fd = 3 + i;
    struct stored e = { .fd = fd };
    bool ours = strncmp (name[i], STORE_PREFIX, strlen (STORE_PREFIX)) == 0;
    if (!ours) {
      if (nsock < 0)
        continue;                 /* one of the socket unit's */
      /* systemd passes the socket units' fds first: one after ours is not a
       * listener listen.c could take (LISTEN_FDS counts from fd 3). */
      log_warn ("restart: fd %d (\"%s\") comes after the stored ones; closing it", fd, name[i]);
      close (fd);
      continue;
    }
    if (nsock < 0)
      nsock = i;
    if (!(st_names[st_nnames++] = strdup (name[i])))
      st_nnames--;
    if (store_name_parse (name[i], &e) == -1) {
      log_warn ("restart: \"%s\" in the file descriptor store is not one blkd stores; "
                "closing it", name[i]);
      close (fd);
      continue;
    }
    st_fds[st_n++] = e;
  }
  if (nsock < 0)
    goto fail;                    /* the prefix only inside another name */
  qsort (st_fds, st_n, sizeof *st_fds, cmp_stored);
  /* The names the socket unit gave, for listen.c if the state is unused. */
  for (int i = 0; i < nsock; i++)
    name[i] = strdup (name[i]);
  for (long i = nsock; i < n; i++)
    name[i] = NULL;
  *names_out = name;
  free (copy);
  return nsock;

fail:
  free (copy);
  free (name);
  free (st_fds);
  st_fds = NULL;
  st_n = 0;
  for (int i = 0; i < st_nnames; i++)
    free (st_names[i]);
  free (st_names);
  st_names = NULL;
  st_nnames = 0;
  return -1;
}

/* The listeners: the socket unit's if it passes any (as a first start
 * would take them), else the ones the previous process bound and stored.
 * 0, or -1 with none. */
static int
store_listeners (int nsock)
{
  n_in_listen = 0;
  if (nsock > MAX_LISTEN)
    return -1;
  if (nsock > 0) {
    for (int i = 0; i < nsock; i++) {
      if (!valid_socket (3 + i, true)) {
        log_error ("restart: fd %d from the socket unit is not a listening socket", 3 + i);
        n_in_listen = 0;
        return -1;
      }
      in_listen[n_in_listen++] = 3 + i;
    }
    in_flags = (in_flags & ~SF_UNIX_CREATED) | SF_SOCKET_ACTIVATED;
    return 0;
  }
  for (int i = 0; i < st_n && n_in_listen < MAX_LISTEN; i++) {
    struct stored *e = &st_fds[i];
    if (e->kind == SK_LISTENER && e->gen == st_gen && valid_socket (e->fd, true)) {
      e->used = true;
      in_listen[n_in_listen++] = e->fd;
    }
  }
  in_flags &= ~SF_SOCKET_ACTIVATED;
  return n_in_listen > 0 ? 0 : -1;
}

/* A restart through the store: systemd started this process with the
 * previous one's state and sockets among LISTEN_FDS. */
static void
store_init (void)
{
  char **sock_names = NULL;
  int nsock = store_scan (&sock_names);
  if (nsock < 0)
    return;
  from_store = true;
  struct stored *state = NULL;
  for (int i = 0; i < st_n; i++)
    if (st_fds[i].kind == SK_STATE)
      state = &st_fds[i];         /* sorted: the last has the latest generation */
  uint8_t *buf = NULL;
  size_t len = 0;
  if (state) {
    st_gen = state->gen;
    buf = state_read (state->fd, &len);
  }
  struct reader r = { buf, buf + len, !buf };
  if (!state)
    log_error ("restart: %d fd(s) in systemd's file descriptor store but no state; "
               "closing them", st_n);
  else if (r.bad || parse_preamble (&r) == -1)
    log_error ("restart: cannot use the state in systemd's file descriptor store; "
               "closing its connections");
  else if (store_listeners (nsock) == -1)
    log_error ("restart: no listening socket to serve from the file descriptor store; "
               "closing its connections");
  else if (parse_conns (&r) == -1) {
    log_error ("restart: cannot read the connections in the file descriptor store; "
               "closing them");
    for (int i = 0; i < st_n; i++)
      if (st_fds[i].kind == SK_CONN)
        st_fds[i].used = false;
  }
  else
    log_info ("restart: state of restart %llu from systemd's file descriptor store, "
              "%u connection(s)", (unsigned long long) st_gen, n_in_conns);
  free (buf);
  store_close_unused ();
  free (st_fds);
  st_fds = NULL;
  st_n = 0;
  if (n_in_listen > 0) {
    unsetenv ("LISTEN_PID");
    unsetenv ("LISTEN_FDS");
    unsetenv ("LISTEN_FDNAMES");
    inherit_done ();
  }
  else if (nsock > 0) {
    /* listen.c takes the socket unit's fds as on any start. */
    size_t need = 1;
    for (int i = 0; i < nsock; i++)
      need += strlen (sock_names[i] ? sock_names[i] : "") + 1;
    char *joined = calloc (1, need), num[16];
    for (int i = 0; joined && i < nsock; i++) {
      if (i)
        strcat (joined, ":");
      strcat (joined, sock_names[i] ? sock_names[i] : "");
    }
    snprintf (num, sizeof num, "%d", nsock);
    setenv ("LISTEN_FDS", num, 1);
    if (joined)
      setenv ("LISTEN_FDNAMES", joined, 1);
    free (joined);
  }
  else {
    unsetenv ("LISTEN_PID");
    unsetenv ("LISTEN_FDS");
    unsetenv ("LISTEN_FDNAMES");
  }
  for (int i = 0; i < nsock; i++)
    free (sock_names[i]);
  free (sock_names);
}

void
restart_init (void)
{
  /* The hooks conn.c and shard.c report through (set before the shards
   * start, so their threads only ever read them). */
  conn_handoff_hook = restart_conn_progress;
  shard_conn_gone_hook = restart_shard_conn_gone;
  const char *env = getenv (RESTART_ENV);
  if (!env) {
    store_init ();
    return;
  }
  char val[32];
  snprintf (val, sizeof val, "%s", env);
  unsetenv (RESTART_ENV);
  /* Started by a live restart even if the state turns out bad: the first
   * image forked and dropped privileges already. */
  adopting = true;
  char *end;
  long fd = strtol (val, &end, 10);
  size_t len = 0;
  uint8_t *buf = NULL;
  if (val[0] != '\0' && !*end && fd > STDERR_FILENO && fd <= INT_MAX) {
    buf = state_read ((int) fd, &len);
    close ((int) fd);
  }
  if (!buf) {
    log_error ("live restart: %s=%s does not name a state file; starting afresh",
               RESTART_ENV, val);
    close_inherited_sockets (NULL, 0);
    return;
  }
  struct reader r = { buf, buf + len, false };
  if (parse_preamble (&r) == -1) {
    log_error ("live restart: cannot use the state passed by the previous image; "
               "starting afresh");
    n_in_listen = 0;
    close_inherited_sockets (NULL, 0);
  }
  else if (parse_conns (&r) == -1) {
    log_error ("live restart: cannot read the connections in the state; keeping the "
               "listening sockets only");
    close_inherited_sockets (in_listen, n_in_listen);
  }
  inherit_done ();
  free (buf);
}

int
restart_listeners (int (*add) (int fd), bool *unix_created)
{
  if (n_in_listen == 0)
    return 0;
  for (int i = 0; i < n_in_listen; i++)
    if (add (in_listen[i]) == -1)
      return -1;
  if (in_flags & SF_SOCKET_ACTIVATED)
    cfg.socket_activated = true;
  if (in_flags & SF_UNIX_CREATED)
    *unix_created = true;
  return n_in_listen;
}

/* On the shard's thread: the export is opened again through the layer
 * stack and must say what the handshake told the client, or the client
 * would be served a different disk than the one it negotiated. */
static void
shard_adopt (struct shard *s, void *arg)
{
  struct handed *list = arg;
  for (struct handed *h = list; h; h = h->next) {
    struct conn *c = shard_conn_adopt (s, h->fd, h->peer);
    if (!c) {
      log_error ("live restart: peer %s: cannot set up the connection: %m; closing", h->peer);
      close (h->fd);
      continue;
    }
    h->fd = -1;                   /* the connection's now */
    log_current = &c->log;
    c->structured = h->cflags & CF_STRUCTURED;
    c->meta_base_allocation = h->cflags & CF_META_BASE_ALLOC;
    c->no_zeroes = h->cflags & CF_NO_ZEROES;
    c->extended = h->cflags & CF_EXTENDED;
    c->fixed_newstyle = true;
    c->export_name = h->name;
    h->name = NULL;
    if (backend_conn_preconnect (&c->pc, cfg.readonly) == -1
        || backend_conn_open (&c->pc, c->export_name, cfg.readonly) == -1) {
      log_error ("live restart: export \"%s\" cannot be opened again; closing",
                 c->export_name);
      conn_close_now (c);
      continue;
    }
    uint32_t bs[3];
    handshake_block_sizes (c, &bs[0], &bs[1], &bs[2]);
    uint16_t eflags = handshake_export_flags (c);
    if ((uint64_t) c->pc.caps.size != h->size || eflags != h->eflags
        || memcmp (bs, h->bs, sizeof bs) != 0) {
      log_error ("live restart: export \"%s\" changed (size %llu, flags 0x%x; was %llu, "
                 "0x%x); closing", c->export_name, (unsigned long long) c->pc.caps.size,
                 eflags, (unsigned long long) h->size, h->eflags);
      conn_close_now (c);
      continue;
    }
    c->phase = CONN_TRANSMISSION;
    event_add (c->ev_read, NULL);
    log_debug ("live restart: adopted (connection %llu before), export \"%s\"%s",
               (unsigned long long) h->old_id, c->export_name,
               c->structured ? ", structured replies" : "");
    log_current = NULL;
  }
  log_current = NULL;
  handed_free_list (list, true);
}

void
restart_adopt_conns (void)
{
  if (n_in_listen == 0)
    return;                       /* not restarted, or nothing usable passed */
  struct handed **lists = calloc (nshards, sizeof *lists);
  if (!lists) {
    log_error ("live restart: out of memory; closing the inherited connections");
    handed_free_list (in_conns, true);
    in_conns = NULL;
    return;
  }
  int i = 0;
  while (in_conns) {
    struct handed *h = in_conns;
    in_conns = h->next;
    h->next = lists[i % nshards];
    lists[i % nshards] = h;
    i++;
  }
  for (int k = 0; k < nshards; k++)
    if (lists[k] && shard_call (&shards[k], shard_adopt, lists[k]) == -1) {
      log_error ("live restart: out of memory; closing %s", "a shard's connections");
      handed_free_list (lists[k], true);
    }
  free (lists);
  log_info ("%s %llu done: serving again, %u connection(s) handed over",
            from_store ? "restart through the file descriptor store" : "live restart",
            (unsigned long long) restart_count (), n_in_conns);
}

/* ---- quiesce (old image) --------------------------------------------- */

static void
report (struct rs_shard *r)
{
  uint64_t one = 1;
  r->state = RS_QUIET;
  atomic_fetch_add (&shards_done, 1);
  if (write (done_fd, &one, sizeof one) != sizeof one)
    log_error ("live restart: eventfd write: %m");
}

/* Every connection left on the shard can change hands: tell main. */
static void
shard_check (struct shard *s)
{
  struct rs_shard *r = &rs[s->index];
  if (r->state != RS_QUIESCING)
    return;
  for (struct conn *c = s->conns; c; c = c->next)
    if (!conn_handoff_ready (c))
      return;
  report (r);
}

static void
restart_conn_progress (struct conn *c)
{
  if (conn_handoff_ready (c))
    shard_check (c->shard);
}

static void
restart_shard_conn_gone (struct shard *s)
{
  struct rs_shard *r = atomic_load_explicit (&rs, memory_order_acquire);
  if (r && s->index < rs_n && r[s->index].state == RS_QUIESCING)
    shard_check (s);
}

/* --restart-timeout on this shard: a request still half received (or its
 * reply unread) is not waited for any longer.  Its connection closes as on
 * a drain timeout: a WRITE whose payload never arrived was never
 * acknowledged. */
static void
shard_bound (struct shard *s, void *arg)
{
  if (rs[s->index].state != RS_QUIESCING)
    return;
  for (struct conn *c = s->conns, *next; c; c = next) {
    next = c->next;
    if (c->fd < 0 || conn_handoff_ready (c))
      continue;
    log_current = &c->log;
    if (c->handoff)
      log_warn ("live restart: a request still incomplete after %u s (--restart-timeout); "
                "closing the connection", cfg.restart_timeout);
    else
      log_warn ("live restart: not closed after %u s (--restart-timeout); closing now",
                cfg.restart_timeout);
    conn_close_now (c);           /* frees it once its workers are done */
    log_current = NULL;
  }
  shard_check (s);
}

static void
shard_quiesce (struct shard *s, void *arg)
{
  struct rs_shard *r = &rs[s->index];
  r->state = RS_QUIESCING;
  for (struct conn *c = s->conns, *next; c; c = next) {
    next = c->next;
    if (c->fd < 0 || c->phase == CONN_CLOSING || (c->read_block & CONN_READ_CLOSING))
      continue;                   /* on its way out already */
    if (c->tls || c->phase != CONN_TRANSMISSION) {
      log_current = &c->log;
      log_info ("live restart: %s cannot be handed over; closing it as on shutdown",
                c->tls ? "a TLS session" : "a connection still in the handshake");
      conn_shutdown (c);          /* may free c */
      log_current = NULL;
      continue;
    }
    conn_quiesce (c, true);
  }
  shard_check (s);
}

/* The restart is called off: serve on. */
static void
shard_resume (struct shard *s, void *arg)
{
  rs[s->index].state = RS_NONE;
  for (struct conn *c = s->conns; c; c = c->next)
    if (c->handoff)
      conn_quiesce (c, false);
}

/* Each connection's socket is kept (a dup without FD_CLOEXEC, for the
 * exec) and the connection freed: the plugin's .close runs here. */
static void
shard_detach (struct shard *s, void *arg)
{
  struct rs_shard *r = &rs[s->index];
  r->state = RS_NONE;
  for (struct conn *c = s->conns, *next; c; c = next) {
    next = c->next;
    log_current = &c->log;
    struct handed *h = conn_handoff_ready (c) ? calloc (1, sizeof *h) : NULL;
    if (h) {
      h->name = strdup (c->export_name ? c->export_name : "");
      h->fd = fcntl (c->fd, F_DUPFD, STDERR_FILENO + 1);
    }
    if (!h || !h->name || h->fd == -1) {
      if (conn_handoff_ready (c))
        log_error ("live restart: cannot keep the connection (%m); closing it");
      if (h) {
        free (h->name);
        free (h);
      }
      conn_close_now (c);
      log_current = NULL;
      continue;
    }
    if (c->rcvlowat > 1) {          /* the next image expects the default */
      int one = 1;
      setsockopt (c->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    }
    h->cflags = (c->structured ? CF_STRUCTURED : 0)
                | (c->meta_base_allocation ? CF_META_BASE_ALLOC : 0)
                | (c->no_zeroes ? CF_NO_ZEROES : 0)
                | (c->extended ? CF_EXTENDED : 0);
    h->size = c->pc.caps.size;
    h->eflags = handshake_export_flags (c);
    handshake_block_sizes (c, &h->bs[0], &h->bs[1], &h->bs[2]);
    h->old_id = c->id;
    snprintf (h->peer, sizeof h->peer, "%s", c->peer);
    h->next = r->out;
    r->out = h;
    r->nout++;
    log_debug ("live restart: handing over, export \"%s\"", h->name);
    conn_close_now (c);           /* our fd; the dup keeps the socket */
    log_current = NULL;
  }
  report (r);
}

static void
call_all_keep (void (*fn) (struct shard *, void *))
{
  for (int i = 0; i < nshards; i++)
    if (shard_call (&shards[i], fn, NULL) == -1) {
      /* A lost call would leave the restart waiting: the give-up timer
       * calls it off. */
      log_error ("live restart: shard %d: out of memory", i);
    }
}

/* A new phase: every shard reports again. */
static void
call_all (void (*fn) (struct shard *, void *))
{
  atomic_store (&shards_done, 0);
  call_all_keep (fn);
}

static void
restart_off (const char *why)
{
  log_error ("live restart called off: %s; still serving in this process", why);
  rphase = R_IDLE;
  evtimer_del (ev_bound);
  evtimer_del (ev_giveup);
  call_all (shard_resume);
  listen_hold (false);
  if (to_store) {
    /* SIGTERM asked for a stop: it still gets one, closing the connections. */
    log_error ("SIGTERM: stopping without the file descriptor store");
    to_store = false;
    nbdkit_shutdown ();           /* what the signal handler does, on this thread */
  }
}

static bool
exe_usable (void)
{
  struct stat st;
  if (!exe_path || !saved_argv) {
    errno = ENOENT;
    return false;
  }
  if (stat (exe_path, &st) == -1 || access (exe_path, X_OK) == -1)
    return false;
  if (!S_ISREG (st.st_mode)) {
    errno = EACCES;
    return false;
  }
  return true;
}

static void
on_bound (evutil_socket_t fd, short what, void *arg)
{
  if (rphase == R_QUIESCE)
    call_all_keep (shard_bound);
}

static void
on_giveup (evutil_socket_t fd, short what, void *arg)
{
  if (rphase == R_QUIESCE)
    restart_off ("connections did not quiesce (a plugin call still running?)");
  else if (rphase == R_DETACH)
    log_error ("live restart: shards are slow to hand over; still waiting");
}

static void
on_done (evutil_socket_t fd, short what, void *arg)
{
  uint64_t n;
  if (read (done_fd, &n, sizeof n) < 0 && errno != EAGAIN)
    log_error ("live restart: eventfd read: %m");
  if (atomic_load (&shards_done) < nshards || atomic_load (&server_stopping))
    return;
  if (rphase == R_QUIESCE) {
    /* Checked again: the binary may have gone while we waited. */
    if (!to_store && !exe_usable ()) {
      char why[PATH_MAX + 64];
      snprintf (why, sizeof why, "cannot execute %s: %m", exe_path ? exe_path : "blkd");
      restart_off (why);
      return;
    }
    rphase = R_DETACH;
    call_all (shard_detach);
  }
  else if (rphase == R_DETACH) {
    evtimer_del (ev_bound);
    evtimer_del (ev_giveup);
    int nl;
    const int *fds = listen_fds_get (&nl);
    n_out_listen = 0;
    for (int i = 0; i < nl && i < MAX_LISTEN; i++) {
      int d = fcntl (fds[i], F_DUPFD, STDERR_FILENO + 1);
      if (d == -1)
        log_error ("live restart: cannot keep listening socket %d: %m", fds[i]);
      else
        out_listen[n_out_listen++] = d;
    }
    /* listen.c made the socket file (and removes it at the final exit)
     * exactly when -U named it and systemd did not pass it. */
    out_flags = cfg.socket_activated ? SF_SOCKET_ACTIVATED
                : cfg.unix_path ? SF_UNIX_CREATED : 0;
    rphase = R_EXEC;
    event_base_loopbreak (mbase);
  }
}

/* SIGUSR2 (to_store false) or, with --fdstore under systemd, SIGTERM.
 * -1: refused, nothing paused. */
int
restart_begin (struct event_base *main_base, bool store)
{
  mbase = main_base;
  if (rphase != R_IDLE) {
    if (store && !to_store) {
      /* The unit is stopping: an exec now would outlive the stop. */
      log_info ("SIGTERM: the live restart under way goes to the file descriptor store "
                "instead of exec");
      to_store = true;
    }
    else
      log_warn ("live restart: already under way");
    return 0;
  }
  if (!store && !exe_usable ()) {
    log_error ("live restart refused: cannot execute %s: %m; still serving in this process",
               exe_path ? exe_path : "the binary");
    return -1;
  }
  if (done_fd < 0) {
    done_fd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
    ev_done = done_fd >= 0 ? event_new (mbase, done_fd, EV_READ | EV_PERSIST, on_done, NULL)
                           : NULL;
    ev_bound = evtimer_new (mbase, on_bound, NULL);
    ev_giveup = evtimer_new (mbase, on_giveup, NULL);
    struct rs_shard *r = calloc (nshards, sizeof *r);
    rs_n = nshards;
    atomic_store_explicit (&rs, r, memory_order_release);
    if (!ev_done || !ev_bound || !ev_giveup || !r || event_add (ev_done, NULL) == -1) {
      log_error ("live restart refused: cannot set up: %m");
      return -1;                  /* restart_cleanup frees what was made */
    }
  }
  to_store = store;
  if (store)
    log_info ("SIGTERM: quiescing %u connection(s) for systemd's file descriptor store",
              shard_total_conns ());
  else
    log_info ("live restart: quiescing %u connection(s), then exec %s",
              shard_total_conns (), exe_path);
  rphase = R_QUIESCE;
  listen_hold (true);
  /* The shards close what they must after --restart-timeout; past that
   * only a plugin call that never returns holds us. */
  struct timeval tv = { .tv_sec = cfg.restart_timeout };
  evtimer_add (ev_bound, &tv);
  tv.tv_sec += 5;
  evtimer_add (ev_giveup, &tv);
  call_all (shard_quiesce);
  return 0;
}

/* ---- exec ------------------------------------------------------------ */

struct writer {
  struct outbuf out;
  bool bad;
};

static void
wr (struct writer *w, const void *p, size_t n)
{
  if (!w->bad && outbuf_append (&w->out, p, n) == -1)
    w->bad = true;
}

static void wr32 (struct writer *w, uint32_t v) { wr (w, &v, 4); }
static void wr64 (struct writer *w, uint64_t v) { wr (w, &v, 8); }

/* SLOTS (the store): each fd field holds the record's slot, which names
 * the fd in the store, not the fd number. */
static int
write_state (bool slots)
{
  struct writer w = { 0 };
  uint32_t nconns = 0;
  for (int i = 0; i < rs_n; i++)
    nconns += rs[i].nout;
  uint32_t exe_len = strlen (exe_path);
  wr (&w, STATE_MAGIC, 8);
  wr32 (&w, n_out_listen);
  wr32 (&w, out_flags);
  for (int i = 0; i < n_out_listen; i++) {
    int32_t fd = slots ? i : out_listen[i];
    wr (&w, &fd, 4);
  }
  wr32 (&w, STATE_VERSION);
  wr32 (&w, nconns);
  wr64 (&w, restart_count ());
  wr64 (&w, restart_handed_total ());
  wr32 (&w, exe_len);
  wr (&w, exe_path, exe_len);
  int32_t slot = 0;
  for (int i = 0; i < rs_n; i++)
    for (struct handed *h = rs[i].out; h; h = h->next) {
      int32_t fd = slots ? slot++ : h->fd;
      wr (&w, &fd, 4);
      wr32 (&w, h->cflags);
      wr64 (&w, h->size);
      wr64 (&w, h->old_id);
      wr32 (&w, h->eflags);
      for (int k = 0; k < 3; k++)
        wr32 (&w, h->bs[k]);
      uint32_t pl = strlen (h->peer), nl = strlen (h->name);
      wr32 (&w, pl);
      wr32 (&w, nl);
      wr (&w, h->peer, pl);
      wr (&w, h->name, nl);
    }
  int fd = w.bad ? -1 : memfd_create ("blkd-restart", 0);   /* no CLOEXEC: for exec */
  size_t off = 0;
  while (fd >= 0 && off < w.out.len) {
    ssize_t n = write (fd, w.out.data + off, w.out.len - off);
    if (n <= 0) {
      close (fd);
      fd = -1;
      break;
    }
    off += n;
  }
  if (fd < 0)
    log_error ("live restart: cannot write the state: %m");
  free (w.out.data);
  return fd;
}

/* One fd into the store under NAME; systemd keeps its own copy. */
static int
store_put (const char *name, int fd)
{
  char msg[128];
  snprintf (msg, sizeof msg, "FDSTORE=1\nFDNAME=%s", name);
  return sdnotify_send (msg, &fd, 1);
}

/* The state first, so that the store's room goes to it before any
 * connection; then the listeners blkd bound itself (a socket unit keeps
 * its own), then each connection.  Whatever systemd refuses (store full)
 * it closes and logs; the next process skips those records. */
static int
store_handover (uint32_t nconns)
{
  uint64_t gen = restart_count ();
  char name[64];
  int fd = write_state (true);
  if (fd < 0)
    return -1;
  snprintf (name, sizeof name, STORE_PREFIX "%llu-state", (unsigned long long) gen);
  int r = store_put (name, fd);
  close (fd);
  if (r == -1) {
    log_error ("SIGTERM: cannot send the state to systemd (%s): %m; every connection closes",
               getenv ("NOTIFY_SOCKET"));
    return -1;
  }
  unsigned lost = 0;
  if (!(out_flags & SF_SOCKET_ACTIVATED))
    for (int i = 0; i < n_out_listen; i++) {
      snprintf (name, sizeof name, STORE_PREFIX "%llu-l%d", (unsigned long long) gen, i);
      if (store_put (name, out_listen[i]) == -1)
        log_error ("SIGTERM: cannot store listening socket %d: %m", i);
    }
  uint32_t slot = 0;
  for (int i = 0; i < rs_n; i++)
    for (struct handed *h = rs[i].out; h; h = h->next, slot++) {
      snprintf (name, sizeof name, STORE_PREFIX "%llu-c%u", (unsigned long long) gen, slot);
      if (store_put (name, h->fd) == -1 && lost++ == 0)
        log_error ("SIGTERM: cannot store a connection (peer %s): %m; it closes", h->peer);
    }
  /* systemd must have read every message before it sees us exit. */
  if (sdnotify_barrier (STORE_BARRIER_MS) == -1)
    log_warn ("SIGTERM: systemd did not confirm the file descriptor store: %m");
  log_info ("SIGTERM: %u connection(s) in systemd's file descriptor store (restart %llu); "
            "they close when the unit stops, or the next start serves them",
            nconns - lost, (unsigned long long) gen);
  sdnotify_close ();
  return 0;
}

int
restart_exec (void)
{
  uint32_t nconns = 0;
  for (int i = 0; i < rs_n; i++)
    nconns += rs[i].nout;
  atomic_fetch_add (&restarts, 1);
  atomic_fetch_add (&handed_total, nconns);
  if (to_store) {
    int r = store_handover (nconns);
    for (int i = 0; i < n_out_listen; i++)
      close (out_listen[i]);
    n_out_listen = 0;
    rphase = R_IDLE;
    restart_cleanup ();
    return r;
  }
  /* Until the next image installs its handler, another SIGUSR2 is
   * dropped instead of killing us (an ignored signal stays ignored
   * across execve). */
  signal (SIGUSR2, SIG_IGN);
  int fd = write_state (false);
  if (fd >= 0) {
    char num[16];
    snprintf (num, sizeof num, "%d", fd);
    setenv (RESTART_ENV, num, 1);
    log_info ("live restart %llu: exec %s with %u connection(s)",
              (unsigned long long) restart_count (), exe_path, nconns);
    execv (exe_path, saved_argv);
    log_error ("live restart: exec %s: %m; starting the running binary again instead",
               exe_path);
    /* The file this process runs, even if it was renamed or deleted:
     * the connections survive on the old code rather than being lost. */
    execv ("/proc/self/exe", saved_argv);
    log_error ("live restart: exec /proc/self/exe: %m; exiting, every connection closes");
    unsetenv (RESTART_ENV);
    close (fd);
  }
  for (int i = 0; i < n_out_listen; i++)
    close (out_listen[i]);
  n_out_listen = 0;
  rphase = R_IDLE;
  restart_cleanup ();
  return -1;
}

static void
store_names_free (void)
{
  for (int i = 0; i < st_nnames; i++)
    free (st_names[i]);
  free (st_names);
  st_names = NULL;
  st_nnames = 0;
}

/* Serving: what this process took from the store leaves it (systemd's
 * copy of a connection would keep it open after we close it), then
 * READY=1 (Type=notify) under any service manager. */
void
restart_ready (void)
{
  if (!sdnotify_available ()) {
    store_names_free ();
    return;
  }
  for (int i = 0; i < st_nnames; i++) {
    char msg[300];
    snprintf (msg, sizeof msg, "FDSTOREREMOVE=1\nFDNAME=%s", st_names[i]);
    if (sdnotify_send (msg, NULL, 0) == -1)
      log_error ("restart: cannot remove \"%s\" from systemd's file descriptor store: %m; "
                 "its connection stays open until the unit stops", st_names[i]);
  }
  store_names_free ();
  if (sdnotify_send ("READY=1", NULL, 0) == -1)
    log_warn ("cannot tell systemd we are ready (%s): %m", getenv ("NOTIFY_SOCKET"));
}

void
restart_cleanup (void)
{
  if (ev_done)
    event_free (ev_done);
  if (ev_bound)
    event_free (ev_bound);
  if (ev_giveup)
    event_free (ev_giveup);
  ev_done = ev_bound = ev_giveup = NULL;
  if (done_fd >= 0)
    close (done_fd);
  done_fd = -1;
  if (rphase == R_EXEC)
    return;                       /* restart_exec needs the rest */
  struct rs_shard *r = atomic_exchange (&rs, NULL);
  for (int i = 0; r && i < rs_n; i++)
    handed_free_list (r[i].out, true);
  free (r);
  handed_free_list (in_conns, true);
  in_conns = NULL;
  free (exe_path);
  exe_path = NULL;
  free_argv ();
  store_names_free ();
  sdnotify_close ();
}
