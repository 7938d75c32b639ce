/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: compressing whole clusters on the image's compressor
 * threads, and placing the results (see qcow2-compress.h).
 */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2-compress.h"
#include "qcow2-alloc.h"
#include "qcow2-cluster.h"
#include "qcow2-codec.h"
#include "qcow2-dedup.h"
#include "qcow2-endian.h"
#include "qcow2-entries.h"
#include "qcow2-hostio.h"
#include "qcow2-map.h"
#include "qcow2-pool.h"
#include "qcow2-writeback.h"

/* Output per batch: enough to keep two threads busy, small enough that
 * many concurrent requests stay cheap in memory.
 */
#define BATCH_BYTES (UINT64_C (8) << 20)
#define BATCH_MAX_CLUSTERS 64

size_t
qcow2_compress_batch_max (const struct qcow2_image *img)
{
  uint64_t n = BATCH_BYTES / img->header.cluster_size;

  if (n > BATCH_MAX_CLUSTERS)
    n = BATCH_MAX_CLUSTERS;
  return n ? n : 1;
}

static bool
all_zero (const uint8_t *p, size_t len)
{
  /* The first byte, then the buffer against itself shifted by one. */
  return len == 0 || (p[0] == 0 && memcmp (p, p + 1, len - 1) == 0);
}

/* The compressor threads.
 *
 * Every compression job of an image runs on one of the workers of the
 * image's own pool, at most one per online CPU, each with a compression
 * context of its own.  A worker that has jobs queued keeps running them,
 * so it stays on its CPU and its context's tables (most of a megabyte
 * for zstd) stay in that CPU's cache; the thread that received the write
 * hands its whole batch over and sleeps once, rather than every serving
 * thread waking a worker for each cluster and leaving CPUs idle while a
 * woken thread waits for one.
 *
 * The pool starts with the image's first compressing write and stops
 * when the image is closed.
 */
struct compressor {
  struct qcow2_image *img;
  struct qcow2_encoder *enc;
  uint8_t *scratch;             /* the zero padded last cluster */
  char err[256];
};

static void
compressor_free (void *state)
{
  struct compressor *c = state;

  if (c == NULL)
    return;
  qcow2_encoder_free (c->enc);
  free (c->scratch);
  free (c);
}

static void *
compressor_new (void *image)
{
  struct qcow2_image *img = image;
  struct compressor *c = calloc (1, sizeof *c);

  if (c == NULL)
    return NULL;
  c->img = img;
  c->enc = qcow2_encoder_new ();
  c->scratch = malloc (img->header.cluster_size);
  if (c->enc == NULL || c->scratch == NULL) {
    compressor_free (c);
    return NULL;
  }
  return c;
}

static void
compress_job (void *arg, size_t index, void *state)
{
  struct compress_ctx *ctx = arg;
  struct compressor *c = state;
  const uint32_t cluster_size = c->img->header.cluster_size;
  const uint8_t *in = ctx->src[index];
  int64_t len;
  int expected = 0;

  if (ctx->src_len[index] < cluster_size) {
    /* The disk's last cluster: qemu compresses it zero padded. */
    memcpy (c->scratch, in, ctx->src_len[index]);
    memset (c->scratch + ctx->src_len[index], 0,
            cluster_size - ctx->src_len[index]);
    in = c->scratch;
  }
  if (all_zero (in, cluster_size)) {
    ctx->result[index] = QCOW2_COMPRESS_ALL_ZERO;
    return;
  }
  if (ctx->dedup[index]) {
    ctx->result[index] = QCOW2_COMPRESS_DUPLICATE;
    return;
  }
  /* qemu keeps a compressed cluster only if it saves at least a byte. */
  len = qcow2_encode_cluster (c->enc, c->img->header.compression_type,
                              c->img->opts.compression_level,
                              in, cluster_size,
                              ctx->out + index * (size_t) cluster_size,
                              cluster_size - 1, c->err, sizeof c->err);
  if (len < 0 && atomic_compare_exchange_strong (&ctx->failed, &expected, 1))
    snprintf (ctx->errmsg, sizeof ctx->errmsg, "%s", c->err);
  ctx->result[index] = len < 0 ? 0 : len;
}

int
qcow2_compress_run (struct compress_ctx *ctx)
{
  struct qcow2_image *img = ctx->img;
  struct qcow2_batch batch = {
    .run = compress_job, .arg = ctx, .count = ctx->count,
    .finished = &ctx->finished,
  };
  struct qcow2_pool *pool;

  if (ctx->count == 0)
    return 0;
  atomic_store (&ctx->failed, 0);

  pthread_mutex_lock (&img->compressors_lock);
  if (img->compressors == NULL) {
    unsigned n = img->opts.compress_threads, cpus = qcow2_online_cpus ();

    if (n == 0)
      n = 1;
    if (n > cpus)
      n = cpus;
    img->compressors = qcow2_pool_new (n, compressor_new, compressor_free,
                                       img);
  }
  pool = img->compressors;
  pthread_mutex_unlock (&img->compressors_lock);
  if (pool == NULL) {
    qcow2_error (img, "cannot start the compressor threads");
    return -EAGAIN;
  }

  qcow2_pool_submit (pool, &batch);
  qcow2_pool_wait (pool, &batch, NULL);
  if (atomic_load (&ctx->failed)) {
    qcow2_error (img, "%s", ctx->errmsg);
    return -EIO;
  }
  return 0;
}

void
qcow2_compress_free (struct qcow2_image *img)
{
  qcow2_pool_free (img->compressors);
  img->compressors = NULL;
  qcow2_encoder_free (img->wencoder);
  img->wencoder = NULL;
}

/* ------------------------------------------------ placing the results */

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

int
qcow2_compress_place (struct qcow2_image *img, struct qcow2_io *io,
                      struct compress_ctx *ctx, uint64_t first_gc,
                      size_t *step)
{
  int r;

  /* Compressed clusters first, plain ones after: a plain cluster placed
   * in between would take the host cluster that the packed data was to
   * run on into, and leave the rest of the current one unused.  Steps
   * [0, count) are the first pass, [count, 2 * count) the second.
   */
  for (; *step < 2 * ctx->count; ++*step) {
    size_t i = *step % ctx->count;
    bool plain_pass = *step >= ctx->count;

    if ((ctx->result[i] == 0) == plain_pass) {
      r = place_cluster (img, io, ctx, i, first_gc + i);
      if (r < 0)
        return r;
    }
  }
  return 0;
}
