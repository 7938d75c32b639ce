/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the metadata writeback.
 *
 * Changed L2 tables (the dirty set), the changed L1 entries and the
 * refcounts stay in memory until qcow2_flush, or until too much has piled
 * up; then a copy of them is written in the order that keeps the image
 * consistent on disk at every moment (see meta/writeback.h).
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/writeback.h"
#include "base/lockorder.h"
#include "base/inflight.h"
#include "format/header.h"
#include "meta/dirty.h"
#include "meta/hostio.h"
#include "meta/log.h"
#include "meta/map.h"
#include "meta/refcount.h"
#include "meta/release.h"

/* Write back before this much changed metadata piles up in memory. */
#define MAX_DIRTY_L2_BYTES (UINT64_C (16) << 20)
#define MIN_DIRTY_L2_TABLES 8
#define MAX_PENDING_FREES 65536

struct qcow2_writeback {
  /* One metadata writeback at a time, taken with no other lock held but
   * the bitmaps' store lock (base/lockorder.h).
   */
  struct qcow2_mutex lock;
};

int
qcow2_writeback_open (struct qcow2_image *img)
{
  img->writeback = calloc (1, sizeof *img->writeback);
  if (img->writeback == NULL) {
    qcow2_error (img, "out of memory for the write state");
    return -ENOMEM;
  }
  qcow2_mutex_init (&img->writeback->lock, QCOW2_RANK_WRITEBACK,
                    "the writeback lock");
  return 0;
}

void
qcow2_writeback_close (struct qcow2_image *img)
{
  if (img->writeback == NULL)
    return;
  qcow2_mutex_destroy (&img->writeback->lock);
  free (img->writeback);
  img->writeback = NULL;
}

bool
qcow2_too_much_dirty (struct qcow2_image *img)
{
  uint64_t limit = MAX_DIRTY_L2_BYTES / img->header.cluster_size;

  if (limit < MIN_DIRTY_L2_TABLES)
    limit = MIN_DIRTY_L2_TABLES;
  return qcow2_dirty_count (img) > limit ||
    qcow2_pending_frees (img) > MAX_PENDING_FREES;
}

/* What one writeback writes: a copy of every changed L2 table and L1
 * entry, the refcounts' own copy, and the releases queued before the
 * copy was made (the copy no longer points at any of them).
 */
struct copy {
  struct refcount_snapshot rc;
  struct dirty_copy l2;
  struct l1_copy l1;
  struct pending_list frees;
};

/* With the image lock held exclusively: copy what changed into *C and
 * count it clean (the refcounts only if WITH_REFCOUNTS), and take the
 * queued releases.  On an error (logged) nothing is taken.
 */
static int
copy_take (struct qcow2_image *img, struct copy *c, bool with_refcounts)
{
  int r;

  memset (c, 0, sizeof *c);
  r = qcow2_dirty_copy (img, &c->l2);
  if (r == 0) {
    r = qcow2_l1_copy (img, &c->l1);
    if (r < 0)
      qcow2_dirty_copy_done (img, &c->l2, false, NULL);
  }
  if (r == 0 && with_refcounts) {
    r = qcow2_refcount_snapshot (img, &c->rc);
    if (r < 0) {
      qcow2_dirty_copy_done (img, &c->l2, false, NULL);
      qcow2_l1_copy_done (img, &c->l1, false);
    }
  }
  if (r == 0)
    qcow2_take_frees (img, &c->frees);
  return r;
}

/* With the image lock held exclusively, after the copy was written
 * (WRITTEN) or not: tables that stayed clean since leave the dirty set
 * for the L2 cache; if the copy was not written, what it held counts as
 * changed again.  The releases are the caller's.
 */
static void
copy_done (struct qcow2_image *img, struct copy *c, bool written)
{
  qcow2_refcount_snapshot_done (img, &c->rc, written);
  qcow2_dirty_copy_done (img, &c->l2, written, qcow2_l2_table_written);
  qcow2_l1_copy_done (img, &c->l1, written);
}

/* While the dirty bit is set on disk (set by the first change in
 * qcow2-lazy-refcounts mode), a crash leaves an image that the next open
 * repairs from its tables, so the refcounts need not be on disk before
 * the tables that count on them: they stay in memory until a writeback
 * WITH_REFCOUNTS.  With the image lock held (the bit changes under it
 * held exclusively, and is cleared only under the writeback lock).
 */
static bool
refcounts_deferred (const struct qcow2_image *img)
{
  return img->header.incompatible_features & QCOW2_INCOMPAT_DIRTY;
}

