/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: writes, zeroes, trims, flushes.
 *
 * Implements qcow2_write, qcow2_zero, qcow2_trim, qcow2_flush and
 * qcow2_finish (qcow2.h, the contract).  Each of the first three marks
 * the range it covers in the persistent bitmaps first, with one call
 * (qcow2_bitmaps_mark), as qemu's block layer marks whole requests; a
 * flush stores the bitmaps with the metadata, and the last writer's
 * finish leaves them consistent (meta/bitmap.h).  The paths below take the image lock only to decide and
 * write the data without it (paths/cluster.h); the metadata they change
 * reaches the disk in the order meta/writeback.h describes.  With
 * compression on, whole clusters are compressed and their compressed
 * data written with no lock held, and only placed under it
 * (paths/compress.h); the parts of clusters at either end of a write
 * take the plain path.  When the file is full but released clusters wait
 * for a writeback, the paths answer CHANGE_NEEDS_ROOM (meta/alloc.h) and
 * this file does the writeback, holding nothing, and goes on.  FUA: a
 * write that changed no metadata, into clusters whose metadata is on
 * disk, only flushes the device; anything else writes the metadata back.
 */

#include <config.h>

#include "qcow2.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/alloc.h"
#include "meta/bitmap.h"
#include "paths/cluster.h"
#include "paths/compress.h"
#include "paths/conn.h"
#include "paths/dedup.h"
#include "meta/first-change.h"
#include "meta/hostio.h"
#include "meta/map.h"
#include "meta/log.h"
#include "meta/writeback.h"
#include "paths/scratch.h"
#include "base/lockorder.h"
#include "base/zeros.h"

/* The paths answered CHANGE_NEEDS_ROOM: the file is full, but clusters
 * released since the last writeback wait for it before they may be
 * reused.  The writeback applies those releases; the caller then goes on
 * from where it stopped.  It holds no lock, claim or grace period here.
 */
static int
reclaim (struct qcow2_image *img, struct qcow2_io *io)
{
  int r;

  qcow2_alloc_room_wanted (img, true);
  r = qcow2_writeback (img, io, false);
  qcow2_alloc_room_wanted (img, false);
  return r;
}

/* qcow2_change_range over the whole range, reclaiming room as often as
 * the allocator asks for it.  Each reclaim applies at least one release
 * and the allocator asks again only once new ones are queued, which
 * takes progress, so this ends.
 */
static int
change (struct qcow2_image *img, struct qcow2_io *io, struct qcow2_conn *conn,
        struct request *req, enum qcow2_op op, const uint8_t *buf,
        uint64_t count, uint64_t offset, struct change_result *result)
{
  uint64_t done;
  int r;

  for (;;) {
    switch (qcow2_change_range (img, io, conn, req, op, buf, count, offset,
                                &done, result, &r)) {
    case CHANGE_DONE:
      return 0;
    case CHANGE_FAILED:
      return r;
    case CHANGE_NEEDS_ROOM:
      r = reclaim (img, io);
      if (r < 0)
        return r;
      break;
    }
    if (buf)
      buf += done;
    count -= done;
    offset += done;
  }
}

static int
check_writable (struct qcow2_image *img, uint64_t count, uint64_t offset)
{
  if (!img->opts.writable) {
    qcow2_error (img, "the image was opened read-only");
    return -EROFS;
  }
  if (atomic_load (&img->corrupt)) {
    qcow2_error (img, "the image is marked corrupt: writes are refused "
                 "(check it with qemu-img check -r all); reads go on");
    return -EIO;
  }
  return qcow2_guest_range_check (img, "request", count, offset);
}

/* Compress the batch (no lock held), then place it. */
static int
flush_compress_batch (struct qcow2_io *io, struct compress_ctx *ctx,
                      uint64_t first_gc, struct change_result *result)
{
  struct qcow2_image *img = ctx->img;
  struct write_scratch *ws;
  int r;

  if (ctx->count == 0)
    return 0;
  r = qcow2_compress_run (ctx);
  if (r < 0)
    return r;
  ws = qcow2_scratch_get (img);
  if (ws == NULL)
    return -ENOMEM;
  for (;;) {
    enum change_outcome outcome = qcow2_compress_place (img, io, ctx, ws,
                                                        first_gc, result,
                                                        &r);
    if (outcome == CHANGE_DONE)
      r = 0;
    if (outcome != CHANGE_NEEDS_ROOM || (r = reclaim (img, io)) < 0)
      break;
  }
  qcow2_scratch_put (img, ws);
  ctx->count = 0;
  return r;
}

