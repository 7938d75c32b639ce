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
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "meta/writeback.h"
#include "meta/alloc.h"
#include "base/cache.h"
#include "format/endian.h"
#include "format/entries.h"
#include "meta/hostio.h"
#include "base/inflight.h"
#include "meta/refcount.h"
#include "base/tablemap.h"

/* Write back before this much changed metadata piles up in memory. */
#define MAX_DIRTY_L2_BYTES (UINT64_C (16) << 20)
#define MIN_DIRTY_L2_TABLES 8
#define MAX_PENDING_FREES 65536

/* Put a table for host OFFSET into the dirty set, its content from
 * SOURCE (0: a new, empty table).
 */
static int
new_dirty_table (struct qcow2_image *img, struct qcow2_io *io,
                 uint64_t offset, uint64_t source, struct meta_table **out)
{
  const uint32_t cluster_size = img->header.cluster_size;
  struct meta_table *t = malloc (sizeof *t + cluster_size), *from;
  int r;

  if (t == NULL)
    goto nomem;
  t->offset = offset;
  /* A loaded table is written back only once an entry changes (a zero
   * or trim of what reads as zeros already changes nothing on disk); a
   * new table, or a copy that the L1 entry will point at, always.
   */
  t->dirty = source != offset;
  if (source == 0)
    memset (t->data, 0, cluster_size);
  else if ((from = tablemap_find (&img->dirty_l2, source)) != NULL)
    memcpy (t->data, from->data, cluster_size);
  else if (!qcow2_cache_get (img->l2_cache, source, 0, t->data,
                             cluster_size)) {
    r = qcow2_pread_clamped (img, io, t->data, cluster_size, source);
    if (r < 0) {
      free (t);
      return r;
    }
  }
  if (tablemap_insert (&img->dirty_l2, t) == -1) {
    free (t);
    goto nomem;
  }
  *out = t;
  return 0;

 nomem:
  qcow2_error (img, "out of memory for an L2 table");
  return -ENOMEM;
}

/* Is the L2 table at OFFSET (L1 entry L1_INDEX) shared with a snapshot?  Its
 * L1 entry's COPIED says so; with snapshots, the refcount is asked too,
 * as a table changed in place while a snapshot still uses it would
 * change the snapshot.  A table to be copied must be counted, or the
 * release of this reference would fail after the L1 entry moved.
 */
static int
table_shared (struct qcow2_image *img, struct qcow2_io *io, uint64_t l1_index,
              uint64_t offset, bool *shared, uint64_t *refcount)
{
  uint64_t l1e = img->l1[l1_index];
  int r;

  *refcount = 1;
  *shared = !(l1e & L2E_COPIED);
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
  *shared = *refcount != 1 || !(l1e & L2E_COPIED);
  return 0;
}

int
qcow2_l2_for_write (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t l1_index, bool create, struct meta_table **out)
{
  const struct qcow2_header *h = &img->header;
  uint64_t l1e = img->l1[l1_index];
  uint64_t offset = l1e & L1E_OFFSET_MASK;
  uint64_t new_offset, refcount;
  bool shared;
  int r;

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
    r = table_shared (img, io, l1_index, offset, &shared, &refcount);
    if (r < 0)
      return r;
    if (!shared) {
      *out = tablemap_find (&img->dirty_l2, offset);
      return *out ? 0 : new_dirty_table (img, io, offset, offset, out);
    }
  }

  /* A new table: empty, or a copy of one shared with a snapshot, which
   * keeps the old one and loses this image's reference to it once the
   * new one is on disk.  The data clusters keep their counts: each is
   * still counted once through each table that maps it (qemu's
   * l2_allocate).
   */
  r = qcow2_alloc_clusters (img, io, 1, QCOW2_ALLOC_ANY, &new_offset);
  if (r < 0)
    return r;
  r = new_dirty_table (img, io, new_offset, offset, out);
  if (r == 0 && offset != 0)
    r = qcow2_free_later (img, offset, h->cluster_size, 0);
  if (r < 0) {
    if (*out)
      free (tablemap_remove (&img->dirty_l2, new_offset));
    *out = NULL;
    qcow2_free_later (img, new_offset, h->cluster_size, 0);
    return r;
  }
  if (offset != 0) {
    qcow2_cache_drop (img->l2_cache, offset);
    qcow2_debug_if (img, QCOW2_DEBUG_MAP, "L1 entry %" PRIu64 ": the L2 "
                    "table at 0x%" PRIx64 " is shared (refcount %" PRIu64
                    "%s): copied to 0x%" PRIx64, l1_index, offset, refcount,
                    l1e & L2E_COPIED ? "" : ", COPIED clear", new_offset);
  }
  img->l1[l1_index] = new_offset | L2E_COPIED;
  img->l1_dirty[l1_index] = 1;
  img->l1_any_dirty = true;
  return 0;
}

bool
qcow2_too_much_dirty (struct qcow2_image *img)
{
  uint64_t limit = MAX_DIRTY_L2_BYTES / img->header.cluster_size;

  if (limit < MIN_DIRTY_L2_TABLES)
    limit = MIN_DIRTY_L2_TABLES;
  return img->dirty_l2.count > limit ||
    qcow2_pending_frees (img) > MAX_PENDING_FREES;
}

