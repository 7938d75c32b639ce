/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: persistent dirty bitmaps (see meta/bitmap.h). */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/bitmap.h"
#include "meta/alloc.h"
#include "format/endian.h"
#include "format/entries.h"
#include "format/header.h"
#include "meta/hostio.h"
#include "meta/refcount.h"
#include "meta/writeback.h"

/* Directory entries (qcow2.txt "Bitmap directory"). */
#define ENTRY_FIXED_BYTES 24
#define FLAG_IN_USE       (UINT32_C (1) << 0)
#define FLAG_AUTO         (UINT32_C (1) << 1)
#define FLAGS_KNOWN       (FLAG_IN_USE | FLAG_AUTO)
#define TYPE_DIRTY_TRACKING 1

/* Bitmap table entries. */
#define TABLE_RESERVED    UINT64_C (0xff000000000001fe)
#define TABLE_OFFSET      UINT64_C (0x00fffffffffffe00)
#define TABLE_ALL_ONES    UINT64_C (1)

/* qemu's limits (block/meta/bitmap.c, block/qcow2.h): what it refuses
 * to open, and so what cannot be kept.
 */
#define MAX_BITMAPS            65535
#define MAX_DIRECTORY_BYTES    (UINT64_C (1024) * MAX_BITMAPS)
#define MAX_NAME_BYTES         1023
#define MIN_GRANULARITY_BITS   9
#define MAX_GRANULARITY_BITS   31
#define MAX_TABLE_ENTRIES      UINT32_C (0x8000000)
#define MAX_BITMAP_BYTES       (UINT64_C (512) << 20)

struct bitmap {
  char *name;                 /* NUL-terminated copy, for messages */
  uint64_t entry_pos;         /* of its directory entry, in the directory */
  uint32_t flags;
  unsigned granularity_bits;
  uint64_t table_offset;
  uint32_t table_size;        /* entries */
  uint64_t *table;            /* host order */
  /* Tracked bitmaps only (enabled and consistent when opened). */
  bool tracked;
  uint8_t *bits;              /* table_size clusters */
  uint64_t nbits;             /* bits that cover the disk */
  uint8_t *changed;           /* per data cluster: set since last stored */
};

struct qcow2_bitmaps {
  /* One store at a time, taken with no other lock held. */
  pthread_mutex_t store_lock;
  /* The tracked bitmaps' bits and changed flags: a leaf. */
  pthread_mutex_t bits_lock;
  bool kept;                  /* kept valid: autoclear bit 0 stays */
  uint64_t dir_offset, dir_size;
  uint32_t count;
  struct bitmap *bitmaps;
  unsigned ntracked;
  /* The tracked bitmaps are in_use on disk: the first change ran since
   * the image opened or was last closed clean.  Written under the image
   * lock by the first change, read and cleared by the store.
   */
  atomic_bool in_use_on_disk;
};

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

static uint64_t
clusters_for (const struct qcow2_image *img, uint64_t bytes)
{
  return (bytes + img->header.cluster_size - 1) >> img->header.cluster_bits;
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
  pthread_mutex_init (&b->store_lock, NULL);
  pthread_mutex_init (&b->bits_lock, NULL);
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
  pthread_mutex_destroy (&b->store_lock);
  pthread_mutex_destroy (&b->bits_lock);
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

/* A range of host clusters and what holds it. */
struct region {
  uint64_t first, end;        /* clusters [first, end) */
  const char *what;
  const char *name;           /* the bitmap's, or NULL */
};

static int
region_cmp (const void *x, const void *y)
{
  const struct region *a = x, *b = y;

  return a->first < b->first ? -1 : a->first > b->first;
}

struct region_list {
  struct qcow2_image *img;
  struct region *r;
  size_t n, cap;
  const char *name;           /* of the bitmap being listed */
};

static int
add_region (void *opaque, uint64_t offset, uint64_t length, const char *what)
{
  struct region_list *l = opaque;
  const unsigned bits = l->img->header.cluster_bits;

  if (length == 0)
    return 0;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    struct region *p = realloc (l->r, cap * sizeof *p);
    if (p == NULL) {
      qcow2_error (l->img, "out of memory checking the bitmaps");
      return -ENOMEM;
    }
    l->r = p;
    l->cap = cap;
  }
  l->r[l->n++] = (struct region) {
    .first = offset >> bits, .end = ((offset + length - 1) >> bits) + 1,
    .what = what, .name = l->name,
  };
  return 0;
}

/* The bitmaps' own regions, each named by its bitmap. */
static int
list_bitmap_regions (struct qcow2_image *img, struct region_list *l)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  const uint64_t cluster_size = img->header.cluster_size;
  uint32_t i, j;
  int r;

  l->name = NULL;
  r = add_region (l, b->dir_offset, b->dir_size, "the bitmap directory");
  for (i = 0; i < b->count && r == 0; ++i) {
    const struct bitmap *bm = &b->bitmaps[i];

    l->name = bm->name;
    r = add_region (l, bm->table_offset, (uint64_t) bm->table_size * 8,
                    "its bitmap table");
    for (j = 0; j < bm->table_size && r == 0; ++j)
      if (bm->table[j] & TABLE_OFFSET)
        r = add_region (l, bm->table[j] & TABLE_OFFSET, cluster_size,
                        "its bitmap data");
  }
  l->name = NULL;
  return r;
}