/* A write with compression on: whole clusters (and the disk's last
 * cluster when the write reaches the end of the disk) are compressed;
 * the parts of clusters at either end take the plain path.
 */
static int
write_compressed (struct qcow2_conn *conn, struct qcow2_io *io,
                  const uint8_t *buf, uint64_t count, uint64_t offset,
                  struct change_result *result)
{
  struct qcow2_image *img = qcow2_conn_image (conn);
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  const uint64_t end = offset + count;
  struct compress_ctx *ctx;
  uint64_t pos = offset, batch_gc = 0;
  size_t clusters = (count >> bits) + 1;
  int r = 0, r2;

  if (clusters > qcow2_compress_batch_max (img))
    clusters = qcow2_compress_batch_max (img);
  ctx = qcow2_conn_batch_get (conn, clusters);
  if (ctx == NULL)
    return -ENOMEM;

  while (pos < end && r == 0) {
    uint64_t cstart = pos & ~(cluster_size - 1);
    uint64_t cend = cstart + cluster_size;
    uint64_t hi = end < cend ? end : cend;

    if (cend > img->header.virtual_size)
      cend = img->header.virtual_size;
    if (pos == cstart && cend <= end) {
      if (ctx->count == 0)
        batch_gc = cstart >> bits;
      ctx->src[ctx->count] = buf + (pos - offset);
      ctx->src_len[ctx->count] = cend - cstart;
      /* Hashed here, where the data just came in and is still in this
       * CPU's cache (a compressor thread would fetch it from memory).
       * The zero padded last cluster is never shared.
       */
      ctx->hash[ctx->count] = 0;
      ctx->dedup[ctx->count] = 0;
      if (cend - cstart == cluster_size) {
        ctx->hash[ctx->count] = qcow2_dedup_hash (ctx->src[ctx->count],
                                                  cluster_size);
        bool pending;
        ctx->dedup[ctx->count] = qcow2_dedup_find (img, ctx->hash[ctx->count],
                                                   &pending);
        /* A copy still being written is waited for when placing. */
        if (pending)
          ctx->dedup[ctx->count] = 0;
      }
      ctx->count++;
      pos = cend;
      if (ctx->count == ctx->capacity)
        r = flush_compress_batch (io, ctx, batch_gc, result);
      continue;
    }
    r = flush_compress_batch (io, ctx, batch_gc, result);
    if (r < 0)
      break;
    r = change (img, io, conn, NULL, QCOW2_OP_WRITE, buf + (pos - offset),
                hi - pos, pos, result);
    pos = hi;
  }
  r2 = flush_compress_batch (io, ctx, batch_gc, result);
  if (r == 0)
    r = r2;
  qcow2_conn_batch_put (conn, ctx);
  return r;
}

/* A stream of writes (a whole disk copied in) leaves its data in the
 * host's page cache, where the kernel's own writeback may not touch it
 * for many seconds; the final flush then waits for all of it at once.
 * Flushing each time this much has been written, from the writing thread
 * and outside the image lock, lets the device write while other threads
 * go on compressing.  It is only a flush of data already written: it
 * takes no part in the ordering of metadata updates.
 *
 * Only a write of a stream's size crosses the mark: small writes
 * scattered over the disk gain nothing by it, and a flush of every
 * 64 MiB of them, each waiting for the page cache's writeback, held 4 KiB
 * random writes at QD16 into a local file to about half the rate of the
 * file itself.
 */
#define EARLY_FLUSH_BYTES (UINT64_C (64) << 20)
#define EARLY_FLUSH_MIN_WRITE (UINT64_C (64) << 10)

static int
flush_data_early (struct qcow2_image *img, struct qcow2_io *io)
{
  bool running = false;
  int r;

  if (atomic_load_explicit (&img->counters.unflushed_bytes,
                           memory_order_relaxed) < EARLY_FLUSH_BYTES)
    return 0;
  if (!atomic_compare_exchange_strong (&img->counters.early_flush_running,
                                       &running, true))
    return 0;
  r = qcow2_flush_logged (img, io);
  atomic_store (&img->counters.early_flush_running, false);
  return r;
}

