/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the refcounts in memory.
 *
 * The refcount table and every refcount block touched are kept in memory
 * while the image is open for writing, and written back in order by
 * qcow2_refcount_writeback.  Where new blocks and a bigger table go, and
 * which clusters are free to hand out, is the allocator's business
 * (meta/alloc.c).
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/refcount.h"
#include "base/check.h"
#include "format/header.h"
#include "base/tablemap.h"
#include "base/cleanup.h"
#include "format/endian.h"
#include "format/entries.h"
#include "meta/corrupt.h"
#include "meta/hostio.h"
#include "meta/log.h"
#include "meta/regions.h"
#include "base/lockorder.h"

/* The refcounts in memory, loaded when the image is opened for writing. */
struct qcow2_refcounts {
  uint64_t *table;            /* host order */
  uint64_t table_entries;
  uint64_t table_offset;      /* where the table is, or goes, on disk */
  uint32_t table_clusters;
  bool table_dirty;           /* entries changed since written */
  bool table_moved;           /* grown: write it whole, then the header */
  struct tablemap blocks;     /* every refcount block loaded so far */
  unsigned width_order;       /* refcount_order */
  unsigned block_bits;        /* log2 of refcounts per block */
  uint64_t max_refcount;
};

static uint64_t
entry_get (const uint8_t *block, uint64_t index, unsigned order)
{
  switch (order) {
  case 0: case 1: case 2: {
    unsigned width = 1u << order;
    uint64_t bit = index * width;
    return (block[bit / 8] >> (bit % 8)) & ((1u << width) - 1);
  }
  case 3: return block[index];
  case 4: return ((uint64_t) block[2 * index] << 8) | block[2 * index + 1];
  case 5: return be32 (block + 4 * index);
  default: return be64 (block + 8 * index);
  }
}

static void
entry_set (uint8_t *block, uint64_t index, unsigned order, uint64_t value)
{
  switch (order) {
  case 0: case 1: case 2: {
    unsigned width = 1u << order;
    uint64_t bit = index * width;
    uint8_t mask = ((1u << width) - 1) << (bit % 8);
    block[bit / 8] = (block[bit / 8] & ~mask) | ((value << (bit % 8)) & mask);
    break;
  }
  case 3: block[index] = value; break;
  case 4: block[2 * index] = value >> 8; block[2 * index + 1] = value; break;
  case 5: put_be32 (block + 4 * index, value); break;
  default: put_be64 (block + 8 * index, value); break;
  }
}

/* A new, empty struct with the refcount width and block size the header
 * says, in place of what img->refcounts held.
 */
static int
set_geometry (struct qcow2_image *img)
{
  const struct qcow2_header *h = &img->header;
  struct qcow2_refcounts *rc;

  qcow2_refcount_free (img);
  rc = img->refcounts = calloc (1, sizeof *rc);
  if (rc == NULL) {
    qcow2_error (img, "out of memory for the refcounts");
    return -ENOMEM;
  }

  rc->width_order = h->refcount_order;
  rc->block_bits = h->cluster_bits + 3 - h->refcount_order;
  rc->max_refcount = h->refcount_order == 6
    ? UINT64_MAX : (UINT64_C (1) << (1u << h->refcount_order)) - 1;
  return 0;
}

int
qcow2_refcount_geometry (struct qcow2_image *img)
{
  return set_geometry (img);
}

int
qcow2_refcount_start_empty (struct qcow2_image *img, uint64_t entries)
{
  struct qcow2_refcounts *rc;
  int r = set_geometry (img);

  if (r < 0)
    return r;
  rc = img->refcounts;
  rc->table = calloc (entries ? entries : 1, sizeof *rc->table);
  if (rc->table == NULL) {
    qcow2_error (img, "out of memory for the refcount table");
    return -ENOMEM;
  }
  rc->table_entries = entries;
  rc->table_offset = img->header.refcount_table_offset;
  rc->table_clusters = img->header.refcount_table_clusters;
  return 0;
}

