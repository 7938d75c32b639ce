/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: packing compressed data (see meta/pack.h). */

#include <config.h>

#include <errno.h>

#include "meta/pack.h"
#include "meta/alloc.h"
#include "meta/alloc-internal.h"
#include "format/entries.h"
#include "meta/log.h"
#include "meta/refcount.h"
#include "meta/release.h"

/* Room at the end of a packed host cluster too small to keep. */
#define MIN_GAP_BYTES 512

/* The host cluster after the one compressed data is being packed into:
 * packed data runs on into it if it is free.
 */
static uint64_t
pack_next_cluster (const struct qcow2_image *img)
{
  return (((img->alloc->pack_cursor - 1) | (img->header.cluster_size - 1)) + 1)
    >> img->header.cluster_bits;
}

/* Stop packing compressed data after the cursor. */
static void
pack_reset (struct qcow2_image *img)
{
  img->alloc->pack_cursor = 0;
}

/* The packing moves on from CUR before the end of its host cluster:
 * remember the room left there, in place of the smallest gap kept if
 * the list is full.
 */
static void
gap_remember (struct qcow2_image *img, uint64_t cur)
{
  struct qcow2_allocator *a = img->alloc;
  uint64_t end = (cur | (img->header.cluster_size - 1)) + 1;
  unsigned i, smallest = 0;

  if ((cur & (img->header.cluster_size - 1)) == 0 ||
      end - cur < MIN_GAP_BYTES)
    return;
  if (a->ngaps < QCOW2_PACK_GAPS) {
    a->gaps[a->ngaps++] = (struct pack_gap) { cur, end - cur };
    return;
  }
  for (i = 1; i < a->ngaps; ++i)
    if (a->gaps[i].length < a->gaps[smallest].length)
      smallest = i;
  if (a->gaps[smallest].length < end - cur)
    a->gaps[smallest] = (struct pack_gap) { cur, end - cur };
}

void
qcow2_pack_forget_cluster (struct qcow2_image *img, uint64_t cluster)
{
  struct qcow2_allocator *a = img->alloc;
  const unsigned bits = img->header.cluster_bits;
  unsigned i = 0;

  while (i < a->ngaps)
    if (a->gaps[i].offset >> bits == cluster)
      a->gaps[i] = a->gaps[--a->ngaps];
    else
      i++;
  if (a->pack_cursor && (a->pack_cursor - 1) >> bits == cluster)
    pack_reset (img);
}

/* Put LEN bytes into the smallest gap they fit, counting one more
 * reference to its host cluster: *HOST is where, or 0 if no gap fits.
 */
static int
gap_take (struct qcow2_image *img, struct qcow2_io *io, uint64_t len,
          uint64_t *host)
{
  struct qcow2_allocator *a = img->alloc;
  const unsigned bits = img->header.cluster_bits;
  uint64_t refcount;
  unsigned i, best;
  int r;

  *host = 0;
  for (;;) {
    best = a->ngaps;
    for (i = 0; i < a->ngaps; ++i)
      if (a->gaps[i].length >= len &&
          (best == a->ngaps || a->gaps[i].length < a->gaps[best].length))
        best = i;
    if (best == a->ngaps)
      return 0;
    r = qcow2_refcount_get (img, io, a->gaps[best].offset >> bits,
                            &refcount);
    if (r < 0)
      return r;
    if (refcount > 0 && refcount < qcow2_refcount_max (img))
      break;
    /* Out of references (narrow refcounts): no use any more. */
    a->gaps[best] = a->gaps[--a->ngaps];
  }
  r = qcow2_refcount_add (img, io, a->gaps[best].offset >> bits, 1, NULL);
  if (r < 0)
    return r;
  *host = a->gaps[best].offset;
  a->gaps[best].offset += len;
  a->gaps[best].length -= len;
  if (a->gaps[best].length < MIN_GAP_BYTES)
    a->gaps[best] = a->gaps[--a->ngaps];
  return 0;
}

int
qcow2_pack_reserve (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t len, uint64_t *host)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  uint64_t cur = img->alloc->pack_cursor;
  uint64_t fresh[2], c, first, last, offset;
  unsigned nfresh = 0, i;
  int r;

  /* Room left behind earlier first: what fits there costs no new room. */
  r = gap_take (img, io, len, &offset);
  if (r < 0)
    return r;
  if (offset) {
    *host = offset;
    return 0;
  }

  if (cur) {
    /* With narrow refcounts (refcount_bits 1 to 4) a host cluster can
     * run out of references before it runs out of bytes; start a new
     * one then, as qemu does.  Only the cluster packed so far can be
     * full: any other that the range runs into is allocated here.
     */
    uint64_t refcount;
    r = qcow2_refcount_get (img, io, (cur & ~UINT64_C (511)) >> bits,
                            &refcount);
    if (r < 0)
      return r;
    if (refcount >= qcow2_refcount_max (img)) {
      pack_reset (img);
      cur = 0;
    }
  }
  if (cur) {
    uint64_t next = pack_next_cluster (img);
    if (cur + len > next << bits) {
      /* Where it cannot run on, packing moves on to a new cluster. */
      r = qcow2_alloc_cluster_at (img, io, next);
      if (r == -EBUSY) {
        gap_remember (img, cur);
        cur = 0;
      }
      else if (r < 0)
        return r;
      else
        fresh[nfresh++] = next;
    }
  }
  if (cur == 0) {
    r = qcow2_alloc_clusters (img, io, 1, &offset);
    if (r < 0)
      return r;
    cur = offset;
    fresh[nfresh++] = offset >> bits;
  }
  if (cur > qcow2_compressed_offset_mask (bits)) {
    qcow2_error (img, "host offset 0x%" PRIx64 " is too large for a "
                 "compressed cluster descriptor", cur);
    r = -EFBIG;
    goto fail;
  }

  first = (cur & ~UINT64_C (511)) >> bits;
  last = ((cur + len - 1) | 511) >> bits;
  for (c = first; c <= last; ++c) {
    bool is_fresh = false;
    for (i = 0; i < nfresh; ++i)
      is_fresh |= fresh[i] == c;
    if (!is_fresh && (r = qcow2_refcount_add (img, io, c, 1, NULL)) < 0)
      goto fail;
  }
  *host = cur;
  img->alloc->pack_cursor = cur + len;
  return 0;

 fail:
  for (i = 0; i < nfresh; ++i)
    qcow2_free_later (img, fresh[i] << bits, cluster_size, 0);
  pack_reset (img);
  return r;
}
