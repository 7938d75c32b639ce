/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: repairing the refcounts of an image left dirty (see
 * meta/repair.h).
 */

#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/repair.h"
#include "meta/bitmap.h"
#include "format/endian.h"
#include "format/entries.h"
#include "format/header.h"
#include "meta/hostio.h"
#include "meta/log.h"
#include "meta/map.h"
#include "meta/refcount.h"
#include "format/snapshot.h"

/* What a host cluster holds, as the counting found it. */
enum use {
  USE_NONE,
  USE_DATA,                   /* guest data, shared by snapshots or not */
  USE_L2,                     /* an L2 table, shared by snapshots or not */
  USE_META,                   /* any other metadata: never shared */
  USE_REFCOUNT,               /* the refcount table or a block */
};

static const char *const use_names[] = {
  "nothing", "guest data", "an L2 table", "other metadata", "refcounts",
};

struct counts {
  struct qcow2_image *img;
  struct qcow2_io *io;
  uint64_t n;                 /* clusters counted */
  uint64_t limit;             /* clusters a reference may reach */
  uint32_t *refs;
  uint8_t *use;
  uint8_t *buf;               /* a cluster */
  uint64_t *table;            /* the refcount table on disk, host order */
  uint64_t table_entries;
  bool sound;                 /* that table and its blocks can be kept */
};

