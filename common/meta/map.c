/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: where guest clusters live: the L1 table, L2 lookups
 * and the validation of every entry before it is used.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "meta/log.h"
#include "meta/map.h"
#include "base/cache.h"
#include "base/check.h"
#include "format/endian.h"
#include "format/entries.h"
#include "meta/dirty.h"
#include "meta/hostio.h"
#include "base/lockorder.h"

/* The map: the L1 table in memory and the cache of L2 tables. */
struct qcow2_map {
  uint64_t *l1;                       /* host order, l1_size entries */
  /* Images opened for writing: per L1 entry, changed since a writeback
   * copied it, and whether any is.
   */
  uint8_t *l1_changed;
  bool l1_any_changed;
  struct qcow2_cache *l2_cache;       /* raw big-endian L2 tables */
  /* Per L1 entry: its L2 table as on disk, when every entry of it
   * follows from the first (see run_of): that entry with RUN_KNOWN and
   * the bitmap's kind in its reserved bits, else 0.  A lookup answered
   * here needs neither the cache nor a read, so an L2 cache smaller than
   * the tables costs reads only for tables that are not one run.  Set by
   * readers (lock shared) from a table just read; cleared with the lock
   * held exclusively when the L1 entry changes or the table is made
   * ready for change (qcow2_l2_run_forget), so a value read with the
   * lock held is the disk's table until the lock is let go.
   */
  _Atomic uint64_t *runs;
  /* Images opened for writing: the host offsets of L2 tables read from
   * disk since the allocator last took them (meta/uncounted.c checks
   * them against the refcounts).  A reader that finds the list full
   * drops its table: the check covers what it can at no cost to reads.
   */
  struct qcow2_mutex loaded_lock;     /* leaf: held for a copy only */
  uint64_t loaded[QCOW2_L2_LOADED_MAX];
  _Atomic size_t nloaded;             /* changed under the lock only */
};

/* The reserved bits of a standard L2 entry (1 to 8) that a run's value
 * uses: known, and the kind of bitmap every extended entry carries.
 */
#define RUN_KNOWN          (UINT64_C (1) << 1)
#define RUN_BITMAP_SHIFT   2
#define RUN_BITMAP_MASK    (UINT64_C (3) << RUN_BITMAP_SHIFT)
#define RUN_FLAGS          (RUN_KNOWN | RUN_BITMAP_MASK)

static const uint64_t run_bitmaps[] = {
  0,                                    /* none allocated, none zero */
  UINT64_C (0x00000000ffffffff),        /* every subcluster allocated */
  UINT64_C (0xffffffff00000000),        /* every subcluster zero */
};

/* The subcluster bitmap every entry of the run RUN carries. */
static inline uint64_t
run_bitmap (uint64_t run)
{
  return run_bitmaps[(run & RUN_BITMAP_MASK) >> RUN_BITMAP_SHIFT];
}

/* Entry I of a run starting with FIRST (a value of map->runs without its
 * flags): consecutive host clusters if FIRST names one, else FIRST
 * throughout (unallocated or zero).
 */
static inline uint64_t
run_entry (const struct qcow2_header *h, uint64_t first, uint64_t i)
{
  return (first & L2E_OFFSET_MASK) ? first + (i << h->cluster_bits) : first;
}

/* How many entries of L1 entry L1_INDEX's table map clusters of the
 * disk (the last table's others are never looked up).
 */
static uint64_t
entries_in_disk (const struct qcow2_header *h, uint64_t l1_index)
{
  const uint64_t per_table = UINT64_C (1) << h->l2_bits;
  const uint64_t disk_clusters =
    (h->virtual_size + h->cluster_size - 1) >> h->cluster_bits;
  const uint64_t first = l1_index << h->l2_bits;

  if (first >= disk_clusters)
    return 0;
  return disk_clusters - first < per_table ? disk_clusters - first
    : per_table;
}

/* The value map->runs keeps for the L2 table TABLE (as on disk) of L1
 * entry L1_INDEX, or 0 if its entries inside the disk do not all follow
 * from the first, or those past the end of the disk are not all 0 (the
 * table is rebuilt from the value when a writer loads it: run_table).
 * Compressed entries never follow: their offsets are bytes.
 */
