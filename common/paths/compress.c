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
#include "meta/alloc.h"
#include "paths/cluster.h"
#include "format/codec.h"
#include "paths/dedup.h"
#include "format/endian.h"
#include "format/entries.h"
#include "meta/first-change.h"
#include "meta/hostio.h"
#include "base/inflight.h"
#include "meta/map.h"
#include "base/pool.h"
#include "paths/scratch.h"
#include "meta/writeback.h"

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
}

/* ------------------------------------------------ placing the results */

/* What placing does to one cluster of a batch (piece_cluster.action). */
enum place_action {
  PLACE_DONE,           /* nothing left: its entry was set under the lock */
  PLACE_PACKED,         /* its compressed bytes go to new_host (entry) */
  PLACE_SHARED,         /* gets entry, a copy packed or shared by the batch */
  PLACE_IN_PLACE,       /* plain data into the cluster it has */
  PLACE_NEW,            /* plain data into the new cluster new_host */
};

/* Why a round stopped before the end of the batch.  The step it stopped
 * at is placed by the next round, after the caller has done this:
 */
enum round_stop {
  ROUND_DONE,
  ROUND_RECLAIM,        /* make room: QCOW2_RECLAIM to the caller */
  ROUND_COMPRESS,       /* compress the cluster: its copy cannot be shared */
  ROUND_VERIFY,         /* read back the copies DUPLICATE clusters share */
  ROUND_WAIT,           /* wait for a claim: a claimed range, or the data
                           of a copy being written */
};

/* After this many read-backs of the copies, releases applied in between
 * mean a copy is not shared (the writebacks that apply them would
 * otherwise hold the batch back for ever).
 */
#define MAX_VERIFY_ROUNDS 3

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

/* Read back the copies that the DUPLICATE clusters of CTX from step STEP
 * on are to share, with no lock held, and compress those whose copy
 * holds other data.  The placing checks under the lock that no release
 * was applied since (verified_generation).
 */