/* The other metadata whose place is known without reading it. */
static int
list_other_regions (struct qcow2_image *img, struct region_list *l)
{
  const struct qcow2_header *h = &img->header;
  const uint64_t cluster_size = h->cluster_size;
  uint64_t i;
  int r;

  r = add_region (l, 0, cluster_size, "the header");
  if (r == 0)
    r = add_region (l, h->l1_table_offset, (uint64_t) h->l1_size * 8,
                    "the L1 table");
  if (r == 0)
    r = add_region (l, img->rc.table_offset,
                    (uint64_t) img->rc.table_clusters << h->cluster_bits,
                    "the refcount table");
  for (i = 0; i < img->rc.table_entries && r == 0; ++i)
    if (img->rc.table[i] & RTE_OFFSET_MASK)
      r = add_region (l, img->rc.table[i] & RTE_OFFSET_MASK, cluster_size,
                      "a refcount block");
  for (i = 0; i < h->l1_size && r == 0; ++i)
    if (img->l1[i] & L1E_OFFSET_MASK)
      r = add_region (l, img->l1[i] & L1E_OFFSET_MASK, cluster_size,
                      "an L2 table");
  if (r == 0 && img->crypt.enabled)
    r = add_region (l, img->crypt.area_offset, img->crypt.area_length,
                    "the LUKS area");
  return r;
}

/* "bitmap 'NAME': WHAT", or WHAT. */
static void
describe_region (const struct region *r, char *buf, size_t len)
{
  if (r->name)
    snprintf (buf, len, "bitmap '%s': %s", r->name, r->what);
  else
    snprintf (buf, len, "%s", r->what);
}

static int
overlap_error (struct qcow2_image *img, const struct region *a,
               const struct region *b)
{
  char what_a[1200], what_b[1200];

  describe_region (a, what_a, sizeof what_a);
  describe_region (b, what_b, sizeof what_b);
  qcow2_error (img, "persistent bitmaps: %s overlaps %s (host cluster 0x%"
               PRIx64 "): the image is damaged; it cannot be written "
               "(serve it read-only with nbdkit -r)", what_a, what_b,
               (a->first > b->first ? a->first : b->first) <<
               img->header.cluster_bits);
  return -EINVAL;
}

int
qcow2_bitmaps_check (struct qcow2_image *img, struct qcow2_io *io)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  struct region_list mine = { .img = img }, other = { .img = img };
  uint64_t *max_end = NULL, c, refcount;
  size_t i, j;
  int r;

  if (b == NULL || !b->kept)
    return 0;
  r = list_bitmap_regions (img, &mine);
  if (r == 0)
    r = list_other_regions (img, &other);
  if (r < 0)
    goto out;
  qsort (mine.r, mine.n, sizeof *mine.r, region_cmp);
  qsort (other.r, other.n, sizeof *other.r, region_cmp);

  /* Among the bitmaps' own regions. */
  for (i = 1, j = 0; i < mine.n; ++i) {
    if (mine.r[i].first < mine.r[j].end) {
      r = overlap_error (img, &mine.r[i], &mine.r[j]);
      goto out;
    }
    if (mine.r[i].end > mine.r[j].end)
      j = i;
  }
  /* Against the rest: the regions starting before one's end, the last
   * of which reaching furthest.
   */
  max_end = malloc ((other.n + 1) * sizeof *max_end);
  if (max_end == NULL) {
    qcow2_error (img, "out of memory checking the bitmaps");
    r = -ENOMEM;
    goto out;
  }
  for (j = 0; j < other.n; ++j)
    max_end[j] = j && max_end[j - 1] > other.r[j].end ? max_end[j - 1]
      : other.r[j].end;
  for (i = 0; i < mine.n; ++i) {
    size_t lo = 0, hi = other.n;

    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (other.r[mid].first < mine.r[i].end)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo > 0 && max_end[lo - 1] > mine.r[i].first) {
      for (j = lo; j-- > 0; )
        if (other.r[j].end > mine.r[i].first)
          break;
      r = overlap_error (img, &mine.r[i], &other.r[j]);
      goto out;
    }
  }

  /* A cluster counted free would be handed out and overwritten. */
  for (i = 0; i < mine.n; ++i)
    for (c = mine.r[i].first; c < mine.r[i].end; ++c) {
      r = qcow2_refcount_get (img, io, c, &refcount);
      if (r < 0)
        goto out;
      if (refcount == 0) {
        char what[1200];

        describe_region (&mine.r[i], what, sizeof what);
        qcow2_error (img, "persistent bitmaps: %s at host offset 0x%" PRIx64
                     " has refcount 0: the image is damaged; it cannot be "
                     "written (repair it with qemu-img check -r all, or "
                     "serve it read-only with nbdkit -r)", what,
                     c << img->header.cluster_bits);
        r = -EINVAL;
        goto out;
      }
    }
  r = 0;

 out:
  free (mine.r);
  free (other.r);
  free (max_end);
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
  pthread_mutex_lock (&b->bits_lock);
  for (i = 0; i < b->count; ++i) {
    struct bitmap *bm = &b->bitmaps[i];

    if (bm->tracked)
      set_bits (bm, img->header.cluster_bits, offset >> bm->granularity_bits,
                (offset + count - 1) >> bm->granularity_bits);
  }
  pthread_mutex_unlock (&b->bits_lock);
}