static uint64_t
run_of (const struct qcow2_image *img, uint64_t l1_index,
        const uint8_t *table)
{
  const struct qcow2_header *h = &img->header;
  const size_t esize = h->l2_entry_size;
  const uint64_t n = entries_in_disk (h, l1_index);
  uint64_t first = be64 (table), bitmap = 0, i;
  unsigned kind;

  if (n == 0 || (first & (L2E_RESERVED_MASK | L2E_COMPRESSED)))
    return 0;
  for (i = n * esize; i < h->cluster_size; ++i)
    if (table[i])
      return 0;
  if (esize == 16)
    bitmap = be64 (table + 8);
  for (kind = 0; kind < 3 && run_bitmaps[kind] != bitmap; ++kind)
    ;
  if (kind == 3)
    return 0;
  for (i = 1; i < n; ++i)
    if (be64 (table + i * esize) != run_entry (h, first, i) ||
        (esize == 16 && be64 (table + i * esize + 8) != bitmap))
      return 0;
  return first | RUN_KNOWN | ((uint64_t) kind << RUN_BITMAP_SHIFT);
}

/* Entries [L2_INDEX, L2_INDEX + COUNT) of the run RUN, in host order. */
static void
run_entries (const struct qcow2_header *h, uint64_t run, uint64_t l2_index,
             size_t count, uint64_t *entries, uint64_t *bitmaps)
{
  const uint64_t first = run & ~RUN_FLAGS;
  const uint64_t bitmap = run_bitmap (run);
  size_t i;

  for (i = 0; i < count; ++i)
    entries[i] = run_entry (h, first, l2_index + i);
  if (bitmaps && h->l2_entry_size == 16)
    for (i = 0; i < count; ++i)
      bitmaps[i] = bitmap;
}

/* The whole table of L1 entry L1_INDEX, kept as the run RUN, as on disk
 * into BUF (a cluster).
 */
static void
run_table (const struct qcow2_header *h, uint64_t l1_index, uint64_t run,
           uint8_t *buf)
{
  const uint64_t n = entries_in_disk (h, l1_index);
  const uint64_t first = run & ~RUN_FLAGS;
  const uint64_t bitmap = run_bitmap (run);
  uint64_t i;

  memset (buf, 0, h->cluster_size);
  for (i = 0; i < n; ++i) {
    uint8_t *at = buf + i * h->l2_entry_size;

    put_be64 (at, run_entry (h, first, i));
    if (h->l2_entry_size == 16)
      put_be64 (at + 8, bitmap);
  }
}

/* An L2 table at OFFSET was read from disk into the cache. */
static void
note_loaded (struct qcow2_map *map, uint64_t offset)
{
  if (map->l1_changed == NULL)
    return;                     /* read-only: nothing is allocated */
  qcow2_mutex_lock (&map->loaded_lock);
  if (map->nloaded < QCOW2_L2_LOADED_MAX)
    map->loaded[map->nloaded++] = offset;
  qcow2_mutex_unlock (&map->loaded_lock);
}

size_t
qcow2_l2_loaded_take (struct qcow2_image *img, uint64_t *offsets)
{
  struct qcow2_map *map = img->map;
  size_t n;

  if (map->nloaded == 0)
    return 0;                   /* looked at without the lock: cheap */
  qcow2_mutex_lock (&map->loaded_lock);
  n = map->nloaded;
  memcpy (offsets, map->loaded, n * sizeof *offsets);
  map->nloaded = 0;
  qcow2_mutex_unlock (&map->loaded_lock);
  return n;
}

bool
qcow2_l2_table_cached (struct qcow2_image *img, uint64_t offset,
                       uint8_t *buf)
{
  return qcow2_cache_get (img->map->l2_cache, offset, 0, buf,
                          img->header.cluster_size);
}

int
qcow2_guest_range_check (struct qcow2_image *img, const char *what,
                         uint64_t count, uint64_t offset)
{
  if (offset > img->header.virtual_size ||
      count > img->header.virtual_size - offset) {
    qcow2_error (img, "%s of %" PRIu64 " bytes at %" PRIu64
                 " is beyond the virtual size %" PRIu64,
                 what, count, offset, img->header.virtual_size);
    return -EINVAL;
  }
  return 0;
}

