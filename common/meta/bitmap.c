/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: persistent dirty bitmaps (see meta/bitmap.h). */

#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/bitmap.h"
#include "base/lockorder.h"
#include "meta/bitmap-internal.h"
#include "format/endian.h"
#include "format/header.h"
#include "meta/hostio.h"
#include "meta/log.h"
#include "meta/refcount.h"
#include "meta/regions.h"

static void
drop (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

/* This writer cannot keep the bitmaps valid: say why, once, and let the
 * first change clear autoclear bit 0 as before.
 */
static void
drop (struct qcow2_image *img, const char *fmt, ...)
{
  char reason[512];
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (reason, sizeof reason, fmt, ap);
  va_end (ap);
  img->bitmaps->kept = false;
  qcow2_error (img, "persistent bitmaps: %s: they cannot be kept valid; "
               "the first write clears autoclear bit 0, and qemu then "
               "drops every bitmap of the image", reason);
}

/* Is [OFFSET, OFFSET+LEN) inside the file? */
static bool
inside_file (const struct qcow2_image *img, uint64_t offset, uint64_t len)
{
  return offset <= img->file_size && len <= img->file_size - offset;
}

/* ------------------------------------------------------------ opening */

/* Parse the directory DIR (b->dir_size bytes, NB entries expected) into
 * b->bitmaps.  0, or 1 after drop () for what cannot be kept.
 */
static int
parse_directory (struct qcow2_image *img, const uint8_t *dir, uint32_t nb)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  const uint64_t size = b->dir_size;
  const uint64_t cluster_size = img->header.cluster_size;
  const uint64_t vsize = img->header.virtual_size;
  uint64_t pos = 0;
  uint32_t i;

  b->bitmaps = calloc (nb, sizeof *b->bitmaps);
  if (b->bitmaps == NULL) {
    drop (img, "out of memory for %u bitmaps", nb);
    return 1;
  }
  for (i = 0; i < nb; ++i) {
    struct bitmap *bm = &b->bitmaps[i];
    uint32_t extra, name_len, type, granularity, entry_len;
    uint64_t bytes, needed;

    if (size - pos < ENTRY_FIXED_BYTES) {
      drop (img, "the bitmap directory ends inside entry %u of %u", i, nb);
      return 1;
    }
    type = dir[pos + 16];
    granularity = dir[pos + 17];
    name_len = (uint32_t) dir[pos + 18] << 8 | dir[pos + 19];
    extra = be32 (dir + pos + 20);
    entry_len = (ENTRY_FIXED_BYTES + extra + name_len + 7) & ~7u;
    if (extra > size || entry_len > size - pos) {
      drop (img, "the bitmap directory ends inside entry %u of %u", i, nb);
      return 1;
    }
    bm->name = strndup ((const char *) dir + pos + ENTRY_FIXED_BYTES + extra,
                        name_len);
    if (bm->name == NULL) {
      drop (img, "out of memory for a bitmap name");
      return 1;
    }
    bm->entry_pos = pos;
    bm->table_offset = be64 (dir + pos);
    bm->table_size = be32 (dir + pos + 8);
    bm->flags = be32 (dir + pos + 12);
    bm->granularity_bits = granularity;
    b->count = i + 1;

    if (bm->flags & ~FLAGS_KNOWN) {
      drop (img, "bitmap '%s' has unknown flags 0x%x", bm->name,
            bm->flags & ~FLAGS_KNOWN);
      return 1;
    }
    if (type != TYPE_DIRTY_TRACKING) {
      drop (img, "bitmap '%s' is of unknown type %u", bm->name, type);
      return 1;
    }
    if (extra != 0) {
      drop (img, "bitmap '%s' has %u bytes of extra data", bm->name, extra);
      return 1;
    }
    if (name_len == 0 || name_len > MAX_NAME_BYTES) {
      drop (img, "bitmap %u has a name of %u bytes (1 to %u)", i, name_len,
            MAX_NAME_BYTES);
      return 1;
    }
    if (granularity < MIN_GRANULARITY_BITS ||
        granularity > MAX_GRANULARITY_BITS) {
      drop (img, "bitmap '%s' has granularity_bits %u (%u to %u)", bm->name,
            granularity, MIN_GRANULARITY_BITS, MAX_GRANULARITY_BITS);
      return 1;
    }
    if (bm->table_size == 0 || bm->table_size > MAX_TABLE_ENTRIES ||
        (uint64_t) bm->table_size * cluster_size > MAX_BITMAP_BYTES ||
        bm->table_offset == 0 || (bm->table_offset & (cluster_size - 1))) {
      drop (img, "bitmap '%s' has a bitmap table of %u entries at 0x%"
            PRIx64 " (unaligned, empty or too large)", bm->name,
            bm->table_size, bm->table_offset);
      return 1;
    }
    /* What qemu loads: the table is exactly as large as the disk needs,
     * but for a bitmap in_use, which qemu does not load.
     */
    bm->nbits = (vsize + (UINT64_C (1) << granularity) - 1) >> granularity;
    bytes = ((bm->nbits + 63) / 64) * 8;
    needed = clusters_for (img, bytes);
    if (!(bm->flags & FLAG_IN_USE) && needed != bm->table_size) {
      drop (img, "bitmap '%s' has %u table entries, and the disk needs %"
            PRIu64, bm->name, bm->table_size, needed);
      return 1;
    }
    pos += entry_len;
  }
  if (pos != size) {
    drop (img, "the bitmap directory has %" PRIu64 " bytes after its %u "
          "entries", size - pos, nb);
    return 1;
  }
  return 0;
}

