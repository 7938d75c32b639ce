/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: images to write, and the test's own checks of
 * what the engine wrote (written from qcow2.txt, sharing no code with the
 * engine).
 */
#include <config.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "write-image.h"
#include "util.h"

#define OFFSET_MASK     UINT64_C (0x00fffffffffffe00)
#define L1_RESERVED     UINT64_C (0x7f000000000001ff)
#define L2_RESERVED     UINT64_C (0x3f000000000001fe)
#define ENTRY_ZERO      (UINT64_C (1) << 0)
#define ENTRY_COMPRESSED (UINT64_C (1) << 62)
#define ENTRY_COPIED    (UINT64_C (1) << 63)

static uint64_t
refcount_entry (const uint8_t *block, uint64_t i, unsigned order)
{
  unsigned bits = 1u << order;

  if (bits < 8)
    return (block[i * bits / 8] >> (i * bits % 8)) & ((1u << bits) - 1);
  uint64_t v = 0;
  for (unsigned b = 0; b < bits / 8; ++b)
    v = v << 8 | block[i * (bits / 8) + b];
  return v;
}

static void
set_refcount_entry (uint8_t *block, uint64_t i, unsigned order, uint64_t v)
{
  unsigned bits = 1u << order;

  if (bits < 8) {
    unsigned shift = i * bits % 8;
    uint8_t mask = ((1u << bits) - 1) << shift;
    block[i * bits / 8] = (block[i * bits / 8] & ~mask) |
      ((v << shift) & mask);
    return;
  }
  for (unsigned b = bits / 8; b-- > 0; v >>= 8)
    block[i * (bits / 8) + b] = v & 0xff;
}

uint8_t *
new_image (const struct new_image *spec)
{
  const uint64_t cs = UINT64_C (1) << spec->cluster_bits;
  const unsigned order = spec->version >= 3 ? spec->refcount_order : 4;
  const uint64_t l2_coverage = cs / 8 * cs;
  const uint32_t l1_size =
    (spec->virtual_size + l2_coverage - 1) / l2_coverage;
  const uint64_t l1_clusters = ((uint64_t) l1_size * 8 + cs - 1) / cs;
  const unsigned rt_clusters = spec->rt_clusters ? spec->rt_clusters : 1;
  const uint64_t rt_offset = cs;
  const uint64_t block_offset = (1 + rt_clusters) * cs;
  const uint64_t l1_offset = block_offset + cs;
  const uint64_t meta = 2 + rt_clusters + (l1_clusters ? l1_clusters : 0);
  uint8_t *file = xcalloc (1, spec->storage_size);

  if (meta * cs > spec->storage_size ||
      meta > (cs * 8 >> order)) {
    fprintf (stderr, "new_image: the metadata does not fit\n");
    exit (1);
  }
  put32 (file + 0, 0x514649fb);
  put32 (file + 4, spec->version);
  put32 (file + 20, spec->cluster_bits);
  put64 (file + 24, spec->virtual_size);
  put32 (file + 36, l1_size);
  put64 (file + 40, l1_size ? l1_offset : 0);
  put64 (file + 48, rt_offset);
  put32 (file + 56, rt_clusters);
  if (spec->version >= 3) {
    put64 (file + 72, spec->compression == QCOW2_COMPRESSION_ZSTD
           ? UINT64_C (1) << 3 : 0);
    put32 (file + 96, order);
    put32 (file + 100, 112);
    file[104] = spec->compression;
  }
  put64 (file + rt_offset, block_offset);
  for (uint64_t c = 0; c < meta; ++c)
    set_refcount_entry (file + block_offset, c, order, 1);
  return file;
}

/* ------------------------------------------------------------ checks */

struct checker {
  const uint8_t *file;
  uint64_t size;
  unsigned bits;
  uint64_t cs;
  struct image_report *r;
};

static void
problem (struct checker *k, uint64_t *counter, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));

static void
problem (struct checker *k, uint64_t *counter, const char *fmt, ...)
{
  va_list ap;

  (*counter)++;
  if (k->r->first_problem[0])
    return;
  va_start (ap, fmt);
  vsnprintf (k->r->first_problem, sizeof k->r->first_problem, fmt, ap);
  va_end (ap);
}

/* One reference to the host cluster at OFFSET, which holds ROLE. */
static void
reference (struct checker *k, uint64_t offset, enum write_kind role,
           const char *what)
{
  uint64_t c = offset >> k->bits;

  if (c >= k->r->host_clusters) {
    problem (k, &k->r->broken, "%s at 0x%" PRIx64 " lies past the end of "
             "the file", what, offset);
    return;
  }
  k->r->refs[c]++;
  if (role != WRITE_DATA || k->r->role[c] == WRITE_DATA)
    k->r->role[c] = role;
}

