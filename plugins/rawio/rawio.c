/* rawio plugin: serve a regular file or block device with pread/pwrite, optional O_DIRECT. */

/* Each connection (open) gets its own file descriptors, so nothing here is
 * shared between connections except the file itself and a few read-only
 * globals set during configuration.  There is no lock anywhere:
 *
 * - pread/pwrite are positional, so one fd serves parallel requests.
 * - Block status uses lseek(SEEK_DATA/SEEK_HOLE) on the handle's own
 *   buffered fd.  lseek moves the fd's file position, which we never use,
 *   and the kernel serialises lseek callers of one open file description
 *   (f_pos_lock), so concurrent block-status calls on one connection queue
 *   in the kernel; different connections never contend.  (nbdkit's file
 *   plugin takes a process-wide mutex here instead.)
 * - flush is fdatasync on the handle's fd.  Dirty data lives in the
 *   inode's page cache, not in the fd, so one connection's flush covers
 *   every connection's writes: that is what makes multi-conn safe.
 *
 * direct=true opens the file O_DIRECT and advertises the device's (or the
 * filesystem's) direct-I/O alignment as the minimum block size.  blkd
 * hands plugins page-aligned buffers, so its requests go straight from the
 * device into the reply buffer.  nbdkit's per-thread buffers are not
 * aligned (malloc), so there we read/write through a posix_memalign'd
 * bounce buffer, allocated per request: correct, but a copy and an
 * allocation per request.  A request whose offset or length is not
 * aligned (a client that ignored the block size) goes through a second,
 * buffered fd on the same file; Linux writes back and invalidates the page
 * cache around direct I/O, so the two views stay coherent for requests
 * that don't overlap in time (NBD promises nothing for those that do).
 *
 * Under blkd (include/blkd-plugin.h), direct=false READs of cached
 * ranges on clear-text connections are not read here at all: blkd asks
 * for the fd and offset and the kernel sends the page cache with
 * sendfile.  direct=true keeps the pool path: the page cache is what
 * O_DIRECT avoids.
 */

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "blkd-plugin.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

#define RAWIO_DEFAULT_ALIGN 4096
#define RAWIO_MAX_ALIGN     65536   /* NBD caps the minimum block size here */

static char *rawio_file;
static bool rawio_direct;
static bool rawio_readonly;
static bool rawio_is_block;
static uint32_t rawio_align = RAWIO_DEFAULT_ALIGN;
static int rawio_rotational;

struct rawio_handle {
  int fd;        /* O_DIRECT when direct=true, else the only fd */
  int bfd;       /* buffered fd; == fd when direct=false */
  bool writable;
};

static void
rawio_unload(void)
{
  free(rawio_file);
}

static int
rawio_config(const char *key, const char *value)
{
  int r;

  if (strcmp(key, "file") == 0) {
    free(rawio_file);
    rawio_file = nbdkit_realpath(value);
    return rawio_file ? 0 : -1;
  }
  if (strcmp(key, "direct") == 0) {
    if ((r = nbdkit_parse_bool(value)) == -1)
      return -1;
    rawio_direct = r;
    return 0;
  }
  if (strcmp(key, "readonly") == 0) {
    if ((r = nbdkit_parse_bool(value)) == -1)
      return -1;
    rawio_readonly = r;
    return 0;
  }
  nbdkit_error("rawio: unknown parameter '%s'", key);
  return -1;
}

/* /sys/dev/block/M:m/queue/rotational exists for whole disks; a
 * partition's queue is its parent's, one directory up.  Unreadable means
 * we don't know: say non-rotational, which only affects client hints. */
static int
rawio_read_rotational(dev_t rdev)
{
  char path[128];
  FILE *f;
  int v = 0;

  snprintf(path, sizeof path, "/sys/dev/block/%u:%u/queue/rotational",
           major(rdev), minor(rdev));
  f = fopen(path, "r");
  if (!f) {
    snprintf(path, sizeof path, "/sys/dev/block/%u:%u/../queue/rotational",
             major(rdev), minor(rdev));
    f = fopen(path, "r");
  }
  if (!f)
    return 0;
  if (fscanf(f, "%d", &v) != 1)
    v = 0;
  fclose(f);
  return v != 0;
}