/* Read the table of BM, and the bits of a tracked one.  0, 1 after
 * drop (), or -errno after logging.
 */
static int
load_bitmap (struct qcow2_image *img, struct qcow2_io *io, struct bitmap *bm)
{
  const uint64_t cluster_size = img->header.cluster_size;
  const uint64_t table_bytes = (uint64_t) bm->table_size * 8;
  uint32_t i;
  int r;

  if (!inside_file (img, bm->table_offset, table_bytes)) {
    qcow2_error (img, "persistent bitmaps: bitmap '%s': its table (0x%"
                 PRIx64 ", %u entries) lies outside the file (%" PRIu64
                 " bytes): the image is truncated; it cannot be written "
                 "(serve it read-only with nbdkit -r)", bm->name,
                 bm->table_offset, bm->table_size,
                 (uint64_t) img->file_size);
    return -EINVAL;
  }
  bm->table = malloc (table_bytes);
  if (bm->table == NULL) {
    qcow2_error (img, "out of memory for bitmap '%s'", bm->name);
    return -ENOMEM;
  }
  r = qcow2_pread_clamped (img, io, bm->table, table_bytes, bm->table_offset);
  if (r < 0)
    return r;
  for (i = 0; i < bm->table_size; ++i) {
    uint64_t e = be64 (&bm->table[i]), off = e & TABLE_OFFSET;

    bm->table[i] = e;
    if ((e & TABLE_RESERVED) || (off && (e & TABLE_ALL_ONES)) ||
        (off & (cluster_size - 1))) {
      drop (img, "bitmap '%s': table entry %u (0x%016" PRIx64 ") is "
            "invalid", bm->name, i, e);
      return 1;
    }
    if (off && !inside_file (img, off, cluster_size)) {
      qcow2_error (img, "persistent bitmaps: bitmap '%s': table entry %u "
                   "points at 0x%" PRIx64 ", outside the file (%" PRIu64
                   " bytes): the image is truncated; it cannot be written "
                   "(serve it read-only with nbdkit -r)", bm->name, i, off,
                   (uint64_t) img->file_size);
      return -EINVAL;
    }
  }
  if (!(bm->flags & FLAG_AUTO) || (bm->flags & FLAG_IN_USE))
    return 0;

  bm->tracked = true;
  bm->bits = calloc (bm->table_size, cluster_size);
  bm->changed = calloc (bm->table_size, 1);
  if (bm->bits == NULL || bm->changed == NULL) {
    qcow2_error (img, "out of memory for bitmap '%s' (%" PRIu64 " bytes)",
                 bm->name, (uint64_t) bm->table_size * cluster_size);
    return -ENOMEM;
  }
  for (i = 0; i < bm->table_size; ++i) {
    uint64_t off = bm->table[i] & TABLE_OFFSET;
    uint8_t *dst = bm->bits + (uint64_t) i * cluster_size;

    if (off) {
      r = qcow2_pread_clamped (img, io, dst, cluster_size, off);
      if (r < 0)
        return r;
    }
    else if (bm->table[i] & TABLE_ALL_ONES)
      memset (dst, 0xff, cluster_size);
  }
  /* Bits past the disk stay zero (qcow2.txt), whatever was read. */
  if (bm->nbits % 8)
    bm->bits[bm->nbits / 8] &= (1u << (bm->nbits % 8)) - 1;
  memset (bm->bits + (bm->nbits + 7) / 8, 0,
          (uint64_t) bm->table_size * cluster_size - (bm->nbits + 7) / 8);
  return 0;
}

