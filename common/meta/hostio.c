/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: every read, write and flush of the image file (see
 * meta/hostio.h).
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/hostio.h"
#include "base/check.h"
#include "base/cleanup.h"
#include "format/header.h"
#include "meta/regions.h"
#include "meta/corrupt.h"
#include "meta/log.h"

/* Set on the thread whose first change is writing (meta/first-change.c):
 * its writes go out while the flag still holds every other back.
 */
static _Thread_local bool first_change_writes;

void
qcow2_hostio_first_change_writes (bool on)
{
  first_change_writes = on;
}

/* LEN bytes at OFFSET of a file of SIZE bytes (WHICH, for a message). */
static int
pread_within (struct qcow2_image *img, struct qcow2_io *io, uint64_t size,
              const char *which, void *buf, uint64_t len, uint64_t offset)
{
  uint64_t avail = offset < size ? size - offset : 0;
  uint64_t from_file = len < avail ? len : avail;
  int r;

  if (from_file > 0) {
    r = io->pread (io->opaque, buf, from_file, offset);
    if (r < 0) {
      qcow2_error (img, "read of %" PRIu64 " bytes at %s offset "
                   "0x%" PRIx64 " failed: %s", from_file, which, offset,
                   strerror (-r));
      return r;
    }
    atomic_fetch_add_explicit (&img->counters.bytes_read_underneath,
                               from_file, memory_order_relaxed);
    atomic_fetch_add_explicit (&img->counters.reads_underneath, 1,
                               memory_order_relaxed);
  }
  if (from_file < len)
    memset ((uint8_t *) buf + from_file, 0, len - from_file);
  return 0;
}

int
qcow2_pread_clamped (struct qcow2_image *img, struct qcow2_io *io,
                     void *buf, uint64_t len, uint64_t offset)
{
  return pread_within (img, io, atomic_load (&img->file_size), "host",
                       buf, len, offset);
}

int
qcow2_pread_data (struct qcow2_image *img, struct qcow2_io *io,
                  void *buf, uint64_t len, uint64_t offset)
{
  if (img->data_io)
    return pread_within (img, img->data_io, img->data_size, "data file",
                         buf, len, offset);
  return qcow2_pread_clamped (img, io, buf, len, offset);
}

static int
pwrite_checked (struct qcow2_image *img, struct qcow2_io *io,
                enum qcow2_region kind, const void *buf, uint64_t len,
                uint64_t offset)
{
  uint64_t size = atomic_load (&img->file_size);
  enum qcow2_region other;
  uint64_t where;
  int r;

  if (atomic_load (&img->corrupt)) {
    qcow2_error (img, "a write of %" PRIu64 " bytes of %s at host offset 0x%"
                 PRIx64 " is refused: the image is marked corrupt", len,
                 qcow2_region_name (kind), offset);
    return -EIO;
  }
  other = qcow2_regions_overlap (img, kind, offset, len, &where);
  if (other != QCOW2_REGION_NONE)
    return qcow2_corrupt_overlap (img, io, kind, other, where, offset, len,
                                  UINT64_MAX);
  if (offset > size || len > size - offset) {
    qcow2_error (img, "internal error: write of %" PRIu64 " bytes at 0x%"
                 PRIx64 " would go past the end of the file", len, offset);
    return -EIO;
  }
  if (atomic_load_explicit (&img->first_change_pending,
                            memory_order_relaxed) &&
      !first_change_writes) {
    QCOW2_ASSERT (!atomic_load (&img->first_change_pending));
    qcow2_error (img, "internal error: a write of %" PRIu64 " bytes at 0x%"
                 PRIx64 " before the image's first change", len, offset);
    return -EIO;
  }
  r = io->pwrite (io->opaque, buf, len, offset);
  if (r < 0)
    qcow2_error (img, "write of %" PRIu64 " bytes of %s at host offset 0x%"
                 PRIx64 " failed: %s", len, qcow2_region_name (kind), offset,
                 strerror (-r));
  else
    atomic_fetch_add_explicit (&img->counters.unflushed_bytes, len,
                               memory_order_relaxed);
  return r;
}

/* Guest data into the external data file: no metadata lives there, and
 * the file grows as qemu grows it, by writing past its end.
 */