int
qcow2_map_open (struct qcow2_image *img, struct qcow2_io *io,
                uint64_t l2_cache_bytes)
{
  const struct qcow2_header *h = &img->header;
  struct qcow2_map *map = calloc (1, sizeof *map);
  uint32_t i;
  int r;

  if (map == NULL)
    goto nomem;
  img->map = map;
  qcow2_mutex_init (&map->loaded_lock, QCOW2_RANK_LEAF,
                    "the L2 tables read since the allocator looked");
  map->l2_cache = qcow2_cache_new (h->cluster_size, l2_cache_bytes);
  map->l1 = calloc (h->l1_size ? h->l1_size : 1, sizeof *map->l1);
  map->runs = calloc (h->l1_size ? h->l1_size : 1, sizeof *map->runs);
  if (map->l2_cache == NULL || map->l1 == NULL || map->runs == NULL)
    goto nomem;
  if (img->opts.writable &&
      (map->l1_changed = calloc (h->l1_size ? h->l1_size : 1, 1)) == NULL)
    goto nomem;
  if (h->l1_size == 0)
    return 0;
  r = qcow2_pread_clamped (img, io, map->l1, (uint64_t) h->l1_size * 8,
                           h->l1_table_offset);
  if (r < 0)
    return r;
  for (i = 0; i < h->l1_size; ++i)
    map->l1[i] = be64 (&map->l1[i]);
  return 0;

 nomem:
  qcow2_error (img, "out of memory for the L1 table (%u entries) and the "
               "L2 cache", h->l1_size);
  return -ENOMEM;
}

void
qcow2_map_close (struct qcow2_image *img)
{
  struct qcow2_map *map = img->map;

  if (map == NULL)
    return;
  qcow2_cache_free (map->l2_cache);
  qcow2_mutex_destroy (&map->loaded_lock);
  free (map->l1);
  free (map->runs);
  free (map->l1_changed);
  free (map);
  img->map = NULL;
}

uint64_t
qcow2_l1_entry (const struct qcow2_image *img, uint64_t l1_index)
{
  QCOW2_ASSERT (l1_index < img->header.l1_size);
  return img->map->l1[l1_index];
}

void
qcow2_l1_set_entry (struct qcow2_image *img, uint64_t l1_index,
                    uint64_t entry)
{
  QCOW2_ASSERT (l1_index < img->header.l1_size);
  img->map->l1[l1_index] = entry;
  qcow2_l2_run_forget (img, l1_index);
}

void
qcow2_l2_run_forget (struct qcow2_image *img, uint64_t l1_index)
{
  QCOW2_ASSERT (l1_index < img->header.l1_size);
  atomic_store_explicit (&img->map->runs[l1_index], 0, memory_order_relaxed);
}

void
qcow2_l1_mark_changed (struct qcow2_image *img, uint64_t l1_index)
{
  QCOW2_ASSERT (l1_index < img->header.l1_size && img->map->l1_changed);
  img->map->l1_changed[l1_index] = 1;
  img->map->l1_any_changed = true;
}

bool
qcow2_l1_changed (const struct qcow2_image *img, uint64_t l1_index)
{
  return img->map->l1_changed && img->map->l1_changed[l1_index];
}

bool
qcow2_l1_any_changed (const struct qcow2_image *img)
{
  return img->map->l1_any_changed;
}

int
qcow2_l1_copy (struct qcow2_image *img, struct l1_copy *copy)
{
  struct qcow2_map *map = img->map;
  size_t n = 0;
  uint32_t i;

  memset (copy, 0, sizeof *copy);
  if (!map->l1_any_changed)
    return 0;
  for (i = 0; i < img->header.l1_size; ++i)
    n += map->l1_changed[i];
  if (n) {
    copy->index = malloc (n * sizeof *copy->index);
    copy->data = malloc (n * 8);
    if (copy->index == NULL || copy->data == NULL) {
      free (copy->index);
      free (copy->data);
      memset (copy, 0, sizeof *copy);
      qcow2_error (img, "out of memory writing the L1 table back");
      return -ENOMEM;
    }
  }
  for (i = 0; copy->count < n; ++i)
    if (map->l1_changed[i]) {
      copy->index[copy->count] = i;
      put_be64 (copy->data + 8 * copy->count, map->l1[i]);
      copy->count++;
      map->l1_changed[i] = 0;
    }
  map->l1_any_changed = false;
  return 0;
}