bool
qcow2_l2_dirty (struct qcow2_image *img, uint64_t l1_index)
{
  uint64_t offset = img->l1[l1_index] & L1E_OFFSET_MASK;

  return img->l1_dirty[l1_index] ||
    (offset && tablemap_find (&img->dirty_l2, offset) != NULL);
}

/* -------------------------------------------------- the copy written */

/* What one writeback writes: a copy of every changed L2 table and L1
 * entry, the refcounts' own copy, and the releases queued before the
 * copy was made (the copy no longer points at any of them).
 */
struct snapshot {
  struct refcount_snapshot rc;
  size_t nl2;
  struct meta_table **l2;         /* the tables copied (in the dirty set) */
  uint8_t *l2_data;               /* their contents, a cluster each */
  size_t nl1;
  uint32_t *l1_index;             /* the changed L1 entries, rising */
  uint8_t *l1_data;               /* their values, big-endian */
  struct pending_list frees;
};

struct l2_copy {
  struct snapshot *s;
  size_t capacity;
  size_t cluster_size;
};

static int
count_dirty_l2 (void *opaque, struct meta_table *t)
{
  size_t *n = opaque;

  *n += t->dirty;
  return 0;
}

static int
copy_l2 (void *opaque, struct meta_table *t)
{
  struct l2_copy *c = opaque;
  struct snapshot *s = c->s;

  if (!t->dirty || s->nl2 == c->capacity)
    return 0;
  memcpy (s->l2_data + s->nl2 * c->cluster_size, t->data, c->cluster_size);
  s->l2[s->nl2++] = t;
  t->dirty = false;
  return 0;
}

static void
snapshot_free (struct snapshot *s)
{
  free (s->l2);
  free (s->l2_data);
  free (s->l1_index);
  free (s->l1_data);
  s->l2 = NULL;
  s->l2_data = s->l1_data = NULL;
  s->l1_index = NULL;
  s->nl2 = s->nl1 = 0;
}

/* With the image lock held exclusively: copy what changed into *S and
 * count it clean, and take the queued releases.  On -ENOMEM (logged)
 * nothing is taken.
 */
static int
snapshot_take (struct qcow2_image *img, struct snapshot *s)
{
  const size_t cluster_size = img->header.cluster_size;
  struct l2_copy c = { .s = s, .cluster_size = cluster_size };
  size_t nl2 = 0, nl1 = 0;
  uint32_t i;
  int r;

  memset (s, 0, sizeof *s);
  tablemap_each (&img->dirty_l2, count_dirty_l2, &nl2);
  if (img->l1_any_dirty)
    for (i = 0; i < img->header.l1_size; ++i)
      nl1 += img->l1_dirty[i];
  if (nl2) {
    s->l2 = malloc (nl2 * sizeof *s->l2);
    s->l2_data = malloc (nl2 * cluster_size);
    if (s->l2 == NULL || s->l2_data == NULL)
      goto nomem;
  }
  if (nl1) {
    s->l1_index = malloc (nl1 * sizeof *s->l1_index);
    s->l1_data = malloc (nl1 * 8);
    if (s->l1_index == NULL || s->l1_data == NULL)
      goto nomem;
  }
  r = qcow2_refcount_snapshot (img, &s->rc);
  if (r < 0) {
    snapshot_free (s);
    return r;
  }

  c.capacity = nl2;
  tablemap_each (&img->dirty_l2, copy_l2, &c);
  for (i = 0; s->nl1 < nl1; ++i)
    if (img->l1_dirty[i]) {
      s->l1_index[s->nl1] = i;
      put_be64 (s->l1_data + 8 * s->nl1, img->l1[i]);
      s->nl1++;
      img->l1_dirty[i] = 0;
    }
  img->l1_any_dirty = false;
  qcow2_take_frees (img, &s->frees);
  return 0;

 nomem:
  snapshot_free (s);
  qcow2_error (img, "out of memory writing the metadata back");
  return -ENOMEM;
}

static int
write_l2 (struct qcow2_image *img, struct qcow2_io *io,
          const struct snapshot *s)
{
  const size_t cluster_size = img->header.cluster_size;
  size_t i;
  int r;

  for (i = 0; i < s->nl2; ++i) {
    r = qcow2_pwrite_logged (img, io, s->l2_data + i * cluster_size,
                             cluster_size, s->l2[i]->offset);
    if (r < 0)
      return r;
  }
  return 0;
}

static int
write_l1 (struct qcow2_image *img, struct qcow2_io *io,
          const struct snapshot *s)
{
  size_t i = 0, j;
  int r;

  while (i < s->nl1) {
    /* A run of consecutive entries, in one write. */
    j = i + 1;
    while (j < s->nl1 && s->l1_index[j] == s->l1_index[j - 1] + 1)
      j++;
    r = qcow2_pwrite_logged (img, io, s->l1_data + 8 * i, 8 * (j - i),
                             img->header.l1_table_offset +
                             8 * (uint64_t) s->l1_index[i]);
    if (r < 0)
      return r;
    i = j;
  }
  return 0;
}