static int
damaged (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

static int
damaged (struct qcow2_image *img, const char *fmt, ...)
{
  char reason[768];
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (reason, sizeof reason, fmt, ap);
  va_end (ap);
  qcow2_error (img, "incompatible_features: the dirty bit is set (the "
               "refcounts may be stale), and the image cannot be repaired: "
               "%s; it is not written (serve it read-only with nbdkit -r)",
               reason);
  return -EINVAL;
}

/* One more reference to each host cluster of [OFFSET, OFFSET+LEN). */
static int
count_range (struct counts *c, uint64_t offset, uint64_t len, enum use use,
             const char *what)
{
  struct qcow2_image *img = c->img;
  const unsigned bits = img->header.cluster_bits;
  uint64_t first, last, cl;

  if (len == 0)
    return 0;
  first = offset >> bits;
  last = (offset + len - 1) >> bits;
  if (offset + len < offset || last >= c->limit)
    return damaged (img, "%s at host offset 0x%" PRIx64 " (%" PRIu64
                    " bytes) lies outside the file", what, offset, len);
  for (cl = first; cl <= last; ++cl) {
    enum use was = c->use[cl];

    if (was != USE_NONE &&
        !(was == use && (use == USE_DATA || use == USE_L2)))
      return damaged (img, "host cluster 0x%" PRIx64 " holds %s and %s "
                      "(%s) at once", cl << bits, use_names[was],
                      use_names[use], what);
    if (c->refs[cl] == UINT32_MAX ||
        c->refs[cl] >= qcow2_refcount_max (img))
      return damaged (img, "host cluster 0x%" PRIx64 " has more references "
                      "than refcount_order %u can count", cl << bits,
                      img->header.refcount_order);
    c->use[cl] = use;
    c->refs[cl]++;
  }
  return 0;
}

static int
count_bitmap_range (void *opaque, uint64_t offset, uint64_t length,
                    const char *what)
{
  return count_range (opaque, offset, length, USE_META, what);
}

/* An L2 table at OFFSET (L1 entry L1_INDEX) and what it points at. */
static int
count_l2 (struct counts *c, uint64_t l1_index, uint64_t offset)
{
  struct qcow2_image *img = c->img;
  const struct qcow2_header *h = &img->header;
  const uint64_t entries = UINT64_C (1) << h->l2_bits;
  struct cluster_map map;
  uint64_t j, start, len;
  int r;

  r = count_range (c, offset, h->cluster_size, USE_L2, "an L2 table");
  if (r == 0)
    r = qcow2_pread_clamped (img, c->io, c->buf, h->cluster_size, offset);
  for (j = 0; j < entries && r == 0; ++j) {
    uint64_t entry = be64 (c->buf + j * h->l2_entry_size);

    if (qcow2_classify (img, (l1_index << h->l2_bits) + j, entry, &map) < 0)
      return damaged (img, "an L2 entry of the table at 0x%" PRIx64 " is "
                      "invalid (above)", offset);
    switch (map.kind) {
    case CLUSTER_NORMAL:
    case CLUSTER_ZERO:
      /* Data in an external data file, which no refcount counts. */
      if (map.host_offset && !img->data_file)
        r = count_range (c, map.host_offset, h->cluster_size, USE_DATA,
                         "a data cluster");
      break;
    case CLUSTER_COMPRESSED:
      qcow2_compressed_span (&map, &start, &len);
      r = count_range (c, start, len, USE_DATA, "compressed data");
      break;
    case CLUSTER_UNALLOCATED:
      break;
    }
  }
  return r;
}

/* An L1 table of SIZE entries at OFFSET (L1: its entries in host order,
 * or NULL to read them) and all it points at.
 */
static int
count_l1 (struct counts *c, uint64_t offset, uint32_t size, const uint64_t *l1,
          const char *whose)
{
  struct qcow2_image *img = c->img;
  const uint64_t cluster_size = img->header.cluster_size;
  uint64_t *read = NULL;
  uint32_t i;
  int r;

  r = count_range (c, offset, (uint64_t) size * 8, USE_META, whose);
  if (r == 0 && l1 == NULL && size) {
    read = malloc ((uint64_t) size * 8);
    if (read == NULL) {
      qcow2_error (img, "out of memory for %s", whose);
      return -ENOMEM;
    }
    r = qcow2_pread_clamped (img, c->io, read, (uint64_t) size * 8, offset);
    for (i = 0; i < size; ++i)
      read[i] = be64 (&read[i]);
    l1 = read;
  }
  for (i = 0; i < size && r == 0; ++i) {
    uint64_t off = l1[i] & L1E_OFFSET_MASK;

    if ((l1[i] & L1E_RESERVED_MASK) || (off & (cluster_size - 1))) {
      r = damaged (img, "entry %u of %s (0x%016" PRIx64 ") has reserved "
                   "bits set or is not cluster aligned", i, whose, l1[i]);
      break;
    }
    if (off)
      r = count_l2 (c, i, off);
  }
  free (read);
  return r;
}

/* The refcount table and blocks on disk: counted in c->use as
 * USE_REFCOUNT (their refcount comes later: 1 if they are kept, else 0),
 * and c->sound cleared if anything is wrong with them.  A block entry
 * that points at other metadata or data is wrong and dropped (qemu
 * rebuilds then); a table on top of other metadata or data is damage, as
 * nothing says which of the two the cluster really is.
 */
static int
mark_refcounts (struct counts *c)
{
  struct qcow2_image *img = c->img;
  const struct qcow2_header *h = &img->header;
  const unsigned bits = h->cluster_bits;
  const uint64_t in_file = img->file_size >> bits;
  uint64_t bytes = (uint64_t) h->refcount_table_clusters << bits;
  uint64_t first = h->refcount_table_offset >> bits, i, cl;
  int r;

  /* What lies (partly) past the file's end is not kept: qemu's
   * qcow2_refcount_load refuses it too.
   */
  c->sound = false;
  if (first + h->refcount_table_clusters > in_file)
    return 0;
  for (cl = first; cl < first + h->refcount_table_clusters; ++cl) {
    if (c->use[cl] != USE_NONE)
      return damaged (img, "host cluster 0x%" PRIx64 " holds %s and the "
                      "refcount table at once", cl << bits,
                      use_names[c->use[cl]]);
    c->use[cl] = USE_REFCOUNT;
  }
  c->table_entries = bytes / 8;
  c->table = malloc (bytes);
  if (c->table == NULL) {
    qcow2_error (img, "out of memory for the refcount table");
    return -ENOMEM;
  }
  r = qcow2_pread_clamped (img, c->io, c->table, bytes,
                           h->refcount_table_offset);
  if (r < 0)
    return r;
  c->sound = true;
  for (i = 0; i < c->table_entries; ++i) {
    uint64_t e = be64 (&c->table[i]), off = e & RTE_OFFSET_MASK;

    c->table[i] = e;
    if (e == 0)
      continue;
    cl = off >> bits;
    if ((e & RTE_RESERVED_MASK) || (off & (h->cluster_size - 1)) ||
        cl >= in_file || c->use[cl] != USE_NONE) {
      c->sound = false;
      c->table[i] = 0;
      continue;
    }
    c->use[cl] = USE_REFCOUNT;
  }
  return 0;
}

/* Does every cluster in use have a block in the table on disk? */
static bool
blocks_cover (const struct counts *c)
{
  const unsigned block_bits = qcow2_refcount_block_bits (c->img);
  uint64_t cl;

  for (cl = 0; cl < c->n; ++cl)
    if ((c->refs[cl] || c->use[cl] == USE_REFCOUNT) &&
        ((cl >> block_bits) >= c->table_entries ||
         c->table[cl >> block_bits] == 0))
      return false;
  return true;
}

/* ------------------------------------------------------------ in place */

static int
set_in_place (struct counts *c, uint64_t *changed)
{
  struct qcow2_image *img = c->img;
  uint64_t cl, now;
  int r;

  for (cl = 0; cl < c->n; ++cl)
    if (c->use[cl] == USE_REFCOUNT)
      c->refs[cl] = 1;
  r = qcow2_refcount_load (img, c->io);
  for (cl = 0; cl < c->n && r == 0; ++cl) {
    r = qcow2_refcount_get (img, c->io, cl, &now);
    if (r == 0 && now != c->refs[cl]) {
      r = qcow2_refcount_set (img, c->io, cl, c->refs[cl]);
      ++*changed;
    }
  }
  return r;
}

/* ------------------------------------------------------------ rebuilt */

/* Make room for clusters up to N (growable storage only). */
static int
grow_counts (struct counts *c, uint64_t n)
{
  uint32_t *refs;
  uint8_t *use;

  if (n <= c->n)
    return 0;
  refs = realloc (c->refs, n * sizeof *refs);
  if (refs)
    c->refs = refs;
  use = realloc (c->use, n);
  if (use)
    c->use = use;
  if (refs == NULL || use == NULL) {
    qcow2_error (c->img, "out of memory rebuilding the refcounts");
    return -ENOMEM;
  }
  memset (c->refs + c->n, 0, (n - c->n) * sizeof *refs);
  memset (c->use + c->n, 0, n - c->n);
  c->n = n;
  return 0;
}

/* The first run of COUNT clusters that nothing uses (not even the old
 * refcounts, which stay intact until the header names the new ones),
 * counted as metadata: *AT.  Inside the file, but on growable storage.
 */
static int
place (struct counts *c, uint64_t count, uint64_t *at)
{
  struct qcow2_image *img = c->img;
  const uint64_t in_file = img->file_size >> img->header.cluster_bits;
  uint64_t cl, run = 0, i;
  int r;

  for (cl = 1; ; ++cl) {
    if (cl >= c->n) {
      if (!img->opts.growable) {
        const char *file = img->opts.room_file;
        qcow2_error (img, "incompatible_features: the dirty bit is set and "
                     "the refcounts must be rebuilt, but the image file has "
                     "no room for %" PRIu64 " more cluster(s) of %u bytes; "
                     "give the image room and reconnect%s%s%s, or repair "
                     "it with qemu-img check -r all; it is not written",
                     count, img->header.cluster_size,
                     file ? " (truncate -s +SIZE " : "", file ? file : "",
                     file ? ")" : "");
        return -ENOSPC;
      }
      r = grow_counts (c, c->n + count + 64);
      if (r < 0)
        return r;
    }
    if (!img->opts.growable && cl >= in_file)
      continue;
    if (c->use[cl] != USE_NONE || c->refs[cl]) {
      run = 0;
      continue;
    }
    if (++run == count)
      break;
  }
  *at = cl + 1 - count;
  for (i = *at; i <= cl; ++i) {
    c->use[i] = USE_META;
    c->refs[i] = 1;
  }
  return 0;
}

static uint64_t
highest_used (const struct counts *c)
{
  uint64_t cl = c->n;

  while (cl > 1 && c->refs[cl - 1] == 0)
    cl--;
  return cl - 1;
}

static bool
range_used (const struct counts *c, uint64_t first, uint64_t end)
{
  uint64_t cl;

  for (cl = first; cl < end && cl < c->n; ++cl)
    if (c->refs[cl])
      return true;
  return false;
}

/* A new table and blocks, in free clusters, holding every count (the old
 * refcounts' clusters counted 0 in them): placed until nothing new needs
 * a block, then made the refcounts in memory, to be written whole.
 */
static int
rebuild (struct counts *c, uint64_t *nblocks)
{
  struct qcow2_image *img = c->img;
  const unsigned bits = img->header.cluster_bits;
  const unsigned block_bits = qcow2_refcount_block_bits (img);
  const uint64_t per_cluster = img->header.cluster_size / 8;
  uint64_t table_at = 0, table_clusters = 0, entries, i, cl;
  uint64_t *block_at = NULL;
  size_t nblock_at = 0;
  bool placed;
  int r = 0;

  do {
    uint64_t want = (highest_used (c) >> block_bits) + 1;
    uint64_t want_clusters = (want + per_cluster - 1) / per_cluster;

    placed = false;
    if (want_clusters << bits > (UINT64_C (8) << 20)) {
      qcow2_error (img, "incompatible_features: the dirty bit is set, and "
                   "rebuilt refcounts would need a table of more than "
                   "8 MiB; the image is not written");
      r = -EFBIG;
      goto out;
    }
    if (want_clusters > table_clusters) {
      /* The table grows: let its old place go (it was never written). */
      for (i = 0; i < table_clusters; ++i) {
        c->use[table_at + i] = USE_NONE;
        c->refs[table_at + i] = 0;
      }
      r = place (c, want_clusters, &table_at);
      if (r < 0)
        goto out;
      table_clusters = want_clusters;
      placed = true;
    }
    if (want > nblock_at) {
      uint64_t *more = realloc (block_at, want * sizeof *more);
      if (more == NULL) {
        qcow2_error (img, "out of memory rebuilding the refcounts");
        r = -ENOMEM;
        goto out;
      }
      memset (more + nblock_at, 0, (want - nblock_at) * sizeof *more);
      block_at = more;
      nblock_at = want;
    }
    for (i = 0; i < want; ++i)
      if (block_at[i] == 0 &&
          range_used (c, i << block_bits, (i + 1) << block_bits)) {
        r = place (c, 1, &block_at[i]);
        if (r < 0)
          goto out;
        placed = true;
      }
  } while (placed);

  /* On growable storage, what was placed past the end makes it longer. */
  if (img->opts.growable &&
      (highest_used (c) + 1) << bits > img->file_size)
    img->file_size = (highest_used (c) + 1) << bits;

  entries = table_clusters * per_cluster;
  r = qcow2_refcount_start_empty (img, entries);
  for (i = 0; i < nblock_at && r == 0; ++i)
    if (block_at[i]) {
      r = qcow2_refcount_add_block (img, i, block_at[i]);
      ++*nblocks;
    }
  for (cl = 0; cl < c->n && r == 0; ++cl)
    if (c->refs[cl])
      r = qcow2_refcount_set (img, c->io, cl, c->refs[cl]);
  if (r == 0)
    qcow2_refcount_place_table (img, table_at << bits, table_clusters);

 out:
  free (block_at);
  return r;
}

/* ------------------------------------------------------------ COPIED */

/* Set COPIED in the active L1 and L2 entries where the count is 1, clear
 * it elsewhere (and in compressed entries, which never have it), writing
 * each table that changes in place.  *FIXED counts the entries.
 */
static int
fix_copied (struct counts *c, uint64_t *fixed)
{
  struct qcow2_image *img = c->img;
  const struct qcow2_header *h = &img->header;
  const uint64_t entries = UINT64_C (1) << h->l2_bits;
  const unsigned bits = h->cluster_bits;
  struct cluster_map map;
  bool l1_changed = false;
  uint64_t i, j;
  int r = 0;

  for (i = 0; i < h->l1_size && r == 0; ++i) {
    uint64_t l1e = qcow2_l1_entry (img, i), off = l1e & L1E_OFFSET_MASK;
    uint64_t want;
    bool changed = false;

    if (off == 0)
      continue;
    want = c->refs[off >> bits] == 1 ? l1e | L2E_COPIED : l1e & ~L2E_COPIED;
    if (want != l1e) {
      qcow2_l1_set_entry (img, i, want);
      l1_changed = true;
      ++*fixed;
    }
    r = qcow2_pread_clamped (img, c->io, c->buf, h->cluster_size, off);
    for (j = 0; j < entries && r == 0; ++j) {
      uint8_t *at = c->buf + j * h->l2_entry_size;
      uint64_t entry = be64 (at), should = entry;

      r = qcow2_classify (img, (i << h->l2_bits) + j, entry, &map);
      if (r < 0)
        break;
      /* qemu sets COPIED on every data cluster of an external data
       * file (it tells guest cluster 0's from an unallocated entry).
       */
      if (map.kind == CLUSTER_COMPRESSED)
        should = entry & ~L2E_COPIED;
      else if (map.host_offset && !img->data_file)
        should = c->refs[map.host_offset >> bits] == 1 ? entry | L2E_COPIED
          : entry & ~L2E_COPIED;
      if (should != entry) {
        put_be64 (at, should);
        changed = true;
        ++*fixed;
      }
    }
    if (r == 0 && changed) {
      /* Nothing kept from before may answer for the table now. */
      qcow2_l2_table_forget (img, off);
      qcow2_l2_run_forget (img, i);
      r = qcow2_pwrite_meta (img, c->io, QCOW2_REGION_L2, c->buf,
                             h->cluster_size, off);
    }
  }
  if (r == 0 && l1_changed) {
    uint8_t *l1 = malloc ((uint64_t) h->l1_size * 8);

    if (l1 == NULL) {
      qcow2_error (img, "out of memory writing the L1 table");
      return -ENOMEM;
    }
    for (i = 0; i < h->l1_size; ++i)
      put_be64 (l1 + 8 * i, qcow2_l1_entry (img, i));
    r = qcow2_pwrite_meta (img, c->io, QCOW2_REGION_L1, l1,
                           (uint64_t) h->l1_size * 8, h->l1_table_offset);
    free (l1);
  }
  return r;
}

/* ------------------------------------------------------------ repair */

static int
count_all (struct counts *c, const struct qcow2_snapshot_table *snapshots)
{
  struct qcow2_image *img = c->img;
  const struct qcow2_header *h = &img->header;
  const struct qcow2_snapshot_image im = {
    .version = h->version, .cluster_bits = h->cluster_bits,
    .virtual_size = h->virtual_size, .file_size = img->file_size,
    .nb_snapshots = h->nb_snapshots, .snapshots_offset = h->snapshots_offset,
  };
  char err[512], whose[64];
  uint32_t i;
  int r;

  r = count_range (c, 0, h->cluster_size, USE_META, "the header");
  if (r == 0)
    r = count_l1 (c, h->l1_table_offset, h->l1_size, NULL, "the L1 table");
  for (i = 0; snapshots && i < snapshots->count && r == 0; ++i) {
    const struct qcow2_snapshot *sn = &snapshots->snapshots[i];

    if (qcow2_snapshot_check (sn, &im, err, sizeof err) == -1)
      return damaged (img, "%s", err);
    snprintf (whose, sizeof whose, "the L1 table of snapshot %u", i + 1);
    r = count_l1 (c, sn->l1_table_offset, sn->l1_size, NULL, whose);
  }
  if (r == 0 && snapshots && snapshots->count)
    r = count_range (c, h->snapshots_offset, snapshots->table_bytes,
                     USE_META, "the snapshot table");
  if (r == 0)
    r = count_range (c, img->luks_area_offset, img->luks_area_length,
                     USE_META, "the LUKS area");
  if (r == 0)
    r = qcow2_bitmaps_each_range (img, count_bitmap_range, c);
  if (r == 0)
    r = mark_refcounts (c);
  return r;
}

int
qcow2_repair_refcounts (struct qcow2_image *img, struct qcow2_io *io,
                        const struct qcow2_snapshot_table *snapshots)
{
  const struct qcow2_header *h = &img->header;
  const unsigned bits = h->cluster_bits;
  struct counts c = { .img = img, .io = io };
  struct refcount_snapshot snap;
  uint64_t changed = 0, nblocks = 0, fixed = 0, in_use = 0, cl;
  bool rebuilt;
  int r;

  r = qcow2_refcount_geometry (img);
  if (r < 0)
    return r;
  /* Compressed data may run a little past the file's end. */
  c.limit = ((img->file_size + h->cluster_size - 1) >> bits) + 2;
  c.n = c.limit;
  c.refs = calloc (c.n, sizeof *c.refs);
  c.use = calloc (c.n, 1);
  c.buf = malloc (h->cluster_size);
  if (c.refs == NULL || c.use == NULL || c.buf == NULL) {
    qcow2_error (img, "out of memory counting the references of %" PRIu64
                 " clusters", c.n);
    r = -ENOMEM;
    goto out;
  }

  /* 1. Count, and decide. */
  r = count_all (&c, snapshots);
  if (r < 0)
    goto out;
  rebuilt = !c.sound || !blocks_cover (&c);
  r = rebuilt ? rebuild (&c, &nblocks) : set_in_place (&c, &changed);
  if (r < 0)
    goto out;
  for (cl = 0; cl < c.n; ++cl)
    in_use += c.refs[cl] > 0;

  /* 2. The refcounts, durably (blocks, then the table and the header
   * naming it when they were rebuilt).
   */
  r = qcow2_refcount_snapshot (img, &snap);
  if (r < 0)
    goto out;
  r = qcow2_refcount_write (img, io, &snap);
  qcow2_refcount_snapshot_done (img, &snap, r == 0);
  if (r == 0)
    r = qcow2_flush_logged (img, io);

  /* 3. COPIED, durably. */
  if (r == 0)
    r = fix_copied (&c, &fixed);
  if (r == 0 && fixed)
    r = qcow2_flush_logged (img, io);

  /* 4. Only now is the image clean. */
  if (r == 0)
    r = qcow2_pwrite_dirty_bit (img, io, false);
  if (r == 0)
    r = qcow2_flush_logged (img, io);
  if (r < 0)
    goto out;
  img->header.incompatible_features &= ~QCOW2_INCOMPAT_DIRTY;
  if (rebuilt)
    qcow2_debug (img, "dirty image repaired: %" PRIu64 " clusters in use; "
                 "the refcounts rebuilt (a table of %u clusters at 0x%"
                 PRIx64 ", %" PRIu64 " blocks; the old ones are free), %"
                 PRIu64 " COPIED flags fixed, the dirty bit cleared", in_use,
                 img->header.refcount_table_clusters,
                 img->header.refcount_table_offset, nblocks, fixed);
  else
    qcow2_debug (img, "dirty image repaired: %" PRIu64 " clusters in use, %"
                 PRIu64 " refcounts set in place, %" PRIu64 " COPIED flags "
                 "fixed, the dirty bit cleared", in_use, changed, fixed);

 out:
  free (c.refs);
  free (c.use);
  free (c.buf);
  free (c.table);
  return r;
}