int
qcow2_refcount_load (struct qcow2_image *img, struct qcow2_io *io)
{
  const struct qcow2_header *h = &img->header;
  struct qcow2_refcounts *rc;
  uint64_t bytes = (uint64_t) h->refcount_table_clusters << h->cluster_bits;
  uint64_t i;
  int r;

  r = set_geometry (img);
  if (r < 0)
    return r;
  rc = img->refcounts;
  rc->table_offset = h->refcount_table_offset;
  rc->table_clusters = h->refcount_table_clusters;
  rc->table_entries = bytes / 8;

  if (h->refcount_table_offset > img->file_size ||
      bytes > img->file_size - h->refcount_table_offset) {
    qcow2_error (img, "refcount_table_offset: the refcount table "
                 "(0x%" PRIx64 ", %u clusters) lies outside the file; the "
                 "image cannot be written (serve it read-only with nbdkit -r)",
                 h->refcount_table_offset, h->refcount_table_clusters);
    return -EINVAL;
  }
  rc->table = malloc (bytes);
  if (rc->table == NULL) {
    qcow2_error (img, "out of memory for the refcount table");
    return -ENOMEM;
  }
  r = qcow2_pread_clamped (img, io, rc->table, bytes, h->refcount_table_offset);
  if (r < 0)
    return r;
  for (i = 0; i < rc->table_entries; ++i) {
    uint64_t e = be64 (&rc->table[i]);
    uint64_t off = e & RTE_OFFSET_MASK;

    rc->table[i] = e;
    if (e == 0)
      continue;
    if ((e & RTE_RESERVED_MASK) || (off & (h->cluster_size - 1)) ||
        off >= img->file_size || h->cluster_size > img->file_size - off) {
      qcow2_error (img, "refcount table entry %" PRIu64 " (0x%016" PRIx64
                   ") is invalid: reserved bits, unaligned or outside the "
                   "file; the image cannot be written (serve it read-only "
                   "with nbdkit -r)", i, e);
      return -EINVAL;
    }
  }
  return 0;
}

void
qcow2_refcount_free (struct qcow2_image *img)
{
  struct qcow2_refcounts *rc = img->refcounts;

  if (rc == NULL)
    return;
  tablemap_clear (&rc->blocks);
  free (rc->table);
  free (rc);
  img->refcounts = NULL;
}

uint64_t
qcow2_refcount_max (const struct qcow2_image *img)
{
  return img->refcounts->max_refcount;
}

unsigned
qcow2_refcount_block_bits (const struct qcow2_image *img)
{
  return img->refcounts->block_bits;
}

uint64_t
qcow2_refcount_table_entries (const struct qcow2_image *img)
{
  return img->refcounts->table_entries;
}

void
qcow2_refcount_table_location (const struct qcow2_image *img,
                               uint64_t *offset, uint32_t *clusters)
{
  *offset = img->refcounts->table_offset;
  *clusters = img->refcounts->table_clusters;
}

int
qcow2_refcount_each_block (const struct qcow2_image *img,
                           int (*fn) (void *opaque, uint64_t offset),
                           void *opaque)
{
  const struct qcow2_refcounts *rc = img->refcounts;
  uint64_t i;
  int r;

  for (i = 0; i < rc->table_entries; ++i)
    if ((rc->table[i] & RTE_OFFSET_MASK) &&
        (r = fn (opaque, rc->table[i] & RTE_OFFSET_MASK)) != 0)
      return r;
  return 0;
}

/* A new block in memory, read from OFF: *OUT, or -errno after logging
 * (then nothing to free).
 */
static int
read_block (struct qcow2_image *img, struct qcow2_io *io, uint64_t off,
            struct meta_table **out)
{
  struct meta_table *t = malloc (sizeof *t + img->header.cluster_size);
  int r;

  *out = NULL;
  if (t == NULL) {
    qcow2_error (img, "out of memory for a refcount block");
    return -ENOMEM;
  }
  t->offset = off;
  t->dirty = false;
  r = qcow2_pread_clamped (img, io, t->data, img->header.cluster_size, off);
  if (r < 0) {
    free (t);
    return r;
  }
  *out = t;
  return 0;
}

/* The block for table index RT_INDEX, loaded if needed; *BLOCK is NULL if
 * the table has no block there (every refcount it would hold is 0).
 */
static int
get_block (struct qcow2_image *img, struct qcow2_io *io, uint64_t rt_index,
           struct meta_table **block)
{
  struct qcow2_refcounts *rc = img->refcounts;
  uint64_t off;
  struct meta_table *t;
  int r;