/* After a change: a FUA request makes it durable (a write in place into
 * clusters whose metadata is on disk only needs the device flushed), and
 * metadata that piled up is written back.
 */
static int
finish_change (struct qcow2_image *img, struct qcow2_io *io, bool fua,
               const struct change_result *result)
{
  int r = 0;

  if (fua)
    r = result->needs_writeback ? qcow2_writeback (img, io, true)
      : qcow2_flush_logged (img, io);
  else if (result->too_much_dirty)
    r = qcow2_writeback_if_idle (img, io);
  return r;
}

/* The whole clusters of [OFFSET, OFFSET+COUNT) (the disk's last one whole
 * once the range reaches the disk's end): *LO to *HI, empty if LO >= HI.
 */
static void
whole_clusters (const struct qcow2_image *img, uint64_t count,
                uint64_t offset, uint64_t *lo, uint64_t *hi)
{
  const uint64_t mask = img->header.cluster_size - 1;
  const uint64_t end = offset + count;

  *lo = (offset + mask) & ~mask;
  *hi = end == img->header.virtual_size ? (end + mask) & ~mask : end & ~mask;
}

/* After a zero or trim of an image with an external data file, every
 * whole cluster of the range reads as zeros without its bytes there:
 * they are given back (and with data_file_raw, must read as zeros in the
 * file too).  Parts of clusters were written with zeros, or kept.
 */
static int
give_back_data (struct qcow2_image *img, uint64_t count, uint64_t offset)
{
  uint64_t lo, hi;

  whole_clusters (img, count, offset, &lo, &hi);
  return lo < hi ? qcow2_discard_data (img, hi - lo, lo) : 0;
}

/* qcow2-detect-zeroes turned the whole clusters of zeros of a write into
 * zero clusters: in a data_file_raw image the file must read as zeros
 * there too.
 */
static int
give_back_zeros_written (struct qcow2_image *img, const uint8_t *buf,
                         uint64_t count, uint64_t offset)
{
  const uint64_t cluster_size = img->header.cluster_size;
  uint64_t lo, hi, pos;
  int r = 0;

  whole_clusters (img, count, offset, &lo, &hi);
  for (pos = lo; r == 0 && pos < hi; pos += cluster_size) {
    const uint8_t *p = buf + (pos - offset);
    uint64_t len = offset + count - pos < cluster_size
      ? offset + count - pos : cluster_size;

    if (qcow2_all_zero (p, len))
      r = qcow2_discard_data (img, len, pos);
  }
  return r;
}

int
qcow2_write (struct qcow2_conn *conn, struct qcow2_io *io,
             const void *buf, uint64_t count, uint64_t offset, bool fua)
{
  struct qcow2_image *img = qcow2_conn_image (conn);
  struct change_result result = { false, false };
  int r = check_writable (img, count, offset);

  if (r < 0 || count == 0)
    return r;
  qcow2_debug_if (img, QCOW2_DEBUG_MAP, "write 0x%" PRIx64 "+%" PRIu64 "%s%s",
                  offset, count, img->opts.compress ? " (compressing)" : "",
                  fua ? " FUA" : "");
  qcow2_bitmaps_mark (img, offset, count);
  if (img->opts.compress)
    r = write_compressed (conn, io, buf, count, offset, &result);
  else {
    /* An encrypted image's data is encrypted into a request's buffer,
     * on the connection's pool.
     */
    struct request *req = NULL;

    if (qcow2_image_encrypted (img) &&
        ((req = qcow2_conn_request_get (conn)) == NULL ||
         qcow2_conn_request_crypt_buf (conn, req) < 0)) {
      if (req)
        qcow2_conn_request_put (conn, req);
      return -ENOMEM;
    }
    r = change (img, io, conn, req, QCOW2_OP_WRITE, buf, count, offset,
                &result);
    if (req)
      qcow2_conn_request_put (conn, req);
  }
  if (r == 0 && qcow2_data_file_raw (img) &&
      img->opts.detect_zeroes != QCOW2_DETECT_ZEROES_OFF)
    r = give_back_zeros_written (img, buf, count, offset);
  if (r == 0)
    r = finish_change (img, io, fua, &result);
  if (r == 0 && count >= EARLY_FLUSH_MIN_WRITE)
    r = flush_data_early (img, io);
  return r;
}

