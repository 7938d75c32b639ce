/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: host clusters that an L2 table maps but whose
 * refcount reads 0 (see meta/alloc-internal.h).
 *
 * On a damaged image such a cluster looks free: the allocator would hand
 * it out, and the allocating write would replace the guest data the
 * table maps there (qemu does so).  Finding all of them takes a scan of
 * every table, which is qemu-img check's job; the engine checks the
 * tables it reads anyway.  Each L2 table read from disk while the image
 * is open for writing is looked at once, before the next allocation,
 * against the refcounts in memory, and the clusters it maps that are
 * counted 0 are remembered here.  The allocator refuses to hand one out:
 * the image is marked corrupt (meta/corrupt.h) and the allocation fails
 * with EIO.
 *
 * The table looked at is the one the engine uses: the dirty set's copy if
 * the table is there (the cache keeps the disk's version, which a
 * writeback may already have replaced, and the refcounts in memory may
 * already have dropped what only the old version mapped), else the
 * cache's; a table no longer cached is skipped.
 */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/alloc.h"
#include "meta/alloc-internal.h"
#include "base/cleanup.h"
#include "format/endian.h"
#include "format/entries.h"
#include "format/header.h"
#include "meta/corrupt.h"
#include "meta/dirty.h"
#include "meta/log.h"
#include "meta/map.h"
#include "meta/refcount.h"
#include "meta/regions.h"

/* The guest offset whose entry INDEX of the table at TABLE is, if an L1
 * entry still names the table; else UINT64_MAX.
 */
static uint64_t
guest_offset_of (struct qcow2_image *img, uint64_t table, uint64_t index)
{
  const struct qcow2_header *h = &img->header;
  uint64_t i;

  for (i = 0; i < h->l1_size; ++i)
    if ((qcow2_l1_entry (img, i) & L1E_OFFSET_MASK) == table)
      return ((i << h->l2_bits) + index) << h->cluster_bits;
  return UINT64_MAX;
}

/* Where CLUSTER is, or would go, in the sorted list of uncounted
 * clusters: the first index whose cluster is not below it.
 */
