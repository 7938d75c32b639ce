/* qcow2zstd engine: compressing whole clusters in the connection's pool.
 *
 * A write of whole clusters is compressed before the image lock is
 * taken, one job per cluster, by the pool's workers and the calling
 * thread together; only placing the results needs the lock.  Contexts
 * (source pointers, results, the output area) are kept on a per-reader
 * free list and grow to the largest batch seen, so a stream of writes
 * allocates nothing.
 */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2-internal.h"
#include "qcow2-codec.h"
#include "qcow2-pool.h"

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

static void
ctx_free (struct compress_ctx *ctx)
{
  if (ctx == NULL)
    return;
  free (ctx->src);
  free (ctx->src_len);
  free (ctx->result);
  free (ctx->out);
  free (ctx);
}

struct compress_ctx *
qcow2_compress_ctx_get (struct qcow2_reader *reader, size_t clusters)
{
  struct qcow2_image *img = qcow2_reader_image (reader);
  pthread_mutex_t *lock = qcow2_reader_lock (reader);
  struct compress_ctx **free_list = qcow2_reader_compress_free (reader);
  struct compress_ctx *ctx;

  pthread_mutex_lock (lock);
  ctx = *free_list;
  if (ctx)
    *free_list = ctx->next_free;
  pthread_mutex_unlock (lock);

  if (ctx == NULL) {
    ctx = calloc (1, sizeof *ctx);
    if (ctx == NULL)
      goto nomem;
    ctx->img = img;
  }
  if (ctx->capacity < clusters) {
    const uint8_t **src = realloc (ctx->src, clusters * sizeof *src);
    if (src)
      ctx->src = src;
    uint32_t *src_len = realloc (ctx->src_len, clusters * sizeof *src_len);
    if (src_len)
      ctx->src_len = src_len;
    int64_t *result = realloc (ctx->result, clusters * sizeof *result);
    if (result)
      ctx->result = result;
    free (ctx->out);
    ctx->out = malloc (clusters * (size_t) img->header.cluster_size);
    if (!src || !src_len || !result || !ctx->out) {
      ctx_free (ctx);
      goto nomem;
    }
    ctx->capacity = clusters;
  }
  ctx->count = 0;
  return ctx;

 nomem:
  qcow2_error (img, "out of memory for compressing a write");
  return NULL;
}

void
qcow2_compress_ctx_put (struct qcow2_reader *reader, struct compress_ctx *ctx)
{
  pthread_mutex_t *lock = qcow2_reader_lock (reader);
  struct compress_ctx **free_list = qcow2_reader_compress_free (reader);

  pthread_mutex_lock (lock);
  ctx->next_free = *free_list;
  *free_list = ctx;
  pthread_mutex_unlock (lock);
}

void
qcow2_compress_ctx_free_all (struct qcow2_reader *reader)
{
  struct compress_ctx **free_list = qcow2_reader_compress_free (reader);

  while (*free_list) {
    struct compress_ctx *ctx = *free_list;
    *free_list = ctx->next_free;
    ctx_free (ctx);
  }
}

/* Every request of every connection has a thread that joins in on its
 * batch, and the pools' workers come on top: dozens of threads may be in
 * a compression job at once on a few CPUs.  With a compressor each, most
 * of a megabyte of zstd tables apiece, used in turn, the tables are never
 * in the CPU's cache (zstd took 20% longer with 16 contexts in rotation
 * than with one, 32% with 64).  So compressors are shared, at most one
 * per CPU: a job waits for one (a thread more could not run anyway), and
 * takes the most recently used, whose tables are warm.
 */
struct encoder_slot {
  struct encoder_slot *next;
  struct qcow2_encoder *enc;
};

