/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: allocating host clusters (see meta/alloc.h). */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/alloc.h"
#include "meta/alloc-internal.h"
#include "meta/log.h"
#include "meta/refcount.h"
#include "meta/regions.h"
#include "meta/release.h"
#include "base/lockorder.h"

int
qcow2_alloc_init (struct qcow2_image *img)
{
  struct qcow2_allocator *a = calloc (1, sizeof *a);

  if (a == NULL) {
    qcow2_error (img, "out of memory for the allocator");
    return -ENOMEM;
  }
  /* Storage that grows (the plugin's own file) ends only where host
   * offsets do.
   */
  a->host_clusters = img->opts.growable
    ? QCOW2_MAX_HOST_OFFSET >> img->header.cluster_bits
    : img->file_size >> img->header.cluster_bits;
  a->free_hint = 1;
  a->cut_from = UINT64_MAX;
  img->alloc = a;
  return 0;
}

void
qcow2_alloc_free (struct qcow2_image *img)
{
  struct qcow2_allocator *a = img->alloc;

  if (a == NULL)
    return;
  free (a->pending);
  free (a->released);
  free (a->uncounted);
  free (a);
  img->alloc = NULL;
}

bool
qcow2_alloc_is_released (const struct qcow2_allocator *a, uint64_t cluster)
{
  size_t lo = 0, hi = a->nreleased;

  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const struct cluster_run *run = &a->released[mid];

    if (cluster < run->first)
      hi = mid;
    else if (cluster >= run->first + run->count)
      lo = mid + 1;
    else
      return true;
  }
  return false;
}

bool
qcow2_alloc_room_after_writeback (const struct qcow2_image *img)
{
  /* Clusters held back after their release was applied count too: a
   * writeback running meanwhile (it lets the image lock go between
   * applying the releases and discarding what they freed) or one that
   * failed makes them reusable; so does the end of a cut in flight.
   */
  return qcow2_pending_frees (img) > 0 || img->alloc->nreleased > 0 ||
    img->alloc->cut_from != UINT64_MAX;
}

void
qcow2_alloc_room_wanted (struct qcow2_image *img, bool waiting)
{
  if (waiting)
    atomic_fetch_add_explicit (&img->alloc->room_wanted, 1,
                               memory_order_relaxed);
  else
    atomic_fetch_sub_explicit (&img->alloc->room_wanted, 1,
                               memory_order_relaxed);
}

int
qcow2_alloc_fetch (struct qcow2_image *img, struct qcow2_io *io,
                   struct refcount_fetch *f)
{
  /* The search for free clusters starts at the hint. */
  return qcow2_refcount_fetch (img, io, img->alloc->free_hint, f);
}

/* Is host cluster I free to hand out? */
static int
cluster_free (struct qcow2_image *img, struct qcow2_io *io, uint64_t i,
              bool *is_free)
{
  uint64_t refcount;
  int r;

  *is_free = false;
  if (qcow2_regions_kind (img, i) != QCOW2_REGION_NONE ||
      qcow2_alloc_is_released (img->alloc, i))
    return 0;
  r = qcow2_refcount_get (img, io, i, &refcount);
  if (r == 0 && refcount == 0)
    r = qcow2_uncounted_refuse (img, io, i);
  if (r == 0)
    *is_free = refcount == 0;
  return r;
}

/* The first cluster index >= START that begins a run of COUNT free
 * clusters inside the file, or UINT64_MAX.
 */
static int
find_free (struct qcow2_image *img, struct qcow2_io *io, uint64_t start,
           uint64_t count, uint64_t *found)
{
  const struct qcow2_allocator *a = img->alloc;
  /* Nothing at or past a cut in flight: it waits for the writeback. */
  const uint64_t end = a->cut_from < a->host_clusters
    ? a->cut_from : a->host_clusters;
  uint64_t run_start = start, i = start;
  bool is_free;
  int r;

  *found = UINT64_MAX;
  while (i < end) {
    if (i - run_start == count) {
      *found = run_start;
      return 0;
    }
    r = cluster_free (img, io, i, &is_free);
    if (r < 0)
      return r;
    if (!is_free)
      run_start = i + 1;
    i++;
  }
  if (i - run_start >= count && i <= end)
    *found = run_start;
  return 0;
}

/* No run of COUNT free clusters: -ENOSPC, said here only when no
 * writeback will make room (meta/alloc.h).
 */
