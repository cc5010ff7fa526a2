/* blkd's optional plugin extension: lending held bytes instead of copying them, and requests completed later (docs/PLUGINS.md). */
#ifndef BLKD_PLUGIN_H
#define BLKD_PLUGIN_H

/* A plugin opts in by exporting one data symbol,
 *
 *   const struct blkd_plugin_extension blkd_plugin_extension = { ... };
 *
 * which blkd finds with dlsym after plugin_init.  nbdkit never looks for
 * it, so the same .so keeps working there through its ordinary pread and
 * pwrite.  Every call may be NULL; blkd then copies as it does for any
 * nbdkit plugin.  Calls run under the same thread-model lock as pread and
 * pwrite; nbdkit_error/nbdkit_set_error work in them.  Each returns 0, or
 * -1 with errno: ENOTSUP or E2BIG make blkd fall back to pread/pwrite for
 * this request (no error reaches the client), anything else is the
 * request's error. */

#include <stdint.h>
#include <sys/uio.h>

/* 2 added the aio calls.  blkd reads any version from 1 up to its own and
 * uses only the calls `size` says the plugin's struct holds. */
#define BLKD_PLUGIN_EXTENSION_VERSION 2

/* One lent range: pieces of memory that together hold the bytes asked
 * for, in order, each with the plugin's own token for it. */
struct blkd_lend {
  /* Set by blkd. */
  struct iovec *iov;              /* room for max pieces */
  void **token;                   /* one per piece; NULL is a valid token */
  unsigned max;
  /* Set by the plugin. */
  unsigned n;
};

/* One request started with an aio call.  blkd sets complete; the plugin
 * calls it exactly once, from any thread (its library's completion
 * thread), with 0 or the request's errno, once it will touch neither the
 * request's buffer nor this struct again.  It may even run before the aio
 * call that started the request returns.  It does not block and takes no
 * lock the plugin might hold while starting a request. */
struct blkd_aio {
  void (*complete) (struct blkd_aio *aio, int err);
};

struct blkd_plugin_extension {
  uint32_t version;               /* BLKD_PLUGIN_EXTENSION_VERSION */
  uint32_t size;                  /* sizeof (struct blkd_plugin_extension) */

  /* READ: describe [offset, offset+count) as pieces of memory the plugin
   * holds.  Until lend_release gets the tokens back, the memory must stay
   * mapped and hold this disk's bytes for that range, old or newer: never
   * freed, never reused for other data.  When more than lend->max pieces
   * would be needed, fail with E2BIG.  On any failure nothing may stay
   * lent: lend_release is not called for a failed lend_pread. */
  int (*lend_pread) (void *handle, uint32_t count, uint64_t offset,
                     uint32_t flags, struct blkd_lend *lend);

  /* The reply built from lent pieces is fully handed to the kernel (or
   * its connection died): the tokens of one lend_pread come back once.
   * Runs without the thread-model lock, on any thread, possibly after
   * the handle that lent them was closed, always before unload. */
  void (*lend_release) (void *const *token, unsigned n);

  /* READ from a file the kernel can send itself (sendfile): the fd and
   * the file offset that hold [offset, offset+count).  The fd must stay
   * open until this handle is closed (blkd sends from it only while the
   * connection that asked is open).  If the file shrinks below the range
   * meanwhile, blkd sends zeros for the missing bytes, as a pread past
   * the end reads.  Used only on clear-text connections. */
  int (*pread_fd) (void *handle, uint32_t count, uint64_t offset,
                   uint32_t flags, int *fd, uint64_t *file_offset);

  /* WRITE in place: give writable memory that blkd receives the payload
   * of [offset, offset+count) into.  The memory must not be visible to
   * readers yet.  blkd then calls pwrite_commit exactly once: ok=1 once
   * the whole payload is there (publish it, honouring NBDKIT_FLAG_FUA in
   * flags as pwrite would), ok=0 when the payload never completed
   * (discard it: the disk keeps its old bytes).  E2BIG/ENOTSUP: blkd
   * uses pwrite. */
  int (*pwrite_place) (void *handle, uint32_t count, uint64_t offset,
                       uint32_t flags, struct blkd_lend *dst);
  int (*pwrite_commit) (void *handle, uint32_t count, uint64_t offset,
                        uint32_t flags, struct blkd_lend *dst, int ok);

  /* Version 2.  Start a request and return without waiting for it: 0 says
   * it started and done->complete will be called exactly once; -1 with
   * errno says it did not start and complete will never be called
   * (ENOTSUP: blkd makes the synchronous call instead, on a worker; any
   * other errno is the request's error).  blkd calls these on its event
   * loop threads, so they must not block: a plugin that would have to
   * wait (a full queue, a lock held across I/O) answers ENOTSUP.  Used
   * only when the plugin is the whole layer stack (no filter, no --cache)
   * and its thread model is PARALLEL, and never with flags the matching
   * synchronous call could not take (FUA only with can_fua NATIVE; zero
   * flags as .zero gets them).  buf stays valid until complete. */
  int (*aio_pread) (void *handle, void *buf, uint32_t count, uint64_t offset,
                    uint32_t flags, struct blkd_aio *done);
  int (*aio_pwrite) (void *handle, const void *buf, uint32_t count, uint64_t offset,
                     uint32_t flags, struct blkd_aio *done);
  int (*aio_flush) (void *handle, uint32_t flags, struct blkd_aio *done);
  int (*aio_trim) (void *handle, uint32_t count, uint64_t offset, uint32_t flags,
                   struct blkd_aio *done);
  int (*aio_zero) (void *handle, uint32_t count, uint64_t offset, uint32_t flags,
                   struct blkd_aio *done);
};

#endif
