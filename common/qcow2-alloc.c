/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: allocating host clusters, and releasing them. */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2-alloc.h"
#include "qcow2-cache.h"
#include "qcow2-hostio.h"
#include "qcow2-refcount.h"
#include "qcow2-tablemap.h"

/* Clusters set apart at a time for plain data while packing. */
#define WINDOW_CLUSTERS 32

void
qcow2_alloc_init (struct qcow2_image *img)
{
  struct allocator *a = &img->alloc;

  /* Storage that grows (the plugin's own file) ends only where host
   * offsets do.
   */
  a->host_clusters = img->opts.growable
    ? QCOW2_MAX_HOST_OFFSET >> img->header.cluster_bits
    : img->file_size >> img->header.cluster_bits;
  a->free_hint = 1;
}

void
qcow2_alloc_free (struct qcow2_image *img)
{
  free (img->alloc.pending);
  memset (&img->alloc, 0, sizeof img->alloc);
}

/* Clusters the allocator must never hand out even if their refcount says
 * they are free: the header, the L1 table, the refcount table, the LUKS
 * area, and every refcount block and changed L2 table held in memory.  A valid image
 * counts them anyway; this keeps a damaged one (a table counted 0) from
 * being made worse, by one table overwriting another.
 */
static bool
holds_metadata (struct qcow2_image *img, uint64_t cluster)
{
  const struct qcow2_header *h = &img->header;
  uint64_t off = cluster << h->cluster_bits;
  uint64_t end = off + h->cluster_size;
  uint64_t l1_end = h->l1_table_offset + (uint64_t) h->l1_size * 8;
  uint64_t rt_end = img->rc.table_offset +
    ((uint64_t) img->rc.table_clusters << h->cluster_bits);

  if (cluster == 0)
    return true;
  if (h->l1_size && off < l1_end && end > h->l1_table_offset)
    return true;
  if (off < rt_end && end > img->rc.table_offset)
    return true;
  if (img->crypt.enabled && off < img->crypt.area_offset +
      img->crypt.area_length && end > img->crypt.area_offset)
    return true;
  return qcow2_refcount_is_block (img, off) ||
    tablemap_find (&img->dirty_l2, off) != NULL;
}

/* The allocator keeps this cluster free for the packing: a plain cluster
 * or a table allocated there would cut the packing short and leave the
 * rest of the current host cluster unused (qemu does that; its images
 * come out slightly larger).  UINT64_MAX when nothing is being packed.
 */
static uint64_t
pack_next_cluster (const struct qcow2_image *img)
{
  if (img->alloc.pack_cursor == 0)
    return UINT64_MAX;
  return (((img->alloc.pack_cursor - 1) | (img->header.cluster_size - 1)) + 1)
    >> img->header.cluster_bits;
}

static bool
in_window (const struct allocator *a, uint64_t cluster)
{
  return cluster >= a->window_next && cluster < a->window_end;
}

/* Allocations may have passed over the clusters set apart: make the
 * search look at them again.
 */
static void
release_window (struct allocator *a)
{
  if (a->window_next < a->window_end && a->window_next < a->free_hint)
    a->free_hint = a->window_next;
  a->window_next = a->window_end = 0;
}

/* Stop packing compressed data after the cursor; the host cluster kept
 * free for it goes back to the allocator.
 */
static void
pack_reset (struct qcow2_image *img)
{
  uint64_t reserved = pack_next_cluster (img);

  if (reserved < img->alloc.free_hint)
    img->alloc.free_hint = reserved;
  img->alloc.pack_cursor = 0;
  release_window (&img->alloc);
}

/* First cluster index >= START that begins a run of COUNT free clusters
 * inside the file, or UINT64_MAX.
 */
static int
find_free (struct qcow2_image *img, struct qcow2_io *io, uint64_t start,
           uint64_t count, uint64_t *found)
{
  struct allocator *a = &img->alloc;
  const uint64_t reserved = pack_next_cluster (img);
  uint64_t run_start = start, i = start;
  int r;

  *found = UINT64_MAX;
  while (i < a->host_clusters) {
    uint64_t refcount;

    if (i - run_start == count) {
      *found = run_start;
      return 0;
    }
    r = qcow2_refcount_get (img, io, i, &refcount);
    if (r < 0)
      return r;
    if (refcount != 0 || i == reserved || in_window (a, i) ||
        holds_metadata (img, i))
      run_start = i + 1;
    i++;
  }
  if (i - run_start >= count && i <= a->host_clusters)
    *found = run_start;
  return 0;
}

