/* gateopen test plugin: an .open, a .list_exports and a .pread that wait for the test to let them go, to show who else waits meanwhile. */

/* gate=DIR.  Opening an export whose name starts with "slow" (and listing
 * the exports, when DIR/list.hold exists) first creates DIR/NAME.entered
 * (DIR/list.entered), then waits until DIR/NAME.release
 * (DIR/list.release) exists: the test decides when the call returns, so
 * it can check what the server did meanwhile without timing anything.
 * Waits at most 60 s, then fails the call.  Other exports open at once.
 * The disk is 1 MiB of the byte 0x5a, read-only.
 *
 * A read on the export "peer" waits for DIR/pread.release the same way,
 * then asks for its client's address (nbdkit_peer_name) and sleeps
 * (nbdkit_nanosleep, 30 s, which a hang-up cuts short), and writes what
 * they said to DIR/pread.peer: "port N" or "port error", then "sleep R"
 * (R the return value).  The test hangs the client up while the read is
 * held and checks that the read still sees its own, gone, client. */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static const char *gate_dir;

static int
gateopen_config (const char *key, const char *value)
{
  if (strcmp (key, "gate") == 0) {
    gate_dir = value;
    return 0;
  }
  nbdkit_error ("unknown parameter '%s'", key);
  return -1;
}

static int
gateopen_config_complete (void)
{
  if (!gate_dir) {
    nbdkit_error ("gate=DIR is required");
    return -1;
  }
  return 0;
}

/* Say we are in, then wait for the release file (bounded). */
static int
gate_wait (const char *what)
{
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/%s.entered", gate_dir, what);
  int fd = open (path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd == -1) {
    nbdkit_error ("%s: %m", path);
    return -1;
  }
  close (fd);
  snprintf (path, sizeof path, "%s/%s.release", gate_dir, what);
  for (int i = 0; i < 6000; i++) {
    if (access (path, F_OK) == 0)
      return 0;
    struct timespec ts = { 0, 10 * 1000 * 1000 };
    nanosleep (&ts, NULL);
  }
  nbdkit_error ("%s never appeared", path);
  return -1;
}

static int plain_handle, peer_handle;

static void *
gateopen_open (int readonly)
{
  const char *name = nbdkit_export_name ();
  if (name && strncmp (name, "slow", 4) == 0 && gate_wait (name) == -1)
    return NULL;
  return name && strcmp (name, "peer") == 0 ? &peer_handle : &plain_handle;
}

/* The client's port, or -1. */
static int
peer_port (void)
{
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (nbdkit_peer_name ((struct sockaddr *) &ss, &len) == -1)
    return -1;
  if (ss.ss_family == AF_INET)
    return ntohs (((struct sockaddr_in *) &ss)->sin_port);
  if (ss.ss_family == AF_INET6)
    return ntohs (((struct sockaddr_in6 *) &ss)->sin6_port);
  return -1;
}

/* The held read of export "peer": what the plugin sees of its client. */
static int
peer_read (void)
{
  char path[PATH_MAX];
  if (gate_wait ("pread") == -1)
    return -1;
  int port = peer_port ();
  int slept = nbdkit_nanosleep (30, 0);
  snprintf (path, sizeof path, "%s/pread.peer.tmp", gate_dir);
  FILE *f = fopen (path, "w");
  if (!f) {
    nbdkit_error ("%s: %m", path);
    return -1;
  }
  if (port >= 0)
    fprintf (f, "port %d\n", port);
  else
    fprintf (f, "port error\n");
  fprintf (f, "sleep %d\n", slept);
  char final[PATH_MAX];
  snprintf (final, sizeof final, "%s/pread.peer", gate_dir);
  if (fclose (f) != 0 || rename (path, final) == -1) {
    nbdkit_error ("%s: %m", final);
    return -1;
  }
  return 0;
}

static int
gateopen_list_exports (int readonly, int is_tls, struct nbdkit_exports *e)
{
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/list.hold", gate_dir);
  if (access (path, F_OK) == 0 && gate_wait ("list") == -1)
    return -1;
  if (nbdkit_add_export (e, "fast", NULL) == -1
      || nbdkit_add_export (e, "slow", NULL) == -1)
    return -1;
  return 0;
}

static int64_t
gateopen_get_size (void *handle)
{
  return 1024 * 1024;
}

static int
gateopen_can_write (void *handle)
{
  return 0;
}

static int
gateopen_pread (void *handle, void *buf, uint32_t count, uint64_t offset, uint32_t flags)
{
  if (handle == &peer_handle && peer_read () == -1)
    return -1;
  memset (buf, 0x5a, count);
  return 0;
}

static struct nbdkit_plugin plugin = {
  .name = "gateopen",
  .config = gateopen_config,
  .config_complete = gateopen_config_complete,
  .open = gateopen_open,
  .list_exports = gateopen_list_exports,
  .get_size = gateopen_get_size,
  .can_write = gateopen_can_write,
  .pread = gateopen_pread,
};

NBDKIT_REGISTER_PLUGIN (plugin)
