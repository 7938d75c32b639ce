/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: allocating host clusters, and releasing them. */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2-alloc.h"
#include "qcow2-cache.h"
#include "qcow2-hostio.h"
#include "qcow2-inflight.h"
#include "qcow2-refcount.h"
#include "qcow2-tablemap.h"

/* Room at the end of a packed host cluster too small to keep. */
#define MIN_GAP_BYTES 512

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
  free (img->alloc.released);
  memset (&img->alloc, 0, sizeof img->alloc);
}

/* Is CLUSTER held back until its release is durable and discarded? */
static bool
is_released (const struct allocator *a, uint64_t cluster)
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

/* The host cluster after the one compressed data is being packed into:
 * packed data runs on into it if it is free.
 */
static uint64_t
pack_next_cluster (const struct qcow2_image *img)
{
  return (((img->alloc.pack_cursor - 1) | (img->header.cluster_size - 1)) + 1)
    >> img->header.cluster_bits;
}

/* Stop packing compressed data after the cursor. */
static void
pack_reset (struct qcow2_image *img)
{
  img->alloc.pack_cursor = 0;
}

/* First cluster index >= START that begins a run of COUNT free clusters
 * inside the file, or UINT64_MAX.
 */
static int
find_free (struct qcow2_image *img, struct qcow2_io *io, uint64_t start,
           uint64_t count, uint64_t *found)
{
  struct allocator *a = &img->alloc;
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
    if (refcount != 0 || holds_metadata (img, i) || is_released (a, i))
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
  const char *file = img->opts.room_file;

  qcow2_error (img, "no room in the image file: %" PRIu64 " more "
               "cluster(s) of %" PRIu64 " bytes are needed (at least %"
               PRIu64 " bytes) and every cluster of the %" PRIu64
               "-byte container is in use; give the image room and "
               "reconnect%s%s%s",
               count, cluster_size, count * cluster_size, img->file_size,
               file ? " (truncate -s +SIZE " : "", file ? file : "",
               file ? ")" : "");
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

  if (index >= a->host_clusters || holds_metadata (img, index) ||
      is_released (a, index))
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

int
qcow2_alloc_clusters (struct qcow2_image *img, struct qcow2_io *io,
                      uint64_t count, unsigned mode, uint64_t *offset)
{
  struct allocator *a = &img->alloc;
  uint64_t first, i;
  int r;

  for (;;) {
    bool still_free = true;

    r = find_free (img, io, a->free_hint, count, &first);
    if (r < 0)
      return r;
    if (first == UINT64_MAX) {
      /* Released clusters wait for a metadata writeback before they may
       * be reused: out of room, the caller does that writeback now
       * rather than fail.  So do clusters held back after their release
       * was applied: a writeback running meanwhile (it lets the image
       * lock go between applying the releases and discarding what they
       * freed) or one that failed makes them reusable.
       */
      if ((qcow2_pending_frees (img) == 0 && a->nreleased == 0) ||
          (mode & QCOW2_ALLOC_NO_RECLAIM))
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

/* The packing moves on from CUR before the end of its host cluster:
 * remember the room left there, in place of the smallest gap kept if
 * the list is full.
 */
static void
gap_remember (struct qcow2_image *img, uint64_t cur)
{
  struct allocator *a = &img->alloc;
  uint64_t end = (cur | (img->header.cluster_size - 1)) + 1;
  unsigned i, smallest = 0;

  if ((cur & (img->header.cluster_size - 1)) == 0 ||
      end - cur < MIN_GAP_BYTES)
    return;
  if (a->ngaps < QCOW2_PACK_GAPS) {
    a->gaps[a->ngaps++] = (struct pack_gap) { cur, end - cur };
    return;
  }
  for (i = 1; i < a->ngaps; ++i)
    if (a->gaps[i].length < a->gaps[smallest].length)
      smallest = i;
  if (a->gaps[smallest].length < end - cur)
    a->gaps[smallest] = (struct pack_gap) { cur, end - cur };
}

/* Forget the gaps in host cluster CLUSTER: it was released. */
static void
gaps_forget_cluster (struct allocator *a, unsigned bits, uint64_t cluster)
{
  unsigned i = 0;

  while (i < a->ngaps)
    if (a->gaps[i].offset >> bits == cluster)
      a->gaps[i] = a->gaps[--a->ngaps];
    else
      i++;
}

/* Put LEN bytes into the smallest gap they fit, counting one more
 * reference to its host cluster: *HOST is where, or 0 if no gap fits.
 */
static int
gap_take (struct qcow2_image *img, struct qcow2_io *io, uint64_t len,
          uint64_t *host)
{
  struct allocator *a = &img->alloc;
  const unsigned bits = img->header.cluster_bits;
  uint64_t refcount;
  unsigned i, best;
  int r;

  *host = 0;
  for (;;) {
    best = a->ngaps;
    for (i = 0; i < a->ngaps; ++i)
      if (a->gaps[i].length >= len &&
          (best == a->ngaps || a->gaps[i].length < a->gaps[best].length))
        best = i;
    if (best == a->ngaps)
      return 0;
    r = qcow2_refcount_get (img, io, a->gaps[best].offset >> bits,
                            &refcount);
    if (r < 0)
      return r;
    if (refcount > 0 && refcount < img->rc.max_refcount)
      break;
    /* Out of references (narrow refcounts): no use any more. */
    a->gaps[best] = a->gaps[--a->ngaps];
  }
  r = qcow2_refcount_add (img, io, a->gaps[best].offset >> bits, 1, NULL);
  if (r < 0)
    return r;
  *host = a->gaps[best].offset;
  a->gaps[best].offset += len;
  a->gaps[best].length -= len;
  if (a->gaps[best].length < MIN_GAP_BYTES)
    a->gaps[best] = a->gaps[--a->ngaps];
  return 0;
}

int
qcow2_pack_reserve (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t len, uint64_t *host)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  uint64_t cur = img->alloc.pack_cursor;
  uint64_t fresh[2], c, first, last, offset;
  unsigned nfresh = 0, i;
  int r;

  /* Room left behind earlier first: what fits there costs no new room. */
  r = gap_take (img, io, len, &offset);
  if (r < 0)
    return r;
  if (offset) {
    *host = offset;
    return 0;
  }

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
      if (r == -EBUSY) {
        gap_remember (img, cur);
        cur = 0;
      }
      else if (r < 0)
        return r;
      else
        fresh[nfresh++] = next;
    }
  }
  if (cur == 0) {
    r = qcow2_alloc_clusters (img, io, 1, QCOW2_ALLOC_ANY, &offset);
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
    .mark = qcow2_inflight_mark (&img->inflight),
  };
  return 0;
}

size_t
qcow2_pending_frees (const struct qcow2_image *img)
{
  return img->alloc.npending + img->alloc.in_writeback;
}

void
qcow2_take_frees (struct qcow2_image *img, struct pending_list *list)
{
  struct allocator *a = &img->alloc;

  list->frees = a->pending;
  list->count = a->npending;
  a->in_writeback += a->npending;
  a->pending = NULL;
  a->npending = a->pending_cap = 0;
}

uint64_t
qcow2_frees_mark (const struct pending_list *list)
{
  /* Marks only grow along the queue. */
  return list->count ? list->frees[list->count - 1].mark : 0;
}

void
qcow2_return_frees (struct qcow2_image *img, struct pending_list *list)
{
  struct allocator *a = &img->alloc;
  size_t n = list->count;

  a->in_writeback -= n;
  if (n && a->npending + n > a->pending_cap) {
    size_t cap = a->npending + n;
    struct pending_free *p = realloc (a->pending, cap * sizeof *p);
    if (p == NULL) {
      /* Memory is gone: the clusters leak (refcounts stay too high),
       * which qemu-img check reports and repairs; nothing is lost.
       */
      qcow2_error (img, "out of memory keeping %zu clusters to free: they "
                   "stay allocated", n);
      n = 0;
    }
    else {
      a->pending = p;
      a->pending_cap = cap;
    }
  }
  if (n) {
    memmove (a->pending + n, a->pending, a->npending * sizeof *a->pending);
    memcpy (a->pending, list->frees, n * sizeof *a->pending);
    a->npending += n;
  }
  free (list->frees);
  list->frees = NULL;
  list->count = 0;
}

/* Hold CLUSTER, whose refcount just dropped to 0, back from allocation
 * until qcow2_alloc_reuse_released.  Without memory for that, it is
 * free at once and never discarded, which is safe.
 */
static void
hold_released (struct qcow2_image *img, uint64_t cluster)
{
  struct allocator *a = &img->alloc;
  struct cluster_run *last = a->nreleased ? &a->released[a->nreleased - 1]
    : NULL;

  gaps_forget_cluster (a, img->header.cluster_bits, cluster);
  if (last && last->first + last->count == cluster) {
    last->count++;
    return;
  }
  if (a->nreleased == a->released_cap) {
    size_t cap = a->released_cap ? a->released_cap * 2 : 64;
    struct cluster_run *p = realloc (a->released, cap * sizeof *p);
    if (p == NULL) {
      if (cluster < a->free_hint)
        a->free_hint = cluster;
      return;
    }
    a->released = p;
    a->released_cap = cap;
  }
  a->released[a->nreleased++] = (struct cluster_run) { cluster, 1 };
}

static int
run_cmp (const void *x, const void *y)
{
  const struct cluster_run *a = x, *b = y;

  return a->first < b->first ? -1 : a->first > b->first;
}

/* Sort the held runs and join those that touch, for is_released. */
static void
sort_released (struct allocator *a)
{
  size_t i, n = 0;

  if (a->nreleased < 2)
    return;
  qsort (a->released, a->nreleased, sizeof *a->released, run_cmp);
  for (i = 1; i < a->nreleased; ++i) {
    struct cluster_run *prev = &a->released[n];
    if (a->released[i].first <= prev->first + prev->count) {
      uint64_t end = a->released[i].first + a->released[i].count;
      if (end > prev->first + prev->count)
        prev->count = end - prev->first;
    }
    else
      a->released[++n] = a->released[i];
  }
  a->nreleased = n + 1;
}

int
qcow2_apply_frees (struct qcow2_image *img, struct qcow2_io *io,
                   struct pending_list *list)
{
  struct allocator *a = &img->alloc;
  const unsigned bits = img->header.cluster_bits;
  size_t i;
  int r = 0;

  if (list->count)
    atomic_fetch_add (&img->free_generation, 1);
  for (i = 0; i < list->count && r == 0; ++i) {
    struct pending_free *p = &list->frees[i];
    uint64_t c, now, last;

    if (p->cache_key)
      qcow2_cache_drop (img->cluster_cache, p->cache_key);
    last = (p->offset + p->length - 1) >> bits;

    for (c = p->offset >> bits; c <= last; ++c) {
      r = qcow2_refcount_add (img, io, c, -1, &now);
      if (r < 0) {
        /* Keep what is left for a later try: from this cluster on (its
         * cached copy, if any, is gone already).
         */
        p->length = p->offset + p->length - (c << bits);
        p->offset = c << bits;
        p->cache_key = 0;
        break;
      }
      if (now == 0)
        hold_released (img, c);
    }
  }
  sort_released (a);
  if (r < 0) {
    i--;
    memmove (list->frees, list->frees + i,
             (list->count - i) * sizeof *list->frees);
    a->in_writeback -= i;
    list->count -= i;
    qcow2_return_frees (img, list);
    return r;
  }
  a->in_writeback -= list->count;
  free (list->frees);
  list->frees = NULL;
  list->count = 0;

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

size_t
qcow2_alloc_released (const struct qcow2_image *img)
{
  return img->alloc.nreleased;
}

/* Tell the storage that run R holds nothing; add its bytes to
 * *DISCARDED.  Only advice: a failure is a debug message, and
 * -EOPNOTSUPP stops the discards for good.
 */
static void
discard_run (struct qcow2_image *img, struct qcow2_io *io,
             const struct cluster_run *run, uint64_t storage_end,
             uint64_t *discarded)
{
  const unsigned bits = img->header.cluster_bits;
  uint64_t offset = run->first << bits;
  uint64_t len = run->count << bits;
  int r;

  if (offset >= storage_end || img->alloc.discard_failed)
    return;
  if (len > storage_end - offset)
    len = storage_end - offset;
  r = io->discard (io->opaque, len, offset);
  if (r == 0) {
    *discarded += len;
    return;
  }
  if (r == -EOPNOTSUPP)
    img->alloc.discard_failed = true;
  qcow2_debug_if (img, QCOW2_DEBUG_MAP, "discard of %" PRIu64 " bytes at "
                  "host offset 0x%" PRIx64 " failed: %s%s", len, offset,
                  strerror (-r),
                  r == -EOPNOTSUPP ? "; no more discards are sent" : "");
}

/* Storage that grows: cut it after the last cluster in use, when the
 * released runs reach its end.  *STORAGE_END becomes its new size.
 */
static int
cut_free_tail (struct qcow2_image *img, struct qcow2_io *io,
               uint64_t *storage_end)
{
  struct allocator *a = &img->alloc;
  const unsigned bits = img->header.cluster_bits;
  const struct cluster_run *last = &a->released[a->nreleased - 1];
  uint64_t end = (img->file_size + img->header.cluster_size - 1) >> bits;
  uint64_t c = end, refcount;
  int r;

  if (last->first + last->count < end)
    return 0;
  while (c > 1) {
    r = qcow2_refcount_get (img, io, c - 1, &refcount);
    if (r < 0)
      return r;
    if (refcount != 0 || holds_metadata (img, c - 1))
      break;
    c--;
  }
  if ((c << bits) >= *storage_end)
    return 0;
  r = io->truncate (io->opaque, c << bits);
  if (r < 0) {
    qcow2_debug_if (img, QCOW2_DEBUG_MAP, "cutting the file to %" PRIu64
                    " bytes failed: %s", c << bits, strerror (-r));
    return 0;
  }
  qcow2_debug_if (img, QCOW2_DEBUG_MAP, "the file is cut to %" PRIu64
                  " bytes: its last %" PRIu64 " clusters were free",
                  c << bits, end - c);
  *storage_end = c << bits;
  if (img->file_size > *storage_end)
    img->file_size = *storage_end;
  return 0;
}

int
qcow2_alloc_reuse_released (struct qcow2_image *img, struct qcow2_io *io)
{
  struct allocator *a = &img->alloc;
  uint64_t storage_end = img->file_size, discarded = 0;
  size_t i;
  int r;

  if (a->nreleased == 0)
    return 0;
  if (img->opts.discard == QCOW2_DISCARD_UNMAP) {
    if (img->opts.growable) {
      int64_t size = io->size (io->opaque);
      if (size < 0) {
        qcow2_error (img, "cannot get the size of the image: %s",
                     strerror ((int) -size));
        return (int) size;
      }
      if ((uint64_t) size < storage_end)
        storage_end = size;
      if (io->truncate) {
        r = cut_free_tail (img, io, &storage_end);
        if (r < 0)
          return r;
      }
    }
    if (io->discard)
      for (i = 0; i < a->nreleased; ++i)
        discard_run (img, io, &a->released[i], storage_end, &discarded);
    if (discarded)
      qcow2_debug_if (img, QCOW2_DEBUG_MAP, "discarded %" PRIu64 " bytes "
                      "of released clusters in %zu ranges", discarded,
                      a->nreleased);
  }
  for (i = 0; i < a->nreleased; ++i)
    if (a->released[i].first < a->free_hint)
      a->free_hint = a->released[i].first;
  a->nreleased = 0;
  return 0;
}