static size_t
position (const struct qcow2_allocator *a, uint64_t cluster)
{
  size_t lo = 0, hi = a->nuncounted;

  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;

    if (a->uncounted[mid].cluster < cluster)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Remember host cluster CLUSTER, mapped by entry INDEX of the table at
 * TABLE.  Kept sorted by cluster; once the list is full the rest are not
 * remembered (the check is a best effort, qemu-img check the full one).
 */
static int
remember (struct qcow2_image *img, uint64_t cluster, uint64_t table,
          uint64_t index)
{
  struct qcow2_allocator *a = img->alloc;
  size_t lo = position (a, cluster);

  if (lo < a->nuncounted && a->uncounted[lo].cluster == cluster)
    return 0;
  if (a->nuncounted == QCOW2_UNCOUNTED_MAX)
    return 0;
  if (a->nuncounted == a->uncounted_cap) {
    size_t cap = a->uncounted_cap ? a->uncounted_cap * 2 : 16;
    struct uncounted *n = realloc (a->uncounted, cap * sizeof *n);

    if (n == NULL) {
      qcow2_error (img, "out of memory for the clusters mapped but not "
                   "counted");
      return -ENOMEM;
    }
    a->uncounted = n;
    a->uncounted_cap = cap;
  }
  memmove (&a->uncounted[lo + 1], &a->uncounted[lo],
           (a->nuncounted - lo) * sizeof *a->uncounted);
  a->uncounted[lo] = (struct uncounted) {
    .cluster = cluster,
    .guest = guest_offset_of (img, table, index),
    .table = table,
  };
  a->nuncounted++;
  qcow2_debug (img, "host cluster 0x%" PRIx64 " is mapped by the L2 table "
               "at 0x%" PRIx64 " (entry %" PRIu64 ") but its refcount is 0",
               cluster << img->header.cluster_bits, table, index);
  return 0;
}

/* Are host clusters [FIRST, LAST] counted, as far as the engine can tell?
 * Those that read 0 are remembered.
 */
static int
check_span (struct qcow2_image *img, struct qcow2_io *io, uint64_t first,
            uint64_t last, uint64_t table, uint64_t index)
{
  const struct qcow2_allocator *a = img->alloc;
  uint64_t c, refcount;
  int r;

  for (c = first; c <= last && c < a->host_clusters; ++c) {
    r = qcow2_refcount_get (img, io, c, &refcount);
    if (r < 0)
      return r;
    /* Metadata is never handed out, and a cluster the engine released
     * itself is held back until its release is durable.  Asked only of
     * the clusters counted 0: the list of regions takes a lock, and a
     * table has thousands of entries that are counted.
     */
    if (refcount != 0 || qcow2_regions_kind (img, c) != QCOW2_REGION_NONE ||
        qcow2_alloc_is_released (a, c))
      continue;
    r = remember (img, c, table, index);
    if (r < 0)
      return r;
  }
  return 0;
}

/* Look at the table at TABLE (big-endian entries in DATA). */
static int
check_table (struct qcow2_image *img, struct qcow2_io *io, uint64_t table,
             const uint8_t *data)
{
  const struct qcow2_header *h = &img->header;
  const unsigned bits = h->cluster_bits;
  const uint64_t entries = UINT64_C (1) << h->l2_bits;
  uint64_t i;
  int r = 0;

  for (i = 0; r == 0 && i < entries; ++i) {
    uint64_t entry = be64 (data + i * h->l2_entry_size);
    uint64_t host, last;

    if (entry & L2E_COMPRESSED) {
      host = qcow2_compressed_offset (entry, bits) & ~UINT64_C (511);
      last = host + (qcow2_compressed_sectors (entry, bits) << 9) - 1;
    }
    else {
      host = entry & L2E_OFFSET_MASK;
      if (host == 0 || (host & (h->cluster_size - 1)))
        continue;               /* none, or refused where it is used */
      last = host;
    }
    r = check_span (img, io, host >> bits, last >> bits, table, i);
  }
  return r;
}

int
qcow2_uncounted_check_loaded (struct qcow2_image *img, struct qcow2_io *io)
{
  uint64_t tables[QCOW2_L2_LOADED_MAX];
  CLEANUP_FREE uint8_t *buf = NULL;
  size_t n, i;
  int r = 0;

  n = qcow2_l2_loaded_take (img, tables);
  /* With an external data file, the tables map into that file, which no
   * refcount counts.
   */
  if (n == 0 || (img->header.incompatible_features & QCOW2_INCOMPAT_DATA_FILE))
    return 0;
  for (i = 0; r == 0 && i < n; ++i) {
    const struct meta_table *changed = qcow2_dirty_table (img, tables[i]);

    if (changed)
      r = check_table (img, io, tables[i], changed->data);
    else {
      if (buf == NULL && (buf = malloc (img->header.cluster_size)) == NULL) {
        qcow2_error (img, "out of memory for an L2 table");
        return -ENOMEM;
      }
      if (qcow2_l2_table_cached (img, tables[i], buf))
        r = check_table (img, io, tables[i], buf);
    }
  }
  return r;
}

int
qcow2_uncounted_refuse (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t cluster)
{
  const struct qcow2_allocator *a = img->alloc;
  size_t i = position (a, cluster);
  const struct uncounted *u;
  char at_guest[64] = " a guest cluster";

  if (i == a->nuncounted || a->uncounted[i].cluster != cluster)
    return 0;
  u = &a->uncounted[i];
  if (u->guest != UINT64_MAX)
    snprintf (at_guest, sizeof at_guest, " guest offset 0x%" PRIx64,
              u->guest);
  return qcow2_mark_corrupt (img, io, "Preventing invalid allocation of "
                             "host cluster 0x%" PRIx64 ": its refcount is 0 "
                             "but the L2 table at host offset 0x%" PRIx64
                             " maps%s to it",
                             cluster << img->header.cluster_bits, u->table,
                             at_guest);
}