static struct encoder_slot *
encoder_get (struct qcow2_image *img)
{
  struct encoder_slot *slot;

  pthread_mutex_lock (&img->encoders_lock);
  while (img->encoders == NULL && img->encoders_made >= img->encoders_max)
    pthread_cond_wait (&img->encoder_returned, &img->encoders_lock);
  slot = img->encoders;
  if (slot)
    img->encoders = slot->next;
  else
    img->encoders_made++;
  pthread_mutex_unlock (&img->encoders_lock);
  if (slot)
    return slot;

  slot = malloc (sizeof *slot);
  if (slot && (slot->enc = qcow2_encoder_new ()) != NULL)
    return slot;
  free (slot);
  pthread_mutex_lock (&img->encoders_lock);
  img->encoders_made--;
  pthread_cond_signal (&img->encoder_returned);
  pthread_mutex_unlock (&img->encoders_lock);
  return NULL;
}

static void
encoder_put (struct qcow2_image *img, struct encoder_slot *slot)
{
  pthread_mutex_lock (&img->encoders_lock);
  slot->next = img->encoders;
  img->encoders = slot;
  pthread_cond_signal (&img->encoder_returned);
  pthread_mutex_unlock (&img->encoders_lock);
}

void
qcow2_encoders_free (struct qcow2_image *img)
{
  struct encoder_slot *slot;

  while ((slot = img->encoders) != NULL) {
    img->encoders = slot->next;
    qcow2_encoder_free (slot->enc);
    free (slot);
  }
  img->encoders_made = 0;
}

static bool
all_zero (const uint8_t *p, size_t len)
{
  /* The first byte, then the buffer against itself shifted by one. */
  return len == 0 || (p[0] == 0 && memcmp (p, p + 1, len - 1) == 0);
}

static void
compress_one (void *arg, size_t index, void *state)
{
  struct compress_ctx *ctx = arg;
  struct qcow2_image *img = ctx->img;
  struct thread_state *ts = state;
  const uint32_t cluster_size = img->header.cluster_size;
  const uint8_t *in = ctx->src[index];
  struct encoder_slot *slot;
  int64_t len;
  int expected = 0;

  if (ctx->src_len[index] < cluster_size) {
    /* The disk's last cluster: qemu compresses it zero padded. */
    memcpy (ts->scratch, in, ctx->src_len[index]);
    memset (ts->scratch + ctx->src_len[index], 0,
            cluster_size - ctx->src_len[index]);
    in = ts->scratch;
  }
  if (all_zero (in, cluster_size)) {
    ctx->result[index] = QCOW2_COMPRESS_ALL_ZERO;
    return;
  }
  slot = encoder_get (img);
  if (slot == NULL) {
    snprintf (ts->err, sizeof ts->err, "out of memory for a compressor");
    len = -1;
  }
  else {
    /* qemu keeps a compressed cluster only if it saves at least a byte. */
    len = qcow2_encode_cluster (slot->enc, img->header.compression_type,
                                img->opts.compression_level,
                                in, cluster_size,
                                ctx->out + index * (size_t) cluster_size,
                                cluster_size - 1, ts->err, sizeof ts->err);
    encoder_put (img, slot);
  }
  if (len < 0 && atomic_compare_exchange_strong (&ctx->failed, &expected, 1))
    snprintf (ctx->errmsg, sizeof ctx->errmsg, "%s", ts->err);
  ctx->result[index] = len < 0 ? 0 : len;
}

int
qcow2_compress_run (struct qcow2_reader *reader, struct compress_ctx *ctx)
{
  struct qcow2_batch batch = {
    .run = compress_one, .arg = ctx, .count = ctx->count,
  };
  struct request *req;

  atomic_store (&ctx->failed, 0);
  req = qcow2_request_get (reader);
  if (req == NULL)
    return -ENOMEM;
  qcow2_pool_submit (qcow2_reader_pool (reader), &batch);
  qcow2_pool_wait (qcow2_reader_pool (reader), &batch,
                   qcow2_request_caller (req));
  qcow2_request_put (reader, req);
  if (atomic_load (&ctx->failed)) {
    qcow2_error (ctx->img, "%s", ctx->errmsg);
    return -EIO;
  }
  return 0;
}