/* Direct-I/O alignment: the logical block size for a block device, the
 * statx DIOALIGN answer for a file (Linux 6.1+), else 4096, which is
 * safe on every common filesystem.  Memory and offset alignment are
 * folded into one number: stricter than needed, never too lax. */
static int
rawio_probe_align(int fd)
{
  uint32_t a = 0;

  if (rawio_is_block) {
    int lbs = 0;
    if (ioctl(fd, BLKSSZGET, &lbs) == 0 && lbs > 0)
      a = lbs;
  }
#ifdef STATX_DIOALIGN
  else {
    struct statx stx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
        (stx.stx_mask & STATX_DIOALIGN)) {
      if (stx.stx_dio_offset_align == 0) {
        nbdkit_error("rawio: %s: the filesystem reports no O_DIRECT support",
                     rawio_file);
        return -1;
      }
      a = stx.stx_dio_offset_align > stx.stx_dio_mem_align
        ? stx.stx_dio_offset_align : stx.stx_dio_mem_align;
    }
  }
#endif
  if (a == 0)
    a = RAWIO_DEFAULT_ALIGN;
  if (a < 512)
    a = 512;
  if ((a & (a - 1)) != 0 || a > RAWIO_MAX_ALIGN) {
    nbdkit_error("rawio: %s: direct-I/O alignment %" PRIu32 " is not a power "
                 "of two up to 64K", rawio_file, a);
    return -1;
  }
  rawio_align = a;
  return 0;
}

static int
rawio_config_complete(void)
{
  struct stat st;
  int fd, r;

  if (!rawio_file) {
    nbdkit_error("rawio: file=PATH is required");
    return -1;
  }
  if (stat(rawio_file, &st) == -1) {
    nbdkit_error("rawio: stat %s: %m", rawio_file);
    return -1;
  }
  if (S_ISBLK(st.st_mode)) {
    rawio_is_block = true;
    rawio_rotational = rawio_read_rotational(st.st_rdev);
  }
  else if (!S_ISREG(st.st_mode)) {
    nbdkit_error("rawio: %s is neither a regular file nor a block device",
                 rawio_file);
    return -1;
  }

  if (!rawio_direct) {
    if (!rawio_is_block)
      return 0;
    /* Devices need logical-block alignment for the discard and zero
     * ioctls even without O_DIRECT. */
    fd = open(rawio_file, O_RDONLY | O_CLOEXEC);
    if (fd == -1) {
      nbdkit_error("rawio: open %s: %m", rawio_file);
      return -1;
    }
    r = rawio_probe_align(fd);
    close(fd);
    return r;
  }
  /* Fail at start-up, loudly, rather than on the first request: tmpfs
   * and some FUSE filesystems refuse O_DIRECT at open time. */
  fd = open(rawio_file, O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd == -1) {
    if (errno == EINVAL)
      nbdkit_error("rawio: %s: direct=true but this filesystem does not "
                   "support O_DIRECT (use direct=false)", rawio_file);
    else
      nbdkit_error("rawio: open %s O_DIRECT: %m", rawio_file);
    return -1;
  }
  r = rawio_probe_align(fd);
  close(fd);
  return r;
}

#define rawio_config_help \
  "file=<PATH>       (required) File or block device to serve (magic key).\n" \
  "direct=<BOOL>     Open with O_DIRECT (default false).\n" \
  "readonly=<BOOL>   Serve read-only (default false)."

static void
rawio_dump_plugin(void)
{
  printf("rawio_direct=yes\n");
  printf("rawio_fua=rwf_dsync\n");
  printf("rawio_default_align=%d\n", RAWIO_DEFAULT_ALIGN);
}

