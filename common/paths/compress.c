/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: compressing whole clusters on the image's compressor
 * threads, and placing the results (see paths/compress.h).
 */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "paths/compress.h"
#include "paths/run.h"
#include "base/lockorder.h"
#include "base/inflight.h"
#include "base/pool.h"
#include "base/zeros.h"
#include "format/codec.h"
#include "format/entries.h"
#include "meta/log.h"
#include "paths/cluster.h"
#include "paths/commit.h"
#include "paths/dedup.h"
#include "paths/scratch.h"

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
/* The image's compressor threads (img->compressors). */
struct qcow2_compressors {
  struct qcow2_mutex lock;      /* a leaf: the start of the pool */
  struct qcow2_pool *pool;      /* started by the first compressing write */
};

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
  if (qcow2_all_zero (in, cluster_size)) {
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

  qcow2_mutex_lock (&img->compressors->lock);
  if (img->compressors->pool == NULL) {
    unsigned n = img->opts.compress_threads, cpus = qcow2_online_cpus ();

    if (n == 0)
      n = 1;
    if (n > cpus)
      n = cpus;
    img->compressors->pool = qcow2_pool_new (n, compressor_new,
                                             compressor_free, img);
  }
  pool = img->compressors->pool;
  qcow2_mutex_unlock (&img->compressors->lock);
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
  /* Ready to place, from the start. */
  memset (ctx->placed, 0, ctx->count);
  memset (ctx->entry, 0, ctx->count * sizeof *ctx->entry);
  ctx->verified = false;
  return 0;
}

int
qcow2_compress_open (struct qcow2_image *img)
{
  img->compressors = calloc (1, sizeof *img->compressors);
  if (img->compressors == NULL) {
    qcow2_error (img, "out of memory for the compressor threads");
    return -ENOMEM;
  }
  qcow2_mutex_init (&img->compressors->lock, QCOW2_RANK_LEAF,
                    "the start of the compressor threads");
  return 0;
}

void
qcow2_compress_free (struct qcow2_image *img)
{
  if (img->compressors == NULL)
    return;
  qcow2_pool_free (img->compressors->pool);
  qcow2_mutex_destroy (&img->compressors->lock);
  free (img->compressors);
  img->compressors = NULL;
}

/* ------------------------------------------------ placing the results */

/* Why placing stopped before the end of a commit: what the caller of
 * commit_run does before it runs it again.
 */
enum place_stop {
  PLACE_ON,
  PLACE_COMPRESS,       /* compress the cluster: its copy cannot be shared */
  PLACE_VERIFY,         /* read back the copies DUPLICATE clusters share */
  PLACE_WAIT,           /* wait for the data of a copy being written */
};

/* After this many read-backs of the copies, releases applied in between
 * mean a copy is not shared (the writebacks that apply them would
 * otherwise hold the batch back for ever).
 */
#define MAX_VERIFY_ROUNDS 3

/* The placing of one batch, the commit policy's opaque. */
struct placing {
  struct compress_ctx *ctx;
  struct write_scratch *ws;
  size_t base;                  /* the batch index of the commit's first */
  size_t order[QCOW2_COMMIT_MAX];
  unsigned verify_rounds;
  enum place_stop stop;
  size_t stop_at;               /* the batch index it stopped at */
  uint64_t ticket;              /* PLACE_WAIT: for qcow2_inflight_wait_claim */
};

/* Compress cluster I of CTX on this thread, with no lock held: it was to
 * share a copy that turned out to be gone or different.
 */
static int
compress_here (struct qcow2_image *img, struct compress_ctx *ctx,
               struct write_scratch *ws, size_t i)
{
  const uint32_t cluster_size = img->header.cluster_size;
  struct qcow2_encoder *enc = qcow2_scratch_encoder (img, ws);
  const uint8_t *in = ctx->src[i];
  char err[256];
  int64_t len;

  if (enc == NULL)
    return -ENOMEM;
  if (ctx->src_len[i] < cluster_size) {
    memcpy (ws->cow[0], in, ctx->src_len[i]);
    memset (ws->cow[0] + ctx->src_len[i], 0,
            cluster_size - ctx->src_len[i]);
    in = ws->cow[0];
  }
  len = qcow2_encode_cluster (enc, img->header.compression_type,
                              img->opts.compression_level, in, cluster_size,
                              ctx->out + i * (size_t) cluster_size,
                              cluster_size - 1, err, sizeof err);
  if (len < 0) {
    qcow2_error (img, "%s", err);
    return -EIO;
  }
  ctx->result[i] = len;
  return 0;
}

/* Read back the copies that the DUPLICATE clusters of CTX not placed yet
 * are to share, with no lock held, and compress those whose copy holds
 * other data.  The placing checks under the lock that no release was
 * applied since (verified_generation).
 */