static int
verify_copies (struct qcow2_image *img, struct qcow2_io *io,
               struct compress_ctx *ctx, struct write_scratch *ws,
               uint64_t first_gc, size_t step)
{
  size_t i;
  int r;

  ctx->verified_generation = atomic_load (&img->free_generation);
  for (i = step; i < ctx->count; ++i) {
    if (ctx->result[i] != QCOW2_COMPRESS_DUPLICATE)
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
batch_has_copy (const struct compress_ctx *ctx, const struct write_scratch *ws,
                size_t j, uint64_t entry)
{
  size_t i;

  for (i = j; i-- > 0; )
    if (ws->piece[i].entry == entry && ctx->hash[i] == ctx->hash[j] &&
        ctx->src_len[i] == ctx->src_len[j] &&
        memcmp (ctx->src[i], ctx->src[j], ctx->src_len[j]) == 0)
      return true;
  return false;
}

/* Set the entry of the cluster PC describes (at INDEX in table T) to
 * ENTRY now, and release what it held.
 */
static int
set_entry (struct qcow2_image *img, struct meta_table *t, uint64_t index,
           const struct piece_cluster *pc, uint64_t entry)
{
  put_be64 (t->data + index * 8, entry);
  t->dirty = true;
  return qcow2_release (img, &pc->old);
}

/* Before the first change to guest cluster GC's entry: the image's first
 * change (qcow2_first_change), and the cluster's L2 table, made into *T
 * if there is none yet.
 */
static int
prepare_change (struct qcow2_image *img, struct qcow2_io *io, uint64_t gc,
                struct meta_table **t)
{
  int r = qcow2_first_change (img, io);

  if (r == 0 && *t == NULL)
    r = qcow2_l2_for_write (img, io, gc >> img->header.l2_bits, true, t);
  return r;
}

/* Decide, with the image lock held exclusively, how cluster I of CTX
 * (guest cluster GC) is placed: set its entry now (zeros, a verified
 * copy), or reserve what its data needs (packed bytes, a new cluster, a
 * reference to a copy the batch made).  0, a ROUND_* reason to stop
 * before it (*TICKET for ROUND_WAIT), QCOW2_RECLAIM, or -errno after
 * logging.
 */
static int
place_one (struct qcow2_image *img, struct qcow2_io *io,
           struct compress_ctx *ctx, struct write_scratch *ws, size_t i,
           uint64_t gc, unsigned verify_rounds, uint64_t *ticket)
{
  const uint64_t index = gc & ((UINT64_C (1) << img->header.l2_bits) - 1);
  const bool whole = ctx->src_len[i] == img->header.cluster_size;
  struct piece_cluster *pc = &ws->piece[i];
  int64_t result = ctx->result[i];
  struct meta_table *t;
  uint64_t entry, host;
  bool pending;
  int r;

  /* Found, not made: a cluster that stays as it is changes nothing. */
  r = qcow2_l2_for_write (img, io, gc >> img->header.l2_bits, false, &t);
  if (r == 0)
    r = qcow2_classify (img, gc, t ? be64 (t->data + index * 8) : 0,
                        &pc->old);
  if (r < 0)
    return r;
  pc->action = PLACE_DONE;
  pc->new_host = 0;

  if (result == QCOW2_COMPRESS_PENDING)
    return ROUND_COMPRESS;
  if (result == QCOW2_COMPRESS_DUPLICATE) {
    if (atomic_load (&img->free_generation) != ctx->verified_generation &&
        verify_rounds < MAX_VERIFY_ROUNDS)
      return ROUND_VERIFY;      /* what was read back may be gone */
    r = 0;
    if (atomic_load (&img->free_generation) == ctx->verified_generation)
      r = qcow2_dedup_can_reference (img, io, ctx->dedup[i]);
    if (r < 0)
      return r;
    qcow2_debug_if (img, QCOW2_DEBUG_MAP, "guest cluster %" PRIu64 ": %s "
                    "compressed entry 0x%" PRIx64, gc,
                    r ? "shares" : "cannot share", ctx->dedup[i]);
    if (r == 0) {
      ctx->dedup[i] = QCOW2_DEDUP_NO_SHARE;
      ctx->result[i] = QCOW2_COMPRESS_PENDING;
      return ROUND_COMPRESS;
    }
    r = prepare_change (img, io, gc, &t);
    if (r == 0)
      r = qcow2_dedup_reference (img, io, ctx->dedup[i]);
    if (r < 0)
      return r;
    pc->entry = ctx->dedup[i];
    return set_entry (img, t, index, pc, pc->entry);
  }
  if (result == QCOW2_COMPRESS_ALL_ZERO) {
    /* What already reads as zeros stays as it is (an unallocated cluster
     * of a new image, as qemu-img convert leaves it).
     */
    if (qcow2_reads_as_zeros (img, &pc->old))
      return 0;
    r = prepare_change (img, io, gc, &t);
    if (r < 0)
      return r;
    if (img->header.version >= 3 || img->backing == NULL)
      return set_entry (img, t, index, pc,
                        img->header.version >= 3 ? L2E_ZERO : 0);
    result = 0;                 /* v2 over a backing file: write zeros */
  }
  /* Anything below changes the image. */
  r = prepare_change (img, io, gc, &t);
  if (r < 0)
    return r;
  if (result == 0) {
    if (pc->old.kind == CLUSTER_NORMAL && (pc->old.l2_entry & L2E_COPIED)) {
      pc->action = PLACE_IN_PLACE;
      return 0;
    }
    r = qcow2_alloc_clusters (img, io, 1, QCOW2_ALLOC_ANY, &pc->new_host);
    if (r == 0)
      pc->action = PLACE_NEW;
    return r;
  }

  /* Compressed: a copy of the same data placed since the batch looked
   * (by the batch itself, or by another write) is shared instead.
   */
  if (whole && ctx->dedup[i] != QCOW2_DEDUP_NO_SHARE &&
      (entry = qcow2_dedup_find (img, ctx->hash[i], &pending)) != 0) {
    r = qcow2_dedup_can_reference (img, io, entry);
    if (r < 0)
      return r;
    if (r == 1 && batch_has_copy (ctx, ws, i, entry)) {
      r = qcow2_dedup_reference (img, io, entry);
      if (r == 0) {
        pc->entry = entry;
        pc->action = PLACE_SHARED;
      }
      return r;
    }
    if (r == 1 && pending) {
      /* Its data is still being written: wait for that write. */
      qcow2_inflight_claimed (&img->inflight, 0, 0, ticket);
      return ROUND_WAIT;
    }
    if (r == 1) {
      ctx->result[i] = QCOW2_COMPRESS_DUPLICATE;
      ctx->dedup[i] = entry;
      return ROUND_VERIFY;
    }
  }
  r = qcow2_pack_reserve (img, io, result, &host);
  if (r < 0)
    return r;
  pc->new_host = host;
  pc->entry = L2E_COMPRESSED | host |
    ((((host + result - 1) >> 9) - (host >> 9)) << img->csize_shift);
  pc->action = PLACE_PACKED;
  if (whole)
    qcow2_dedup_remember (img, ctx->hash[i], pc->entry, true);
  return 0;
}

/* The data of the clusters of CTX placed by this round, with no lock
 * held: the packed bytes (those that follow each other on the host in one
 * write, moved together in CTX->out), and the plain clusters.
 */
static int
write_round (struct qcow2_image *img, struct qcow2_io *io,
             struct compress_ctx *ctx, struct write_scratch *ws)
{
  const uint32_t cluster_size = img->header.cluster_size;
  struct data_run plain = { 0 }, packed = { 0 };
  uint8_t *packed_buf = NULL;
  size_t i;
  int r = 0;

  for (i = 0; i < ctx->count && r == 0; ++i) {
    const struct piece_cluster *pc = &ws->piece[i];
    uint8_t *data = ctx->out + i * (size_t) cluster_size;
    const uint8_t *src = ctx->src[i];

    switch (pc->action) {
    case PLACE_PACKED:
      /* The packed clusters come in the order of their host offsets and
       * of their places in CTX->out, so a cluster's bytes only ever move
       * down over those of clusters already moved.
       */
      if (packed.len && packed.host + packed.len == pc->new_host) {
        memmove (packed_buf + packed.len, data, ctx->result[i]);
        packed.len += ctx->result[i];
        break;
      }
      r = qcow2_run_flush (img, io, &packed);
      packed_buf = data;
      packed = (struct data_run) {
        .src = data, .host = pc->new_host, .len = ctx->result[i],
      };
      break;
    case PLACE_IN_PLACE:
      r = qcow2_run_add (img, io, &plain, src, pc->old.host_offset,
                         ctx->src_len[i]);
      break;
    case PLACE_NEW:
      if (ctx->src_len[i] < cluster_size) {
        /* The disk's last cluster, zero padded. */
        memcpy (ws->cow[0], src, ctx->src_len[i]);
        memset (ws->cow[0] + ctx->src_len[i], 0,
                cluster_size - ctx->src_len[i]);
        src = ws->cow[0];
      }
      r = qcow2_run_add (img, io, &plain, src, pc->new_host, cluster_size);
      break;
    }
  }
  if (r == 0)
    r = qcow2_run_flush (img, io, &packed);
  if (r == 0)
    r = qcow2_run_flush (img, io, &plain);
  return r;
}

/* With the image lock held exclusively, after the data of the clusters
 * this round placed was written (WRITTEN) or not: point the entries at
 * what was written and release what they held, or give back what was
 * reserved.
 */
static int
link_round (struct qcow2_image *img, struct qcow2_io *io,
            struct compress_ctx *ctx, struct write_scratch *ws,
            uint64_t first_gc, bool written)
{
  const uint64_t l2_mask = (UINT64_C (1) << img->header.l2_bits) - 1;
  size_t i;
  int r = 0;

  for (i = 0; i < ctx->count; ++i) {
    uint64_t gc = first_gc + i;
    struct piece_cluster *pc = &ws->piece[i];
    bool whole = ctx->src_len[i] == img->header.cluster_size;
    struct meta_table *t = NULL;
    struct cluster_map map;
    uint64_t entry;

    if (pc->action != PLACE_PACKED && pc->action != PLACE_SHARED &&
        pc->action != PLACE_NEW)
      continue;
    entry = pc->action == PLACE_NEW ? pc->new_host | L2E_COPIED : pc->entry;
    if (written && r == 0) {
      r = qcow2_l2_for_write (img, io, gc >> img->header.l2_bits, false, &t);
      if (r == 0 && t == NULL) {
        qcow2_error (img, "internal error: the L2 table of guest cluster %"
                     PRIu64 " went away", gc);
        r = -EIO;
      }
    }
    if (!written || r < 0) {
      /* Nothing points at what was reserved: back at the next writeback. */
      if (pc->action == PLACE_NEW)
        qcow2_free_later (img, pc->new_host, img->header.cluster_size, 0);
      else if (qcow2_classify (img, gc, entry, &map) == 0)
        qcow2_release (img, &map);
      if (pc->action == PLACE_PACKED && whole)
        qcow2_dedup_forget (img, ctx->hash[i], entry);
      pc->entry = 0;
      continue;
    }
    put_be64 (t->data + (gc & l2_mask) * 8, entry);
    t->dirty = true;
    r = qcow2_release (img, &pc->old);
    if (pc->action == PLACE_PACKED && whole)
      qcow2_dedup_written (img, ctx->hash[i], entry);
  }
  return r;
}

/* One round: decide steps from *STEP on under the lock until the batch
 * ends or a step cannot be placed now (*STOP says why), write their data
 * without the lock, and link them under it.  Moves *STEP on.
 */
static int
place_round (struct qcow2_image *img, struct qcow2_io *io,
             struct compress_ctx *ctx, struct write_scratch *ws,
             uint64_t first_gc, size_t *step, unsigned verify_rounds,
             struct change_result *result, int *stop, uint64_t *ticket)
{
  const size_t count = ctx->count;
  struct qcow2_claim claim;
  struct qcow2_inflight_op reg;
  bool claims = false, in_place = false;
  size_t s0 = *step, s, i;
  int r = 0, r2;

  /* What earlier rounds placed is done: the write and link below see
   * only this round's clusters.
   */
  for (i = 0; i < count; ++i)
    ws->piece[i].action = PLACE_DONE;
  *stop = ROUND_DONE;
  pthread_rwlock_wrlock (&img->lock);
  if (qcow2_inflight_claimed (&img->inflight, first_gc, first_gc + count,
                              ticket)) {
    pthread_rwlock_unlock (&img->lock);
    *stop = ROUND_WAIT;
    return 0;
  }
  /* Compressed clusters first, plain ones after: a plain cluster placed
   * in between would take the host cluster that the packed data was to
   * run on into, and leave the rest of the current one unused.  Steps
   * [0, count) are the first pass, [count, 2 * count) the second.
   */
  for (s = s0; s < 2 * count; ++s) {
    bool plain_pass = s >= count;

    i = s % count;
    if ((ctx->result[i] == 0) != plain_pass)
      continue;
    r = place_one (img, io, ctx, ws, i, first_gc + i, verify_rounds, ticket);
    if (r == QCOW2_RECLAIM) {
      *stop = ROUND_RECLAIM;
      r = 0;
    }
    else if (r > 0) {
      *stop = r;
      r = 0;
    }
    if (r < 0 || *stop != ROUND_DONE)
      break;
    claims |= ws->piece[i].action == PLACE_PACKED ||
      ws->piece[i].action == PLACE_SHARED || ws->piece[i].action == PLACE_NEW;
    in_place |= ws->piece[i].action == PLACE_IN_PLACE;
  }
  if (r < 0) {
    link_round (img, io, ctx, ws, first_gc, false);
    pthread_rwlock_unlock (&img->lock);
    return r;
  }
  if (claims)
    qcow2_inflight_claim (&img->inflight, &claim, first_gc, first_gc + count);
  if (in_place)
    qcow2_inflight_enter (&img->inflight, &reg);
  if (!claims && qcow2_too_much_dirty (img))
    result->too_much_dirty = true;
  pthread_rwlock_unlock (&img->lock);

  r = write_round (img, io, ctx, ws);
  if (in_place)
    qcow2_inflight_leave (&img->inflight, &reg);
  if (claims) {
    pthread_rwlock_wrlock (&img->lock);
    r2 = link_round (img, io, ctx, ws, first_gc, r == 0);
    qcow2_inflight_unclaim (&img->inflight, &claim);
    if (qcow2_too_much_dirty (img))
      result->too_much_dirty = true;
    pthread_rwlock_unlock (&img->lock);
    if (r == 0)
      r = r2;
  }
  if (r == 0)
    *step = s;
  return r;
}

int
qcow2_compress_place (struct qcow2_image *img, struct qcow2_io *io,
                      struct compress_ctx *ctx, struct write_scratch *ws,
                      uint64_t first_gc, size_t *step,
                      struct change_result *result)
{
  unsigned verify_rounds = 0;
  uint64_t ticket = 0;
  size_t i;
  int r = 0, stop;

  /* The metadata changes, and a FUA request writes it back. */
  result->needs_writeback = true;
  if (*step == 0) {
    for (i = 0; i < ctx->count; ++i)
      ws->piece[i].entry = 0;
    r = verify_copies (img, io, ctx, ws, first_gc, 0);
  }
  while (r == 0 && *step < 2 * ctx->count) {
    r = place_round (img, io, ctx, ws, first_gc, step, verify_rounds, result,
                     &stop, &ticket);
    if (r < 0)
      break;
    switch (stop) {
    case ROUND_RECLAIM:
      return QCOW2_RECLAIM;
    case ROUND_COMPRESS:
      r = compress_here (img, ctx, ws, *step % ctx->count);
      break;
    case ROUND_VERIFY:
      verify_rounds++;
      r = verify_copies (img, io, ctx, ws, first_gc, *step % ctx->count);
      break;
    case ROUND_WAIT:
      qcow2_inflight_wait_claim (&img->inflight, ticket);
      break;
    }
  }
  return r;
}