static int
no_room (struct qcow2_image *img, uint64_t count)
{
  uint64_t cluster_size = img->header.cluster_size;

  qcow2_error (img, "no room in the image file: %" PRIu64 " more "
               "cluster(s) of %" PRIu64 " bytes are needed (at least %"
               PRIu64 " bytes) and every cluster of the %" PRIu64
               "-byte container is in use; give the image room and "
               "reconnect (for a file: truncate -s +SIZE FILE)",
               count, cluster_size, count * cluster_size, img->file_size);
  return -ENOSPC;
}

/* On growable storage, clusters handed out past its end extend the size
 * the engine reads up to; the file itself grows when they are written.
 */
static void
cover_allocation (struct qcow2_image *img, uint64_t first_cluster,
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
            uint64_t min_entries, unsigned mode)
{
  struct refcounts *rc = &img->rc;
  const struct qcow2_header *h = &img->header;
  uint64_t per_cluster = h->cluster_size / 8;
  /* Growable storage: room for the file to double first. */
  uint64_t clusters_to_cover = img->opts.growable
    ? ((img->file_size >> h->cluster_bits) + 1024) * 2
    : img->alloc.host_clusters;
  uint64_t needed = (clusters_to_cover >> rc->block_bits) + 2;
  uint64_t entries, clusters, old_offset = rc->table_offset;
  uint32_t old_clusters = rc->table_clusters;
  uint64_t new_offset;
  int r;

  /* Cover every cluster the file can hold at once, so that allocating
   * the new table never needs a bigger one.
   */
  entries = rc->table_entries * 2;
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
  r = qcow2_refcount_resize_table (img, entries);
  if (r < 0)
    return r;

  /* The table in memory is already larger than its clusters on disk: no
   * writeback may run until it has its new place.
   */
  r = qcow2_alloc_clusters (img, io, clusters, mode | QCOW2_ALLOC_NO_RECLAIM,
                            &new_offset);
  if (r < 0)
    return r;
  qcow2_refcount_place_table (img, new_offset, clusters);
  qcow2_debug (img, "refcount table grows to %" PRIu64 " clusters at 0x%"
               PRIx64, clusters, new_offset);
  return qcow2_free_later (img, old_offset,
                           (uint64_t) old_clusters << h->cluster_bits, 0);
}

/* Create the refcount block for table index RT_INDEX. */
static int
new_block (struct qcow2_image *img, struct qcow2_io *io, uint64_t rt_index,
           unsigned mode)
{
  struct refcounts *rc = &img->rc;
  const uint64_t host_clusters = img->alloc.host_clusters;
  uint64_t cluster;
  bool counted;
  int r;

  if (rt_index >= rc->table_entries) {
    r = grow_table (img, io, rt_index + 1, mode);
    if (r < 0)
      return r;
    if (rc->table[rt_index] != 0)
      return 0;                 /* the growth made it */
  }
  /* A range without a block has no cluster in use, so the block can
   * describe itself: put it in the first cluster of its own range.  It
   * then never needs another block to count it.
   */
  cluster = rt_index << rc->block_bits;
  while (cluster < host_clusters && holds_metadata (img, cluster))
    cluster++;
  counted = false;
  if (cluster >= host_clusters || cluster >> rc->block_bits != rt_index) {
    /* The range holds nothing but metadata (a large L1 table of a
     * new image): the block goes wherever the allocator finds room,
     * which also counts it.
     */
    uint64_t offset;
    r = qcow2_alloc_clusters (img, io, 1, mode, &offset);
    if (r < 0)
      return r;
    cluster = offset >> img->header.cluster_bits;
    counted = true;
  }

  r = qcow2_refcount_add_block (img, rt_index, cluster);
  if (r < 0)
    return r;
  cover_allocation (img, cluster, 1);
  return counted ? 0 : qcow2_refcount_add (img, io, cluster, 1, NULL);
}

/* Make sure a refcount block counts CLUSTER. */
static int
ensure_block (struct qcow2_image *img, struct qcow2_io *io, uint64_t cluster,
              unsigned mode)
{
  uint64_t rt_index = cluster >> img->rc.block_bits;
  bool has;
  int r = qcow2_refcount_has_block (img, io, rt_index, &has);

  if (r == 0 && !has)
    r = new_block (img, io, rt_index, mode);
  return r;
}

