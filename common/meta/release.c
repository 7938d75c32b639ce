/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: releasing host clusters (see meta/release.h). */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/release.h"
#include "meta/pack.h"
#include "meta/alloc-internal.h"
#include "base/cache.h"
#include "base/check.h"
#include "base/inflight.h"
#include "meta/log.h"
#include "meta/refcount.h"
#include "meta/regions.h"

int
qcow2_free_later (struct qcow2_image *img, uint64_t offset, uint64_t length,
                  uint64_t cache_key)
{
  struct qcow2_allocator *a = img->alloc;

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
  return img->alloc->npending + img->alloc->in_writeback;
}

void
qcow2_take_frees (struct qcow2_image *img, struct pending_list *list)
{
  struct qcow2_allocator *a = img->alloc;

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

int
qcow2_frees_fetch (struct qcow2_image *img, struct qcow2_io *io,
                   const struct pending_list *list, struct refcount_fetch *f)
{
  const unsigned bits = img->header.cluster_bits;
  size_t i;
  int r = 0;

  /* A release lies inside one block, or reaches into the next. */
  for (i = 0; i < list->count && r == 0; ++i) {
    const struct pending_free *p = &list->frees[i];

    r = qcow2_refcount_fetch (img, io, p->offset >> bits, f);
    if (r == 0 && p->length)
      r = qcow2_refcount_fetch (img, io,
                                (p->offset + p->length - 1) >> bits, f);
  }
  return r;
}

void
qcow2_return_frees (struct qcow2_image *img, struct pending_list *list)
{
  struct qcow2_allocator *a = img->alloc;
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
  struct qcow2_allocator *a = img->alloc;
  struct cluster_run *last = a->nreleased ? &a->released[a->nreleased - 1]
    : NULL;

  qcow2_pack_forget_cluster (img, cluster);
  qcow2_regions_remove (img, cluster);
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
sort_released (struct qcow2_allocator *a)
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
  struct qcow2_allocator *a = img->alloc;
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
  return 0;
}

size_t
qcow2_alloc_released (const struct qcow2_image *img)
{
  return img->alloc->nreleased;
}

/* Before bytes of the file up to END are discarded or cut off: new
 * clusters there are not taken for holes any more (paths/cluster.c).
 */
static void
raise_discarded_end (struct qcow2_image *img, uint64_t end)
{
  uint64_t seen = atomic_load (&img->discarded_end);

  while (seen < end &&
         !atomic_compare_exchange_weak (&img->discarded_end, &seen, end))
    ;
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

  if (offset >= storage_end || img->alloc->discard_failed)
    return;
  if (len > storage_end - offset)
    len = storage_end - offset;
  raise_discarded_end (img, offset + len);
  r = io->discard (io->opaque, len, offset);
  if (r == 0) {
    *discarded += len;
    return;
  }
  if (r == -EOPNOTSUPP)
    img->alloc->discard_failed = true;
  qcow2_debug_if (img, QCOW2_DEBUG_MAP, "discard of %" PRIu64 " bytes at "
                  "host offset 0x%" PRIx64 " failed: %s%s", len, offset,
                  strerror (-r),
                  r == -EOPNOTSUPP ? "; no more discards are sent" : "");
}

/* Storage that grows: where it can be cut, after the last cluster in
 * use, when the released runs reach its end: a cluster index, or 0 for
 * no cut.  With the image lock held exclusively.
 */
static int
plan_cut (struct qcow2_image *img, struct qcow2_io *io, uint64_t *cut)
{
  struct qcow2_allocator *a = img->alloc;
  const unsigned bits = img->header.cluster_bits;
  const struct cluster_run *last = &a->released[a->nreleased - 1];
  uint64_t end = (img->file_size + img->header.cluster_size - 1) >> bits;
  uint64_t c = end, refcount;
  int r;

  *cut = 0;
  if (last->first + last->count < end)
    return 0;
  while (c > 1) {
    r = qcow2_refcount_get (img, io, c - 1, &refcount);
    if (r < 0)
      return r;
    if (refcount != 0 ||
        qcow2_regions_kind (img, c - 1) != QCOW2_REGION_NONE)
      break;
    c--;
  }
  if (c < end)
    *cut = c;
  return 0;
}

int
qcow2_alloc_cut_released (struct qcow2_image *img, struct qcow2_io *io,
                          struct qcow2_release_plan *plan)
{
  struct qcow2_allocator *a = img->alloc;
  int r;

  qcow2_rwlock_assert_held (&img->lock, true);
  *plan = (struct qcow2_release_plan) {
    .runs = a->nreleased, .storage_end = img->file_size,
  };
  if (a->nreleased == 0 || img->opts.discard != QCOW2_DISCARD_UNMAP)
    return 0;
  if (img->opts.growable && io->truncate) {
    r = plan_cut (img, io, &plan->cut_from);
    if (r < 0) {
      plan->runs = 0;
      return r;
    }
    /* Held back from the allocator until the cut is done. */
    if (plan->cut_from)
      a->cut_from = plan->cut_from;
  }
  plan->discard = io->discard != NULL;
  return 0;
}

/* Storage that grows ends where its size says (the file may be shorter
 * than img->file_size, which counts clusters allocated but not written
 * yet); cut it where PLAN says.  Only advice, like the discards: a
 * failure is a debug message.
 */
static void
cut_tail (struct qcow2_image *img, struct qcow2_io *io,
          struct qcow2_release_plan *plan)
{
  const unsigned bits = img->header.cluster_bits;
  int64_t size = io->size (io->opaque);
  uint64_t cut = plan->cut_from << bits;
  int r;

  if (size < 0) {
    qcow2_debug_if (img, QCOW2_DEBUG_MAP, "the size of the image is not "
                    "known (%s): no discard and no cut",
                    strerror ((int) -size));
    plan->discard = false;
    plan->cut_from = 0;
    return;
  }
  if ((uint64_t) size < plan->storage_end)
    plan->storage_end = size;
  if (plan->cut_from == 0 || cut >= plan->storage_end) {
    plan->cut_from = 0;
    return;
  }
  raise_discarded_end (img, plan->storage_end);
  r = io->truncate (io->opaque, cut);
  if (r < 0) {
    qcow2_debug_if (img, QCOW2_DEBUG_MAP, "cutting the file to %" PRIu64
                    " bytes failed: %s", cut, strerror (-r));
    plan->cut_from = 0;
    return;
  }
  qcow2_debug_if (img, QCOW2_DEBUG_MAP, "the file is cut to %" PRIu64
                  " bytes: its last %" PRIu64 " clusters were free", cut,
                  (plan->storage_end - cut) >> bits);
  plan->storage_end = cut;
}

void
qcow2_alloc_discard_released (struct qcow2_image *img, struct qcow2_io *io,
                              struct qcow2_release_plan *plan)
{
  struct qcow2_allocator *a = img->alloc;
  uint64_t discarded = 0;
  size_t i;

  /* The whole point of the split: readers and writers go on meanwhile. */
  qcow2_rwlock_assert_not_held (&img->lock);
  if (plan->runs == 0)
    return;
  if (img->opts.growable && img->opts.discard == QCOW2_DISCARD_UNMAP)
    cut_tail (img, io, plan);
  if (!plan->discard)
    return;
  /* A writer waiting for room will write into these clusters as soon as
   * they are reusable: a discard each (a device round trip, and scattered
   * clusters are one run each) would give the storage nothing back for
   * long, and keep every allocating writer waiting for all of them.  The
   * rest are reused as they are.
   */
  for (i = 0; i < plan->runs &&
         atomic_load_explicit (&a->room_wanted, memory_order_relaxed) == 0;
       ++i)
    discard_run (img, io, &a->released[i], plan->storage_end, &discarded);
  if (discarded || i < plan->runs)
    qcow2_debug_if (img, QCOW2_DEBUG_MAP, "discarded %" PRIu64 " bytes "
                    "of released clusters in %zu of %zu ranges%s",
                    discarded, i, plan->runs,
                    i < plan->runs ? ": a writer waits for room" : "");
}

void
qcow2_alloc_reuse_released (struct qcow2_image *img,
                            const struct qcow2_release_plan *plan)
{
  struct qcow2_allocator *a = img->alloc;
  size_t i;

  qcow2_rwlock_assert_held (&img->lock, true);
  /* Only a writeback adds runs, and the caller is the writeback. */
  QCOW2_ASSERT (plan->runs == a->nreleased);
  a->cut_from = UINT64_MAX;
  if (plan->cut_from) {
    const uint64_t cut = plan->cut_from << img->header.cluster_bits;

    /* Nothing was allocated from the cut on meanwhile. */
    if (img->file_size > cut)
      img->file_size = cut;
  }
  for (i = 0; i < plan->runs; ++i)
    if (a->released[i].first < a->free_hint)
      a->free_hint = a->released[i].first;
  a->nreleased = 0;
}