static void *
rawio_open(int readonly)
{
  struct rawio_handle *h;
  bool want_write = !readonly && !rawio_readonly;
  int mode = want_write ? O_RDWR : O_RDONLY;

  h = malloc(sizeof *h);
  if (!h) {
    nbdkit_error("rawio: malloc: %m");
    return NULL;
  }
  h->writable = want_write;
  h->bfd = open(rawio_file, mode | O_CLOEXEC);
  if (h->bfd == -1 && want_write &&
      (errno == EACCES || errno == EROFS || errno == EPERM)) {
    /* Like nbdkit's file plugin: a file we may only read is still served,
     * read-only, rather than refused. */
    nbdkit_debug("rawio: %s is not writable (%m), serving read-only",
                 rawio_file);
    h->writable = false;
    mode = O_RDONLY;
    h->bfd = open(rawio_file, mode | O_CLOEXEC);
  }
  if (h->bfd == -1) {
    nbdkit_error("rawio: open %s: %m", rawio_file);
    free(h);
    return NULL;
  }
  h->fd = h->bfd;
  if (rawio_direct) {
    h->fd = open(rawio_file, mode | O_DIRECT | O_CLOEXEC);
    if (h->fd == -1) {
      nbdkit_error("rawio: open %s O_DIRECT: %m", rawio_file);
      close(h->bfd);
      free(h);
      return NULL;
    }
  }
  return h;
}

static void
rawio_close(void *handle)
{
  struct rawio_handle *h = handle;

  if (h->fd != h->bfd)
    close(h->fd);
  close(h->bfd);
  free(h);
}

static int64_t
rawio_get_size(void *handle)
{
  struct rawio_handle *h = handle;
  struct stat st;
  uint64_t size;

  if (rawio_is_block) {
    if (ioctl(h->bfd, BLKGETSIZE64, &size) == -1) {
      nbdkit_error("rawio: BLKGETSIZE64 %s: %m", rawio_file);
      return -1;
    }
    return size;
  }
  if (fstat(h->bfd, &st) == -1) {
    nbdkit_error("rawio: fstat %s: %m", rawio_file);
    return -1;
  }
  return st.st_size;
}

static int
rawio_can_write(void *handle)
{
  struct rawio_handle *h = handle;
  return h->writable;
}

static int
rawio_can_true(void *handle)
{
  return 1;
}

static int
rawio_can_fua(void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

static int
rawio_can_cache(void *handle)
{
  return NBDKIT_CACHE_NATIVE;
}

static int
rawio_can_extents(void *handle)
{
  /* Block devices have no SEEK_DATA; the server then reports all data. */
  return !rawio_is_block;
}

static int
rawio_is_rotational(void *handle)
{
  return rawio_rotational;
}

static int
rawio_block_size(void *handle, uint32_t *minimum, uint32_t *preferred,
                 uint32_t *maximum)
{
  if (!rawio_direct) {
    *minimum = *preferred = *maximum = 0;   /* no constraint to report */
    return 0;
  }
  *minimum = rawio_align;
  *preferred = rawio_align > 4096 ? rawio_align : 4096;
  *maximum = 0xffffffff;
  return 0;
}

static bool
rawio_misaligned(uint64_t v)
{
  return (v & (rawio_align - 1)) != 0;
}

/* Read all of [offset, offset+count) from fd.  A short read continues on
 * bfd (an O_DIRECT fd can't continue at an unaligned offset), and EOF
 * zero-fills the rest explicitly so no caller byte is left unwritten. */
static int
rawio_read_full(int fd, int bfd, char *buf, size_t count, uint64_t offset)
{
  while (count > 0) {
    ssize_t r = pread(fd, buf, count, offset);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      nbdkit_error("rawio: pread %s at %" PRIu64 ": %m", rawio_file, offset);
      return -1;
    }
    if (r == 0) {
      memset(buf, 0, count);   /* file shrank under us: reads as zeros */
      return 0;
    }
    buf += r;
    count -= r;
    offset += r;
    fd = bfd;
  }
  return 0;
}

static int
rawio_pread(void *handle, void *buf, uint32_t count, uint64_t offset,
            uint32_t flags)
{
  struct rawio_handle *h = handle;
  void *bounce;
  int r;

  if (!rawio_direct || rawio_misaligned(offset) || rawio_misaligned(count))
    return rawio_read_full(h->bfd, h->bfd, buf, count, offset);
  if (!rawio_misaligned((uintptr_t)buf))
    return rawio_read_full(h->fd, h->bfd, buf, count, offset);

  if ((r = posix_memalign(&bounce, rawio_align, count)) != 0) {
    errno = r;
    nbdkit_error("rawio: bounce buffer of %" PRIu32 " bytes: %m", count);
    return -1;
  }
  r = rawio_read_full(h->fd, h->bfd, bounce, count, offset);
  if (r == 0)
    memcpy(buf, bounce, count);
  free(bounce);
  return r;
}

