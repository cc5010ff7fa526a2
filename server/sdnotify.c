/* Messages to the service manager over $NOTIFY_SOCKET: sd_notify(3)'s
 * datagram protocol (READY=1, the file descriptor store, BARRIER=1),
 * written here in a few lines instead of linking libsystemd. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"

#define SDNOTIFY_MAX_FDS 4

static int notify_fd = -1;
static struct sockaddr_un notify_addr;
static socklen_t notify_len;

/* The address in $NOTIFY_SOCKET: a path, or '@' for the abstract
 * namespace.  systemd 252 uses /run/systemd/notify; later ones may name a
 * vsock address ("vsock:CID:PORT") for a VM's manager, which is not a
 * service manager that keeps our fds and is refused here. */
static int
notify_address (void)
{
  const char *path = getenv ("NOTIFY_SOCKET");
  if (!path || (path[0] != '/' && path[0] != '@') || path[1] == '\0') {
    errno = path ? EAFNOSUPPORT : ENOENT;
    return -1;
  }
  size_t len = strlen (path);
  if (len >= sizeof notify_addr.sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memset (&notify_addr, 0, sizeof notify_addr);
  notify_addr.sun_family = AF_UNIX;
  memcpy (notify_addr.sun_path, path, len);
  if (path[0] == '@')
    notify_addr.sun_path[0] = '\0';
  notify_len = offsetof (struct sockaddr_un, sun_path) + len;
  return 0;
}

bool
sdnotify_available (void)
{
  return notify_address () == 0;
}

int
sdnotify_send (const char *msg, const int *fds, int nfds)
{
  if (nfds < 0 || nfds > SDNOTIFY_MAX_FDS) {
    errno = EINVAL;
    return -1;
  }
  if (notify_fd < 0) {
    if (notify_address () == -1)
      return -1;
    notify_fd = socket (AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (notify_fd < 0)
      return -1;
  }
  struct iovec iov = { .iov_base = (void *) msg, .iov_len = strlen (msg) };
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE (sizeof (int) * SDNOTIFY_MAX_FDS)];
  } ctl;
  struct msghdr mh = {
    .msg_name = &notify_addr, .msg_namelen = notify_len,
    .msg_iov = &iov, .msg_iovlen = 1,
  };
  if (nfds > 0) {
    memset (&ctl, 0, sizeof ctl);
    mh.msg_control = ctl.buf;
    mh.msg_controllen = CMSG_SPACE (sizeof (int) * nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR (&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN (sizeof (int) * nfds);
    memcpy (CMSG_DATA (c), fds, sizeof (int) * nfds);
  }
  /* The manager learns who sent it from the credentials the kernel
   * attaches (it sets SO_PASSCRED): NotifyAccess=main checks our PID. */
  ssize_t n;
  do
    n = sendmsg (notify_fd, &mh, MSG_NOSIGNAL);
  while (n == -1 && errno == EINTR);
  if (n == (ssize_t) iov.iov_len)
    return 0;
  if (n >= 0)
    errno = EMSGSIZE;             /* a datagram goes whole or not at all */
  return -1;
}

/* BARRIER=1 with the write end of a pipe: the manager closes its copy
 * once it has handled every message sent before, so our end's POLLHUP
 * says all of them arrived (systemd >= 246). */
int
sdnotify_barrier (int timeout_ms)
{
  int p[2];
  if (pipe2 (p, O_CLOEXEC) == -1)
    return -1;
  int r = sdnotify_send ("BARRIER=1", &p[1], 1);
  close (p[1]);
  if (r == 0) {
    struct pollfd pf = { .fd = p[0], .events = POLLIN };
    do
      r = poll (&pf, 1, timeout_ms);
    while (r == -1 && errno == EINTR);
    if (r == 0) {
      errno = ETIMEDOUT;
      r = -1;
    }
    else if (r > 0)
      r = 0;
  }
  int saved = errno;
  close (p[0]);
  errno = saved;
  return r;
}

void
sdnotify_close (void)
{
  if (notify_fd >= 0)
    close (notify_fd);
  notify_fd = -1;
}
