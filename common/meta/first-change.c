/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the image's first change (see meta/first-change.h). */

#include <config.h>

#include "meta/first-change.h"
#include "format/header.h"
#include "meta/bitmap.h"
#include "meta/hostio.h"
#include "meta/log.h"
#include "base/lockorder.h"

/* The autoclear bits the header keeps: those of what is kept valid (the
 * bitmaps, and a data_file_raw data file, which every write keeps equal
 * to the disk).
 */
static uint64_t
kept_autoclear (const struct qcow2_image *img)
{
  uint64_t kept = qcow2_bitmaps_autoclear (img);

  if (qcow2_data_file_raw (img))
    kept |= QCOW2_AUTOCLEAR_DATA_FILE_RAW;
  return img->header.autoclear_features & kept;
}

/* In qcow2-lazy-refcounts mode, is the dirty bit still to be set? */
static bool
dirty_bit_wanted (const struct qcow2_image *img)
{
  return img->opts.lazy_refcounts &&
    !(img->header.incompatible_features & QCOW2_INCOMPAT_DIRTY);
}

void
qcow2_first_change_arm (struct qcow2_image *img)
{
  img->first_change_pending =
    kept_autoclear (img) != img->header.autoclear_features ||
    qcow2_bitmaps_tracking (img) || dirty_bit_wanted (img);
}

/* The writes and the flush, with the first change's lock held and no
 * image lock: nothing else changes what they are made from (the header's
 * autoclear bits, the bitmaps' flags), since no change of the image goes
 * before them.
 */
static int
write_first_change (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t keep, bool set_dirty)
{
  struct qcow2_header changed;
  struct qcow2_field_bytes field;
  int r;

  r = qcow2_bitmaps_first_change (img, io);
  if (r == 0 && set_dirty) {
    /* From here on the refcounts on disk may lag behind the tables
     * (meta/writeback.h): the next open must count them again.
     */
    qcow2_debug (img, "first change: the dirty bit set (lazy refcounts)");
    r = qcow2_pwrite_dirty_bit (img, io, true);
  }
  if (r == 0 && keep != img->header.autoclear_features) {
    qcow2_debug (img, "first change: autoclear_features 0x%" PRIx64
                 " becomes 0x%" PRIx64, img->header.autoclear_features, keep);
    changed = img->header;
    changed.autoclear_features = keep;
    qcow2_header_field (&changed, QCOW2_FIELD_AUTOCLEAR_FEATURES, &field);
    r = qcow2_pwrite_meta (img, io, QCOW2_REGION_HEADER, field.bytes,
                           field.len, field.offset);
  }
  if (r == 0)
    r = qcow2_flush_logged (img, io);
  return r;
}

int
qcow2_first_change (struct qcow2_image *img, struct qcow2_io *io)
{
  uint64_t keep;
  bool set_dirty;
  int r;

  qcow2_rwlock_assert_not_held (&img->lock);
  if (!atomic_load (&img->first_change_pending))
    return 0;
  qcow2_mutex_lock (&img->first_change_lock);
  /* Made by another thread while this one waited. */
  if (!atomic_load (&img->first_change_pending)) {
    qcow2_mutex_unlock (&img->first_change_lock);
    return 0;
  }
  keep = kept_autoclear (img);
  set_dirty = dirty_bit_wanted (img);
  qcow2_hostio_first_change_writes (true);
  r = write_first_change (img, io, keep, set_dirty);
  qcow2_hostio_first_change_writes (false);
  if (r == 0) {
    qcow2_rwlock_wrlock (&img->lock);
    img->header.autoclear_features = keep;
    if (set_dirty)
      __atomic_fetch_or (&img->header.incompatible_features,
                         QCOW2_INCOMPAT_DIRTY, __ATOMIC_RELAXED);
    atomic_store (&img->first_change_pending, false);
    qcow2_rwlock_unlock (&img->lock);
  }
  qcow2_mutex_unlock (&img->first_change_lock);
  return r;
}
