/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: storing the persistent bitmaps (see meta/bitmap.h:
 * what a flush and a clean close write of them, and in which order).
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/bitmap.h"
#include "meta/bitmap-internal.h"
#include "format/endian.h"
#include "meta/alloc.h"
#include "meta/hostio.h"
#include "meta/log.h"
#include "meta/regions.h"
#include "meta/release.h"
#include "meta/writeback.h"
#include "base/lockorder.h"

/* What one store writes for one tracked bitmap. */
struct bitmap_store {
  struct bitmap *bm;
  size_t nchanged;
  uint32_t *index;            /* the data clusters that changed, rising */
  uint8_t *data;              /* their bits as copied, a cluster each */
  uint64_t *new_data;         /* their new host clusters (0: not yet) */
  uint64_t new_table;         /* the new table's host offset (0: not yet) */
};

struct store {
  struct bitmap_store *s;     /* one per bitmap (only tracked ones used) */
  size_t nstored;             /* bitmaps with changes */
};

static void
store_free (struct qcow2_bitmaps *b, struct store *st)
{
  uint32_t i;

  if (st->s)
    for (i = 0; i < b->count; ++i) {
      free (st->s[i].index);
      free (st->s[i].data);
      free (st->s[i].new_data);
    }
  free (st->s);
  st->s = NULL;
}

/* Copy the data clusters that changed and count them stored, with
 * b->bits_lock held.  -ENOMEM (logged) leaves them changed.
 */
static int
store_copy (struct qcow2_image *img, struct store *st)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  const uint64_t cluster_size = img->header.cluster_size;
  uint32_t i, j;
  size_t n;

  st->s = calloc (b->count, sizeof *st->s);
  if (st->s == NULL)
    goto nomem;
  for (i = 0; i < b->count; ++i) {
    struct bitmap *bm = &b->bitmaps[i];
    struct bitmap_store *s = &st->s[i];

    s->bm = bm;
    if (!bm->tracked)
      continue;
    for (j = 0, n = 0; j < bm->table_size; ++j)
      n += bm->changed[j];
    if (n == 0)
      continue;
    s->index = malloc (n * sizeof *s->index);
    s->data = malloc (n * cluster_size);
    s->new_data = calloc (n, sizeof *s->new_data);
    if (s->index == NULL || s->data == NULL || s->new_data == NULL)
      goto nomem;
    for (j = 0; j < bm->table_size; ++j)
      if (bm->changed[j]) {
        s->index[s->nchanged] = j;
        memcpy (s->data + s->nchanged * cluster_size,
                bm->bits + (uint64_t) j * cluster_size, cluster_size);
        s->nchanged++;
      }
    st->nstored++;
  }
  for (i = 0; i < b->count; ++i)
    for (j = 0; j < st->s[i].nchanged; ++j)
      st->s[i].bm->changed[st->s[i].index[j]] = 0;
  return 0;

 nomem:
  store_free (b, st);
  qcow2_error (img, "out of memory storing the bitmaps");
  return -ENOMEM;
}

/* The store failed before anything pointed at its new clusters: they are
 * released, and what it copied counts as changed again.
 */
static void
store_undo (struct qcow2_image *img, struct store *st, bool release)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  const uint64_t cluster_size = img->header.cluster_size;
  uint32_t i;
  size_t j;

  qcow2_mutex_lock (&b->bits_lock);
  for (i = 0; i < b->count; ++i)
    for (j = 0; j < st->s[i].nchanged; ++j)
      st->s[i].bm->changed[st->s[i].index[j]] = 1;
  qcow2_mutex_unlock (&b->bits_lock);
  if (!release)
    return;
  qcow2_rwlock_wrlock (&img->lock);
  for (i = 0; i < b->count; ++i) {
    struct bitmap_store *s = &st->s[i];

    if (s->new_table)
      qcow2_free_later (img, s->new_table,
                        (uint64_t) s->bm->table_size * 8, 0);
    for (j = 0; j < s->nchanged; ++j)
      if (s->new_data[j])
        qcow2_free_later (img, s->new_data[j], cluster_size, 0);
  }
  qcow2_rwlock_unlock (&img->lock);
}

/* Allocate the new tables and data clusters, and list them as metadata,
 * with the image lock held exclusively.  0, -ENOSPC (what was allocated
 * so far stays in ST), or -errno after logging.
 */