int
qcow2_l1_copy_write (struct qcow2_image *img, struct qcow2_io *io,
                     const struct l1_copy *copy)
{
  size_t i = 0, j;
  int r;

  while (i < copy->count) {
    /* A run of consecutive entries, in one write. */
    j = i + 1;
    while (j < copy->count && copy->index[j] == copy->index[j - 1] + 1)
      j++;
    r = qcow2_pwrite_meta (img, io, QCOW2_REGION_L1, copy->data + 8 * i,
                           8 * (j - i), img->header.l1_table_offset +
                           8 * (uint64_t) copy->index[i]);
    if (r < 0)
      return r;
    i = j;
  }
  return 0;
}

void
qcow2_l1_copy_done (struct qcow2_image *img, struct l1_copy *copy,
                    bool written)
{
  size_t i;

  if (!written && copy->count) {
    for (i = 0; i < copy->count; ++i)
      img->map->l1_changed[copy->index[i]] = 1;
    img->map->l1_any_changed = true;
  }
  free (copy->index);
  free (copy->data);
  memset (copy, 0, sizeof *copy);
}

bool
qcow2_l1_unallocated (const struct qcow2_image *img, uint64_t l1_index)
{
  return l1_index >= img->header.l1_size || img->map->l1[l1_index] == 0;
}

int
qcow2_l2_table_read (struct qcow2_image *img, struct qcow2_io *io,
                     uint64_t l1_index, uint8_t *buf)
{
  const uint32_t cluster_size = img->header.cluster_size;
  const uint64_t offset = qcow2_l1_entry (img, l1_index) & L1E_OFFSET_MASK;
  uint64_t run;
  int r;

  if (qcow2_cache_get (img->map->l2_cache, offset, 0, buf, cluster_size))
    return 0;
  run = atomic_load_explicit (&img->map->runs[l1_index],
                              memory_order_relaxed);
  if (run) {
    run_table (&img->header, l1_index, run, buf);
    return 0;
  }
  r = qcow2_pread_clamped (img, io, buf, cluster_size, offset);
  if (r == 0) {
    qcow2_cache_put (img->map->l2_cache, offset, buf);
    note_loaded (img->map, offset);
    atomic_store_explicit (&img->map->runs[l1_index],
                           run_of (img, l1_index, buf), memory_order_relaxed);
  }
  return r;
}

void
qcow2_l2_table_written (struct qcow2_image *img, uint64_t offset,
                        const uint8_t *data)
{
  qcow2_cache_put (img->map->l2_cache, offset, data);
}

void
qcow2_l2_table_forget (struct qcow2_image *img, uint64_t offset)
{
  qcow2_cache_drop (img->map->l2_cache, offset);
}

void
qcow2_l2_cache_stats (struct qcow2_image *img,
                      struct qcow2_cache_stats *stats)
{
  qcow2_cache_get_stats (img->map->l2_cache, stats);
}