  *block = NULL;
  if (rt_index >= rc->table_entries)
    return 0;
  off = rc->table[rt_index] & RTE_OFFSET_MASK;
  if (off == 0)
    return 0;
  t = tablemap_find (&rc->blocks, off);
  if (t == NULL && !qcow2_regions_is (img, QCOW2_REGION_REFCOUNT_BLOCK, off))
    return qcow2_mark_corrupt (img, io, "refcount table entry %" PRIu64
                               " names the %s at host offset 0x%" PRIx64
                               " as a refcount block", rt_index,
                               qcow2_region_name
                               (qcow2_regions_kind (img, off >>
                                                    img->header.cluster_bits)),
                               off);
  if (t == NULL) {
    r = read_block (img, io, off, &t);
    if (r == 0 && tablemap_insert (&rc->blocks, t) == -1) {
      qcow2_error (img, "out of memory for a refcount block");
      r = -ENOMEM;
    }
    if (r < 0) {
      free (t);
      return r;
    }
  }
  *block = t;
  return 0;
}

int
qcow2_refcount_fetch (struct qcow2_image *img, struct qcow2_io *io,
                      uint64_t cluster, struct refcount_fetch *f)
{
  const struct qcow2_refcounts *rc = img->refcounts;
  const uint64_t rt_index = cluster >> rc->block_bits;
  struct meta_table *t;
  uint64_t off;
  unsigned i;
  int r;

  if (f->n == QCOW2_REFCOUNT_FETCH_MAX || rt_index >= rc->table_entries)
    return 0;
  off = rc->table[rt_index] & RTE_OFFSET_MASK;
  /* An entry that names no block, or something else (get_block marks
   * the image corrupt for that, with the lock held exclusively).
   */
  if (off == 0 || tablemap_find (&rc->blocks, off) != NULL ||
      !qcow2_regions_is (img, QCOW2_REGION_REFCOUNT_BLOCK, off))
    return 0;
  for (i = 0; i < f->n; ++i)
    if (f->rt_index[i] == rt_index)
      return 0;
  /* Not in memory, so not changed since the image was opened: what the
   * storage holds is current.
   */
  r = read_block (img, io, off, &t);
  if (r < 0)
    return r;
  f->rt_index[f->n] = rt_index;
  f->block[f->n++] = t;
  return 0;
}

void
qcow2_refcount_adopt (struct qcow2_image *img, struct refcount_fetch *f)
{
  struct qcow2_refcounts *rc = img->refcounts;
  unsigned i;

  qcow2_rwlock_assert_held (&img->lock, true);
  for (i = 0; i < f->n; ++i) {
    struct meta_table *t = f->block[i];

    if (f->rt_index[i] < rc->table_entries &&
        (rc->table[f->rt_index[i]] & RTE_OFFSET_MASK) == t->offset &&
        tablemap_find (&rc->blocks, t->offset) == NULL &&
        tablemap_insert (&rc->blocks, t) == 0)
      continue;
    free (t);
  }
  f->n = 0;
}

int
qcow2_refcount_get (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t cluster, uint64_t *refcount)
{
  const struct qcow2_refcounts *rc = img->refcounts;
  struct meta_table *block;
  int r = get_block (img, io, cluster >> rc->block_bits, &block);

  if (r < 0)
    return r;
  *refcount = block
    ? entry_get (block->data, cluster & ((UINT64_C (1) << rc->block_bits) - 1),
                 rc->width_order)
    : 0;
  return 0;
}

int
qcow2_refcount_add (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t cluster, int delta, uint64_t *now)
{
  struct qcow2_refcounts *rc = img->refcounts;
  uint64_t rt_index = cluster >> rc->block_bits;
  uint64_t index = cluster & ((UINT64_C (1) << rc->block_bits) - 1);
  struct meta_table *block;
  uint64_t value;
  int r;

  r = get_block (img, io, rt_index, &block);
  if (r < 0)
    return r;
  if (block == NULL) {
    if (delta < 0)
      goto underflow;
    QCOW2_ASSERT (block != NULL);
    qcow2_error (img, "internal error: no refcount block for host cluster "
                 "0x%" PRIx64, cluster << img->header.cluster_bits);
    return -EIO;
  }
  value = entry_get (block->data, index, rc->width_order);
  if (delta < 0 && value < (uint64_t) -delta)
    goto underflow;
  if (delta > 0 && rc->max_refcount - value < (uint64_t) delta)
    return qcow2_mark_corrupt (img, io, "the refcount of host cluster 0x%"
                               PRIx64 " would exceed %" PRIu64
                               " (refcount_order %u)",
                               cluster << img->header.cluster_bits,
                               rc->max_refcount, rc->width_order);
  value += delta;
  entry_set (block->data, index, rc->width_order, value);
  block->dirty = true;
  if (now)
    *now = value;
  return 0;

 underflow:
  return qcow2_mark_corrupt (img, io, "the refcount of host cluster 0x%"
                             PRIx64 " would drop below zero",
                             cluster << img->header.cluster_bits);
}

