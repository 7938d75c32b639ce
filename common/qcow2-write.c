/* qcow2zstd engine: writes, zeroes and trims.
 *
 * Every change runs with the image lock held exclusively; the metadata it
 * changes reaches the disk in the order qcow2-writeback.h describes.
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2-internal.h"
#include "qcow2-cluster.h"
#include "qcow2-codec.h"
#include "qcow2-endian.h"

static int
check_writable (struct qcow2_image *img, uint64_t count, uint64_t offset)
{
  if (!img->opts.writable) {
    qcow2_error (img, "the image was opened read-only");
    return -EROFS;
  }
  if (offset > img->header.virtual_size ||
      count > img->header.virtual_size - offset) {
    qcow2_error (img, "request of %" PRIu64 " bytes at %" PRIu64
                 " is beyond the virtual size %" PRIu64,
                 count, offset, img->header.virtual_size);
    return -EINVAL;
  }
  return 0;
}


/* Compress a cluster whose shared copy turned out to be gone or different
 * (under the lock: rare).  Returns what compress_job would have stored in
 * result: the length in OUT, or 0 to store it plain.
 */
static int64_t
compress_locked (struct qcow2_image *img, const uint8_t *src,
                 uint32_t src_len, uint8_t *out)
{
  const uint32_t cluster_size = img->header.cluster_size;
  const uint8_t *in = src;
  char err[256];
  int64_t len;

  if (img->wencoder == NULL) {
    img->wencoder = qcow2_encoder_new ();
    if (img->wencoder == NULL) {
      qcow2_error (img, "out of memory for compressing a write");
      return -ENOMEM;
    }
  }
  if (src_len < cluster_size) {
    memcpy (img->wbuf, src, src_len);
    memset (img->wbuf + src_len, 0, cluster_size - src_len);
    in = img->wbuf;
  }
  len = qcow2_encode_cluster (img->wencoder, img->header.compression_type,
                              img->opts.compression_level, in, cluster_size,
                              out, cluster_size - 1, err, sizeof err);
  if (len < 0) {
    qcow2_error (img, "%s", err);
    return -EIO;
  }
  return len;
}

/* Pack LEN bytes of compressed data of cluster I of CTX (guest cluster
 * GC), and set *NEW_ENTRY to describe them.  If MAY_SHARE, first look
 * for a copy of the same data that another write placed while this one
 * was being compressed (or that came earlier in the same batch), and
 * share it instead.
 */
static int
store_compressed (struct qcow2_image *img, struct qcow2_io *io,
                  struct compress_ctx *ctx, size_t i, uint64_t gc,
                  int64_t len, bool may_share, uint64_t *new_entry)
{
  const bool whole = ctx->src_len[i] == img->header.cluster_size;
  uint64_t copy, host;
  int r;

  if (may_share && whole &&
      (copy = qcow2_dedup_find (img, ctx->hash[i])) != 0) {
    r = qcow2_dedup_share (img, io, gc, copy, ctx->src[i], ctx->src_len[i]);
    if (r < 0)
      return r;
    if (r == 1) {
      *new_entry = copy;
      return 0;
    }
  }
  r = qcow2_pack_compressed (img, io,
                       ctx->out + i * (size_t) img->header.cluster_size,
                       len, &host);
  if (r < 0)
    return r;
  *new_entry = L2E_COMPRESSED | host |
    ((((host + len - 1) >> 9) - (host >> 9)) << img->csize_shift);
  if (whole)
    qcow2_dedup_remember (img, ctx->hash[i], *new_entry);
  return 0;
}

/* Store the compression result of cluster I of CTX, guest cluster GC:
 * its compressed data, its shared copy, its plain data or nothing (all
 * zero).
 */
static int
place_cluster (struct qcow2_image *img, struct qcow2_io *io,
               struct compress_ctx *ctx, size_t i, uint64_t gc)
{
  uint64_t l1_index = gc >> img->header.l2_bits;
  uint64_t index = gc & ((UINT64_C (1) << img->header.l2_bits) - 1);
  const uint8_t *src = ctx->src[i];
  const uint32_t src_len = ctx->src_len[i];
  uint8_t *cdata = ctx->out + i * (size_t) img->header.cluster_size;
  int64_t result = ctx->result[i];
  struct meta_table *t;
  struct cluster_map map;
  uint64_t entry, new_entry;
  int r;

  r = qcow2_l2_for_write (img, io, l1_index, true, &t);
  if (r < 0)
    return r;
  entry = be64 (t->data + index * 8);
  r = qcow2_classify (img, gc, entry, &map);
  if (r < 0)
    return r;
  if (result == QCOW2_COMPRESS_DUPLICATE) {
    r = qcow2_dedup_share (img, io, gc, ctx->dedup[i], src, src_len);
    if (r < 0)
      return r;
    qcow2_debug_if (img, QCOW2_DEBUG_MAP, "guest cluster %" PRIu64 ": %s "
                    "compressed entry 0x%" PRIx64, gc,
                    r ? "shares" : "cannot share", ctx->dedup[i]);
    if (r == 0) {
      result = compress_locked (img, src, src_len, cdata);
      if (result < 0)
        return result;
    }
  }
  if (result == 0)
    return qcow2_write_cluster (img, io, t, index, gc, src, 0, src_len);