int
qcow2_bitmaps_open (struct qcow2_image *img, struct qcow2_io *io,
                    const uint8_t *first, size_t first_len)
{
  const struct qcow2_header *h = &img->header;
  struct qcow2_bitmaps_ext ext;
  struct qcow2_bitmaps *b;
  uint8_t *dir = NULL;
  char err[512];
  uint32_t i;
  int r;

  if (qcow2_header_find_bitmaps (first, first_len, h, &ext,
                                 err, sizeof err) == -1) {
    qcow2_error (img, "invalid or unsupported qcow2 image: %s", err);
    return -EINVAL;
  }
  if (!(h->autoclear_features & QCOW2_AUTOCLEAR_BITMAPS)) {
    if (ext.found)
      qcow2_debug (img, "bitmaps extension without autoclear bit 0: the "
                   "bitmaps are inconsistent already and left as they are");
    return 0;
  }
  if (!ext.found) {
    qcow2_debug (img, "autoclear bit 0 is set without a bitmaps "
                 "extension: the first write clears it");
    return 0;
  }

  b = calloc (1, sizeof *b);
  if (b == NULL) {
    qcow2_error (img, "out of memory for the bitmaps");
    return -ENOMEM;
  }
  qcow2_mutex_init (&b->store_lock, QCOW2_RANK_BITMAP_STORE,
                    "the bitmaps' store lock");
  qcow2_mutex_init (&b->bits_lock, QCOW2_RANK_LEAF, "the bitmaps' bits");
  b->kept = true;
  img->bitmaps = b;

  if (ext.len != QCOW2_BITMAPS_EXT_BYTES) {
    drop (img, "the bitmaps extension is %u bytes long, not %d", ext.len,
          QCOW2_BITMAPS_EXT_BYTES);
    return 0;
  }
  if (ext.reserved != 0 || ext.nb_bitmaps == 0 ||
      ext.nb_bitmaps > MAX_BITMAPS || ext.directory_size == 0 ||
      ext.directory_size > MAX_DIRECTORY_BYTES ||
      ext.directory_offset == 0 ||
      (ext.directory_offset & (h->cluster_size - 1))) {
    drop (img, "the bitmaps extension is invalid (%u bitmaps, directory of "
          "%" PRIu64 " bytes at 0x%" PRIx64 ", reserved 0x%x)",
          ext.nb_bitmaps, ext.directory_size, ext.directory_offset,
          ext.reserved);
    return 0;
  }
  b->dir_offset = ext.directory_offset;
  b->dir_size = ext.directory_size;
  if (!inside_file (img, b->dir_offset, b->dir_size)) {
    qcow2_error (img, "persistent bitmaps: the bitmap directory (0x%" PRIx64
                 ", %" PRIu64 " bytes) lies outside the file (%" PRIu64
                 " bytes): the image is truncated; it cannot be written "
                 "(serve it read-only with nbdkit -r)", b->dir_offset,
                 b->dir_size, (uint64_t) img->file_size);
    return -EINVAL;
  }
  dir = malloc (b->dir_size);
  if (dir == NULL) {
    qcow2_error (img, "out of memory for the bitmap directory");
    return -ENOMEM;
  }
  r = qcow2_pread_clamped (img, io, dir, b->dir_size, b->dir_offset);
  if (r == 0 && parse_directory (img, dir, ext.nb_bitmaps) == 0)
    for (i = 0; i < b->count && r == 0 && b->kept; ++i)
      r = load_bitmap (img, io, &b->bitmaps[i]);
  free (dir);
  if (r < 0)
    return r;
  if (!b->kept) {
    /* Nothing of them is changed: forget the bits, keep the tables (the
     * refcount repair counts their clusters).
     */
    for (i = 0; i < b->count; ++i) {
      free (b->bitmaps[i].bits);
      free (b->bitmaps[i].changed);
      b->bitmaps[i].bits = b->bitmaps[i].changed = NULL;
      b->bitmaps[i].tracked = false;
    }
    return 0;
  }
  for (i = 0; i < b->count; ++i) {
    const struct bitmap *bm = &b->bitmaps[i];

    b->ntracked += bm->tracked;
    qcow2_debug (img, "bitmap '%s': granularity %u, %u table entries at 0x%"
                 PRIx64 ", %s%s", bm->name, 1u << bm->granularity_bits,
                 bm->table_size, bm->table_offset,
                 bm->flags & FLAG_AUTO ? "enabled" : "disabled",
                 bm->flags & FLAG_IN_USE ? ", in use (inconsistent: left "
                 "as it is)" : bm->tracked ? ", tracked" : "");
  }
  return 0;
}