int
qcow2_refcount_set (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t cluster, uint64_t value)
{
  struct qcow2_refcounts *rc = img->refcounts;
  struct meta_table *block;
  int r = get_block (img, io, cluster >> rc->block_bits, &block);

  if (r < 0)
    return r;
  if (block == NULL || value > rc->max_refcount) {
    qcow2_error (img, "internal error: refcount %" PRIu64 " of host cluster "
                 "0x%" PRIx64 " cannot be set", value,
                 cluster << img->header.cluster_bits);
    return -EIO;
  }
  entry_set (block->data, cluster & ((UINT64_C (1) << rc->block_bits) - 1),
             rc->width_order, value);
  block->dirty = true;
  return 0;
}

int
qcow2_refcount_has_block (struct qcow2_image *img, struct qcow2_io *io,
                          uint64_t rt_index, bool *has)
{
  struct meta_table *block;
  int r = get_block (img, io, rt_index, &block);

  *has = block != NULL;
  return r;
}

int
qcow2_refcount_add_block (struct qcow2_image *img, uint64_t rt_index,
                          uint64_t cluster)
{
  struct qcow2_refcounts *rc = img->refcounts;
  struct meta_table *t = calloc (1, sizeof *t + img->header.cluster_size);

  if (t == NULL) {
    qcow2_error (img, "out of memory for a refcount block");
    return -ENOMEM;
  }
  t->offset = cluster << img->header.cluster_bits;
  t->dirty = true;
  if (tablemap_insert (&rc->blocks, t) == -1) {
    free (t);
    qcow2_error (img, "out of memory for a refcount block");
    return -ENOMEM;
  }
  rc->table[rt_index] = t->offset;
  rc->table_dirty = true;
  return 0;
}

int
qcow2_refcount_resize_table (struct qcow2_image *img, uint64_t entries)
{
  struct qcow2_refcounts *rc = img->refcounts;
  uint64_t *table, i;

  if (entries < rc->table_entries) {
    /* Taking a growth back: only entries that name no block go. */
    for (i = entries; i < rc->table_entries; ++i)
      if (rc->table[i])
        return -EBUSY;
    rc->table_entries = entries;
    return 0;
  }
  table = realloc (rc->table, entries * 8);
  if (table == NULL) {
    qcow2_error (img, "out of memory for the refcount table");
    return -ENOMEM;
  }
  memset (table + rc->table_entries, 0, (entries - rc->table_entries) * 8);
  rc->table = table;
  rc->table_entries = entries;
  return 0;
}

void
qcow2_refcount_place_table (struct qcow2_image *img, uint64_t offset,
                            uint32_t clusters)
{
  struct qcow2_refcounts *rc = img->refcounts;

  rc->table_offset = offset;
  rc->table_clusters = clusters;
  rc->table_dirty = true;
  rc->table_moved = true;
}

struct snapshot_ctx {
  struct qcow2_image *img;
  struct refcount_snapshot *snap;
  size_t capacity;
};

static int
count_dirty (void *opaque, struct meta_table *t)
{
  size_t *n = opaque;

  *n += t->dirty;
  return 0;
}

static int
copy_block (void *opaque, struct meta_table *t)
{
  struct snapshot_ctx *ctx = opaque;
  struct refcount_snapshot *snap = ctx->snap;
  const size_t cluster_size = ctx->img->header.cluster_size;

  if (!t->dirty || snap->nblocks == ctx->capacity)
    return 0;
  memcpy (snap->data + snap->nblocks * cluster_size, t->data, cluster_size);
  snap->blocks[snap->nblocks++] = t;
  t->dirty = false;
  return 0;
}

int
qcow2_refcount_snapshot (struct qcow2_image *img,
                         struct refcount_snapshot *snap)
{
  struct qcow2_refcounts *rc = img->refcounts;
  struct snapshot_ctx ctx = { .img = img, .snap = snap };
  CLEANUP_FREE struct meta_table **blocks = NULL;
  CLEANUP_FREE uint8_t *data = NULL, *table = NULL;
  size_t n = 0;
  uint64_t i;