static int
store_allocate_some (struct qcow2_image *img, struct qcow2_io *io,
                     struct store *st)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  const unsigned bits = img->header.cluster_bits;
  uint32_t i;
  size_t j;
  int r = 0;

  for (i = 0; i < b->count && r == 0; ++i) {
    struct bitmap_store *s = &st->s[i];
    uint64_t table_clusters = clusters_for (img, (uint64_t)
                                            s->bm->table_size * 8);

    if (s->nchanged == 0)
      continue;
    if (s->new_table == 0) {
      r = qcow2_alloc_clusters (img, io, table_clusters, &s->new_table);
      if (r == 0 &&
          qcow2_regions_add (img, QCOW2_REGION_BITMAP_TABLE, s->new_table,
                             table_clusters << bits) < 0)
        r = -ENOMEM;
    }
    for (j = 0; j < s->nchanged && r == 0; ++j)
      if (s->new_data[j] == 0) {
        r = qcow2_alloc_clusters (img, io, 1, &s->new_data[j]);
        if (r == 0 &&
            qcow2_regions_add (img, QCOW2_REGION_BITMAP_DATA,
                               s->new_data[j], 1) < 0)
          r = -ENOMEM;
      }
  }
  if (r == -ENOMEM)
    qcow2_error (img, "out of memory for the list of metadata regions");
  return r;
}

/* Allocate what the store needs, making room with a writeback (no lock
 * held then) as often as the allocator says one will.
 */
static int
store_allocate (struct qcow2_image *img, struct qcow2_io *io,
                struct store *st)
{
  bool again;
  int r;

  for (;;) {
    qcow2_rwlock_wrlock (&img->lock);
    r = store_allocate_some (img, io, st);
    again = r == -ENOSPC && qcow2_alloc_room_after_writeback (img);
    qcow2_rwlock_unlock (&img->lock);
    if (!again)
      return r;
    r = qcow2_writeback (img, io, false);
    if (r < 0)
      return r;
  }
}

/* Write the new data clusters and tables. */
static int
store_write (struct qcow2_image *img, struct qcow2_io *io, struct store *st)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  const uint64_t cluster_size = img->header.cluster_size;
  uint64_t table_bytes;
  uint8_t *table;
  uint32_t i, k;
  size_t j;
  int r = 0;

  for (i = 0; i < b->count && r == 0; ++i) {
    struct bitmap_store *s = &st->s[i];

    if (s->nchanged == 0)
      continue;
    for (j = 0; j < s->nchanged && r == 0; ++j)
      r = qcow2_pwrite_meta (img, io, QCOW2_REGION_BITMAP_DATA,
                             s->data + j * cluster_size, cluster_size,
                             s->new_data[j]);
    if (r < 0)
      break;
    table_bytes = clusters_for (img, (uint64_t) s->bm->table_size * 8)
      << img->header.cluster_bits;
    table = calloc (1, table_bytes);
    if (table == NULL) {
      qcow2_error (img, "out of memory storing bitmap '%s'", s->bm->name);
      return -ENOMEM;
    }
    for (k = 0, j = 0; k < s->bm->table_size; ++k) {
      uint64_t e = s->bm->table[k];
      if (j < s->nchanged && s->index[j] == k)
        e = s->new_data[j++];
      put_be64 (table + 8 * (uint64_t) k, e);
    }
    r = qcow2_pwrite_meta (img, io, QCOW2_REGION_BITMAP_TABLE, table,
                           table_bytes, s->new_table);
    free (table);
  }
  return r;
}

/* Point each stored bitmap's directory entry at its new table, and with
 * CLEAN clear in_use in every tracked one.  Each entry's fields change
 * with one write inside a sector (when the offset and the flags lie in
 * two sectors, the offset goes first and is flushed before the flags
 * say that it is consistent).
 */