void
qcow2_bitmaps_free (struct qcow2_image *img)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  uint32_t i;

  if (b == NULL)
    return;
  for (i = 0; i < b->count; ++i) {
    free (b->bitmaps[i].name);
    free (b->bitmaps[i].table);
    free (b->bitmaps[i].bits);
    free (b->bitmaps[i].changed);
  }
  free (b->bitmaps);
  qcow2_mutex_destroy (&b->store_lock);
  qcow2_mutex_destroy (&b->bits_lock);
  free (b);
  img->bitmaps = NULL;
}

uint64_t
qcow2_bitmaps_autoclear (const struct qcow2_image *img)
{
  return img->bitmaps && img->bitmaps->kept ? QCOW2_AUTOCLEAR_BITMAPS : 0;
}

bool
qcow2_bitmaps_tracking (const struct qcow2_image *img)
{
  return img->bitmaps && img->bitmaps->kept && img->bitmaps->ntracked > 0;
}

int
qcow2_bitmaps_each_range (struct qcow2_image *img, qcow2_range_fn fn,
                          void *opaque)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  const uint64_t cluster_size = img->header.cluster_size;
  uint32_t i, j;
  int r;

  if (b == NULL || b->dir_size == 0)
    return 0;
  r = fn (opaque, b->dir_offset, b->dir_size, "the bitmap directory");
  for (i = 0; i < b->count && r == 0; ++i) {
    const struct bitmap *bm = &b->bitmaps[i];

    if (bm->table == NULL)
      continue;
    r = fn (opaque, bm->table_offset, (uint64_t) bm->table_size * 8,
            "a bitmap table");
    for (j = 0; j < bm->table_size && r == 0; ++j)
      if (bm->table[j] & TABLE_OFFSET)
        r = fn (opaque, bm->table[j] & TABLE_OFFSET, cluster_size,
                "bitmap data");
  }
  return r;
}

/* ------------------------------------------------------------ checking */

struct check_ctx {
  struct qcow2_image *img;
  struct qcow2_io *io;
  const char *name;                 /* the bitmap's, or NULL */
};

/* A range the bitmaps use: counted, and apart from every metadata region
 * listed so far (the image's own, and the bitmaps' ranges checked
 * before), to which it is added then.
 */
static int
check_range (struct check_ctx *c, uint64_t offset, uint64_t length,
             enum qcow2_region kind, const char *what)
{
  struct qcow2_image *img = c->img;
  const unsigned bits = img->header.cluster_bits;
  enum qcow2_region other;
  uint64_t where, cl, refcount;
  int r;

  if (length == 0)
    return 0;
  other = qcow2_regions_overlap (img, QCOW2_REGION_NONE, offset, length,
                                 &where);
  if (other != QCOW2_REGION_NONE) {
    qcow2_error (img, "persistent bitmaps: %s%s%s%s overlaps the %s (host "
                 "cluster 0x%" PRIx64 "): the image is damaged; it cannot be "
                 "written (serve it read-only with nbdkit -r)",
                 c->name ? "bitmap '" : "", c->name ? c->name : "",
                 c->name ? "': " : "", what, qcow2_region_name (other),
                 where);
    return -EINVAL;
  }
  /* A cluster counted free would be handed out and overwritten. */
  for (cl = offset >> bits; cl <= (offset + length - 1) >> bits; ++cl) {
    r = qcow2_refcount_get (img, c->io, cl, &refcount);
    if (r < 0)
      return r;
    if (refcount == 0) {
      qcow2_error (img, "persistent bitmaps: %s%s%s%s at host offset 0x%"
                   PRIx64 " has refcount 0: the image is damaged; it cannot "
                   "be written (repair it with qemu-img check -r all, or "
                   "serve it read-only with nbdkit -r)",
                   c->name ? "bitmap '" : "", c->name ? c->name : "",
                   c->name ? "': " : "", what, cl << bits);
      return -EINVAL;
    }
  }
  if (qcow2_regions_add (img, kind, offset, length) < 0) {
    qcow2_error (img, "out of memory for the list of metadata regions");
    return -ENOMEM;
  }
  return 0;
}

