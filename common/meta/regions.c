/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the list of metadata regions (see meta/regions.h).
 *
 * A hash table from host cluster index to kind, open addressing with
 * linear probing and backward-shift deletion, so that a removal leaves
 * no tombstone behind: the table is looked up on every write.
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include "meta/regions.h"
#include "base/check.h"
#include "base/lockorder.h"

struct slot {
  uint64_t key;                     /* cluster index + 1; 0: empty */
  uint8_t kind;
};

/* In a slot's kind: a second structure of another kind claims the
 * cluster too (a damaged image).
 */
#define CLAIMED_TWICE 0x80

struct qcow2_regions {
  /* Writes check the list with no image lock held (meta/hostio.c): a
   * leaf, held only inside each call.
   */
  struct qcow2_rwlock lock;
  struct slot *slots;
  uint64_t capacity;                /* a power of two, or 0 */
  uint64_t count;
};

static const char *const names[QCOW2_REGION_KINDS] = {
  [QCOW2_REGION_NONE] = "guest data",
  [QCOW2_REGION_HEADER] = "qcow2_header",
  [QCOW2_REGION_L1] = "active L1 table",
  [QCOW2_REGION_L2] = "active L2 table",
  [QCOW2_REGION_REFCOUNT_TABLE] = "refcount table",
  [QCOW2_REGION_REFCOUNT_BLOCK] = "refcount block",
  [QCOW2_REGION_SNAPSHOT_TABLE] = "snapshot table",
  [QCOW2_REGION_SNAPSHOT_L1] = "inactive L1 table",
  [QCOW2_REGION_BITMAP_DIRECTORY] = "bitmap directory",
  [QCOW2_REGION_BITMAP_TABLE] = "bitmap table",
  [QCOW2_REGION_BITMAP_DATA] = "bitmap data",
  [QCOW2_REGION_LUKS] = "LUKS area",
};

const char *
qcow2_region_name (enum qcow2_region kind)
{
  return kind < QCOW2_REGION_KINDS ? names[kind] : "metadata";
}

int
qcow2_regions_open (struct qcow2_image *img)
{
  img->regions = calloc (1, sizeof *img->regions);
  if (img->regions == NULL)
    return -ENOMEM;
  qcow2_rwlock_init (&img->regions->lock, QCOW2_RANK_LEAF,
                     "the list of metadata regions");
  return 0;
}

void
qcow2_regions_close (struct qcow2_image *img)
{
  if (img->regions == NULL)
    return;
  qcow2_rwlock_destroy (&img->regions->lock);
  free (img->regions->slots);
  free (img->regions);
  img->regions = NULL;
}

static uint64_t
home (const struct qcow2_regions *r, uint64_t key)
{
  /* Tables lie in runs of consecutive clusters: spread them. */
  return (key * UINT64_C (0x9e3779b97f4a7c15)) >> 17 & (r->capacity - 1);
}

static struct slot *
find (const struct qcow2_regions *r, uint64_t key)
{
  uint64_t i;

  if (r->capacity == 0)
    return NULL;
  for (i = home (r, key); r->slots[i].key; i = (i + 1) & (r->capacity - 1))
    if (r->slots[i].key == key)
      return &r->slots[i];
  return NULL;
}

static void
put (struct qcow2_regions *r, uint64_t key, uint8_t kind)
{
  uint64_t i = home (r, key);

  while (r->slots[i].key)
    i = (i + 1) & (r->capacity - 1);
  r->slots[i] = (struct slot) { key, kind };
  r->count++;
}

/* Room for NEEDED more entries at a load below 1/2. */
static int
reserve (struct qcow2_regions *r, uint64_t needed)
{
  struct slot *old = r->slots;
  uint64_t old_capacity = r->capacity, cap = r->capacity ? r->capacity : 64;
  uint64_t i;

  while (2 * (r->count + needed) > cap)
    cap *= 2;
  if (cap == r->capacity)
    return 0;
  r->slots = calloc (cap, sizeof *r->slots);
  if (r->slots == NULL) {
    r->slots = old;
    return -ENOMEM;
  }
  r->capacity = cap;
  r->count = 0;
  for (i = 0; i < old_capacity; ++i)
    if (old[i].key)
      put (r, old[i].key, old[i].kind);
  free (old);
  return 0;
}