static int
store_point (struct qcow2_image *img, struct qcow2_io *io, struct store *st,
             bool clean)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  uint32_t i;
  int r = 0;

  for (i = 0; i < b->count && r == 0; ++i) {
    struct bitmap_store *s = &st->s[i];
    struct bitmap *bm = s->bm;
    uint64_t pos = b->dir_offset + bm->entry_pos;
    uint32_t flags = clean ? bm->flags & ~FLAG_IN_USE : bm->flags;
    uint8_t fields[16];

    if (!bm->tracked || (s->nchanged == 0 && !clean))
      continue;
    if (s->nchanged == 0)
      r = qcow2_bitmap_write_flags (img, io, bm, flags);
    else if (!clean) {
      put_be64 (fields, s->new_table);
      r = qcow2_pwrite_meta (img, io, QCOW2_REGION_BITMAP_DIRECTORY, fields,
                             8, pos);
    }
    else if (pos / 512 == (pos + 15) / 512) {
      put_be64 (fields, s->new_table);
      put_be32 (fields + 8, bm->table_size);
      put_be32 (fields + 12, flags);
      r = qcow2_pwrite_meta (img, io, QCOW2_REGION_BITMAP_DIRECTORY, fields,
                             16, pos);
    }
    else {
      put_be64 (fields, s->new_table);
      r = qcow2_pwrite_meta (img, io, QCOW2_REGION_BITMAP_DIRECTORY, fields,
                             8, pos);
      if (r == 0)
        r = qcow2_flush_logged (img, io);
      if (r == 0)
        r = qcow2_bitmap_write_flags (img, io, bm, flags);
    }
    if (r == 0)
      bm->flags = flags;
  }
  return r;
}

/* The entries point at the new tables (durably): release the old ones,
 * and their data clusters that were replaced, and remember the new.
 */
static void
store_switch (struct qcow2_image *img, struct store *st, bool release)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  const uint64_t cluster_size = img->header.cluster_size;
  uint32_t i;
  size_t j;

  qcow2_rwlock_wrlock (&img->lock);
  for (i = 0; i < b->count; ++i) {
    struct bitmap_store *s = &st->s[i];
    struct bitmap *bm = s->bm;

    if (s->nchanged == 0)
      continue;
    if (release)
      qcow2_free_later (img, bm->table_offset,
                        (uint64_t) bm->table_size * 8, 0);
    bm->table_offset = s->new_table;
    for (j = 0; j < s->nchanged; ++j) {
      uint64_t old = bm->table[s->index[j]] & TABLE_OFFSET;
      if (release && old)
        qcow2_free_later (img, old, cluster_size, 0);
      bm->table[s->index[j]] = s->new_data[j];
    }
  }
  qcow2_rwlock_unlock (&img->lock);
}

static int
store_locked (struct qcow2_image *img, struct qcow2_io *io, bool clean,
              bool *cleared)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  struct store st = { NULL, 0 };
  int r, r2;

  if (!b->in_use_on_disk)
    return qcow2_writeback (img, io, true);
  qcow2_mutex_lock (&b->bits_lock);
  r = store_copy (img, &st);
  qcow2_mutex_unlock (&b->bits_lock);
  if (r < 0)
    return r;
  if (st.nstored == 0 && !clean) {
    store_free (b, &st);
    return qcow2_writeback (img, io, true);
  }

  /* 1. New tables and data clusters, written, and durable with their
   * refcounts before anything points at them.
   */
  r = store_allocate (img, io, &st);
  if (r == 0)
    r = store_write (img, io, &st);
  if (r == 0)
    r = qcow2_writeback (img, io, true);
  if (r < 0) {
    store_undo (img, &st, true);
    /* The guest's metadata goes to disk whatever the bitmaps do. */
    r2 = qcow2_writeback (img, io, true);
    (void) r2;
    store_free (b, &st);
    return r;
  }

  /* 2. The directory entries point at them (and with CLEAN say that they
   * are consistent), durably.  After a failure here the entries may
   * point at either table: the old ones are never released, and what
   * was copied is stored again next time.
   */
  if (clean) {
    b->in_use_on_disk = false;
    *cleared = true;
  }
  r = store_point (img, io, &st, clean);
  if (r == 0)
    r = qcow2_flush_logged (img, io);
  store_switch (img, &st, r == 0);
  if (r < 0) {
    store_undo (img, &st, false);
    store_free (b, &st);
    return r;
  }
  if (st.nstored)
    qcow2_debug_if (img, QCOW2_DEBUG_MAP, "stored %zu bitmap(s)%s",
                    st.nstored, clean ? ", in_use cleared" : "");
  store_free (b, &st);

  /* 3. A clean close releases the old clusters now: nothing leaks. */
  return clean ? qcow2_writeback (img, io, true) : 0;
}

int
qcow2_bitmaps_store (struct qcow2_image *img, struct qcow2_io *io,
                     enum qcow2_bitmaps_store_mode mode, bool *cleared)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  int r;

  *cleared = false;
  if (b == NULL || !b->kept || b->ntracked == 0)
    return qcow2_writeback (img, io, true);
  qcow2_mutex_lock (&b->store_lock);
  r = store_locked (img, io, mode == QCOW2_STORE_CLEAN, cleared);
  qcow2_mutex_unlock (&b->store_lock);
  return r;
}