/* With the image lock held exclusively, after the copy was written
 * (WRITTEN) or not: tables that stayed clean since leave the dirty set
 * for the read cache; if the copy was not written, what it held counts
 * as changed again.  The releases are the caller's.
 */
static void
snapshot_done (struct qcow2_image *img, struct snapshot *s, bool written)
{
  size_t i;

  qcow2_refcount_snapshot_done (img, &s->rc, written);
  if (!written) {
    for (i = 0; i < s->nl2; ++i)
      s->l2[i]->dirty = true;
    for (i = 0; i < s->nl1; ++i)
      img->l1_dirty[s->l1_index[i]] = 1;
    if (s->nl1)
      img->l1_any_dirty = true;
  }
  else {
    for (i = 0; i < img->dirty_l2.capacity; ) {
      struct meta_table *t = img->dirty_l2.slots[i];
      if (t && !t->dirty) {
        qcow2_cache_put (img->l2_cache, t->offset, t->data);
        free (tablemap_remove (&img->dirty_l2, t->offset));
        continue;             /* the removal may have moved another here */
      }
      i++;
    }
  }
  snapshot_free (s);
}

/* ---------------------------------------------------------- writeback */

/* The writeback, with img->writeback_lock held. */
static int
writeback_serialized (struct qcow2_image *img, struct qcow2_io *io,
                      bool flush_underneath)
{
  struct snapshot s;
  bool releases, held;
  int r;

  pthread_rwlock_wrlock (&img->lock);
  r = snapshot_take (img, &s);
  /* Clusters released by a writeback that failed after applying its
   * releases: their decrements go with this copy's refcounts, and must
   * be flushed before step 4.
   */
  held = qcow2_alloc_released (img) > 0;
  if (held)
    flush_underneath = true;
  pthread_rwlock_unlock (&img->lock);
  if (r < 0)
    return r;
  releases = s.frees.count > 0;

  /* 1. Increments: refcount blocks, table, header. */
  r = qcow2_refcount_write (img, io, &s.rc);

  /* 2. L2 tables, then L1, each only after what it points at is durable:
   * the data (written before its entry was changed) and the increments.
   */
  if (r == 0 && (s.nl2 || s.nl1)) {
    r = qcow2_flush_logged (img, io);
    if (r == 0)
      r = write_l2 (img, io, &s);
    if (r == 0 && s.nl1) {
      r = qcow2_flush_logged (img, io);
      if (r == 0)
        r = write_l1 (img, io, &s);
    }
  }

  /* 3. Decrements, once nothing on disk points at those clusters and no
   * read or write that looked them up before is still in flight.
   */
  if (r == 0 && releases) {
    qcow2_inflight_wait (&img->inflight, qcow2_frees_mark (&s.frees));
    r = qcow2_flush_logged (img, io);
  }
  pthread_rwlock_wrlock (&img->lock);
  snapshot_done (img, &s, r == 0);
  if (releases) {
    if (r == 0)
      r = qcow2_apply_frees (img, io, &s.frees);
    else
      qcow2_return_frees (img, &s.frees);
    if (r == 0)
      r = qcow2_refcount_snapshot (img, &s.rc);
  }
  pthread_rwlock_unlock (&img->lock);
  if (r == 0 && releases) {
    r = qcow2_refcount_write (img, io, &s.rc);
    pthread_rwlock_wrlock (&img->lock);
    qcow2_refcount_snapshot_done (img, &s.rc, r == 0);
    pthread_rwlock_unlock (&img->lock);
    flush_underneath = true;
  }

  if (r == 0 && flush_underneath)
    r = qcow2_flush_logged (img, io);

  /* 4. The clusters the decrements brought to 0 are free on disk now,
   * and past the grace period their releases waited for in step 3 (only
   * this writeback, under the writeback lock, applies releases, so every
   * held cluster was applied after its wait): discard them, then they
   * may be handed out again.  Under the image lock, since the allocator
   * and the file's size change.  Only this function holds clusters back,
   * so with neither releases nor held clusters there is nothing to do.
   */
  if (r == 0 && (releases || held)) {
    pthread_rwlock_wrlock (&img->lock);
    if (qcow2_alloc_released (img))
      r = qcow2_alloc_reuse_released (img, io);
    pthread_rwlock_unlock (&img->lock);
  }
  return r;
}

int
qcow2_writeback (struct qcow2_image *img, struct qcow2_io *io,
                 bool flush_underneath)
{
  int r;

  pthread_mutex_lock (&img->writeback_lock);
  r = writeback_serialized (img, io, flush_underneath);
  pthread_mutex_unlock (&img->writeback_lock);
  return r;
}

int
qcow2_writeback_if_idle (struct qcow2_image *img, struct qcow2_io *io)
{
  int r;

  if (pthread_mutex_trylock (&img->writeback_lock) != 0)
    return 0;
  r = writeback_serialized (img, io, false);
  pthread_mutex_unlock (&img->writeback_lock);
  return r;
}