/* The writeback, with the writeback lock held. */
static int
writeback_serialized (struct qcow2_image *img, struct qcow2_io *io,
                      bool flush_underneath, bool with_refcounts)
{
  struct copy c;
  struct refcount_fetch fetched = { .n = 0 };
  bool releases, held;
  int r;

  qcow2_rwlock_wrlock (&img->lock);
  with_refcounts = with_refcounts || !refcounts_deferred (img);
  r = copy_take (img, &c, with_refcounts);
  /* Clusters released by a writeback that failed after applying its
   * releases: their decrements go with this copy's refcounts, and must
   * be flushed before step 4.
   */
  held = qcow2_alloc_released (img) > 0;
  if (held)
    flush_underneath = true;
  qcow2_rwlock_unlock (&img->lock);
  if (r < 0)
    return r;
  releases = c.frees.count > 0;

  /* 1. Increments: refcount blocks, table, header. */
  r = qcow2_refcount_write (img, io, &c.rc);

  /* 2. L2 tables, then L1, each only after what it points at is durable:
   * the data (written before its entry was changed) and the increments.
   */
  if (r == 0 && (c.l2.count || c.l1.count)) {
    r = qcow2_flush_logged (img, io);
    if (r == 0)
      r = qcow2_dirty_copy_write (img, io, &c.l2);
    if (r == 0 && c.l1.count) {
      r = qcow2_flush_logged (img, io);
      if (r == 0)
        r = qcow2_l1_copy_write (img, io, &c.l1);
    }
  }

  /* 3. Decrements, once nothing on disk points at those clusters and no
   * read or write that looked them up before is still in flight.
   */
  if (r == 0 && releases) {
    qcow2_inflight_wait (&img->inflight, qcow2_frees_mark (&c.frees));
    r = qcow2_flush_logged (img, io);
    /* The refcount blocks the decrements change, read before the lock
     * is held exclusively.
     */
    if (r == 0) {
      qcow2_rwlock_rdlock (&img->lock);
      r = qcow2_frees_fetch (img, io, &c.frees, &fetched);
      qcow2_rwlock_unlock (&img->lock);
    }
  }
  qcow2_rwlock_wrlock (&img->lock);
  qcow2_refcount_adopt (img, &fetched);
  copy_done (img, &c, r == 0);
  if (releases) {
    if (r == 0)
      r = qcow2_apply_frees (img, io, &c.frees);
    else
      qcow2_return_frees (img, &c.frees);
    if (r == 0 && with_refcounts)
      r = qcow2_refcount_snapshot (img, &c.rc);
  }
  qcow2_rwlock_unlock (&img->lock);
  if (r == 0 && releases && with_refcounts) {
    r = qcow2_refcount_write (img, io, &c.rc);
    qcow2_rwlock_wrlock (&img->lock);
    qcow2_refcount_snapshot_done (img, &c.rc, r == 0);
    qcow2_rwlock_unlock (&img->lock);
    flush_underneath = true;
  }

  if (r == 0 && flush_underneath)
    r = qcow2_flush_logged (img, io);

  /* 4. The clusters the decrements brought to 0 are free on disk now,
   * and past the grace period their releases waited for in step 3 (only
   * this writeback, under the writeback lock, applies releases, so every
   * held cluster was applied after its wait): discard them, then they
   * may be handed out again.  The file's size and the allocator change
   * under the image lock; the discards go out between, with no image
   * lock held (the clusters are still held back, and this writeback
   * alone changes what is held), so that a trim of the guest never
   * stops its readers and writers for a device round trip.  Only this
   * function holds clusters back, so with neither releases nor held
   * clusters there is nothing to do.
   */
  if (r == 0 && (releases || held)) {
    struct qcow2_release_plan plan;

    qcow2_rwlock_wrlock (&img->lock);
    r = qcow2_alloc_cut_released (img, io, &plan);
    qcow2_rwlock_unlock (&img->lock);
    if (r == 0 && plan.runs) {
      qcow2_alloc_discard_released (img, io, &plan);
      qcow2_rwlock_wrlock (&img->lock);
      qcow2_alloc_reuse_released (img, &plan);
      qcow2_rwlock_unlock (&img->lock);
    }
  }
  return r;
}

int
qcow2_writeback (struct qcow2_image *img, struct qcow2_io *io,
                 bool flush_underneath)
{
  int r;

  qcow2_mutex_lock (&img->writeback->lock);
  r = writeback_serialized (img, io, flush_underneath, false);
  qcow2_mutex_unlock (&img->writeback->lock);
  return r;
}

/* With the writeback lock held: the dirty bit cleared on disk, durably,
 * if nothing changed since the writeback before (then 0 with *CLEARED
 * set).  The header is written with the image lock held exclusively, so
 * that no change slips in between the check and the bit; it happens once
 * a session, at its close.
 */
static int
clear_dirty_bit (struct qcow2_image *img, struct qcow2_io *io, bool *cleared)
{
  int r = 0;

  *cleared = false;
  qcow2_rwlock_wrlock (&img->lock);
  if (qcow2_dirty_count (img) == 0 && !qcow2_l1_any_changed (img) &&
      !qcow2_refcount_dirty (img) && qcow2_pending_frees (img) == 0) {
    r = qcow2_pwrite_dirty_bit (img, io, false);
    if (r == 0)
      r = qcow2_flush_logged (img, io);
    if (r == 0) {
      __atomic_fetch_and (&img->header.incompatible_features,
                          ~QCOW2_INCOMPAT_DIRTY, __ATOMIC_RELAXED);
      *cleared = true;
    }
  }
  qcow2_rwlock_unlock (&img->lock);
  return r;
}

int
qcow2_writeback_clean (struct qcow2_image *img, struct qcow2_io *io)
{
  bool dirty, cleared = false;
  int r, tries;

  qcow2_mutex_lock (&img->writeback->lock);
  qcow2_rwlock_rdlock (&img->lock);
  dirty = refcounts_deferred (img);
  qcow2_rwlock_unlock (&img->lock);
  /* Called with nothing in flight, one writeback is enough; a change
   * that came in meanwhile is written by another round.
   */
  r = 0;
  for (tries = 0; r == 0 && !cleared && tries < 3; ++tries) {
    r = writeback_serialized (img, io, true, true);
    if (r == 0 && !dirty)
      break;
    if (r == 0)
      r = clear_dirty_bit (img, io, &cleared);
  }
  qcow2_mutex_unlock (&img->writeback->lock);
  if (r == 0 && cleared)
    qcow2_debug (img, "the refcounts written, the dirty bit cleared");
  return r;
}

int
qcow2_writeback_if_idle (struct qcow2_image *img, struct qcow2_io *io)
{
  int r;

  if (!qcow2_mutex_trylock (&img->writeback->lock))
    return 0;
  r = writeback_serialized (img, io, false, false);
  qcow2_mutex_unlock (&img->writeback->lock);
  return r;
}