/* A zero or a trim, once checked: no data of the client's to carry. */
static int
change_without_data (struct qcow2_image *img, struct qcow2_io *io,
                     enum qcow2_op op, uint64_t count, uint64_t offset,
                     bool fua)
{
  struct change_result result = { false, false };
  int r;

  qcow2_bitmaps_mark (img, offset, count);
  r = change (img, io, NULL, NULL, op, NULL, count, offset, &result);
  if (r == 0 && img->data_file)
    r = give_back_data (img, count, offset);
  if (r == 0)
    r = finish_change (img, io, fua, &result);
  return r;
}

/* Zeros written as data over [OFFSET, OFFSET+COUNT), a cluster's worth
 * at a time (the buffer of zeros is one cluster).
 */
static int
write_zeros (struct qcow2_image *img, struct qcow2_io *io, uint64_t count,
             uint64_t offset, struct change_result *result)
{
  const uint64_t cluster_size = img->header.cluster_size;
  int r = 0;

  while (r == 0 && count > 0) {
    uint64_t n = cluster_size - (offset & (cluster_size - 1));

    if (n > count)
      n = count;
    r = change (img, io, NULL, NULL, QCOW2_OP_WRITE, qcow2_scratch_zeros (img),
                n, offset, result);
    offset += n;
    count -= n;
  }
  return r;
}

/* qemu's block layer writes the zeros of an unsupported zero request as
 * data at most this much at a time (its bounce buffer).
 */
#define ZERO_FALLBACK_MAX (UINT64_C (16) << 20)

/* Are the zeros of the subcluster-aligned [START, END) written as data,
 * as qemu writes them when a cluster they cover in part at either end is
 * compressed (*AS_DATA)?
 */
static int
middle_as_data (struct qcow2_image *img, struct qcow2_io *io, uint64_t start,
                uint64_t end, bool *as_data)
{
  const uint64_t cmask = img->header.cluster_size - 1;
  bool head_c = false, tail_c = false, unused;
  int r = 0;

  if (start & cmask)
    r = qcow2_sub_edge (img, io, start, start + 1, &unused, &head_c);
  if (r == 0 && (end & cmask) && end < img->header.virtual_size &&
      (end & ~cmask) > start)
    r = qcow2_sub_edge (img, io, end - 1, end, &unused, &tail_c);
  *as_data = head_c || tail_c;
  return r;
}

/* Zero [EDGE[0], EDGE[1]), part of one subcluster: the whole subcluster
 * (WHOLE_SUB, qcow2_sub_edge's answer), or zeros written as data.
 */
static int
zero_edge (struct qcow2_image *img, struct qcow2_io *io,
           const uint64_t edge[2], bool whole_sub,
           struct change_result *result)
{
  const uint64_t sub = img->header.cluster_size / 32;
  const uint64_t s0 = edge[0] / sub * sub;
  uint64_t s1 = s0 + sub;

  if (!whole_sub)
    return write_zeros (img, io, edge[1] - edge[0], edge[0], result);
  if (s1 > img->header.virtual_size)
    s1 = img->header.virtual_size;
  return change (img, io, NULL, NULL, QCOW2_OP_ZERO, NULL, s1 - s0, s0,
                 result);
}

/* A zero of an image with extended L2 entries, once checked, as qemu
 * 7.2 does it (the reference for the allocation it leaves).  Its block
 * layer splits the request at the subcluster size (qcow2's zero
 * alignment): a subcluster covered only in part at either end is zeroed
 * whole if it is zero or unallocated and the rest of it reads as zeros
 * by the metadata, else the zeros are written as data (qcow2_sub_edge).
 * The subclusters between get their zero bits (paths/cluster.h), unless
 * a cluster they cover in part at either end is compressed: then zeros
 * are written as data over them, at most ZERO_FALLBACK_MAX at a time.
 * With FAST, what would write data fails with -ENOTSUP before anything
 * changed.
 */