static int
pwrite_data_file (struct qcow2_image *img, const void *buf, uint64_t len,
                  uint64_t offset)
{
  uint64_t end = offset + len, size;
  int r;

  if (atomic_load (&img->corrupt)) {
    qcow2_error (img, "a write of %" PRIu64 " bytes of guest data at data "
                 "file offset 0x%" PRIx64 " is refused: the image is marked "
                 "corrupt", len, offset);
    return -EIO;
  }
  if (atomic_load_explicit (&img->first_change_pending,
                            memory_order_relaxed) &&
      !first_change_writes) {
    QCOW2_ASSERT (!atomic_load (&img->first_change_pending));
    qcow2_error (img, "internal error: a data file write of %" PRIu64
                 " bytes at 0x%" PRIx64 " before the image's first change",
                 len, offset);
    return -EIO;
  }
  r = img->data_io->pwrite (img->data_io->opaque, buf, len, offset);
  if (r < 0) {
    qcow2_error (img, "write of %" PRIu64 " bytes of guest data at data "
                 "file offset 0x%" PRIx64 " failed: %s", len, offset,
                 strerror (-r));
    return r;
  }
  /* Readers clamp to data_size: it covers the write before any entry
   * that maps it is linked.
   */
  size = atomic_load (&img->data_size);
  while (size < end &&
         !atomic_compare_exchange_weak (&img->data_size, &size, end))
    ;
  atomic_fetch_add_explicit (&img->counters.unflushed_bytes, len,
                             memory_order_relaxed);
  return 0;
}

int
qcow2_pwrite_data (struct qcow2_image *img, struct qcow2_io *io,
                   const void *buf, uint64_t len, uint64_t offset)
{
  if (img->data_io)
    return pwrite_data_file (img, buf, len, offset);
  return pwrite_checked (img, io, QCOW2_REGION_NONE, buf, len, offset);
}

int
qcow2_discard_data (struct qcow2_image *img, uint64_t len, uint64_t offset)
{
  struct qcow2_io *d = img->data_io;
  const bool raw = qcow2_data_file_raw (img);
  uint64_t size = atomic_load (&img->data_size);
  CLEANUP_FREE uint8_t *zeros = NULL;
  uint64_t done, n;
  int r = -EOPNOTSUPP;

  QCOW2_ASSERT (d != NULL);
  if (offset >= size)
    return 0;                   /* reads as zeros already */
  if (len > size - offset)
    len = size - offset;
  /* The engine's own file I/O punches a hole, which reads as zeros. */
  if (d->discard)
    r = d->discard (d->opaque, len, offset);
  if (r == 0 || !raw) {
    if (r < 0 && r != -EOPNOTSUPP)
      qcow2_debug (img, "discard of %" PRIu64 " bytes at data file offset "
                   "0x%" PRIx64 " failed (%s): the space stays in use", len,
                   offset, strerror (-r));
    return 0;
  }
  /* data_file_raw: the file must read as the guest disk does, zeros. */
  zeros = calloc (1, img->header.cluster_size);
  if (zeros == NULL) {
    qcow2_error (img, "out of memory zeroing the data file");
    return -ENOMEM;
  }
  for (done = 0, r = 0; r == 0 && done < len; done += n) {
    n = len - done < img->header.cluster_size ? len - done
      : img->header.cluster_size;
    r = pwrite_data_file (img, zeros, n, offset + done);
  }
  return r;
}

int
qcow2_pwrite_meta (struct qcow2_image *img, struct qcow2_io *io,
                   enum qcow2_region kind, const void *buf, uint64_t len,
                   uint64_t offset)
{
  return pwrite_checked (img, io, kind, buf, len, offset);
}

int
qcow2_pwrite_dirty_bit (struct qcow2_image *img, struct qcow2_io *io,
                        bool dirty)
{
  struct qcow2_header changed = img->header;
  struct qcow2_field_bytes field;
  int r;

  if (dirty)
    changed.incompatible_features |= QCOW2_INCOMPAT_DIRTY;
  else
    changed.incompatible_features &= ~QCOW2_INCOMPAT_DIRTY;
  qcow2_header_field (&changed, QCOW2_FIELD_INCOMPATIBLE_FEATURES, &field);
  r = qcow2_pwrite_meta (img, io, QCOW2_REGION_HEADER, field.bytes,
                         field.len, field.offset);
  /* Marked corrupt meanwhile, by a write that holds no lock: the mark's
   * header write may have gone out before these bytes, which then
   * cleared the corrupt bit on disk.  Set it again, over them.
   */
  if (r == 0 && atomic_load (&img->corrupt)) {
    (void) qcow2_corrupt_bit_write (img, io, changed.incompatible_features);
    r = -EIO;
  }
  return r;
}

int
qcow2_flush_logged (struct qcow2_image *img, struct qcow2_io *io)
{
  int r;

  atomic_store_explicit (&img->counters.unflushed_bytes, 0,
                         memory_order_relaxed);
  /* Data before the metadata that maps it: the data file first. */
  if (img->data_io && img->data_io->flush) {
    r = img->data_io->flush (img->data_io->opaque);
    if (r < 0) {
      qcow2_error (img, "flush of the data file failed: %s", strerror (-r));
      return r;
    }
  }
  r = io->flush (io->opaque);
  if (r < 0)
    qcow2_error (img, "flush failed: %s", strerror (-r));
  return r;
}