/* A table of whole clusters at OFFSET, N bytes, counted and inside. */
static bool
table (struct checker *k, uint64_t offset, uint64_t n, enum write_kind role,
       const char *what)
{
  if ((offset & (k->cs - 1)) || offset > k->size || n > k->size - offset) {
    problem (k, &k->r->broken, "%s at 0x%" PRIx64 " (%" PRIu64 " bytes) "
             "is misaligned or outside the file", what, offset, n);
    return false;
  }
  for (uint64_t c = 0; c < (n + k->cs - 1) / k->cs; ++c)
    reference (k, offset + c * k->cs, role, what);
  return true;
}

static void
check_l2 (struct checker *k, uint64_t l2_offset, unsigned version)
{
  const unsigned csize_shift = 62 - (k->bits - 8);
  const uint64_t csize_mask = (UINT64_C (1) << (k->bits - 8)) - 1;

  for (uint64_t i = 0; i < k->cs / 8; ++i) {
    uint64_t e = get64 (k->file + l2_offset + 8 * i);
    uint64_t off;

    if (e & ENTRY_COMPRESSED) {
      uint64_t coff = e & ((UINT64_C (1) << csize_shift) - 1);
      uint64_t sectors = ((e >> csize_shift) & csize_mask) + 1;
      uint64_t start = coff & ~UINT64_C (511);

      if (e & ENTRY_COPIED)
        problem (k, &k->r->copied_wrong, "compressed L2 entry 0x%016"
                 PRIx64 " with COPIED", e);
      for (uint64_t c = start >> k->bits;
           c <= (start + sectors * 512 - 1) >> k->bits; ++c)
        reference (k, c << k->bits, WRITE_DATA, "compressed data");
      continue;
    }
    if (e & L2_RESERVED)
      problem (k, &k->r->broken, "L2 entry 0x%016" PRIx64 " has reserved "
               "bits", e);
    if ((e & ENTRY_ZERO) && version < 3)
      problem (k, &k->r->broken, "zero flag in a v2 image");
    off = e & OFFSET_MASK;
    if (off == 0)
      continue;
    if (off & (k->cs - 1))
      problem (k, &k->r->broken, "data at 0x%" PRIx64 " misaligned", off);
    else
      reference (k, off, WRITE_DATA, "data cluster");
  }
}

/* The LUKS area the full disk encryption header extension names. */
static void
luks_area (struct checker *k, unsigned version)
{
  uint64_t pos = version >= 3 ? get32 (k->file + 100) : 72;
  uint64_t end = k->cs < k->size ? k->cs : k->size;

  while (pos + 8 <= end) {
    uint32_t type = get32 (k->file + pos), len = get32 (k->file + pos + 4);

    if (type == 0 || len > end - pos - 8)
      return;
    if (type == 0x0537be77 && len == 16) {
      table (k, get64 (k->file + pos + 8), get64 (k->file + pos + 16),
             WRITE_LUKS, "LUKS area");
      return;
    }
    pos += 8 + ((len + 7) & ~7u);
  }
}

/* The snapshot table and what each snapshot's L1 table reaches. */
static void
snapshots (struct checker *k, unsigned version)
{
  uint32_t nb = get32 (k->file + 60);
  uint64_t start = get64 (k->file + 64), pos = start;

  for (uint32_t i = 0; i < nb; ++i) {
    const uint8_t *e = k->file + pos;
    uint64_t l1_offset;
    uint32_t l1_size;

    if (pos + 40 > k->size) {
      problem (k, &k->r->broken, "snapshot %u lies past the end", i);
      return;
    }
    l1_offset = get64 (e);
    l1_size = get32 (e + 8);
    pos += 40 + get32 (e + 36) + (e[12] << 8 | e[13]) + (e[14] << 8 | e[15]);
    pos = (pos + 7) & ~UINT64_C (7);
    if (!table (k, l1_offset, (uint64_t) l1_size * 8, WRITE_L1,
                "snapshot L1 table"))
      continue;
    for (uint32_t j = 0; j < l1_size; ++j) {
      uint64_t l2 = get64 (k->file + l1_offset + 8 * j) & OFFSET_MASK;
      if (l2 && table (k, l2, k->cs, WRITE_L2, "snapshot L2 table"))
        check_l2 (k, l2, version);
    }
  }
  if (nb)
    table (k, start, pos - start, WRITE_SNAPSHOT_TABLE, "snapshot table");
}

/* Every COPIED flag against the refcount it promises (1), and no plain
 * cluster with refcount 1 without it (qemu-img check reports both).
 */
static void
check_copied (struct checker *k, uint64_t entry, const char *what)
{
  uint64_t c = (entry & OFFSET_MASK) >> k->bits;

  if (c >= k->r->host_clusters)
    return;
  if (!!(entry & ENTRY_COPIED) != (k->r->refcount[c] == 1))
    problem (k, &k->r->copied_wrong, "%s entry 0x%016" PRIx64 ": COPIED %s "
             "but refcount %" PRIu64, what, entry,
             entry & ENTRY_COPIED ? "set" : "clear", k->r->refcount[c]);
}