static int
no_room (struct qcow2_image *img, uint64_t count)
{
  uint64_t cluster_size = img->header.cluster_size;
  const char *file = img->opts.room_file;

  if (qcow2_alloc_room_after_writeback (img))
    return -ENOSPC;
  qcow2_error (img, "no room in the image file: %" PRIu64 " more "
               "cluster(s) of %" PRIu64 " bytes are needed (at least %"
               PRIu64 " bytes) and every cluster of the %" PRIu64
               "-byte container is in use; give the image room and "
               "reconnect%s%s%s",
               count, cluster_size, count * cluster_size,
               (uint64_t) img->file_size,
               file ? " (truncate -s +SIZE " : "", file ? file : "",
               file ? ")" : "");
  return -ENOSPC;
}

void
qcow2_alloc_cover (struct qcow2_image *img, uint64_t first_cluster,
                   uint64_t count)
{
  uint64_t end = (first_cluster + count) << img->header.cluster_bits;

  if (img->opts.growable && end > img->file_size)
    img->file_size = end;
}

/* Make the table hold at least MIN_ENTRIES.  The grown table goes to new
 * clusters; it is written whole, and the header pointed at it, at the
 * next writeback; the old clusters are released after that.
 */
static int
grow_table (struct qcow2_image *img, struct qcow2_io *io,
            uint64_t min_entries)
{
  const struct qcow2_header *h = &img->header;
  const unsigned block_bits = qcow2_refcount_block_bits (img);
  uint64_t per_cluster = h->cluster_size / 8;
  /* Growable storage: room for the file to double first. */
  uint64_t clusters_to_cover = img->opts.growable
    ? ((img->file_size >> h->cluster_bits) + 1024) * 2
    : img->alloc->host_clusters;
  uint64_t needed = (clusters_to_cover >> block_bits) + 2;
  uint64_t old_entries = qcow2_refcount_table_entries (img);
  uint64_t entries, clusters, old_offset, new_offset;
  uint32_t old_clusters;
  int r;

  qcow2_refcount_table_location (img, &old_offset, &old_clusters);
  /* Cover every cluster the file can hold at once, so that allocating
   * the new table never needs a bigger one.
   */
  entries = old_entries * 2;
  if (entries < min_entries)
    entries = min_entries;
  if (entries < needed)
    entries = needed;
  clusters = (entries + per_cluster - 1) / per_cluster;
  entries = clusters * per_cluster;
  if ((clusters << h->cluster_bits) > (UINT64_C (8) << 20)) {
    qcow2_error (img, "the refcount table would exceed 8 MiB");
    return -EFBIG;
  }
  /* The table in memory grows first, so that the blocks counting the new
   * table's own clusters fit in it.  Until it has its new place it is
   * larger than its clusters on disk, which the refcounts refuse to
   * write back; a failure takes the growth back.
   */
  r = qcow2_refcount_resize_table (img, entries);
  if (r < 0)
    return r;
  r = qcow2_alloc_clusters (img, io, clusters, &new_offset);
  if (r < 0) {
    qcow2_refcount_resize_table (img, old_entries);
    return r;
  }
  r = qcow2_regions_add (img, QCOW2_REGION_REFCOUNT_TABLE, new_offset,
                         clusters << h->cluster_bits);
  if (r < 0) {
    qcow2_error (img, "out of memory for the list of metadata regions");
    qcow2_free_later (img, new_offset, clusters << h->cluster_bits, 0);
    qcow2_refcount_resize_table (img, old_entries);
    return r;
  }
  qcow2_refcount_place_table (img, new_offset, clusters);
  qcow2_debug (img, "refcount table grows to %" PRIu64 " clusters at 0x%"
               PRIx64, clusters, new_offset);
  return qcow2_free_later (img, old_offset,
                           (uint64_t) old_clusters << h->cluster_bits, 0);
}

