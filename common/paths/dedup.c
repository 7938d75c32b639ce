/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: sharing one compressed cluster between guest clusters
 * with the same data (see paths/dedup.h).
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "paths/dedup.h"
#include "base/lockorder.h"
#include "format/codec.h"
#include "meta/hostio.h"
#include "meta/log.h"
#include "meta/map.h"
#include "meta/refcount.h"
#include "paths/scratch.h"

struct dedup_slot {
  uint64_t hash;
  uint64_t entry;               /* compressed L2 entry; 0: empty */
  bool pending;                 /* its data is still being written */
};

/* One slot per guest cluster, within these bounds (16 bytes each). */
#define MIN_SLOTS (UINT64_C (1) << 10)
#define MAX_SLOTS (UINT64_C (1) << 20)

static inline uint64_t
rotl64 (uint64_t x, unsigned r)
{
  return (x << r) | (x >> (64 - r));
}

/* Two 64-bit lanes of vector registers with SSE2 or NEON, plain
 * registers elsewhere.
 */
typedef uint64_t u64x2 __attribute__ ((vector_size (16)));

static inline u64x2
load_u64x2 (const uint8_t *p)
{
  u64x2 v;
  memcpy (&v, p, sizeof v);
  return v;
}

uint64_t
qcow2_dedup_hash (const uint8_t *data, size_t len)
{
  /* Running sums and sums of sums (position dependent) of the data's
   * 64-bit words in eight lanes, mixed at the end.  Every cluster written
   * is hashed, and a weak hash only costs a comparison on a collision:
   * additions keep up with memory, where a multiply per word would not,
   * and either is cheap next to compressing the cluster.
   */
  const uint64_t k1 = UINT64_C (0x9e3779b97f4a7c15);  /* 2^64 / golden ratio */
  const uint64_t k2 = UINT64_C (0xd6e8feb86659fd93);
  u64x2 sum0 = { 0 }, sum1 = { 0 }, sum2 = { 0 }, sum3 = { 0 };
  u64x2 acc0 = { 0 }, acc1 = { 0 }, acc2 = { 0 }, acc3 = { 0 };
  uint64_t h = len, tail = 0;
  size_t i;

  for (i = 0; i + 64 <= len; i += 64) {
    sum0 += load_u64x2 (data + i);
    sum1 += load_u64x2 (data + i + 16);
    sum2 += load_u64x2 (data + i + 32);
    sum3 += load_u64x2 (data + i + 48);
    acc0 += sum0;
    acc1 += sum1;
    acc2 += sum2;
    acc3 += sum3;
  }
  for (; i < len; ++i)
    tail = (tail ^ data[i]) * k2;

  const u64x2 lanes[] = { sum0, sum1, sum2, sum3, acc0, acc1, acc2, acc3 };
  for (i = 0; i < sizeof lanes / sizeof lanes[0]; ++i) {
    h = rotl64 (h ^ (lanes[i][0] * k2), 27) * k1;
    h = rotl64 (h ^ (lanes[i][1] * k2), 27) * k1;
  }
  h = rotl64 (h ^ tail, 27) * k1;
  return h ^ (h >> 32);
}

/* Compressed clusters by the hash of their data (img->dedup). */
struct qcow2_dedup {
  struct qcow2_mutex lock;
  struct dedup_slot *slots;
  uint64_t mask;
};

int
qcow2_dedup_init (struct qcow2_image *img)
{
  uint64_t clusters = (img->header.virtual_size + img->header.cluster_size
                       - 1) >> img->header.cluster_bits;
  uint64_t slots = MIN_SLOTS;
  struct qcow2_dedup *d = calloc (1, sizeof *d);

  while (slots < clusters && slots < MAX_SLOTS)
    slots <<= 1;
  if (d == NULL || (d->slots = calloc (slots, sizeof *d->slots)) == NULL) {
    free (d);
    qcow2_error (img, "out of memory for the table of compressed clusters");
    return -ENOMEM;
  }
  d->mask = slots - 1;
  qcow2_mutex_init (&d->lock, QCOW2_RANK_DEDUP,
                    "the table of compressed clusters");
  img->dedup = d;
  return 0;
}

void
qcow2_dedup_free (struct qcow2_image *img)
{
  if (img->dedup == NULL)
    return;
  qcow2_mutex_destroy (&img->dedup->lock);
  free (img->dedup->slots);
  free (img->dedup);
  img->dedup = NULL;
}

/* A hash may sit in any of the WAYS slots of its set, so that a few
 * hashes falling into one set do not push each other out.
 */
#define WAYS 4

/* The set of slots HASH may sit in; with the dedup lock held. */
static struct dedup_slot *
set_of (struct qcow2_image *img, uint64_t hash)
{
  return &img->dedup->slots[hash & img->dedup->mask & ~(uint64_t) (WAYS - 1)];
}

