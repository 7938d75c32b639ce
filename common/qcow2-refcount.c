/* qcow2zstd engine: refcounts and cluster allocation.
 *
 * The refcount table and every refcount block touched are kept in memory
 * while the image is open for writing.  Increments are made in memory and
 * written (then flushed) before any L2 entry that needs them; decrements
 * are queued and applied only after the metadata that stopped referencing
 * the clusters is on disk, so that a freed cluster cannot be reused while
 * the disk still points at it.  A crash can therefore leak clusters but
 * never leave one referenced with refcount 0.
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2-internal.h"
#include "qcow2-endian.h"

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

int
qcow2_pwrite_logged (struct qcow2_image *img, struct qcow2_io *io,
                     const void *buf, uint64_t len, uint64_t offset)
{
  int r;

  if (offset > img->file_size || len > img->file_size - offset) {
    qcow2_error (img, "internal error: write of %" PRIu64 " bytes at 0x%"
                 PRIx64 " would go past the end of the file", len, offset);
    return -EIO;
  }
  if (img->autoclear_on_disk && (r = qcow2_first_change (img, io)) < 0)
    return r;
  r = io->pwrite (io->opaque, buf, len, offset);
  if (r < 0)
    qcow2_error (img, "write of %" PRIu64 " bytes at host offset 0x%" PRIx64
                 " failed: %s", len, offset, strerror (-r));
  else
    atomic_fetch_add_explicit (&img->unflushed_bytes, len,
                               memory_order_relaxed);
  return r;
}

int
qcow2_flush_logged (struct qcow2_image *img, struct qcow2_io *io)
{
  int r;

  atomic_store_explicit (&img->unflushed_bytes, 0, memory_order_relaxed);
  r = io->flush (io->opaque);
  if (r < 0)
    qcow2_error (img, "flush failed: %s", strerror (-r));
  return r;
}

int
qcow2_refcount_load (struct qcow2_image *img, struct qcow2_io *io)
{
  const struct qcow2_header *h = &img->header;
  struct refcounts *rc = &img->rc;
  uint64_t bytes = (uint64_t) h->refcount_table_clusters << h->cluster_bits;
  uint64_t i;
  int r;

  rc->width_order = h->refcount_order;
  rc->block_bits = h->cluster_bits + 3 - h->refcount_order;
  rc->max_refcount = h->refcount_order == 6
    ? UINT64_MAX : (UINT64_C (1) << (1u << h->refcount_order)) - 1;
  /* Storage that grows (the plugin's own file) ends only where host
   * offsets do.
   */
  rc->host_clusters = img->opts.growable
    ? QCOW2_MAX_HOST_OFFSET >> h->cluster_bits
    : img->file_size >> h->cluster_bits;
  rc->free_hint = 1;
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

static int
free_table (void *opaque, struct meta_table *t)
{
  return 0;
}

void
qcow2_refcount_free (struct qcow2_image *img)
{
  tablemap_each (&img->rc.blocks, free_table, NULL);
  tablemap_clear (&img->rc.blocks);
  free (img->rc.table);
  free (img->rc.pending);
  memset (&img->rc, 0, sizeof img->rc);
}

/* The block for table index RT_INDEX, loaded if needed; *BLOCK is NULL if
 * the table has no block there (every refcount it would hold is 0).
 */