int
qcow2_regions_add (struct qcow2_image *img, enum qcow2_region kind,
                   uint64_t offset, uint64_t length)
{
  struct qcow2_regions *r = img->regions;
  const unsigned bits = img->header.cluster_bits;
  uint64_t c, first, last;

  struct slot *s;

  QCOW2_ASSERT (kind != QCOW2_REGION_NONE && kind < QCOW2_REGION_KINDS);
  if (r == NULL || length == 0)
    return 0;
  first = offset >> bits;
  last = (offset + length - 1) >> bits;
  qcow2_rwlock_wrlock (&r->lock);
  if (reserve (r, last - first + 1) < 0) {
    qcow2_rwlock_unlock (&r->lock);
    return -ENOMEM;
  }
  for (c = first; c <= last; ++c)
    if ((s = find (r, c + 1)) == NULL)
      put (r, c + 1, kind);
    else if ((s->kind & ~CLAIMED_TWICE) != kind)
      s->kind |= CLAIMED_TWICE;
  qcow2_rwlock_unlock (&r->lock);
  return 0;
}

void
qcow2_regions_remove (struct qcow2_image *img, uint64_t cluster)
{
  struct qcow2_regions *r = img->regions;
  struct slot *s;
  uint64_t hole, i, want;

  if (r == NULL)
    return;
  qcow2_rwlock_wrlock (&r->lock);
  s = find (r, cluster + 1);
  if (s == NULL) {
    qcow2_rwlock_unlock (&r->lock);
    return;
  }
  /* Shift back the entries after the hole that probed past it. */
  hole = s - r->slots;
  r->slots[hole].key = 0;
  r->count--;
  for (i = (hole + 1) & (r->capacity - 1); r->slots[i].key;
       i = (i + 1) & (r->capacity - 1)) {
    want = home (r, r->slots[i].key);
    /* Entry I may move to HOLE if HOLE lies between its home and I. */
    if (((i - want) & (r->capacity - 1)) >= ((i - hole) & (r->capacity - 1))) {
      r->slots[hole] = r->slots[i];
      r->slots[i].key = 0;
      hole = i;
    }
  }
  qcow2_rwlock_unlock (&r->lock);
}

/* The kind of CLUSTER with the CLAIMED_TWICE bit, with the lock held. */
static uint8_t
raw_kind (const struct qcow2_regions *r, uint64_t cluster)
{
  const struct slot *s = find (r, cluster + 1);

  return s ? s->kind : QCOW2_REGION_NONE;
}

enum qcow2_region
qcow2_regions_kind (const struct qcow2_image *img, uint64_t cluster)
{
  struct qcow2_regions *r = img->regions;
  uint8_t kind;

  if (r == NULL)
    return QCOW2_REGION_NONE;
  qcow2_rwlock_rdlock (&r->lock);
  kind = raw_kind (r, cluster);
  qcow2_rwlock_unlock (&r->lock);
  return kind & ~CLAIMED_TWICE;
}

enum qcow2_region
qcow2_regions_overlap (const struct qcow2_image *img,
                       enum qcow2_region allowed,
                       uint64_t offset, uint64_t length, uint64_t *where)
{
  struct qcow2_regions *r = img->regions;
  const unsigned bits = img->header.cluster_bits;
  enum qcow2_region found = QCOW2_REGION_NONE;
  uint64_t c, last;
  uint8_t kind;

  if (r == NULL || length == 0)
    return QCOW2_REGION_NONE;
  last = (offset + length - 1) >> bits;
  qcow2_rwlock_rdlock (&r->lock);
  for (c = offset >> bits; c <= last && r->count; ++c) {
    kind = raw_kind (r, c);
    /* A cluster two structures claim is the right kind for neither. */
    if (kind != QCOW2_REGION_NONE && kind != allowed) {
      *where = c << bits;
      found = kind & ~CLAIMED_TWICE;
      break;
    }
  }
  qcow2_rwlock_unlock (&r->lock);
  return found;
}

bool
qcow2_regions_is (const struct qcow2_image *img, enum qcow2_region kind,
                  uint64_t offset)
{
  struct qcow2_regions *r = img->regions;
  uint8_t found;

  if (r == NULL)
    return true;
  qcow2_rwlock_rdlock (&r->lock);
  found = raw_kind (r, offset >> img->header.cluster_bits);
  qcow2_rwlock_unlock (&r->lock);
  return found == kind;
}

uint64_t
qcow2_regions_count (const struct qcow2_image *img)
{
  return img->regions ? img->regions->count : 0;
}