uint64_t
qcow2_dedup_find (struct qcow2_image *img, uint64_t hash, bool *pending)
{
  const struct dedup_slot *set;
  uint64_t entry = 0;
  unsigned way;

  *pending = false;
  if (img->dedup == NULL)
    return 0;
  qcow2_mutex_lock (&img->dedup->lock);
  set = set_of (img, hash);
  for (way = 0; way < WAYS; ++way)
    if (set[way].entry && set[way].hash == hash) {
      entry = set[way].entry;
      *pending = set[way].pending;
      break;
    }
  qcow2_mutex_unlock (&img->dedup->lock);
  return entry;
}

void
qcow2_dedup_remember (struct qcow2_image *img, uint64_t hash, uint64_t entry,
                      bool pending)
{
  struct dedup_slot *set;
  unsigned way, pick;

  if (img->dedup == NULL)
    return;
  qcow2_mutex_lock (&img->dedup->lock);
  set = set_of (img, hash);
  /* The slot already holding HASH, else an empty one, else one picked by
   * bits of the hash that did not choose the set.
   */
  pick = (hash >> 62) & (WAYS - 1);
  for (way = WAYS; way-- > 0; )
    if (set[way].entry == 0)
      pick = way;
  for (way = 0; way < WAYS; ++way)
    if (set[way].entry && set[way].hash == hash)
      pick = way;
  set[pick] = (struct dedup_slot) {
    .hash = hash, .entry = entry, .pending = pending,
  };
  qcow2_mutex_unlock (&img->dedup->lock);
}

/* The slot holding ENTRY for HASH, if the table still has it: marked
 * written, or (FORGET) emptied.
 */
static void
update_slot (struct qcow2_image *img, uint64_t hash, uint64_t entry,
             bool forget)
{
  struct dedup_slot *set;
  unsigned way;

  if (img->dedup == NULL)
    return;
  qcow2_mutex_lock (&img->dedup->lock);
  set = set_of (img, hash);
  for (way = 0; way < WAYS; ++way)
    if (set[way].entry == entry && set[way].hash == hash) {
      if (forget)
        set[way] = (struct dedup_slot) { 0 };
      else
        set[way].pending = false;
      break;
    }
  qcow2_mutex_unlock (&img->dedup->lock);
}

void
qcow2_dedup_written (struct qcow2_image *img, uint64_t hash, uint64_t entry)
{
  update_slot (img, hash, entry, false);
}

void
qcow2_dedup_forget (struct qcow2_image *img, uint64_t hash, uint64_t entry)
{
  update_slot (img, hash, entry, true);
}

int
qcow2_dedup_verify (struct qcow2_image *img, struct qcow2_io *io,
                    struct write_scratch *ws, uint64_t guest_cluster,
                    uint64_t entry, const uint8_t *src, uint32_t src_len)
{
  const uint32_t cluster_size = img->header.cluster_size;
  uint8_t *data = ws->cow[1];
  struct cluster_map map;
  char err[256];
  int r;

  if (qcow2_classify (img, guest_cluster, entry, &map) < 0 ||
      map.kind != CLUSTER_COMPRESSED)
    return -EIO;
  r = qcow2_pread_clamped (img, io, ws->compressed, map.compressed_len,
                           map.host_offset);
  if (r < 0)
    return r;
  if (qcow2_decode_cluster (ws->dec, img->header.compression_type,
                            ws->compressed, map.compressed_len,
                            data, cluster_size, err, sizeof err) < 0)
    return 0;
  /* The disk's last cluster was compressed zero padded. */
  return memcmp (data, src, src_len) == 0 &&
    (src_len == cluster_size ||
     (data[src_len] == 0 &&
      memcmp (data + src_len, data + src_len + 1,
              cluster_size - src_len - 1) == 0));
}

/* The host clusters compressed ENTRY is counted in: [*FIRST, *LAST]. */
static int
span_clusters (struct qcow2_image *img, uint64_t entry, uint64_t *first,
               uint64_t *last)
{
  struct cluster_map map;
  uint64_t start, len;

  if (qcow2_classify (img, 0, entry, &map) < 0 ||
      map.kind != CLUSTER_COMPRESSED)
    return -EIO;
  qcow2_compressed_span (&map, &start, &len);
  *first = start >> img->header.cluster_bits;
  *last = (start + len - 1) >> img->header.cluster_bits;
  return 0;
}

int
qcow2_dedup_can_reference (struct qcow2_image *img, struct qcow2_io *io,
                           uint64_t entry)
{
  uint64_t first, last, c, refcount;
  int r = span_clusters (img, entry, &first, &last);

  if (r < 0)
    return r;
  for (c = first; c <= last; ++c) {
    r = qcow2_refcount_get (img, io, c, &refcount);
    if (r < 0)
      return r;
    /* Freed (and maybe handed out again), or no reference left to give. */
    if (refcount == 0 || refcount >= qcow2_refcount_max (img))
      return 0;
  }
  return 1;
}

int
qcow2_dedup_reference (struct qcow2_image *img, struct qcow2_io *io,
                       uint64_t entry)
{
  uint64_t first, last, c;
  int r = span_clusters (img, entry, &first, &last);

  for (c = first; r == 0 && c <= last; ++c) {
    r = qcow2_refcount_add (img, io, c, 1, NULL);
    if (r < 0)
      while (c-- > first)
        qcow2_refcount_add (img, io, c, -1, NULL);
  }
  return r;
}
