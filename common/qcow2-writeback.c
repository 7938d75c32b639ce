/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the metadata writeback.
 *
 * Changed L2 tables (the dirty set), the changed L1 entries and the
 * refcounts stay in memory until qcow2_flush, or until too much has piled
 * up; then they are written in the order that keeps the image consistent
 * on disk at every moment (see qcow2-writeback.h).
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2-writeback.h"
#include "qcow2-alloc.h"
#include "qcow2-cache.h"
#include "qcow2-endian.h"
#include "qcow2-entries.h"
#include "qcow2-hostio.h"
#include "qcow2-refcount.h"
#include "qcow2-tablemap.h"

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

struct l2_writeback {
  struct qcow2_image *img;
  struct qcow2_io *io;
};

static int
write_l2 (void *opaque, struct meta_table *t)
{
  struct l2_writeback *ctx = opaque;
  int r;

  if (!t->dirty)
    return 0;
  r = qcow2_pwrite_logged (ctx->img, ctx->io, t->data,
                           ctx->img->header.cluster_size, t->offset);
  if (r == 0)
    t->dirty = false;
  return r;
}

/* Written L2 tables leave the dirty set for the shared read cache. */
static int
retire_l2 (struct qcow2_image *img)
{
  size_t i;

  for (i = 0; i < img->dirty_l2.capacity; ) {
    struct meta_table *t = img->dirty_l2.slots[i];
    if (t && !t->dirty) {
      qcow2_cache_put (img->l2_cache, t->offset, t->data);
      free (tablemap_remove (&img->dirty_l2, t->offset));
      continue;                 /* the removal may have moved another here */
    }
    i++;
  }
  return 0;
}

static int
write_l1 (struct qcow2_image *img, struct qcow2_io *io)
{
  uint32_t i = 0, n = img->header.l1_size;
  uint8_t *buf = img->wbuf;
  uint64_t per_buf = img->header.cluster_size / 8;
  int r;

  while (i < n) {
    uint32_t start, j;

    if (!img->l1_dirty[i]) {
      i++;
      continue;
    }
    /* A run of dirty entries, at most a buffer's worth. */
    start = i;
    for (j = 0; i < n && img->l1_dirty[i] && j < per_buf; ++i, ++j)
      put_be64 (buf + 8 * j, img->l1[i]);
    r = qcow2_pwrite_logged (img, io, buf, 8 * (uint64_t) j,
                             img->header.l1_table_offset + 8 * (uint64_t) start);
    if (r < 0)
      return r;
    memset (img->l1_dirty + start, 0, j);
  }
  img->l1_any_dirty = false;
  return 0;
}

int
qcow2_writeback (struct qcow2_image *img, struct qcow2_io *io,
                 bool flush_underneath)
{
  struct l2_writeback ctx = { .img = img, .io = io };
  bool l2_dirty = img->dirty_l2.count > 0;
  int r;

  /* Clusters released by a writeback that failed part way: their
   * decrements are written again in step 1, and flushed at the end.
   */
  if (qcow2_alloc_released (img))
    flush_underneath = true;

  /* 1. Increments: refcount blocks, table, header. */
  r = qcow2_refcount_writeback (img, io);
  if (r < 0)
    return r;

  /* 2. L2 tables, then L1, each only after what it points at is durable. */
  if (l2_dirty || img->l1_any_dirty) {
    r = qcow2_flush_logged (img, io);
    if (r < 0)
      return r;
    r = tablemap_each (&img->dirty_l2, write_l2, &ctx);
    if (r < 0)
      return r;
    retire_l2 (img);
    if (img->l1_any_dirty) {
      r = qcow2_flush_logged (img, io);
      if (r == 0)
        r = write_l1 (img, io);
      if (r < 0)
        return r;
    }
  }

  /* 3. Decrements, now that nothing on disk points at those clusters. */
  if (qcow2_pending_frees (img)) {
    r = qcow2_flush_logged (img, io);
    if (r == 0)
      r = qcow2_apply_frees (img, io);
    if (r == 0)
      r = qcow2_refcount_writeback (img, io);
    if (r < 0)
      return r;
    flush_underneath = true;
  }

  if (flush_underneath)
    r = qcow2_flush_logged (img, io);

  /* 4. The clusters whose refcount the decrements brought to 0 are free
   * on disk now: discard them, then they may be handed out again.
   */
  if (r == 0 && qcow2_alloc_released (img))
    r = qcow2_alloc_reuse_released (img, io);
  return r;
}

int
qcow2_flush (struct qcow2_image *img, struct qcow2_io *io)
{
  int r;

  if (!img->opts.writable)
    return 0;
  pthread_rwlock_wrlock (&img->lock);
  r = qcow2_writeback (img, io, true);
  pthread_rwlock_unlock (&img->lock);
  return r;
}