static int
zero_subclusters (struct qcow2_image *img, struct qcow2_io *io,
                  uint64_t count, uint64_t offset, bool fast, bool fua)
{
  const uint64_t sub = img->header.cluster_size / 32;
  const uint64_t end = offset + count;
  uint64_t mid_start = offset, mid_end = end;
  struct change_result result = { false, false };
  uint64_t head[2] = { 0, 0 }, tail[2] = { 0, 0 };
  bool head_whole = false, tail_whole = false, compressed, as_data;
  int r = 0;

  if (offset % sub) {
    mid_start = (offset / sub + 1) * sub;
    if (mid_start > end)
      mid_start = end;
    head[0] = offset;
    head[1] = mid_start;
    r = qcow2_sub_edge (img, io, head[0], head[1], &head_whole, &compressed);
  }
  if (r == 0 && end % sub && end != img->header.virtual_size &&
      end > mid_start) {
    mid_end = end / sub * sub;
    if (mid_end < mid_start)
      mid_end = mid_start;
    tail[0] = mid_end;
    tail[1] = end;
    r = qcow2_sub_edge (img, io, tail[0], tail[1], &tail_whole, &compressed);
  }
  if (r == 0 && fast) {
    as_data = false;
    if (mid_start < mid_end)
      r = middle_as_data (img, io, mid_start, mid_end, &as_data);
    if (r == 0 && (as_data || (head[1] > head[0] && !head_whole) ||
                   (tail[1] > tail[0] && !tail_whole)))
      r = -ENOTSUP;
  }
  if (r < 0)
    return r;

  qcow2_bitmaps_mark (img, offset, count);
  /* The head first, the middle, the tail: the block layer's order. */
  if (head[1] > head[0])
    r = zero_edge (img, io, head, head_whole, &result);
  while (r == 0 && mid_start < mid_end) {
    r = middle_as_data (img, io, mid_start, mid_end, &as_data);
    if (r == 0 && as_data) {
      uint64_t n = mid_end - mid_start;

      if (n > ZERO_FALLBACK_MAX)
        n = ZERO_FALLBACK_MAX;
      r = write_zeros (img, io, n, mid_start, &result);
      mid_start += n;
      continue;
    }
    if (r == 0)
      r = change (img, io, NULL, NULL, QCOW2_OP_ZERO, NULL,
                  mid_end - mid_start, mid_start, &result);
    break;
  }
  if (r == 0 && tail[1] > tail[0])
    r = zero_edge (img, io, tail, tail_whole, &result);
  if (r == 0 && img->data_file)
    r = give_back_data (img, count, offset);
  if (r == 0)
    r = finish_change (img, io, fua, &result);
  return r;
}

int
qcow2_zero (struct qcow2_image *img, struct qcow2_io *io,
            uint64_t count, uint64_t offset, bool fast, bool fua)
{
  int r = check_writable (img, count, offset);

  if (r < 0 || count == 0)
    return r;
  if (img->header.extended_l2)
    return zero_subclusters (img, io, count, offset, fast, fua);
  if (fast) {
    bool needs;
    r = qcow2_zero_needs_writes (img, io, count, offset, &needs);
    if (r == 0 && needs)
      r = -ENOTSUP;
  }
  if (r < 0)
    return r;
  return change_without_data (img, io, QCOW2_OP_ZERO, count, offset, fua);
}

int
qcow2_trim (struct qcow2_image *img, struct qcow2_io *io,
            uint64_t count, uint64_t offset, bool fua)
{
  int r = check_writable (img, count, offset);

  if (r < 0 || count == 0)
    return r;
  return change_without_data (img, io, QCOW2_OP_TRIM, count, offset, fua);
}

int
qcow2_flush (struct qcow2_image *img, struct qcow2_io *io)
{
  bool cleared;

  if (!img->opts.writable)
    return 0;
  return qcow2_bitmaps_store (img, io, QCOW2_STORE_IN_USE, &cleared);
}

int
qcow2_finish (struct qcow2_image *img, struct qcow2_io *io)
{
  bool cleared;
  int r;

  if (!img->opts.writable)
    return 0;
  r = qcow2_bitmaps_store (img, io, QCOW2_STORE_CLEAN, &cleared);
  if (r == 0 && img->opts.lazy_refcounts)
    r = qcow2_writeback_clean (img, io);
  if (cleared || img->opts.lazy_refcounts) {
    /* Consistent on disk again: a later write marks the bitmaps in use
     * and sets the dirty bit first.
     */
    qcow2_rwlock_wrlock (&img->lock);
    qcow2_first_change_arm (img);
    qcow2_rwlock_unlock (&img->lock);
  }
  return r;
}
