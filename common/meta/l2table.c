/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: L2 tables made ready for change (see
 * meta/l2table.h).
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include "meta/l2table.h"
#include "base/cleanup.h"
#include "format/entries.h"
#include "meta/alloc.h"
#include "meta/corrupt.h"
#include "meta/dirty.h"
#include "meta/log.h"
#include "meta/map.h"
#include "meta/refcount.h"
#include "meta/regions.h"
#include "meta/release.h"
#include "base/lockorder.h"

/* Is the L2 table at OFFSET (L1 entry L1_ENTRY, index L1_INDEX) shared
 * with a snapshot?  Its L1 entry's COPIED says so; with snapshots, the
 * refcount is asked too, as a table changed in place while a snapshot
 * still uses it would change the snapshot.  A table to be copied must be
 * counted, or the release of this reference would fail after the L1
 * entry moved.
 */
static int
table_shared (struct qcow2_image *img, struct qcow2_io *io, uint64_t l1_index,
              uint64_t l1_entry, uint64_t offset, bool *shared,
              uint64_t *refcount)
{
  int r;

  *refcount = 1;
  *shared = !(l1_entry & L2E_COPIED);
  if (!*shared && img->header.nb_snapshots == 0)
    return 0;
  r = qcow2_refcount_get (img, io, offset >> img->header.cluster_bits,
                          refcount);
  if (r < 0)
    return r;
  if (*refcount == 0) {
    qcow2_error (img, "L1 entry %" PRIu64 ": the L2 table at 0x%" PRIx64
                 " is in use but its refcount is 0", l1_index, offset);
    return -EIO;
  }
  *shared = *refcount != 1 || !(l1_entry & L2E_COPIED);
  return 0;
}

/* Load the table at OFFSET (L1 entry L1_INDEX's), as on disk, into the
 * dirty set.
 */
static int
load (struct qcow2_image *img, struct qcow2_io *io, uint64_t l1_index,
      uint64_t offset, struct meta_table **out)
{
  CLEANUP_FREE uint8_t *buf = malloc (img->header.cluster_size);
  int r;

  if (buf == NULL) {
    qcow2_error (img, "out of memory for an L2 table");
    return -ENOMEM;
  }
  r = qcow2_l2_table_read (img, io, l1_index, buf);
  if (r == 0)
    r = qcow2_dirty_add (img, offset, buf, false, out);
  return r;
}

/* A new table at NEW_OFFSET holding what the table at SOURCE (L1 entry
 * L1_INDEX's) holds (0: an empty one), in the dirty set and changed.
 */
static int
make (struct qcow2_image *img, struct qcow2_io *io, uint64_t l1_index,
      uint64_t new_offset, uint64_t source, struct meta_table **out)
{
  const struct meta_table *from;
  CLEANUP_FREE uint8_t *buf = NULL;
  int r;

  if (source == 0)
    return qcow2_dirty_add (img, new_offset, NULL, true, out);
  if ((from = qcow2_dirty_table (img, source)) != NULL)
    return qcow2_dirty_add (img, new_offset, from->data, true, out);
  buf = malloc (img->header.cluster_size);
  if (buf == NULL) {
    qcow2_error (img, "out of memory for an L2 table");
    return -ENOMEM;
  }
  r = qcow2_l2_table_read (img, io, l1_index, buf);
  if (r == 0)
    r = qcow2_dirty_add (img, new_offset, buf, true, out);
  return r;
}

int
qcow2_l2_for_write (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t l1_index, bool create, struct meta_table **out)
{
  const struct qcow2_header *h = &img->header;
  uint64_t l1e = qcow2_l1_entry (img, l1_index);
  uint64_t offset = l1e & L1E_OFFSET_MASK;
  uint64_t new_offset, refcount;
  bool shared;
  int r;

  qcow2_rwlock_assert_held (&img->lock, true);
  *out = NULL;
  if (offset == 0 && !create)
    return 0;
  if (offset != 0) {
    if ((l1e & L1E_RESERVED_MASK) || (offset & (h->cluster_size - 1)) ||
        offset > img->file_size || h->cluster_size > img->file_size - offset) {
      qcow2_error (img, "L1 entry %" PRIu64 " (0x%016" PRIx64 ") is invalid: "
                   "reserved bits, unaligned or outside the file",
                   l1_index, l1e);
      return -EIO;
    }
    if (!qcow2_regions_is (img, QCOW2_REGION_L2, offset)) {
      enum qcow2_region other = qcow2_regions_kind (img,
                                                    offset >> h->cluster_bits);
      return qcow2_mark_corrupt (img, io, "L1 entry %" PRIu64 " names the "
                                 "%s at host offset 0x%" PRIx64 " as its L2 "
                                 "table", l1_index,
                                 qcow2_region_name (other), offset);
    }
    r = table_shared (img, io, l1_index, l1e, offset, &shared, &refcount);
    if (r < 0)
      return r;
    if (!shared) {
      /* Lookups must find the table in the dirty set from now on, not
       * the run of what is on disk.
       */
      *out = qcow2_dirty_table (img, offset);
      r = *out ? 0 : load (img, io, l1_index, offset, out);
      if (*out)
        qcow2_l2_run_forget (img, l1_index);
      return r;
    }
  }

  r = qcow2_alloc_clusters (img, io, 1, &new_offset);
  if (r < 0)
    return r;
  r = make (img, io, l1_index, new_offset, offset, out);
  if (r == 0 &&
      qcow2_regions_add (img, QCOW2_REGION_L2, new_offset, 1) < 0) {
    qcow2_error (img, "out of memory for the list of metadata regions");
    r = -ENOMEM;
  }
  if (r == 0 && offset != 0)
    r = qcow2_free_later (img, offset, h->cluster_size, 0);
  if (r < 0) {
    if (*out)
      qcow2_dirty_drop (img, new_offset);
    *out = NULL;
    qcow2_free_later (img, new_offset, h->cluster_size, 0);
    return r;
  }
  if (offset != 0) {
    qcow2_l2_table_forget (img, offset);
    qcow2_debug_if (img, QCOW2_DEBUG_MAP, "L1 entry %" PRIu64 ": the L2 "
                    "table at 0x%" PRIx64 " is shared (refcount %" PRIu64
                    "%s): copied to 0x%" PRIx64, l1_index, offset, refcount,
                    l1e & L2E_COPIED ? "" : ", COPIED clear", new_offset);
  }
  qcow2_l1_set_entry (img, l1_index, new_offset | L2E_COPIED);
  qcow2_l1_mark_changed (img, l1_index);
  return 0;
}

bool
qcow2_l2_dirty (struct qcow2_image *img, uint64_t l1_index)
{
  uint64_t offset = qcow2_l1_entry (img, l1_index) & L1E_OFFSET_MASK;

  return qcow2_l1_changed (img, l1_index) ||
    (offset && qcow2_dirty_table (img, offset) != NULL);
}
