/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the storage and logging interfaces the engine uses.
 *
 * The engine never calls nbdkit.  Whoever drives it (the nbdkit filter,
 * a unit test, a fuzz target) supplies a struct qcow2_io for the bytes of
 * the image and a struct qcow2_log for messages.
 */
#ifndef QCOW2_IO_H
#define QCOW2_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct qcow2_io {
  void *opaque;

  /* Read exactly COUNT bytes at OFFSET.  The engine only asks for bytes
   * below size(); it clamps its own requests.  Returns 0, or -errno.
   * Called only from the thread that called into the engine, never from
   * pool workers, so it needs no more thread safety than its caller has.
   */
  int (*pread) (void *opaque, void *buf, size_t count, uint64_t offset);

  /* Write exactly COUNT bytes at OFFSET, inside size().  Returns 0, or
   * -errno.  NULL for an image opened read-only.  Same threading rule as
   * pread.
   */
  int (*pwrite) (void *opaque, const void *buf, size_t count,
                 uint64_t offset);

  /* Make every completed write durable.  Returns 0 or -errno.  NULL for
   * an image opened read-only.
   */
  int (*flush) (void *opaque);

  /* Size of the image in bytes, or -errno. */
  int64_t (*size) (void *opaque);

  /* The calls below are optional: NULL where the storage cannot.  Same
   * threading rule as pread.
   */

  /* Tell the storage that the COUNT bytes at OFFSET (inside size()) hold
   * nothing any more, so that it can give their space back (a file
   * punches a hole).  They may read as anything afterwards.  0, or
   * -errno; -EOPNOTSUPP when the storage turns out not to discard.
   * NULL for an image opened read-only.
   */
  int (*discard) (void *opaque, uint64_t count, uint64_t offset);

  /* Storage that grows (the plugin's own file): make it SIZE bytes long,
   * SIZE at most size(), dropping the bytes after it.  0, or -errno.
   */
  int (*truncate) (void *opaque, uint64_t size);

  /* Where data lies: set *LENGTH (1 to COUNT) to how many bytes from
   * OFFSET (inside size()) are alike, and *HOLE to whether they are a
   * hole that reads as zeros rather than data.  0, or -errno.  NULL:
   * everything is data.
   */
  int (*block_status) (void *opaque, uint64_t count, uint64_t offset,
                       uint64_t *length, bool *hole);
};

/* Storage that a thread of the engine's own reads, beside the calls
 * through the connection's struct qcow2_io and at the same time: the
 * bytes fetched ahead of a sequential reader in the background
 * (paths/fetchahead.h).  The front end gives it to a connection
 * (qcow2_conn_fetch_in_background) only where the storage can serve two
 * readers at once, and closes what open made after qcow2_conn_free.
 */
struct qcow2_background_io {
  void *opaque;

  /* Called at most once, before the first pread, on a thread that
   * called into the engine (the front end may open a handle of its own
   * there).  0, or -errno: then nothing is read in the background.  NULL
   * when there is nothing to open.
   */
  int (*open) (void *opaque);

  /* As qcow2_io.pread, called by the connection's one background
   * thread only.
   */
  int (*pread) (void *opaque, void *buf, size_t count, uint64_t offset);
};

/* Messages.  Any callback may be NULL.  MSG is a complete sentence
 * without a trailing newline.  A warning is something the user should
 * fix although the image was served.
 */
struct qcow2_log {
  void *opaque;
  void (*error) (void *opaque, const char *msg);
  void (*debug) (void *opaque, const char *msg);
  void (*warning) (void *opaque, const char *msg);
};

/* What qcow2_extents reports, one range at a time (qcow2.h). */
typedef int (*qcow2_extent_fn) (void *opaque, uint64_t offset,
                                uint64_t length, bool zero);

#endif /* QCOW2_IO_H */
