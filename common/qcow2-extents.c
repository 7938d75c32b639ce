/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the allocation map of the guest disk (block status).
 *
 * Implements qcow2_extents (qcow2.h, the contract), with the image lock
 * held shared.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>

#include "qcow2-conn.h"
#include "qcow2-map.h"

/* L2 entries fetched at a time (on the stack). */
#define ENTRY_BATCH 512

int
qcow2_extents (struct qcow2_conn *conn, struct qcow2_io *io,
               uint64_t offset, uint64_t count,
               qcow2_extent_fn fn, void *opaque)
{
  struct qcow2_image *img = qcow2_conn_image (conn);
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t end = offset + count;
  uint64_t entries[ENTRY_BATCH], bitmaps[ENTRY_BATCH];
  uint64_t pos = offset, run_start = offset;
  bool run_zero = false;
  struct request *req;
  int r = 0;

  if (count == 0)
    return 0;
  req = qcow2_conn_request_get (conn);
  if (req == NULL)
    return -ENOMEM;
  pthread_rwlock_rdlock (&img->lock);

  int fn_error = 0;

  while (pos < end && r == 0 && fn_error == 0) {
    uint64_t first = pos >> bits;
    uint64_t last = (end - 1) >> bits;
    size_t n = last - first + 1 < ENTRY_BATCH ? last - first + 1 : ENTRY_BATCH;
    size_t i;

    r = qcow2_l2_entries (img, io, first, &n, entries, bitmaps, req->l2buf);
    for (i = 0; i < n && r == 0 && fn_error == 0; ++i) {
      uint64_t cstart = (first + i) << bits;
      uint64_t cend = (first + i + 1) << bits;
      uint64_t hi = end < cend ? end : cend;
      /* Extended L2: subcluster by subcluster. */
      uint64_t step = img->header.extended_l2 ? (cend - cstart) / 32 : hi - pos;
      struct cluster_map map;

      r = qcow2_classify (img, first + i, entries[i], &map);
      if (r == 0 && img->header.extended_l2)
        r = qcow2_check_bitmap (img, first + i, &map, bitmaps[i]);
      if (r < 0)
        break;
      while (pos < hi && fn_error == 0) {
        uint64_t piece_end = cstart + ((pos - cstart) / step + 1) * step;
        unsigned x = (pos - cstart) * 32 / (cend - cstart);
        bool zero;

        if (piece_end > hi || !img->header.extended_l2)
          piece_end = hi;
        /* Without a backing file, unallocated reads as zeros; with one,
         * it is the backing file's data, reported as data.
         */
        if (img->header.extended_l2 && map.kind != CLUSTER_COMPRESSED) {
          bool allocated = bitmaps[i] & (UINT64_C (1) << x);
          zero = !allocated && ((bitmaps[i] & (UINT64_C (1) << (32 + x))) ||
                                img->backing == NULL);
        }
        else
          zero = map.kind == CLUSTER_ZERO ||
            (map.kind == CLUSTER_UNALLOCATED && img->backing == NULL);
        if (pos == offset)
          run_zero = zero;
        else if (zero != run_zero) {
          fn_error = fn (opaque, run_start, pos - run_start, run_zero);
          run_start = pos;
          run_zero = zero;
        }
        pos = piece_end;
      }
    }
  }
  if (fn_error)
    r = fn_error;
  /* If a later entry is bad, still answer with the ranges before it, so
   * that a client makes progress up to the bad cluster; the next request
   * starts there and gets the error.
   */
  else if (pos > run_start)
    r = fn (opaque, run_start, pos - run_start, run_zero);
  pthread_rwlock_unlock (&img->lock);
  qcow2_conn_request_put (conn, req);
  return r;
}