static int
verify_copies (struct qcow2_image *img, struct qcow2_io *io,
               struct compress_ctx *ctx, struct write_scratch *ws,
               uint64_t first_gc)
{
  size_t i;
  int r;

  ctx->verified_generation = atomic_load (&img->free_generation);
  for (i = 0; i < ctx->count; ++i) {
    if (ctx->placed[i] || ctx->result[i] != QCOW2_COMPRESS_DUPLICATE)
      continue;
    r = qcow2_dedup_verify (img, io, ws, first_gc + i, ctx->dedup[i],
                            ctx->src[i], ctx->src_len[i]);
    if (r < 0)
      return r;
    if (r == 0) {
      qcow2_debug_if (img, QCOW2_DEBUG_MAP, "guest cluster %" PRIu64
                      ": cannot share compressed entry 0x%" PRIx64,
                      first_gc + i, ctx->dedup[i]);
      ctx->dedup[i] = QCOW2_DEDUP_NO_SHARE;
      r = compress_here (img, ctx, ws, i);
      if (r < 0)
        return r;
    }
  }
  return 0;
}

/* Has cluster J of CTX the same data as an earlier cluster of the batch
 * that was placed with ENTRY?
 */
static bool
batch_has_copy (const struct compress_ctx *ctx, size_t j, uint64_t entry)
{
  size_t i;

  for (i = j; i-- > 0; )
    if (ctx->entry[i] == entry && ctx->hash[i] == ctx->hash[j] &&
        ctx->src_len[i] == ctx->src_len[j] &&
        memcmp (ctx->src[i], ctx->src[j], ctx->src_len[j]) == 0)
      return true;
  return false;
}

static enum commit_step
stop (struct placing *p, size_t b, enum place_stop why)
{
  p->stop = why;
  p->stop_at = b;
  return COMMIT_STEP_STOP;
}

static enum commit_step
fail (struct commit *commit, int r)
{
  commit->error = r;
  return COMMIT_STEP_FAILED;
}

/* A copy of the data verified and referenced under this lock: shared at
 * once.
 */
static enum commit_step
share_verified (struct commit *commit, size_t i, struct placing *p, size_t b)
{
  struct qcow2_image *img = commit->img;
  struct compress_ctx *ctx = p->ctx;
  enum commit_step step;
  int r = 0;

  if (atomic_load (&img->free_generation) != ctx->verified_generation &&
      p->verify_rounds < MAX_VERIFY_ROUNDS)
    return stop (p, b, PLACE_VERIFY);   /* what was read back may be gone */
  if (atomic_load (&img->free_generation) == ctx->verified_generation)
    r = qcow2_dedup_can_reference (img, commit->io, ctx->dedup[b]);
  if (r < 0)
    return fail (commit, r);
  qcow2_debug_if (img, QCOW2_DEBUG_MAP, "guest cluster %" PRIu64 ": %s "
                  "compressed entry 0x%" PRIx64, commit->first + i,
                  r ? "shares" : "cannot share", ctx->dedup[b]);
  if (r == 0) {
    /* The copy filled up (or went) since the batch found it.  Writes in
     * flight with the same data each find it full at once; compressed,
     * this cluster looks in the table again when placed, and shares the
     * copy the first of them made, as a serial write would.
     */
    ctx->dedup[b] = p->verify_rounds < MAX_VERIFY_ROUNDS
      ? 0 : QCOW2_DEDUP_NO_SHARE;
    ctx->result[b] = QCOW2_COMPRESS_PENDING;
    return stop (p, b, PLACE_COMPRESS);
  }
  /* The reference is taken once nothing else can fail before the entry
   * is set.
   */
  step = commit_prepare (commit, i);
  if (step != COMMIT_STEP_NEXT)
    return step;
  r = qcow2_dedup_reference (img, commit->io, ctx->dedup[b]);
  if (r < 0)
    return fail (commit, r);
  ctx->entry[b] = ctx->dedup[b];
  return commit_set_entry (commit, i, ctx->dedup[b]);
}

/* Compressed data of RESULT bytes: a copy of the same data placed since
 * the batch looked (by the batch itself, or by another write) is shared
 * instead, else it is packed.
 */