/* Create the refcount block for table index RT_INDEX. */
static int
new_block (struct qcow2_image *img, struct qcow2_io *io, uint64_t rt_index)
{
  const unsigned block_bits = qcow2_refcount_block_bits (img);
  const uint64_t host_clusters = img->alloc->host_clusters;
  uint64_t cluster;
  bool counted, has;
  int r;

  if (rt_index >= qcow2_refcount_table_entries (img)) {
    r = grow_table (img, io, rt_index + 1);
    if (r == 0)
      r = qcow2_refcount_has_block (img, io, rt_index, &has);
    if (r < 0 || has)
      return r;                 /* the growth made it */
  }
  /* A range without a block has no cluster in use, so the block can
   * describe itself: put it in the first cluster of its own range.  It
   * then never needs another block to count it.
   */
  cluster = rt_index << block_bits;
  while (cluster < host_clusters &&
         qcow2_regions_kind (img, cluster) != QCOW2_REGION_NONE)
    cluster++;
  counted = false;
  if (cluster >= host_clusters || cluster >> block_bits != rt_index) {
    /* The range holds nothing but metadata (a large L1 table of a
     * new image): the block goes wherever the allocator finds room,
     * which also counts it.
     */
    uint64_t offset;
    r = qcow2_alloc_clusters (img, io, 1, &offset);
    if (r < 0)
      return r;
    cluster = offset >> img->header.cluster_bits;
    counted = true;
  }

  r = qcow2_refcount_add_block (img, rt_index, cluster);
  if (r == 0 &&
      qcow2_regions_add (img, QCOW2_REGION_REFCOUNT_BLOCK,
                         cluster << img->header.cluster_bits, 1) < 0) {
    qcow2_error (img, "out of memory for the list of metadata regions");
    r = -ENOMEM;
  }
  if (r < 0)
    return r;
  qcow2_alloc_cover (img, cluster, 1);
  return counted ? 0 : qcow2_refcount_add (img, io, cluster, 1, NULL);
}

/* Make sure a refcount block counts CLUSTER. */
static int
ensure_block (struct qcow2_image *img, struct qcow2_io *io, uint64_t cluster)
{
  uint64_t rt_index = cluster >> qcow2_refcount_block_bits (img);
  bool has;
  int r = qcow2_refcount_has_block (img, io, rt_index, &has);

  if (r == 0 && !has)
    r = new_block (img, io, rt_index);
  return r;
}

int
qcow2_alloc_cluster_at (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t index)
{
  bool is_free = false;
  int r;

  if (index >= img->alloc->host_clusters ||
      index >= img->alloc->cut_from ||
      qcow2_regions_kind (img, index) != QCOW2_REGION_NONE ||
      qcow2_alloc_is_released (img->alloc, index))
    return -EBUSY;
  r = qcow2_uncounted_check_loaded (img, io);
  if (r < 0)
    return r;
  r = ensure_block (img, io, index);
  if (r == -ENOSPC)
    return -EBUSY;
  if (r == 0)
    r = cluster_free (img, io, index, &is_free);
  if (r < 0)
    return r;
  if (!is_free)
    return -EBUSY;
  qcow2_alloc_cover (img, index, 1);
  return qcow2_refcount_add (img, io, index, 1, NULL);
}

int
qcow2_alloc_clusters (struct qcow2_image *img, struct qcow2_io *io,
                      uint64_t count, uint64_t *offset)
{
  struct qcow2_allocator *a = img->alloc;
  const unsigned block_bits = qcow2_refcount_block_bits (img);
  uint64_t first, i;
  int r;

  qcow2_rwlock_assert_held (&img->lock, true);
  r = qcow2_uncounted_check_loaded (img, io);
  if (r < 0)
    return r;
  for (;;) {
    bool still_free = true;

    r = find_free (img, io, a->free_hint, count, &first);
    if (r < 0)
      return r;
    if (first == UINT64_MAX)
      return no_room (img, count);

    /* Make the refcount blocks first: making one takes a cluster, maybe
     * one of the run just found, and then the search starts again.
     */
    for (i = first >> block_bits; i <= (first + count - 1) >> block_bits;
         ++i) {
      bool has;
      r = qcow2_refcount_has_block (img, io, i, &has);
      if (r == 0 && !has) {
        r = new_block (img, io, i);
        still_free = false;
      }
      if (r < 0)
        return r;
    }
    if (!still_free) {
      uint64_t again;
      r = find_free (img, io, first, count, &again);
      if (r < 0)
        return r;
      if (again != first)
        continue;
    }
    break;
  }

  for (i = 0; i < count; ++i) {
    r = qcow2_refcount_add (img, io, first + i, 1, NULL);
    if (r < 0)
      return r;
  }
  /* The search for one cluster found the first free one at or after the
   * hint, so nothing below it is free.  A run may have skipped single
   * free clusters, so the hint stays.
   */
  if (count == 1)
    a->free_hint = first + 1;
  qcow2_alloc_cover (img, first, count);
  *offset = first << img->header.cluster_bits;
  return 0;
}
