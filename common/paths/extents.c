/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the allocation map of the guest disk (block status).
 *
 * Implements qcow2_extents (qcow2.h, the contract), with the image lock
 * held shared.  What the image does not allocate reports what the
 * backing chain below reports for it, as qemu's block status does; an
 * L1 entry without an L2 table is one step however much of the disk it
 * covers, so that the cost of a map follows what is allocated.
 */

#include <config.h>

#include "qcow2.h"

#include <errno.h>
#include <pthread.h>

#include "paths/conn.h"
#include "meta/log.h"
#include "meta/map.h"
#include "base/lockorder.h"

/* L2 entries fetched at a time (on the stack). */
#define ENTRY_BATCH 512

/* Ranges reported so far: the one not yet given to FN grows while the
 * next range is alike; a range the backing file answers for waits in
 * BACKING_*.
 */
struct report {
  struct qcow2_image *img;
  qcow2_extent_fn fn;
  void *opaque;
  uint64_t start, len;
  bool zero;
  uint64_t backing_start, backing_len;
  int fn_error;                 /* FN failed: stop */
};

static int
report_add (void *opaque, uint64_t offset, uint64_t len, bool zero)
{
  struct report *rep = opaque;
  int r;

  if (len == 0)
    return 0;
  if (rep->len && rep->zero == zero && rep->start + rep->len == offset) {
    rep->len += len;
    return 0;
  }
  if (rep->len && (r = rep->fn (rep->opaque, rep->start, rep->len,
                                rep->zero)) != 0) {
    rep->fn_error = r;
    return r;
  }
  rep->start = offset;
  rep->len = len;
  rep->zero = zero;
  return 0;
}

/* Ask the backing file about the range waiting for it.  Called with
 * the image lock held for reading, which it lets go meanwhile.
 */
static int
report_backing (struct report *rep)
{
  uint64_t end = rep->backing_start + rep->backing_len;
  int r;

  rep->backing_len = 0;
  for (;;) {
    uint64_t from = rep->len ? rep->start + rep->len : rep->backing_start;
    if (from < rep->backing_start)
      from = rep->backing_start;
    if (from >= end)
      return 0;
    /* With no lock of this image held, as every read of a backing file
     * (base/lockorder.h: the image locks of a chain never nest); the
     * entries being reported are a copy.
     */
    qcow2_rwlock_unlock (&rep->img->lock);
    r = rep->img->backing_extents (rep->img, from, end - from,
                                   report_add, rep);
    qcow2_rwlock_rdlock (&rep->img->lock);
    if (r != 0)
      return r;
    if ((rep->len ? rep->start + rep->len : rep->backing_start) <= from) {
      qcow2_error (rep->img, "internal error: the backing file reported "
                   "nothing at guest offset 0x%" PRIx64, from);
      return -EIO;
    }
  }
}

/* [OFFSET, OFFSET+LEN) is zero, data, or (BACKING) up to the backing
 * file.
 */
static int
report_piece (struct report *rep, uint64_t offset, uint64_t len,
              bool zero, bool backing)
{
  int r;

  if (backing) {
    if (rep->backing_len &&
        rep->backing_start + rep->backing_len == offset) {
      rep->backing_len += len;
      return 0;
    }
    if (rep->backing_len && (r = report_backing (rep)) != 0)
      return r;
    rep->backing_start = offset;
    rep->backing_len = len;
    return 0;
  }
  if (rep->backing_len && (r = report_backing (rep)) != 0)
    return r;
  return report_add (rep, offset, len, zero);
}

/* Report the L2 entries of [*POS, END), one L2 table at most. */
static int
report_entries (struct report *rep, struct qcow2_io *io, struct request *req,
                uint64_t *pos, uint64_t end)
{
  struct qcow2_image *img = rep->img;
  const uint32_t bits = img->header.cluster_bits;
  const bool has_backing = img->backing != NULL;
  uint64_t entries[ENTRY_BATCH], bitmaps[ENTRY_BATCH];
  uint64_t first = *pos >> bits;
  uint64_t last = (end - 1) >> bits;
  size_t n = last - first + 1 < ENTRY_BATCH ? last - first + 1 : ENTRY_BATCH;
  size_t i;
  int r;

  r = qcow2_l2_entries (img, io, first, &n, entries, bitmaps, req->l2buf);
  for (i = 0; i < n && r == 0; ++i) {
    uint64_t cstart = (first + i) << bits;
    uint64_t cend = (first + i + 1) << bits;
    uint64_t hi = end < cend ? end : cend;
    struct cluster_map map;

    r = qcow2_classify_fetched (img, first, i, entries, bitmaps, &map);
    if (r < 0)
      break;
    if (img->header.extended_l2 && map.kind != CLUSTER_COMPRESSED) {
      /* Subcluster by subcluster, runs of alike ones at once. */
      while (*pos < hi && r == 0) {
        uint64_t run_end;
        enum subcluster_source from =
          qcow2_subcluster_run (img, &map, bitmaps[i], *pos - cstart,
                                hi - cstart, &run_end);

        r = report_piece (rep, *pos, cstart + run_end - *pos,
                          from != SUB_HOST, from == SUB_BACKING);
        *pos = cstart + run_end;
      }
      continue;
    }
    switch (map.kind) {
    case CLUSTER_UNALLOCATED:
      r = report_piece (rep, *pos, hi - *pos, true, has_backing);
      break;
    case CLUSTER_ZERO:
      r = report_piece (rep, *pos, hi - *pos, true, false);
      break;
    default:
      r = report_piece (rep, *pos, hi - *pos, false, false);
      break;
    }
    *pos = hi;
  }
  return r;
}

int
qcow2_extents (struct qcow2_conn *conn, struct qcow2_io *io,
               uint64_t offset, uint64_t count,
               qcow2_extent_fn fn, void *opaque)
{
  struct qcow2_image *img = qcow2_conn_image (conn);
  const uint32_t l1_shift = img->header.cluster_bits + img->header.l2_bits;
  const uint64_t end = offset + count;
  struct report rep = { .img = img, .fn = fn, .opaque = opaque };
  uint64_t pos = offset;
  struct request *req;
  int r = 0, r2;

  if (count == 0)
    return 0;
  req = qcow2_conn_request_get (conn);
  if (req == NULL)
    return -ENOMEM;
  qcow2_rwlock_rdlock (&img->lock);

  while (pos < end && r == 0) {
    uint64_t l1_index = pos >> l1_shift;

    if (qcow2_l1_unallocated (img, l1_index)) {
      /* No L2 table: all of it in one step. */
      uint64_t l1_end = (l1_index + 1) << l1_shift;
      uint64_t hi = l1_end < end && l1_end > pos ? l1_end : end;
      r = report_piece (&rep, pos, hi - pos, true, img->backing != NULL);
      pos = hi;
    }
    else
      r = report_entries (&rep, io, req, &pos, end);
  }
  /* If a later entry is bad, still answer with the ranges before it, so
   * that a client makes progress up to the bad cluster; the next request
   * starts there and gets the error.  A failure of FN ends it all.
   */
  if (rep.fn_error)
    r = rep.fn_error;
  else {
    r2 = 0;
    if (rep.backing_len)
      r2 = report_backing (&rep);
    if (r2 == 0 && rep.len)
      r2 = rep.fn_error ? rep.fn_error
        : fn (opaque, rep.start, rep.len, rep.zero);
    if (r2 != 0)
      r = r2;
    else if (pos > offset)
      r = 0;
  }
  qcow2_rwlock_unlock (&img->lock);
  qcow2_conn_request_put (conn, req);
  return r;
}