static enum commit_step
place_compressed (struct commit *commit, size_t i, struct placing *p,
                  size_t b, int64_t result)
{
  struct qcow2_image *img = commit->img;
  struct compress_ctx *ctx = p->ctx;
  const bool whole = ctx->src_len[b] == img->header.cluster_size;
  enum commit_step step;
  uint64_t entry;
  bool pending;
  int r;

  if (whole && ctx->dedup[b] != QCOW2_DEDUP_NO_SHARE &&
      (entry = qcow2_dedup_find (img, ctx->hash[b], &pending)) != 0) {
    r = qcow2_dedup_can_reference (img, commit->io, entry);
    if (r < 0)
      return fail (commit, r);
    if (r == 1 && batch_has_copy (ctx, b, entry)) {
      step = commit_prepare (commit, i);
      if (step != COMMIT_STEP_NEXT)
        return step;
      r = qcow2_dedup_reference (img, commit->io, entry);
      if (r < 0)
        return fail (commit, r);
      ctx->entry[b] = entry;
      return commit_link_entry (commit, i, entry);
    }
    if (r == 1 && pending) {
      /* Its data is still being written: wait for that write. */
      qcow2_inflight_claimed (&img->inflight, 0, 0, &p->ticket);
      return stop (p, b, PLACE_WAIT);
    }
    if (r == 1) {
      ctx->result[b] = QCOW2_COMPRESS_DUPLICATE;
      ctx->dedup[b] = entry;
      return stop (p, b, PLACE_VERIFY);
    }
  }
  step = commit_pack (commit, i, result);
  if (step == COMMIT_STEP_NEXT) {
    ctx->entry[b] = commit->c[i].entry;
    if (whole)
      qcow2_dedup_remember (img, ctx->hash[b], ctx->entry[b], true);
  }
  return step;
}

static enum commit_step
place_decide (struct commit *commit, size_t i, void *opaque)
{
  struct placing *p = opaque;
  struct compress_ctx *ctx = p->ctx;
  struct qcow2_image *img = commit->img;
  const struct cluster_map *old = &commit->c[i].old;
  const size_t b = p->base + i;
  int64_t result = ctx->result[b];
  enum commit_step step;

  if (ctx->placed[b])
    return commit_keep (commit, i);
  if (result == QCOW2_COMPRESS_PENDING)
    return stop (p, b, PLACE_COMPRESS);
  if (result == QCOW2_COMPRESS_DUPLICATE)
    step = share_verified (commit, i, p, b);
  else if (result == QCOW2_COMPRESS_ALL_ZERO &&
           qcow2_reads_as_zeros (img, old))
    /* What already reads as zeros stays as it is (an unallocated cluster
     * of a new image, as qemu-img convert leaves it).
     */
    step = commit_keep (commit, i);
  else if (result == QCOW2_COMPRESS_ALL_ZERO &&
           (img->header.version >= 3 || img->backing == NULL))
    step = commit_set_entry (commit, i,
                             img->header.version >= 3 ? L2E_ZERO : 0);
  else if (result == QCOW2_COMPRESS_ALL_ZERO || result == 0) {
    /* Stored plain (v2 over a backing file writes its zeros so). */
    if (result != 0)
      ctx->result[b] = 0;
    step = old->kind == CLUSTER_NORMAL && (old->l2_entry & L2E_COPIED)
      ? commit_in_place (commit, i) : commit_new_cluster (commit, i);
  }
  else
    step = place_compressed (commit, i, p, b, result);
  if (step == COMMIT_STEP_NEXT)
    ctx->placed[b] = 1;
  return step;
}

/* The data of the clusters this commit placed, with no lock held: the
 * packed bytes (those that follow each other on the host in one write,
 * moved together in CTX->out), and the plain clusters.
 */
static int
place_write (struct commit *commit, void *opaque)
{
  struct placing *p = opaque;
  struct compress_ctx *ctx = p->ctx;
  struct qcow2_image *img = commit->img;
  const uint32_t cluster_size = img->header.cluster_size;
  struct write_target target = { .img = img, .io = commit->io };
  struct data_run plain = qcow2_run_new (img->opts.request_size,
                                         qcow2_write_mover, &target);
  struct data_run packed = qcow2_run_new (UINT64_MAX, qcow2_write_mover,
                                          &target);
  size_t i;
  int r = 0;

  for (i = 0; i < commit->n && r == 0; ++i) {
    const struct commit_cluster *c = &commit->c[i];
    const size_t b = p->base + i;
    uint8_t *data = ctx->out + b * (size_t) cluster_size;
    uint8_t *src = (uint8_t *) ctx->src[b];     /* the mover only reads */

    switch (c->action) {
    case COMMIT_LINK:
      if (c->host == 0)
        break;                  /* a copy shared: no data of its own */
      /* The packed clusters come in the order of their host offsets and
       * of their places in CTX->out, so a cluster's bytes only ever move
       * down over those of clusters already moved.
       */
      if (packed.len && packed.host + packed.len == c->host) {
        memmove (packed.buf + packed.len, data, ctx->result[b]);
        packed.len += ctx->result[b];
        break;
      }
      r = qcow2_run_flush (&packed);
      packed.buf = data;
      packed.host = c->host;
      packed.len = ctx->result[b];
      break;
    case COMMIT_IN_PLACE:
      r = qcow2_run_add (&plain, src, c->old.host_offset, ctx->src_len[b]);
      break;
    case COMMIT_NEW:
      if (ctx->src_len[b] < cluster_size) {
        /* The disk's last cluster, zero padded. */
        memcpy (p->ws->cow[0], src, ctx->src_len[b]);
        memset (p->ws->cow[0] + ctx->src_len[b], 0,
                cluster_size - ctx->src_len[b]);
        src = p->ws->cow[0];
      }
      r = qcow2_run_add (&plain, src, c->host, cluster_size);
      break;
    default:
      break;
    }
  }
  if (r == 0)
    r = qcow2_run_flush (&packed);
  if (r == 0)
    r = qcow2_run_flush (&plain);
  return r;
}