/* Write all of buf.  FUA uses RWF_DSYNC so only this write is made
 * durable; if the kernel refuses the flag we write plainly and fdatasync
 * once at the end.  As with reads, a short write continues on bfd. */
static int
rawio_write_full(int fd, int bfd, const char *buf, size_t count,
                 uint64_t offset, bool fua)
{
  int rwf = fua ? RWF_DSYNC : 0;
  bool sync_after = false;

  while (count > 0) {
    struct iovec iov = { .iov_base = (void *)buf, .iov_len = count };
    ssize_t r = pwritev2(fd, &iov, 1, offset, rwf);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      if (rwf && (errno == EOPNOTSUPP || errno == ENOSYS)) {
        rwf = 0;
        sync_after = true;
        continue;
      }
      nbdkit_error("rawio: pwrite %s at %" PRIu64 ": %m", rawio_file, offset);
      return -1;
    }
    if (r == 0) {
      errno = ENOSPC;
      nbdkit_error("rawio: pwrite %s at %" PRIu64 " wrote nothing",
                   rawio_file, offset);
      return -1;
    }
    buf += r;
    count -= r;
    offset += r;
    fd = bfd;
  }
  if (sync_after && fdatasync(fd) == -1) {
    nbdkit_error("rawio: fdatasync %s: %m", rawio_file);
    return -1;
  }
  return 0;
}

static int
rawio_pwrite(void *handle, const void *buf, uint32_t count, uint64_t offset,
             uint32_t flags)
{
  struct rawio_handle *h = handle;
  bool fua = flags & NBDKIT_FLAG_FUA;
  void *bounce;
  int r;

  if (!rawio_direct || rawio_misaligned(offset) || rawio_misaligned(count))
    return rawio_write_full(h->bfd, h->bfd, buf, count, offset, fua);
  if (!rawio_misaligned((uintptr_t)buf))
    return rawio_write_full(h->fd, h->bfd, buf, count, offset, fua);

  if ((r = posix_memalign(&bounce, rawio_align, count)) != 0) {
    errno = r;
    nbdkit_error("rawio: bounce buffer of %" PRIu32 " bytes: %m", count);
    return -1;
  }
  memcpy(bounce, buf, count);
  r = rawio_write_full(h->fd, h->bfd, bounce, count, offset, fua);
  free(bounce);
  return r;
}

static int
rawio_flush(void *handle, uint32_t flags)
{
  struct rawio_handle *h = handle;

  if (fdatasync(h->bfd) == -1) {
    nbdkit_error("rawio: fdatasync %s: %m", rawio_file);
    return -1;
  }
  return 0;
}

static int
rawio_fua_sync(struct rawio_handle *h, uint32_t flags)
{
  if (flags & NBDKIT_FLAG_FUA)
    return rawio_flush(h, 0);
  return 0;
}

static bool
rawio_unsupported(int err)
{
  return err == EOPNOTSUPP || err == ENOSYS || err == ENOTTY;
}

/* Trim is advisory: where the file or device can't deallocate, report
 * success and keep the data, which NBD allows. */
static int
rawio_trim(void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct rawio_handle *h = handle;

  if (rawio_is_block) {
    /* BLKDISCARD wants logical-block alignment: shrink the range inward
     * rather than fail, since discarding less is always allowed. */
    uint64_t a = rawio_align, range[2];
    uint64_t start = (offset + a - 1) & ~(a - 1);
    uint64_t end = (offset + count) & ~(a - 1);
    if (end > start) {
      range[0] = start;
      range[1] = end - start;
      if (ioctl(h->bfd, BLKDISCARD, range) == -1 &&
          !rawio_unsupported(errno)) {
        nbdkit_error("rawio: BLKDISCARD %s: %m", rawio_file);
        return -1;
      }
    }
  }
  else if (fallocate(h->bfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                     offset, count) == -1 && !rawio_unsupported(errno)) {
    nbdkit_error("rawio: punch hole %s: %m", rawio_file);
    return -1;
  }
  return rawio_fua_sync(h, flags);
}