/* Allocate host cluster INDEX if it is free; -EBUSY if it is not. */
static int
alloc_cluster_at (struct qcow2_image *img, struct qcow2_io *io,
                  uint64_t index, unsigned mode)
{
  struct allocator *a = &img->alloc;
  uint64_t refcount;
  int r;

  if (index >= a->host_clusters || in_window (a, index) ||
      holds_metadata (img, index))
    return -EBUSY;
  r = ensure_block (img, io, index, mode);
  if (r == 0)
    r = qcow2_refcount_get (img, io, index, &refcount);
  if (r < 0)
    return r;
  if (refcount != 0)
    return -EBUSY;
  cover_allocation (img, index, 1);
  return qcow2_refcount_add (img, io, index, 1, NULL);
}

/* One cluster from the window, setting a new one apart when it is used
 * up; -ENOSPC when there is no run of free clusters for a window.
 */
static int
alloc_from_window (struct qcow2_image *img, struct qcow2_io *io,
                   unsigned mode, uint64_t *offset)
{
  struct allocator *a = &img->alloc;
  bool fresh = false;
  uint64_t first;
  int r;

  for (;;) {
    while (a->window_next < a->window_end) {
      uint64_t cluster = a->window_next++;
      r = alloc_cluster_at (img, io, cluster, mode);
      if (r == 0) {
        *offset = cluster << img->header.cluster_bits;
        return 0;
      }
      if (r == QCOW2_RECLAIM)
        a->window_next--;       /* the retry takes it */
      if (r != -EBUSY)
        return r;
    }
    if (fresh)
      return -ENOSPC;
    r = find_free (img, io, a->free_hint, WINDOW_CLUSTERS, &first);
    if (r < 0)
      return r;
    if (first == UINT64_MAX)
      return -ENOSPC;
    a->window_next = first;
    a->window_end = first + WINDOW_CLUSTERS;
    fresh = true;
  }
}