  memset (snap, 0, sizeof *snap);
  if (rc->table_dirty && rc->table_entries * 8 >
      ((uint64_t) rc->table_clusters << img->header.cluster_bits)) {
    /* Grown in memory and not placed yet: written where it is, it would
     * run over the clusters after it.
     */
    qcow2_error (img, "internal error: the refcount table (%" PRIu64
                 " entries) has outgrown its %u clusters at 0x%" PRIx64,
                 rc->table_entries, rc->table_clusters, rc->table_offset);
    return -EIO;
  }
  tablemap_each (&rc->blocks, count_dirty, &n);
  if (n) {
    blocks = malloc (n * sizeof *blocks);
    data = malloc (n * (size_t) img->header.cluster_size);
    if (blocks == NULL || data == NULL)
      goto nomem;
  }
  if (rc->table_dirty) {
    table = malloc (rc->table_entries * 8);
    if (table == NULL)
      goto nomem;
    for (i = 0; i < rc->table_entries; ++i)
      put_be64 (table + 8 * i, rc->table[i]);
    snap->table_bytes = rc->table_entries * 8;
    snap->table_offset = rc->table_offset;
    snap->table_clusters = rc->table_clusters;
    snap->table_moved = rc->table_moved;
    rc->table_dirty = false;
    rc->table_moved = false;
  }
  snap->blocks = blocks;
  snap->data = data;
  snap->table = table;
  blocks = NULL;
  data = table = NULL;
  ctx.capacity = n;
  tablemap_each (&rc->blocks, copy_block, &ctx);
  return 0;

 nomem:
  qcow2_error (img, "out of memory writing the refcounts back");
  return -ENOMEM;
}

int
qcow2_refcount_write (struct qcow2_image *img, struct qcow2_io *io,
                      const struct refcount_snapshot *snap)
{
  const size_t cluster_size = img->header.cluster_size;
  struct qcow2_header moved;
  struct qcow2_field_bytes field;
  size_t i;
  int r;

  for (i = 0; i < snap->nblocks; ++i) {
    r = qcow2_pwrite_meta (img, io, QCOW2_REGION_REFCOUNT_BLOCK,
                           snap->data + i * cluster_size, cluster_size,
                           snap->blocks[i]->offset);
    if (r < 0)
      return r;
  }
  if (snap->table == NULL)
    return 0;

  /* New blocks must be on disk before the table points at them. */
  if (snap->nblocks) {
    r = qcow2_flush_logged (img, io);
    if (r < 0)
      return r;
  }
  r = qcow2_pwrite_meta (img, io, QCOW2_REGION_REFCOUNT_TABLE, snap->table,
                         snap->table_bytes, snap->table_offset);
  if (r < 0 || !snap->table_moved)
    return r;

  /* The whole new table must be durable before the header names it. */
  r = qcow2_flush_logged (img, io);
  if (r < 0)
    return r;
  moved = img->header;
  moved.refcount_table_offset = snap->table_offset;
  moved.refcount_table_clusters = snap->table_clusters;
  qcow2_header_field (&moved, QCOW2_FIELD_REFCOUNT_TABLE, &field);
  return qcow2_pwrite_meta (img, io, QCOW2_REGION_HEADER, field.bytes,
                            field.len, field.offset);
}

void
qcow2_refcount_snapshot_done (struct qcow2_image *img,
                              struct refcount_snapshot *snap, bool written)
{
  struct qcow2_refcounts *rc = img->refcounts;
  size_t i;

  if (written && snap->table_moved) {
    img->header.refcount_table_offset = snap->table_offset;
    img->header.refcount_table_clusters = snap->table_clusters;
  }
  if (!written) {
    for (i = 0; i < snap->nblocks; ++i)
      snap->blocks[i]->dirty = true;
    if (snap->table) {
      rc->table_dirty = true;
      /* Moved again since is still moved. */
      rc->table_moved |= snap->table_moved;
    }
  }
  free (snap->blocks);
  free (snap->data);
  free (snap->table);
  memset (snap, 0, sizeof *snap);
}

bool
qcow2_refcount_dirty (struct qcow2_image *img)
{
  size_t n = 0;

  if (img->refcounts->table_dirty)
    return true;
  tablemap_each (&img->refcounts->blocks, count_dirty, &n);
  return n > 0;
}