/* Zero without writing zeros ourselves.  Order: punch a hole when the
 * client allows deallocation (MAY_TRIM; reclaims space and is what
 * nbdkit's file plugin does first), else ZERO_RANGE (files) or
 * BLKZEROOUT (devices).  If none applies we fail with ENOTSUP so the
 * server emulates with writes -- or, for FAST_ZERO, tells the client it
 * would be slow.  BLKZEROOUT may itself write zeros on devices without
 * a write-zeroes command, so it is not used for FAST_ZERO: only the
 * punch (the kernel's NOFALLBACK zeroout) counts as fast on a device. */
static int
rawio_zero(void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct rawio_handle *h = handle;
  bool may_trim = flags & NBDKIT_FLAG_MAY_TRIM;
  bool fast = flags & NBDKIT_FLAG_FAST_ZERO;

  if (rawio_is_block &&
      (rawio_misaligned(offset) || rawio_misaligned(count))) {
    errno = ENOTSUP;   /* the device ioctls need aligned ranges */
    return -1;
  }

  if (may_trim) {
    if (fallocate(h->bfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  offset, count) == 0)
      return rawio_fua_sync(h, flags);
    if (!rawio_unsupported(errno)) {
      nbdkit_error("rawio: punch hole %s: %m", rawio_file);
      return -1;
    }
  }

  if (!rawio_is_block) {
    if (fallocate(h->bfd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
                  offset, count) == 0)
      return rawio_fua_sync(h, flags);
    if (!rawio_unsupported(errno)) {
      nbdkit_error("rawio: zero range %s: %m", rawio_file);
      return -1;
    }
  }
  else if (!fast) {
    uint64_t range[2] = { offset, count };
    if (ioctl(h->bfd, BLKZEROOUT, range) == 0)
      return rawio_fua_sync(h, flags);
    if (!rawio_unsupported(errno)) {
      nbdkit_error("rawio: BLKZEROOUT %s: %m", rawio_file);
      return -1;
    }
  }

  errno = ENOTSUP;
  return -1;
}

static int
rawio_cache(void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct rawio_handle *h = handle;
  int r;

  /* O_DIRECT reads bypass the page cache, so prefetching would only
   * waste memory; buffered reads benefit from readahead. */
  if (rawio_direct)
    return 0;
  r = posix_fadvise(h->bfd, offset, count, POSIX_FADV_WILLNEED);
  if (r != 0) {
    errno = r;
    nbdkit_error("rawio: posix_fadvise %s: %m", rawio_file);
    return -1;
  }
  return 0;
}

/* Walk [offset, offset+count) with SEEK_DATA/SEEK_HOLE.  ENXIO from
 * SEEK_DATA means no data before EOF; ENXIO from SEEK_HOLE means the file
 * shrank under us, and the rest is reported as a hole (it reads as zeros). */
static int
rawio_extents(void *handle, uint32_t count, uint64_t offset, uint32_t flags,
              struct nbdkit_extents *extents)
{
  struct rawio_handle *h = handle;
  bool req_one = flags & NBDKIT_FLAG_REQ_ONE;
  uint64_t end = offset + count;
  uint64_t pos = offset;

  while (pos < end) {
    off_t data, hole;

    data = lseek(h->bfd, pos, SEEK_DATA);
    if (data == -1) {
      /* A filesystem without SEEK_DATA (some FUSE ones): say "data",
       * which is always a correct answer. */
      if (errno == EINVAL || errno == EOPNOTSUPP)
        return nbdkit_add_extent(extents, pos, end - pos, 0);
      if (errno != ENXIO) {
        nbdkit_error("rawio: lseek SEEK_DATA %s: %m", rawio_file);
        return -1;
      }
      data = end;
    }
    if ((uint64_t)data > pos) {
      if (nbdkit_add_extent(extents, pos, data - pos,
                            NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO) == -1)
        return -1;
      if (req_one)
        return 0;
      pos = data;
      if (pos >= end)
        break;
    }

    hole = lseek(h->bfd, pos, SEEK_HOLE);
    if (hole == -1) {
      if (errno != ENXIO) {
        nbdkit_error("rawio: lseek SEEK_HOLE %s: %m", rawio_file);
        return -1;
      }
      return nbdkit_add_extent(extents, pos, end - pos,
                               NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO);
    }
    if (nbdkit_add_extent(extents, pos, hole - pos, 0) == -1)
      return -1;
    if (req_one)
      return 0;
    pos = hole;
  }
  return 0;
}