int
qcow2_bitmaps_check (struct qcow2_image *img, struct qcow2_io *io)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  const uint64_t cluster_size = img->header.cluster_size;
  struct check_ctx c = { .img = img, .io = io };
  uint32_t i, j;
  int r;

  if (b == NULL || !b->kept)
    return 0;
  r = check_range (&c, b->dir_offset, b->dir_size,
                   QCOW2_REGION_BITMAP_DIRECTORY, "the bitmap directory");
  for (i = 0; i < b->count && r == 0; ++i) {
    const struct bitmap *bm = &b->bitmaps[i];

    c.name = bm->name;
    r = check_range (&c, bm->table_offset, (uint64_t) bm->table_size * 8,
                     QCOW2_REGION_BITMAP_TABLE, "its bitmap table");
    for (j = 0; j < bm->table_size && r == 0; ++j)
      if (bm->table[j] & TABLE_OFFSET)
        r = check_range (&c, bm->table[j] & TABLE_OFFSET, cluster_size,
                         QCOW2_REGION_BITMAP_DATA, "its bitmap data");
  }
  return r;
}

/* ----------------------------------------------------------- the bits */

/* Set bits [FIRST, LAST] of BM, with b->bits_lock held. */
static void
set_bits (struct bitmap *bm, unsigned cluster_bits, uint64_t first,
          uint64_t last)
{
  uint64_t byte = first / 8, last_byte = last / 8;

  for (; byte <= last_byte; ++byte) {
    unsigned lo = byte == first / 8 ? first % 8 : 0;
    unsigned hi = byte == last_byte ? last % 8 : 7;
    uint8_t mask = (uint8_t) ((0xffu >> (7 - hi)) & (0xffu << lo));

    if ((bm->bits[byte] & mask) != mask) {
      bm->bits[byte] |= mask;
      bm->changed[byte >> cluster_bits] = 1;
    }
  }
}

void
qcow2_bitmaps_mark (struct qcow2_image *img, uint64_t offset, uint64_t count)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  uint32_t i;

  if (b == NULL || b->ntracked == 0 || count == 0)
    return;
  qcow2_mutex_lock (&b->bits_lock);
  for (i = 0; i < b->count; ++i) {
    struct bitmap *bm = &b->bitmaps[i];

    if (bm->tracked)
      set_bits (bm, img->header.cluster_bits, offset >> bm->granularity_bits,
                (offset + count - 1) >> bm->granularity_bits);
  }
  qcow2_mutex_unlock (&b->bits_lock);
}

int
qcow2_bitmap_write_flags (struct qcow2_image *img, struct qcow2_io *io,
                          const struct bitmap *bm, uint32_t flags)
{
  uint8_t buf[4];

  put_be32 (buf, flags);
  return qcow2_pwrite_meta (img, io, QCOW2_REGION_BITMAP_DIRECTORY, buf,
                            sizeof buf,
                            img->bitmaps->dir_offset + bm->entry_pos + 12);
}

int
qcow2_bitmaps_first_change (struct qcow2_image *img, struct qcow2_io *io)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  uint32_t i;
  int r;

  if (b == NULL || !b->kept || b->ntracked == 0)
    return 0;
  /* The flags and in_use_on_disk are the store's too. */
  qcow2_mutex_lock (&b->store_lock);
  /* From here on a store has something to do, even if a write fails. */
  b->in_use_on_disk = true;
  for (i = 0, r = 0; i < b->count && r == 0; ++i) {
    struct bitmap *bm = &b->bitmaps[i];

    if (!bm->tracked)
      continue;
    bm->flags |= FLAG_IN_USE;
    r = qcow2_bitmap_write_flags (img, io, bm, bm->flags);
  }
  qcow2_mutex_unlock (&b->store_lock);
  if (r == 0)
    qcow2_debug (img, "first change: %u bitmap(s) marked in use",
                 b->ntracked);
  return r;
}