int
qcow2_classify (struct qcow2_image *img, uint64_t guest_cluster,
                uint64_t entry, struct cluster_map *map)
{
  const struct qcow2_header *h = &img->header;
  uint64_t guest = guest_cluster << h->cluster_bits;
  uint64_t offset, limit;

  map->l2_entry = entry;
  map->compressed_len = 0;

  if (entry & L2E_COMPRESSED) {
    uint64_t sectors = qcow2_compressed_sectors (entry, h->cluster_bits);

    offset = qcow2_compressed_offset (entry, h->cluster_bits);
    /* qemu never compresses into an encrypted image ("Compression and
     * encryption not supported at the same time"), and such data could
     * only be read undecrypted.
     */
    if (qcow2_image_encrypted (img)) {
      qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": a "
                   "compressed cluster in an encrypted image (entry 0x%016"
                   PRIx64 ")", guest, entry);
      return -EIO;
    }
    /* qemu writes no compressed cluster into an image with a data file
     * either, and would find none: its data lives in that file.
     */
    if (img->data_file) {
      qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": a "
                   "compressed cluster in an image with an external data "
                   "file (entry 0x%016" PRIx64 ")", guest, entry);
      return -EIO;
    }
    map->kind = CLUSTER_COMPRESSED;
    map->host_offset = offset;
    map->compressed_len = sectors * 512 - (offset & 511);
    if (offset >= img->file_size) {
      qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": compressed "
                   "data at host offset 0x%" PRIx64 " lies past the end of "
                   "the file (%" PRIu64 " bytes)",
                   guest, offset, img->file_size);
      return -EIO;
    }
    return 0;
  }

  if (entry & L2E_RESERVED_MASK) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": reserved "
                 "bits are set (entry 0x%016" PRIx64 ")", guest, entry);
    return -EIO;
  }
  offset = entry & L2E_OFFSET_MASK;
  if (offset & (h->cluster_size - 1)) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": host offset "
                 "0x%" PRIx64 " is not cluster aligned", guest, offset);
    return -EIO;
  }
  map->host_offset = offset;

  if ((entry & L2E_ZERO) && h->extended_l2) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": the zero "
                 "flag is reserved with extended L2 entries", guest);
    return -EIO;
  }
  if (entry & L2E_ZERO) {
    if (h->version < 3) {
      qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": the zero "
                   "flag is set in a version 2 image", guest);
      return -EIO;
    }
    map->kind = CLUSTER_ZERO;
    return 0;
  }
  /* With an external data file the host offset is into that file, where
   * guest cluster 0 has host offset 0 too: qemu tells it from an
   * unallocated entry by COPIED, which it sets on every data cluster of
   * such an image.
   */
  if (offset == 0 && !(img->data_file && (entry & L2E_COPIED))) {
    map->kind = CLUSTER_UNALLOCATED;
    return 0;
  }
  limit = img->data_file ? img->data_size : img->file_size;
  if (offset >= limit) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": host offset "
                 "0x%" PRIx64 " lies past the end of the %s "
                 "(%" PRIu64 " bytes)", guest, offset,
                 img->data_file ? "data file" : "file", limit);
    return -EIO;
  }
  map->kind = CLUSTER_NORMAL;
  return 0;
}

static int
check_bitmap (struct qcow2_image *img, uint64_t guest_cluster,
              const struct cluster_map *map, uint64_t bitmap)
{
  uint64_t guest = guest_cluster << img->header.cluster_bits;
  uint32_t alloc = bitmap, zero = bitmap >> 32;

  if (map->kind == CLUSTER_COMPRESSED && bitmap != 0) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": a compressed "
                 "cluster with a subcluster bitmap (0x%016" PRIx64 ")",
                 guest, bitmap);
    return -EIO;
  }
  if (alloc & zero) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": subclusters "
                 "both allocated and zero (bitmap 0x%016" PRIx64 ")",
                 guest, bitmap);
    return -EIO;
  }
  if (map->kind == CLUSTER_UNALLOCATED && alloc) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": allocated "
                 "subclusters in a cluster without a host offset (bitmap "
                 "0x%016" PRIx64 ")", guest, bitmap);
    return -EIO;
  }
  return 0;
}

static enum subcluster_source
subcluster_source (const struct qcow2_image *img,
                   const struct cluster_map *map, uint64_t bitmap,
                   unsigned sc)
{
  if (map->kind == CLUSTER_NORMAL && (bitmap & (UINT64_C (1) << sc)))
    return SUB_HOST;
  if ((bitmap & (UINT64_C (1) << (32 + sc))) || img->backing == NULL)
    return SUB_ZEROS;
  return SUB_BACKING;
}

enum subcluster_source
qcow2_subcluster_run (const struct qcow2_image *img,
                      const struct cluster_map *map, uint64_t bitmap,
                      uint64_t pos, uint64_t hi, uint64_t *end)
{
  const uint64_t sub = img->header.cluster_size / 32;
  const enum subcluster_source what = subcluster_source (img, map, bitmap,
                                                         pos / sub);
  uint64_t e = (pos / sub + 1) * sub;

  while (e < hi && subcluster_source (img, map, bitmap, e / sub) == what)
    e += sub;
  *end = e < hi ? e : hi;
  return what;
}

int
qcow2_classify_fetched (struct qcow2_image *img, uint64_t first, size_t i,
                        const uint64_t *entries, const uint64_t *bitmaps,
                        struct cluster_map *map)
{
  int r = qcow2_classify (img, first + i, entries[i], map);