/* cachestat(2) (Linux 6.5): how much of a range is in the page cache,
 * without mapping it.  Debian 12's headers predate it; 451 is its number
 * on every architecture. */
#ifndef SYS_cachestat
#define SYS_cachestat 451
#endif
struct rawio_cachestat_range {
  uint64_t off, len;
};
struct rawio_cachestat {
  uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};
static bool rawio_no_cachestat;

/* True when every page of the range is in the page cache. */
static bool
rawio_resident(int fd, uint64_t offset, uint32_t count)
{
  struct rawio_cachestat_range range = { offset, count };
  struct rawio_cachestat cs;
  long page = sysconf(_SC_PAGESIZE);
  uint64_t pages;

  if (__atomic_load_n(&rawio_no_cachestat, __ATOMIC_RELAXED))
    return false;
  if (syscall(SYS_cachestat, fd, &range, &cs, 0) == -1) {
    if (errno == ENOSYS)
      __atomic_store_n(&rawio_no_cachestat, true, __ATOMIC_RELAXED);
    return false;
  }
  pages = (offset + count + page - 1) / page - offset / page;
  return cs.nr_cache >= pages;
}

/* blkd's extension: the buffered fd holds the range at the same offset.
 * blkd runs sendfile on its event loop, where a page-cache miss would
 * stall every connection of that loop on the disk, so only a range that
 * is all in the page cache is lent (checked here, on a worker thread);
 * the rest is read by pread, which also brings it into the cache.  A page
 * evicted between the check and the send still costs one synchronous read.
 * Without cachestat (Linux < 6.5) nothing is lent.  The handle's fd stays
 * open until close, which blkd calls only after every reply of the
 * connection is sent or dropped. */
static int
rawio_pread_fd(void *handle, uint32_t count, uint64_t offset, uint32_t flags,
               int *fd, uint64_t *file_offset)
{
  struct rawio_handle *h = handle;

  if (rawio_direct || !rawio_resident(h->bfd, offset, count)) {
    errno = ENOTSUP;
    return -1;
  }
  *fd = h->bfd;
  *file_offset = offset;
  return 0;
}

/* Found by blkd with dlsym; nbdkit never looks for it. */
const struct blkd_plugin_extension blkd_plugin_extension = {
  .version  = BLKD_PLUGIN_EXTENSION_VERSION,
  .size     = sizeof (struct blkd_plugin_extension),
  .pread_fd = rawio_pread_fd,
};

static struct nbdkit_plugin plugin = {
  .name              = "rawio",
  .longname          = "blkd raw file / block device plugin",
  .version           = "0.1.0",
  .description       = "Serve a file or block device, optionally O_DIRECT",
  .unload            = rawio_unload,
  .config            = rawio_config,
  .config_complete   = rawio_config_complete,
  .config_help       = rawio_config_help,
  .magic_config_key  = "file",
  .dump_plugin       = rawio_dump_plugin,
  .open              = rawio_open,
  .close             = rawio_close,
  .get_size          = rawio_get_size,
  .can_write         = rawio_can_write,
  .can_flush         = rawio_can_true,
  .can_trim          = rawio_can_write,
  .can_zero          = rawio_can_write,
  .can_fast_zero     = rawio_can_true,
  .can_multi_conn    = rawio_can_true,
  .can_fua           = rawio_can_fua,
  .can_cache         = rawio_can_cache,
  .can_extents       = rawio_can_extents,
  .is_rotational     = rawio_is_rotational,
  .block_size        = rawio_block_size,
  .pread             = rawio_pread,
  .pwrite            = rawio_pwrite,
  .flush             = rawio_flush,
  .trim              = rawio_trim,
  .zero              = rawio_zero,
  .cache             = rawio_cache,
  .extents           = rawio_extents,
  .errno_is_preserved = 1,
};

NBDKIT_REGISTER_PLUGIN(plugin)
