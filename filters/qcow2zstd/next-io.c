/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-qcow2zstd-filter: the plugin under the filter as storage (see
 * next-io.h).
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "next-io.h"

/* Requests to a plugin are 32-bit sized. */
#define PIECE (UINT32_C (1) << 30)

static int
next_pread (void *opaque, void *buf, size_t count, uint64_t offset)
{
  nbdkit_next *next = opaque;
  int err = 0;

  while (count > 0) {
    uint32_t n = count > PIECE ? PIECE : count;
    if (next->pread (next, buf, n, offset, 0, &err) == -1)
      return -(err ? err : EIO);
    buf = (char *) buf + n;
    offset += n;
    count -= n;
  }
  return 0;
}

static int
next_pwrite (void *opaque, const void *buf, size_t count, uint64_t offset)
{
  nbdkit_next *next = opaque;
  int err = 0;

  while (count > 0) {
    uint32_t n = count > PIECE ? PIECE : count;
    if (next->pwrite (next, buf, n, offset, 0, &err) == -1)
      return -(err ? err : EIO);
    buf = (const char *) buf + n;
    offset += n;
    count -= n;
  }
  return 0;
}

static int
next_flush (void *opaque)
{
  nbdkit_next *next = opaque;
  int err = 0;
  int can_flush = next->can_flush (next);

  /* nbdkit asserts on a flush to a plugin without one.  Such a plugin's
   * writes are as durable as it ever makes them once they return, so
   * the engine's ordering still holds.
   */
  if (can_flush == -1)
    return -EIO;
  if (can_flush == 0)
    return 0;
  if (next->flush (next, 0, &err) == -1)
    return -(err ? err : EIO);
  return 0;
}

/* Released clusters, passed on as trims where the plugin takes them
 * (nbdkit's file plugin punches holes).
 */
static int
next_discard (void *opaque, uint64_t count, uint64_t offset)
{
  nbdkit_next *next = opaque;
  int err = 0;
  int can_trim = next->can_trim (next);

  /* nbdkit asserts on a trim to a plugin that did not say it takes them. */
  if (can_trim == -1)
    return -EIO;
  if (can_trim == 0)
    return -EOPNOTSUPP;
  while (count > 0) {
    uint32_t n = count > PIECE ? PIECE : count;
    if (next->trim (next, n, offset, 0, &err) == -1)
      return -(err ? err : EIO);
    offset += n;
    count -= n;
  }
  return 0;
}

/* Where the plugin says it can (nbdkit's file plugin: SEEK_DATA and
 * SEEK_HOLE), whether the bytes at OFFSET read as zeros without data:
 * the first extent, of the ZERO type (a hole alone does not promise
 * zeros).
 */
static int
next_block_status (void *opaque, uint64_t count, uint64_t offset,
                   uint64_t *length, bool *hole)
{
  nbdkit_next *next = opaque;
  int can_extents = next->can_extents (next);
  int64_t size = next->get_size (next);
  struct nbdkit_extents *extents;
  struct nbdkit_extent first;
  int err = 0, r = -EIO;

  if (can_extents == -1 || size == -1)
    return -EIO;
  if (can_extents == 0)
    return -EOPNOTSUPP;
  /* nbdkit asserts that a request lies inside the size it knows. */
  if ((uint64_t) size <= offset)
    return -EINVAL;
  if (count > (uint64_t) size - offset)
    count = size - offset;
  if (count > PIECE)
    count = PIECE;
  extents = nbdkit_extents_new (offset, size);
  if (extents == NULL)
    return -ENOMEM;
  if (next->extents (next, count, offset, NBDKIT_FLAG_REQ_ONE, extents,
                     &err) == -1)
    r = -(err ? err : EIO);
  else if (nbdkit_extents_count (extents) > 0 &&
           (first = nbdkit_get_extent (extents, 0)).offset == offset) {
    *length = first.length < count ? first.length : count;
    *hole = (first.type & NBDKIT_EXTENT_ZERO) != 0;
    r = 0;
  }
  nbdkit_extents_free (extents);
  return r;
}

static int64_t
next_size (void *opaque)
{
  nbdkit_next *next = opaque;
  int64_t size = next->get_size (next);

  return size < 0 ? -EIO : size;
}

struct qcow2_io
next_io (nbdkit_next *next)
{
  return (struct qcow2_io) {
    .opaque = next, .pread = next_pread, .pwrite = next_pwrite,
    .flush = next_flush, .size = next_size, .discard = next_discard,
    .block_status = next_block_status,
  };
}

static int
background_open (void *opaque)
{
  struct next_background *bg = opaque;
  /* nbdkit 1.32 opens a plugin once per connection (it asserts so),
   * so the context is one of no connection.
   */
  nbdkit_next *next = nbdkit_next_context_open (bg->backend, 1,
                                                bg->exportname, 1);

  if (next == NULL)
    return -EIO;
  if (next->prepare (next) == -1) {
    nbdkit_next_context_close (next);
    return -EIO;
  }
  /* nbdkit checks each read against a size it learns when asked. */
  if (next->get_size (next) == -1) {
    next->finalize (next);
    nbdkit_next_context_close (next);
    return -EIO;
  }
  bg->next = next;
  return 0;
}

static int
background_pread (void *opaque, void *buf, size_t count, uint64_t offset)
{
  struct next_background *bg = opaque;
  return next_pread (bg->next, buf, count, offset);
}

struct qcow2_background_io
next_background_io (struct next_background *bg)
{
  return (struct qcow2_background_io) {
    .opaque = bg, .open = background_open, .pread = background_pread,
  };
}

void
next_background_close (struct next_background *bg)
{
  if (bg->next == NULL)
    return;
  bg->next->finalize (bg->next);
  nbdkit_next_context_close (bg->next);
  bg->next = NULL;
}

/* The same size, or the same first bytes.  The size alone is not
 * enough: another process writing the image may grow it between the two
 * looks, and that writer is just who the lock must find.  Different
 * first bytes with a different size mean a filter between us and the
 * file (a partition, a decompressor) serves something else.
 */
bool
next_serves_file (void *opaque, int fd, uint64_t size, const char *path,
                  char *why, size_t whylen)
{
  nbdkit_next *next = opaque;
  char served_head[4096], file_head[4096];
  int64_t served = next->get_size (next);
  size_t n;
  int err = 0;

  if (served < 0) {
    snprintf (why, whylen, "the plugin's size is not known, so it cannot "
              "be told whether it serves %s", path);
    return false;
  }
  if ((uint64_t) served == size)
    return true;
  n = sizeof served_head;
  if ((uint64_t) served < n)
    n = served;
  if (size < n)
    n = size;
  if (n >= 4 &&
      next->pread (next, served_head, n, 0, 0, &err) == 0 &&
      pread (fd, file_head, n, 0) == (ssize_t) n &&
      memcmp (served_head, file_head, n) == 0)
    return true;
  snprintf (why, whylen, "the plugin serves %" PRId64 " bytes, not the %"
            PRIu64 " of %s, and they begin differently: it is not that "
            "file", served, size, path);
  return false;
}