static int
get_block (struct qcow2_image *img, struct qcow2_io *io, uint64_t rt_index,
           struct meta_table **block)
{
  struct refcounts *rc = &img->rc;
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
  if (t == NULL) {
    t = malloc (sizeof *t + img->header.cluster_size);
    if (t == NULL) {
      qcow2_error (img, "out of memory for a refcount block");
      return -ENOMEM;
    }
    t->offset = off;
    t->dirty = false;
    r = qcow2_pread_clamped (img, io, t->data, img->header.cluster_size, off);
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
qcow2_refcount_get (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t cluster, uint64_t *refcount)
{
  struct meta_table *block;
  int r = get_block (img, io, cluster >> img->rc.block_bits, &block);

  if (r < 0)
    return r;
  *refcount = block
    ? entry_get (block->data,
                 cluster & ((UINT64_C (1) << img->rc.block_bits) - 1),
                 img->rc.width_order)
    : 0;
  return 0;
}

/* Clusters the allocator must never hand out even if their refcount says
 * they are free: the header, the L1 table, the refcount table, and every
 * refcount block and changed L2 table held in memory.  A valid image
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
  return tablemap_find (&img->rc.blocks, off) != NULL ||
    tablemap_find (&img->dirty_l2, off) != NULL;
}

/* The allocator keeps this cluster free for the packing: a plain cluster
 * or a table allocated there would cut the packing short and leave the
 * rest of the current host cluster unused (qemu does that; its images
 * come out slightly larger).
 */
uint64_t
qcow2_pack_next_cluster (const struct qcow2_image *img)
{
  if (img->pack_cursor == 0)
    return UINT64_MAX;
  return (((img->pack_cursor - 1) | (img->header.cluster_size - 1)) + 1)
    >> img->header.cluster_bits;
}

static bool
in_window (const struct refcounts *rc, uint64_t cluster)
{
  return cluster >= rc->window_next && cluster < rc->window_end;
}

/* Allocations may have passed over the clusters set apart: make the
 * search look at them again.
 */
static void
release_window (struct refcounts *rc)
{
  if (rc->window_next < rc->window_end && rc->window_next < rc->free_hint)
    rc->free_hint = rc->window_next;
  rc->window_next = rc->window_end = 0;
}

void
qcow2_pack_reset (struct qcow2_image *img)
{
  uint64_t reserved = qcow2_pack_next_cluster (img);

  if (reserved < img->rc.free_hint)
    img->rc.free_hint = reserved;
  img->pack_cursor = 0;
  release_window (&img->rc);
}

/* First cluster index >= START that begins a run of COUNT free clusters
 * inside the file, or UINT64_MAX.
 */
static int
find_free (struct qcow2_image *img, struct qcow2_io *io, uint64_t start,
           uint64_t count, uint64_t *found)
{
  struct refcounts *rc = &img->rc;
  const uint64_t reserved = qcow2_pack_next_cluster (img);
  uint64_t run_start = start, i = start;
  int r;

  *found = UINT64_MAX;
  while (i < rc->host_clusters) {
    uint64_t refcount;

    if (i - run_start == count) {
      *found = run_start;
      return 0;
    }
    r = qcow2_refcount_get (img, io, i, &refcount);
    if (r < 0)
      return r;
    if (refcount != 0 || i == reserved || in_window (rc, i) ||
        holds_metadata (img, i))
      run_start = i + 1;
    i++;
  }
  if (i - run_start >= count && i <= rc->host_clusters)
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

static int grow_table (struct qcow2_image *img, struct qcow2_io *io,
                       uint64_t min_entries);

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

/* Create the refcount block for table index RT_INDEX. */
static int
new_block (struct qcow2_image *img, struct qcow2_io *io, uint64_t rt_index)
{
  struct refcounts *rc = &img->rc;
  uint64_t cluster;
  struct meta_table *t;
  bool counted;
  int r;

  if (rt_index >= rc->table_entries) {
    r = grow_table (img, io, rt_index + 1);
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
  while (cluster < rc->host_clusters && holds_metadata (img, cluster))
    cluster++;
  counted = false;
  if (cluster >= rc->host_clusters ||
      cluster >> rc->block_bits != rt_index) {
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

  t = calloc (1, sizeof *t + img->header.cluster_size);
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
  cover_allocation (img, cluster, 1);
  return counted ? 0 : qcow2_refcount_add (img, io, cluster, 1);
}

int
qcow2_refcount_add (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t cluster, int delta)
{
  struct refcounts *rc = &img->rc;
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
    r = new_block (img, io, rt_index);
    if (r < 0)
      return r;
    r = get_block (img, io, rt_index, &block);
    if (r < 0)
      return r;
    if (block == NULL) {
      qcow2_error (img, "internal error: refcount block %" PRIu64
                   " missing after creation", rt_index);
      return -EIO;
    }
  }
  value = entry_get (block->data, index, rc->width_order);
  if (delta < 0 && value < (uint64_t) -delta)
    goto underflow;
  if (delta > 0 && rc->max_refcount - value < (uint64_t) delta) {
    qcow2_error (img, "refcount of host cluster 0x%" PRIx64 " would exceed "
                 "%" PRIu64 " (refcount_order %u)",
                 cluster << img->header.cluster_bits, rc->max_refcount,
                 rc->width_order);
    return -ERANGE;
  }
  value += delta;
  entry_set (block->data, index, rc->width_order, value);
  block->dirty = true;
  if (value == 0 && cluster < rc->free_hint)
    rc->free_hint = cluster;
  return 0;

 underflow:
  qcow2_error (img, "refcount of host cluster 0x%" PRIx64 " would drop "
               "below zero: the image's refcounts are corrupt",
               cluster << img->header.cluster_bits);
  return -EIO;
}

/* Clusters set apart at a time for plain data while packing. */
#define WINDOW_CLUSTERS 32

/* One cluster from the window, setting a new one apart when it is used
 * up; -ENOSPC when there is no run of free clusters for a window.
 */
static int
alloc_from_window (struct qcow2_image *img, struct qcow2_io *io,
                   uint64_t *offset)
{
  struct refcounts *rc = &img->rc;
  bool fresh = false;
  uint64_t first;
  int r;

  for (;;) {
    while (rc->window_next < rc->window_end) {
      uint64_t cluster = rc->window_next++;
      r = qcow2_alloc_cluster_at (img, io, cluster);
      if (r == 0) {
        *offset = cluster << img->header.cluster_bits;
        return 0;
      }
      if (r != -EBUSY)
        return r;
    }
    if (fresh)
      return -ENOSPC;
    r = find_free (img, io, rc->free_hint, WINDOW_CLUSTERS, &first);
    if (r < 0)
      return r;
    if (first == UINT64_MAX)
      return -ENOSPC;
    rc->window_next = first;
    rc->window_end = first + WINDOW_CLUSTERS;
    fresh = true;
  }
}

int
qcow2_alloc_pack_cluster (struct qcow2_image *img, struct qcow2_io *io,
                          uint64_t *offset)
{
  int r;

  img->rc.for_pack = true;
  r = qcow2_alloc_clusters (img, io, 1, offset);
  img->rc.for_pack = false;
  return r;
}

int
qcow2_alloc_clusters (struct qcow2_image *img, struct qcow2_io *io,
                      uint64_t count, uint64_t *offset)
{
  struct refcounts *rc = &img->rc;
  uint64_t first, i;
  int r;

  bool reclaimed = false;

  if (count == 1 && img->pack_cursor != 0 && !rc->for_pack &&
      !rc->in_window) {
    rc->in_window = true;
    r = alloc_from_window (img, io, offset);
    rc->in_window = false;
    if (r != -ENOSPC)
      return r;
  }

  for (;;) {
    bool still_free = true;

    r = find_free (img, io, rc->free_hint, count, &first);
    if (r < 0)
      return r;
    if (first == UINT64_MAX &&
        (qcow2_pack_next_cluster (img) != UINT64_MAX ||
         rc->window_next < rc->window_end)) {
      /* Out of room but for the clusters set apart: give them up. */
      qcow2_pack_reset (img);
      continue;
    }
    if (first == UINT64_MAX) {
      /* Released clusters wait for a metadata writeback before they may
       * be reused.  Out of room, do that writeback now rather than fail.
       */
      if (reclaimed || rc->npending == 0 || rc->no_reclaim)
        return no_room (img, count);
      reclaimed = true;
      r = qcow2_writeback_for_room (img, io);
      if (r < 0)
        return r;
      continue;
    }

    /* Make the refcount blocks first: making one takes a cluster, maybe
     * one of the run just found, and then the search starts again.
     */
    for (i = first >> rc->block_bits;
         i <= (first + count - 1) >> rc->block_bits; ++i) {
      struct meta_table *block;
      r = get_block (img, io, i, &block);
      if (r < 0)
        return r;
      if (block == NULL) {
        r = new_block (img, io, i);
        if (r < 0)
          return r;
        still_free = false;
      }
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
    r = qcow2_refcount_add (img, io, first + i, 1);
    if (r < 0)
      return r;
  }
  /* The search for one cluster found the first free one at or after the
   * hint, so nothing below it is free.  A run may have skipped single
   * free clusters, so the hint stays.
   */
  if (count == 1)
    rc->free_hint = first + 1;
  cover_allocation (img, first, count);
  *offset = first << img->header.cluster_bits;
  return 0;
}

int
qcow2_alloc_cluster_at (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t index)
{
  struct refcounts *rc = &img->rc;
  struct meta_table *block;
  uint64_t refcount;
  int r;

  if (index >= rc->host_clusters || in_window (rc, index) ||
      holds_metadata (img, index))
    return -EBUSY;
  r = get_block (img, io, index >> rc->block_bits, &block);
  if (r == 0 && block == NULL)
    r = new_block (img, io, index >> rc->block_bits);
  if (r == 0)
    r = qcow2_refcount_get (img, io, index, &refcount);
  if (r < 0)
    return r;
  if (refcount != 0)
    return -EBUSY;
  cover_allocation (img, index, 1);
  return qcow2_refcount_add (img, io, index, 1);
}

/* Make the table hold at least MIN_ENTRIES.  The grown table goes to new
 * clusters; it is written whole, and the header pointed at it, at the
 * next writeback; the old clusters are released after that.
 */
static int
grow_table (struct qcow2_image *img, struct qcow2_io *io, uint64_t min_entries)
{
  struct refcounts *rc = &img->rc;
  const struct qcow2_header *h = &img->header;
  uint64_t per_cluster = h->cluster_size / 8;
  /* Growable storage: room for the file to double first. */
  uint64_t clusters_to_cover = img->opts.growable
    ? ((img->file_size >> h->cluster_bits) + 1024) * 2 : rc->host_clusters;
  uint64_t needed = (clusters_to_cover >> rc->block_bits) + 2;
  uint64_t entries, clusters, old_offset = rc->table_offset;
  uint32_t old_clusters = rc->table_clusters;
  uint64_t *table, new_offset;
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
  table = realloc (rc->table, entries * 8);
  if (table == NULL) {
    qcow2_error (img, "out of memory for the refcount table");
    return -ENOMEM;
  }
  memset (table + rc->table_entries, 0,
          (entries - rc->table_entries) * 8);
  rc->table = table;
  rc->table_entries = entries;

  /* The table in memory is already larger than its clusters on disk: no
   * writeback may run until it has its new place.
   */
  rc->no_reclaim = true;
  r = qcow2_alloc_clusters (img, io, clusters, &new_offset);
  rc->no_reclaim = false;
  if (r < 0)
    return r;
  rc->table_offset = new_offset;
  rc->table_clusters = clusters;
  rc->table_dirty = true;
  rc->table_moved = true;
  qcow2_debug (img, "refcount table grows to %" PRIu64 " clusters at 0x%"
               PRIx64, clusters, new_offset);
  return qcow2_free_later (img, old_offset,
                           (uint64_t) old_clusters << h->cluster_bits, 0);
}

int
qcow2_free_later (struct qcow2_image *img, uint64_t offset, uint64_t length,
                  uint64_t cache_key)
{
  struct refcounts *rc = &img->rc;

  if (rc->npending == rc->pending_cap) {
    size_t cap = rc->pending_cap ? rc->pending_cap * 2 : 64;
    struct pending_free *p = realloc (rc->pending, cap * sizeof *p);
    if (p == NULL) {
      qcow2_error (img, "out of memory for the list of clusters to free");
      return -ENOMEM;
    }
    rc->pending = p;
    rc->pending_cap = cap;
  }
  rc->pending[rc->npending++] = (struct pending_free) {
    .offset = offset, .length = length, .cache_key = cache_key,
  };
  return 0;
}

int
qcow2_refcount_apply_frees (struct qcow2_image *img, struct qcow2_io *io)
{
  struct refcounts *rc = &img->rc;
  const unsigned bits = img->header.cluster_bits;
  size_t i;
  int r;

  if (rc->npending)
    atomic_fetch_add (&img->free_generation, 1);
  for (i = 0; i < rc->npending; ++i) {
    struct pending_free *p = &rc->pending[i];
    uint64_t c;

    if (p->cache_key)
      qcow2_cache_drop (img->cluster_cache, p->cache_key);
    for (c = p->offset >> bits; c <= (p->offset + p->length - 1) >> bits; ++c) {
      r = qcow2_refcount_add (img, io, c, -1);
      if (r < 0) {
        /* Keep what is left for a later try. */
        memmove (rc->pending, rc->pending + i,
                 (rc->npending - i) * sizeof *rc->pending);
        rc->npending -= i;
        return r;
      }
    }
  }
  rc->npending = 0;

  /* If the host cluster that compressed data was being packed into was
   * released entirely, it may be handed out again: pack elsewhere.
   */
  if (img->pack_cursor) {
    uint64_t refcount;
    r = qcow2_refcount_get (img, io, (img->pack_cursor - 1) >> bits,
                            &refcount);
    if (r < 0)
      return r;
    if (refcount == 0)
      qcow2_pack_reset (img);
  }
  return 0;
}

struct writeback_ctx {
  struct qcow2_image *img;
  struct qcow2_io *io;
  unsigned written;
};

static int
write_block (void *opaque, struct meta_table *t)
{
  struct writeback_ctx *ctx = opaque;
  int r;

  if (!t->dirty)
    return 0;
  r = qcow2_pwrite_logged (ctx->img, ctx->io, t->data,
                           ctx->img->header.cluster_size, t->offset);
  if (r < 0)
    return r;
  t->dirty = false;
  ctx->written++;
  return 0;
}

int
qcow2_refcount_writeback (struct qcow2_image *img, struct qcow2_io *io)
{
  struct refcounts *rc = &img->rc;
  struct writeback_ctx ctx = { .img = img, .io = io };
  uint8_t header_fields[12];
  uint8_t *buf;
  uint64_t i;
  int r;

  r = tablemap_each (&rc->blocks, write_block, &ctx);
  if (r < 0)
    return r;
  if (!rc->table_dirty)
    return 0;

  /* New blocks must be on disk before the table points at them. */
  if (ctx.written) {
    r = qcow2_flush_logged (img, io);
    if (r < 0)
      return r;
  }
  buf = malloc (rc->table_entries * 8);
  if (buf == NULL) {
    qcow2_error (img, "out of memory writing the refcount table");
    return -ENOMEM;
  }
  for (i = 0; i < rc->table_entries; ++i)
    put_be64 (buf + 8 * i, rc->table[i]);
  r = qcow2_pwrite_logged (img, io, buf, rc->table_entries * 8,
                           rc->table_offset);
  free (buf);
  if (r < 0)
    return r;
  rc->table_dirty = false;

  if (rc->table_moved) {
    /* The whole new table must be durable before the header names it. */
    r = qcow2_flush_logged (img, io);
    if (r < 0)
      return r;
    put_be64 (header_fields, rc->table_offset);
    put_be32 (header_fields + 8, rc->table_clusters);
    r = qcow2_pwrite_logged (img, io, header_fields, sizeof header_fields, 48);
    if (r < 0)
      return r;
    img->header.refcount_table_offset = rc->table_offset;
    img->header.refcount_table_clusters = rc->table_clusters;
    rc->table_moved = false;
  }
  return 0;
}