/* With the image lock held exclusively: the packed data of cluster I is
 * now another write's to share (or, not written, nobody's).
 */
static void
place_linked (struct commit *commit, size_t i, bool linked, void *opaque)
{
  struct placing *p = opaque;
  struct compress_ctx *ctx = p->ctx;
  const size_t b = p->base + i;
  const struct commit_cluster *c = &commit->c[i];

  if (!linked) {
    ctx->entry[b] = 0;
    ctx->placed[b] = 0;
  }
  if (c->action != COMMIT_LINK || c->host == 0 ||
      ctx->src_len[b] != commit->img->header.cluster_size)
    return;
  if (linked)
    qcow2_dedup_written (commit->img, ctx->hash[b], c->entry);
  else
    qcow2_dedup_forget (commit->img, ctx->hash[b], c->entry);
}

/* The decisions of one commit: the compressed clusters first, the plain
 * ones after, so that a plain cluster does not take the host cluster
 * that the packed data was to run on into and leave the rest of the
 * current one unused.
 */
static void
order_round (struct placing *p, size_t n)
{
  size_t i, k = 0;
  int pass;

  for (pass = 0; pass < 2; ++pass)
    for (i = 0; i < n; ++i)
      if ((p->ctx->result[p->base + i] == 0) == (pass == 1))
        p->order[k++] = i;
}

enum change_outcome
qcow2_compress_place (struct qcow2_image *img, struct qcow2_io *io,
                      struct compress_ctx *ctx, struct write_scratch *ws,
                      uint64_t first_gc, struct change_result *result,
                      int *error)
{
  const uint64_t l2_mask = (UINT64_C (1) << img->header.l2_bits) - 1;
  struct placing p = { .ctx = ctx, .ws = ws };
  const struct commit_policy policy = {
    .decide = place_decide, .write = place_write, .linked = place_linked,
    .order = p.order, .exclusive = true,
  };
  int r = 0;

  /* The metadata changes, and a FUA request writes it back. */
  result->needs_writeback = true;
  if (!ctx->verified) {
    r = verify_copies (img, io, ctx, ws, first_gc);
    if (r < 0)
      goto failed;
    ctx->verified = true;
  }
  /* A commit per L2 table the batch touches, each run until all its
   * clusters are placed.
   */
  while (p.base < ctx->count) {
    uint64_t gc = first_gc + p.base;
    size_t n = ctx->count - p.base, i;
    struct commit commit;
    bool all = true;

    if (n > (l2_mask - (gc & l2_mask)) + 1)
      n = (l2_mask - (gc & l2_mask)) + 1;
    for (i = 0; i < n; ++i)
      all &= ctx->placed[p.base + i];
    if (all) {
      p.base += n;
      continue;
    }
    order_round (&p, n);
    p.stop = PLACE_ON;
    commit_init (&commit, img, io, gc, n, ws->piece, ws->entries,
                 ws->bitmaps, ws->l2buf);
    switch (commit_run (&commit, &policy, &p)) {
    case COMMIT_OK:
      break;
    case COMMIT_NEEDS_ROOM:
      result->too_much_dirty |= commit.too_much_dirty;
      return CHANGE_NEEDS_ROOM;
    case COMMIT_FAILED:
      r = commit.error;
      goto failed;
    case COMMIT_STOPPED:
      switch (p.stop) {
      case PLACE_ON:
        break;
      case PLACE_COMPRESS:
        r = compress_here (img, ctx, ws, p.stop_at);
        break;
      case PLACE_VERIFY:
        p.verify_rounds++;
        r = verify_copies (img, io, ctx, ws, first_gc);
        break;
      case PLACE_WAIT:
        qcow2_inflight_wait_claim (&img->inflight, p.ticket);
        break;
      }
      if (r < 0)
        goto failed;
      break;
    }
    result->too_much_dirty |= commit.too_much_dirty;
  }
  return CHANGE_DONE;

 failed:
  *error = r;
  return CHANGE_FAILED;
}