/* Write the 4-byte flags of BM's directory entry (FLAGS). */
static int
write_flags (struct qcow2_image *img, struct qcow2_io *io,
             const struct bitmap *bm, uint32_t flags)
{
  uint8_t buf[4];

  put_be32 (buf, flags);
  return qcow2_pwrite_logged (img, io, buf, sizeof buf,
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
  /* From here on a store has something to do, even if a write fails. */
  b->in_use_on_disk = true;
  for (i = 0; i < b->count; ++i) {
    struct bitmap *bm = &b->bitmaps[i];

    if (!bm->tracked)
      continue;
    bm->flags |= FLAG_IN_USE;
    r = write_flags (img, io, bm, bm->flags);
    if (r < 0)
      return r;
  }
  qcow2_debug (img, "first change: %u bitmap(s) marked in use",
               b->ntracked);
  return 0;
}

/* ----------------------------------------------------------- storing */

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

  pthread_mutex_lock (&b->bits_lock);
  for (i = 0; i < b->count; ++i)
    for (j = 0; j < st->s[i].nchanged; ++j)
      st->s[i].bm->changed[st->s[i].index[j]] = 1;
  pthread_mutex_unlock (&b->bits_lock);
  if (!release)
    return;
  pthread_rwlock_wrlock (&img->lock);
  for (i = 0; i < b->count; ++i) {
    struct bitmap_store *s = &st->s[i];

    if (s->new_table)
      qcow2_free_later (img, s->new_table,
                        (uint64_t) s->bm->table_size * 8, 0);
    for (j = 0; j < s->nchanged; ++j)
      if (s->new_data[j])
        qcow2_free_later (img, s->new_data[j], cluster_size, 0);
  }
  pthread_rwlock_unlock (&img->lock);
}

/* Allocate the new tables and data clusters, reclaiming room with a
 * writeback (no lock held then) as often as the allocator asks.
 */
static int
store_allocate (struct qcow2_image *img, struct qcow2_io *io,
                struct store *st)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  uint32_t i;
  size_t j;
  int r = 0;

  for (;;) {
    pthread_rwlock_wrlock (&img->lock);
    for (i = 0; i < b->count && r == 0; ++i) {
      struct bitmap_store *s = &st->s[i];

      if (s->nchanged == 0)
        continue;
      if (s->new_table == 0)
        r = qcow2_alloc_clusters (img, io,
                                  clusters_for (img, (uint64_t)
                                                s->bm->table_size * 8),
                                  QCOW2_ALLOC_ANY, &s->new_table);
      for (j = 0; j < s->nchanged && r == 0; ++j)
        if (s->new_data[j] == 0)
          r = qcow2_alloc_clusters (img, io, 1, QCOW2_ALLOC_ANY,
                                    &s->new_data[j]);
    }
    pthread_rwlock_unlock (&img->lock);
    if (r != QCOW2_RECLAIM)
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
      r = qcow2_pwrite_logged (img, io, s->data + j * cluster_size,
                               cluster_size, s->new_data[j]);
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
    r = qcow2_pwrite_logged (img, io, table, table_bytes, s->new_table);
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
      r = write_flags (img, io, bm, flags);
    else if (!clean) {
      put_be64 (fields, s->new_table);
      r = qcow2_pwrite_logged (img, io, fields, 8, pos);
    }
    else if (pos / 512 == (pos + 15) / 512) {
      put_be64 (fields, s->new_table);
      put_be32 (fields + 8, bm->table_size);
      put_be32 (fields + 12, flags);
      r = qcow2_pwrite_logged (img, io, fields, 16, pos);
    }
    else {
      put_be64 (fields, s->new_table);
      r = qcow2_pwrite_logged (img, io, fields, 8, pos);
      if (r == 0)
        r = qcow2_flush_logged (img, io);
      if (r == 0)
        r = write_flags (img, io, bm, flags);
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

  pthread_rwlock_wrlock (&img->lock);
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
  pthread_rwlock_unlock (&img->lock);
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
  pthread_mutex_lock (&b->bits_lock);
  r = store_copy (img, &st);
  pthread_mutex_unlock (&b->bits_lock);
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
  pthread_mutex_lock (&b->store_lock);
  r = store_locked (img, io, mode == QCOW2_STORE_CLEAN, cleared);
  pthread_mutex_unlock (&b->store_lock);
  return r;
}