bool
check_image (const uint8_t *file, uint64_t size, bool exact,
             struct image_report *r)
{
  struct checker k = { .file = file, .size = size, .r = r };
  unsigned version, order;
  uint64_t rt_entries, block_entries;

  memset (r, 0, sizeof *r);
  if (size < 72 || get32 (file) != 0x514649fb) {
    snprintf (r->first_problem, sizeof r->first_problem, "no qcow2 header");
    r->broken = 1;
    return false;
  }
  version = get32 (file + 4);
  k.bits = get32 (file + 20);
  k.cs = UINT64_C (1) << k.bits;
  order = version >= 3 ? get32 (file + 96) : 4;
  r->cluster_size = k.cs;
  r->host_clusters = (size + k.cs - 1) >> k.bits;
  r->refs = xcalloc (r->host_clusters, sizeof *r->refs);
  r->refcount = xcalloc (r->host_clusters, sizeof *r->refcount);
  r->role = xcalloc (r->host_clusters, 1);
  r->l1_size = get32 (file + 36);
  r->l1_offset = get64 (file + 40);
  r->refcount_table_offset = get64 (file + 48);
  r->refcount_table_clusters = get32 (file + 56);

  reference (&k, 0, WRITE_HEADER, "header");
  if (!table (&k, r->refcount_table_offset,
              (uint64_t) r->refcount_table_clusters << k.bits,
              WRITE_REFCOUNT_TABLE, "refcount table"))
    goto out;
  if (r->l1_size &&
      !table (&k, r->l1_offset, (uint64_t) r->l1_size * 8, WRITE_L1,
              "L1 table"))
    goto out;

  /* The refcounts stored, and the blocks they are in. */
  rt_entries = ((uint64_t) r->refcount_table_clusters << k.bits) / 8;
  block_entries = k.cs * 8 >> order;
  for (uint64_t i = 0; i < rt_entries; ++i) {
    uint64_t block = get64 (file + r->refcount_table_offset + 8 * i);

    if (block == 0)
      continue;
    if (block & 511) {
      problem (&k, &r->broken, "refcount table entry 0x%" PRIx64, block);
      continue;
    }
    if (!table (&k, block, k.cs, WRITE_REFCOUNT_BLOCK, "refcount block"))
      continue;
    for (uint64_t j = 0; j < block_entries; ++j) {
      uint64_t c = i * block_entries + j;
      if (c < r->host_clusters)
        r->refcount[c] = refcount_entry (file + block, j, order);
    }
  }

  /* L1 and L2. */
  for (uint32_t i = 0; i < r->l1_size; ++i) {
    uint64_t l1e = get64 (file + r->l1_offset + 8 * i);
    uint64_t l2 = l1e & OFFSET_MASK;

    if (l1e & L1_RESERVED)
      problem (&k, &r->broken, "L1 entry %u has reserved bits", i);
    if (l2 == 0)
      continue;
    if (table (&k, l2, k.cs, WRITE_L2, "L2 table"))
      check_l2 (&k, l2, version);
  }
  luks_area (&k, version);
  snapshots (&k, version);

  for (uint64_t c = 0; c < r->host_clusters; ++c) {
    if (r->refcount[c] < r->refs[c])
      problem (&k, &r->short_counted, "host cluster %" PRIu64 ": refcount %"
               PRIu64 " but %u references", c, r->refcount[c], r->refs[c]);
    else if (r->refcount[c] > r->refs[c] && exact)
      problem (&k, &r->leaked, "host cluster %" PRIu64 ": refcount %" PRIu64
               " but %u references (a leak)", c, r->refcount[c], r->refs[c]);
    else if (r->refcount[c] > r->refs[c])
      r->leaked++;
  }
  for (uint32_t i = 0; i < r->l1_size; ++i) {
    uint64_t l1e = get64 (file + r->l1_offset + 8 * i);
    uint64_t l2 = l1e & OFFSET_MASK;

    if (l2 == 0 || l2 + k.cs > size)
      continue;
    check_copied (&k, l1e, "L1");
    for (uint64_t j = 0; j < k.cs / 8; ++j) {
      uint64_t e = get64 (file + l2 + 8 * j);
      if (!(e & ENTRY_COMPRESSED) && (e & OFFSET_MASK))
        check_copied (&k, e, "L2");
    }
  }

 out:
  return r->broken == 0 && r->short_counted == 0 && r->copied_wrong == 0 &&
    (!exact || r->leaked == 0);
}

void
image_report_free (struct image_report *r)
{
  free (r->refs);
  free (r->refcount);
  free (r->role);
  r->refs = NULL;
  r->refcount = NULL;
  r->role = NULL;
}

enum write_kind
classify_write (const struct image_report *r, uint64_t offset, uint64_t len)
{
  uint64_t c = offset / r->cluster_size;

  (void) len;
  if (c >= r->host_clusters)
    return WRITE_DATA;
  return r->role[c];
}