  if (r == 0 && img->header.extended_l2)
    r = check_bitmap (img, first + i, map, bitmaps[i]);
  return r;
}

int
qcow2_l2_entries (struct qcow2_image *img, struct qcow2_io *io,
                  uint64_t first, size_t *n, uint64_t *entries,
                  uint64_t *bitmaps, uint8_t *l2buf)
{
  const struct qcow2_header *h = &img->header;
  const size_t esize = h->l2_entry_size;
  uint64_t l2_entries = UINT64_C (1) << h->l2_bits;
  uint64_t l1_index = first >> h->l2_bits;
  uint64_t l2_index = first & (l2_entries - 1);
  uint64_t l1e, l2_offset, run;
  const struct meta_table *changed;
  uint8_t raw[QCOW2_L2_BATCH * 16];
  size_t i, count = *n;
  int r;

  /* What is kept of a table read here (map->runs) is the disk's only
   * while no writer can change it meanwhile.
   */
  qcow2_rwlock_assert_held (&img->lock, false);
  if (count > l2_entries - l2_index)
    count = l2_entries - l2_index;
  if (count > QCOW2_L2_BATCH)
    count = QCOW2_L2_BATCH;
  *n = count;
  if (bitmaps)
    memset (bitmaps, 0, count * sizeof *bitmaps);

  if (l1_index >= h->l1_size) {
    /* Cannot happen for offsets inside the virtual size (the header check
     * makes the L1 table cover it); be safe anyway.
     */
    memset (entries, 0, count * sizeof *entries);
    return 0;
  }
  l1e = img->map->l1[l1_index];
  l2_offset = l1e & L1E_OFFSET_MASK;
  if (l1e & L1E_RESERVED_MASK) {
    qcow2_error (img, "L1 entry %" PRIu64 ": reserved bits are set "
                 "(entry 0x%016" PRIx64 ")", l1_index, l1e);
    return -EIO;
  }
  if (l2_offset == 0) {
    memset (entries, 0, count * sizeof *entries);
    return 0;
  }
  if (l2_offset & (h->cluster_size - 1)) {
    qcow2_error (img, "L1 entry %" PRIu64 ": L2 table offset 0x%" PRIx64
                 " is not cluster aligned", l1_index, l2_offset);
    return -EIO;
  }
  if (l2_offset > img->file_size ||
      h->cluster_size > img->file_size - l2_offset) {
    qcow2_error (img, "L1 entry %" PRIu64 ": L2 table at 0x%" PRIx64
                 " lies outside the file (%" PRIu64 " bytes)",
                 l1_index, l2_offset, img->file_size);
    return -EIO;
  }

  changed = qcow2_dirty_table (img, l2_offset);
  if (changed) {
    memcpy (raw, changed->data + l2_index * esize, count * esize);
    goto convert;
  }
  run = atomic_load_explicit (&img->map->runs[l1_index],
                              memory_order_relaxed);
  if (run) {
    run_entries (h, run, l2_index, count, entries, bitmaps);
    return 0;
  }
  if (!qcow2_cache_get (img->map->l2_cache, l2_offset, l2_index * esize,
                        raw, count * esize)) {
    r = qcow2_pread_clamped (img, io, l2buf, h->cluster_size, l2_offset);
    if (r < 0)
      return r;
    qcow2_cache_put (img->map->l2_cache, l2_offset, l2buf);
    note_loaded (img->map, l2_offset);
    atomic_store_explicit (&img->map->runs[l1_index],
                           run_of (img, l1_index, l2buf),
                           memory_order_relaxed);
    memcpy (raw, l2buf + l2_index * esize, count * esize);
  }
 convert:
  /* Extended entries are the standard entry and then the subcluster
   * bitmap.
   */
  for (i = 0; i < count; ++i) {
    entries[i] = be64 (raw + i * esize);
    if (bitmaps && esize == 16)
      bitmaps[i] = be64 (raw + i * esize + 8);
  }
  return 0;
}

void
qcow2_compressed_span (const struct cluster_map *map, uint64_t *start,
                       uint64_t *len)
{
  *start = map->host_offset & ~UINT64_C (511);
  *len = (map->host_offset & 511) + map->compressed_len;
}