  if (result == QCOW2_COMPRESS_ALL_ZERO) {
    /* What already reads as zeros stays as it is (an unallocated cluster
     * of a new image, as qemu-img convert leaves it).
     */
    if (qcow2_reads_as_zeros (img, &map))
      return 0;
    if (img->header.version < 3 && img->backing)
      return qcow2_write_cluster (img, io, t, index, gc, src, 0, src_len);
    new_entry = img->header.version >= 3 ? L2E_ZERO : 0;
  }
  else if (result == QCOW2_COMPRESS_DUPLICATE)
    new_entry = ctx->dedup[i];
  else {
    r = store_compressed (img, io, ctx, i, gc, result,
                          ctx->result[i] != QCOW2_COMPRESS_DUPLICATE,
                          &new_entry);
    if (r < 0)
      return r;
  }
  put_be64 (t->data + index * 8, new_entry);
  t->dirty = true;
  return qcow2_release (img, &map);
}

/* Compress the batch outside the lock, then place it under the lock. */
static int
flush_compress_batch (struct qcow2_io *io, struct compress_ctx *ctx,
                      uint64_t first_gc)
{
  struct qcow2_image *img = ctx->img;
  size_t i;
  int pass, r;

  if (ctx->count == 0)
    return 0;
  r = qcow2_compress_run (ctx);
  if (r < 0)
    return r;
  pthread_rwlock_wrlock (&img->lock);
  /* Compressed clusters first, plain ones after: a plain cluster placed
   * in between would take the host cluster that the packed data was to
   * run on into, and leave the rest of the current one unused.
   */
  for (pass = 0; pass < 2; ++pass)
    for (i = 0; i < ctx->count && r == 0; ++i)
      if ((ctx->result[i] == 0) == (pass == 1))
        r = place_cluster (img, io, ctx, i, first_gc + i);
  if (r == 0 && qcow2_too_much_dirty (img))
    r = qcow2_writeback (img, io, false);
  pthread_rwlock_unlock (&img->lock);
  ctx->count = 0;
  return r;
}

/* A write with compression on: whole clusters (and the disk's last
 * cluster when the write reaches the end of the disk) are compressed;
 * the parts of clusters at either end take the plain path.
 */
static int
write_compressed (struct qcow2_conn *conn, struct qcow2_io *io,
                  const uint8_t *buf, uint64_t count, uint64_t offset)
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
        ctx->dedup[ctx->count] = qcow2_dedup_find (img,
                                                   ctx->hash[ctx->count]);
      }
      ctx->count++;
      pos = cend;
      if (ctx->count == ctx->capacity)
        r = flush_compress_batch (io, ctx, batch_gc);
      continue;
    }
    r = flush_compress_batch (io, ctx, batch_gc);
    if (r < 0)
      break;
    pthread_rwlock_wrlock (&img->lock);
    r = qcow2_change_range (img, io, QCOW2_OP_WRITE, buf + (pos - offset),
                            hi - pos, pos);
    pthread_rwlock_unlock (&img->lock);
    pos = hi;
  }
  r2 = flush_compress_batch (io, ctx, batch_gc);
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
 */
#define EARLY_FLUSH_BYTES (UINT64_C (64) << 20)

static int
flush_data_early (struct qcow2_image *img, struct qcow2_io *io)
{
  bool running = false;
  int r;

  if (atomic_load_explicit (&img->unflushed_bytes, memory_order_relaxed)
      < EARLY_FLUSH_BYTES)
    return 0;
  if (!atomic_compare_exchange_strong (&img->early_flush_running,
                                       &running, true))
    return 0;
  r = qcow2_flush_logged (img, io);
  atomic_store (&img->early_flush_running, false);
  return r;
}

int
qcow2_write (struct qcow2_conn *conn, struct qcow2_io *io,
             const void *buf, uint64_t count, uint64_t offset, bool fua)
{
  struct qcow2_image *img = qcow2_conn_image (conn);
  int r = check_writable (img, count, offset);

  if (r < 0 || count == 0)
    return r;
  qcow2_debug_if (img, QCOW2_DEBUG_MAP, "write 0x%" PRIx64 "+%" PRIu64 "%s%s",
                  offset, count, img->opts.compress ? " (compressing)" : "",
                  fua ? " FUA" : "");
  if (img->opts.compress) {
    r = write_compressed (conn, io, buf, count, offset);
    if (r == 0 && fua)
      r = qcow2_flush (img, io);
  }
  else {
    pthread_rwlock_wrlock (&img->lock);
    r = qcow2_change_range (img, io, QCOW2_OP_WRITE, buf, count, offset);
    if (r == 0 && fua)
      r = qcow2_writeback (img, io, true);
    pthread_rwlock_unlock (&img->lock);
  }
  if (r == 0)
    r = flush_data_early (img, io);
  return r;
}

int
qcow2_zero (struct qcow2_image *img, struct qcow2_io *io,
            uint64_t count, uint64_t offset, bool fast, bool fua)
{
  int r = check_writable (img, count, offset);

  if (r < 0 || count == 0)
    return r;
  pthread_rwlock_wrlock (&img->lock);
  if (fast) {
    bool needs;
    r = qcow2_zero_needs_writes (img, io, count, offset, &needs);
    if (r == 0 && needs)
      r = -ENOTSUP;
  }
  if (r == 0)
    r = qcow2_change_range (img, io, QCOW2_OP_ZERO, NULL, count, offset);
  if (r == 0 && fua)
    r = qcow2_writeback (img, io, true);
  pthread_rwlock_unlock (&img->lock);
  return r;
}

int
qcow2_trim (struct qcow2_image *img, struct qcow2_io *io,
            uint64_t count, uint64_t offset, bool fua)
{
  int r = check_writable (img, count, offset);

  if (r < 0 || count == 0)
    return r;
  pthread_rwlock_wrlock (&img->lock);
  r = qcow2_change_range (img, io, QCOW2_OP_TRIM, NULL, count, offset);
  if (r == 0 && fua)
    r = qcow2_writeback (img, io, true);
  pthread_rwlock_unlock (&img->lock);
  return r;
}