int
qcow2_alloc_clusters (struct qcow2_image *img, struct qcow2_io *io,
                      uint64_t count, unsigned mode, uint64_t *offset)
{
  struct allocator *a = &img->alloc;
  uint64_t first, i;
  int r;

  if (count == 1 && a->pack_cursor != 0 &&
      !(mode & (QCOW2_ALLOC_PACK | QCOW2_ALLOC_NO_WINDOW))) {
    r = alloc_from_window (img, io, mode | QCOW2_ALLOC_NO_WINDOW, offset);
    if (r != -ENOSPC)
      return r;
  }

  for (;;) {
    bool still_free = true;

    r = find_free (img, io, a->free_hint, count, &first);
    if (r < 0)
      return r;
    if (first == UINT64_MAX &&
        (pack_next_cluster (img) != UINT64_MAX ||
         a->window_next < a->window_end)) {
      /* Out of room but for the clusters set apart: give them up. */
      pack_reset (img);
      continue;
    }
    if (first == UINT64_MAX) {
      /* Released clusters wait for a metadata writeback before they may
       * be reused: out of room, the caller does that writeback now
       * rather than fail.
       */
      if (a->npending == 0 || (mode & QCOW2_ALLOC_NO_RECLAIM))
        return no_room (img, count);
      return QCOW2_RECLAIM;
    }

    /* Make the refcount blocks first: making one takes a cluster, maybe
     * one of the run just found, and then the search starts again.
     */
    for (i = first >> img->rc.block_bits;
         i <= (first + count - 1) >> img->rc.block_bits; ++i) {
      bool has;
      r = qcow2_refcount_has_block (img, io, i, &has);
      if (r == 0 && !has) {
        r = new_block (img, io, i, mode);
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
  cover_allocation (img, first, count);
  *offset = first << img->header.cluster_bits;
  return 0;
}

int
qcow2_pack_compressed (struct qcow2_image *img, struct qcow2_io *io,
                       const uint8_t *data, uint64_t len, uint64_t *host)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  uint64_t cur = img->alloc.pack_cursor;
  uint64_t fresh[2], c, first, last, offset;
  unsigned nfresh = 0, i;
  int r;

  if (cur) {
    /* With narrow refcounts (refcount_bits 1 to 4) a host cluster can
     * run out of references before it runs out of bytes; start a new
     * one then, as qemu does.  Only the cluster packed so far can be
     * full: any other that the range runs into is allocated here.
     */
    uint64_t refcount;
    r = qcow2_refcount_get (img, io, (cur & ~UINT64_C (511)) >> bits,
                            &refcount);
    if (r < 0)
      return r;
    if (refcount >= img->rc.max_refcount) {
      pack_reset (img);
      cur = 0;
    }
  }
  if (cur) {
    uint64_t next = pack_next_cluster (img);
    if (cur + len > next << bits) {
      /* No writeback here: it could release the cluster CUR is in. */
      r = alloc_cluster_at (img, io, next, QCOW2_ALLOC_NO_RECLAIM);
      if (r == -EBUSY)
        cur = 0;
      else if (r < 0)
        return r;
      else
        fresh[nfresh++] = next;
    }
  }
  if (cur == 0) {
    r = qcow2_alloc_clusters (img, io, 1, QCOW2_ALLOC_PACK, &offset);
    if (r < 0)
      return r;
    cur = offset;
    fresh[nfresh++] = offset >> bits;
  }
  if (cur > img->coffset_mask) {
    qcow2_error (img, "host offset 0x%" PRIx64 " is too large for a "
                 "compressed cluster descriptor", cur);
    r = -EFBIG;
    goto fail;
  }

  first = (cur & ~UINT64_C (511)) >> bits;
  last = ((cur + len - 1) | 511) >> bits;
  for (c = first; c <= last; ++c) {
    bool is_fresh = false;
    for (i = 0; i < nfresh; ++i)
      is_fresh |= fresh[i] == c;
    if (!is_fresh && (r = qcow2_refcount_add (img, io, c, 1, NULL)) < 0)
      goto fail;
  }
  r = qcow2_pwrite_logged (img, io, data, len, cur);
  if (r < 0)
    goto fail;
  *host = cur;
  img->alloc.pack_cursor = cur + len;
  return 0;

 fail:
  for (i = 0; i < nfresh; ++i)
    qcow2_free_later (img, fresh[i] << bits, cluster_size, 0);
  pack_reset (img);
  return r;
}

int
qcow2_free_later (struct qcow2_image *img, uint64_t offset, uint64_t length,
                  uint64_t cache_key)
{
  struct allocator *a = &img->alloc;

  if (a->npending == a->pending_cap) {
    size_t cap = a->pending_cap ? a->pending_cap * 2 : 64;
    struct pending_free *p = realloc (a->pending, cap * sizeof *p);
    if (p == NULL) {
      qcow2_error (img, "out of memory for the list of clusters to free");
      return -ENOMEM;
    }
    a->pending = p;
    a->pending_cap = cap;
  }
  a->pending[a->npending++] = (struct pending_free) {
    .offset = offset, .length = length, .cache_key = cache_key,
  };
  return 0;
}

size_t
qcow2_pending_frees (const struct qcow2_image *img)
{
  return img->alloc.npending;
}

int
qcow2_apply_frees (struct qcow2_image *img, struct qcow2_io *io)
{
  struct allocator *a = &img->alloc;
  const unsigned bits = img->header.cluster_bits;
  size_t i;
  int r;

  if (a->npending)
    atomic_fetch_add (&img->free_generation, 1);
  for (i = 0; i < a->npending; ++i) {
    struct pending_free *p = &a->pending[i];
    uint64_t c, now;

    if (p->cache_key)
      qcow2_cache_drop (img->cluster_cache, p->cache_key);
    for (c = p->offset >> bits; c <= (p->offset + p->length - 1) >> bits; ++c) {
      r = qcow2_refcount_add (img, io, c, -1, &now);
      if (r < 0) {
        /* Keep what is left for a later try. */
        memmove (a->pending, a->pending + i,
                 (a->npending - i) * sizeof *a->pending);
        a->npending -= i;
        return r;
      }
      if (now == 0 && c < a->free_hint)
        a->free_hint = c;
    }
  }
  a->npending = 0;

  /* If the host cluster that compressed data was being packed into was
   * released entirely, it may be handed out again: pack elsewhere.
   */
  if (a->pack_cursor) {
    uint64_t refcount;
    r = qcow2_refcount_get (img, io, (a->pack_cursor - 1) >> bits,
                            &refcount);
    if (r < 0)
      return r;
    if (refcount == 0)
      pack_reset (img);
  }
  return 0;
}
