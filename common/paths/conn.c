/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the connection. */

#include <config.h>

#include "qcow2.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "paths/conn.h"
#include "paths/fetchahead.h"
#include "meta/crypt.h"
#include "paths/compress.h"
#include "base/lockorder.h"
#include "base/pool.h"
#include "format/codec.h"
#include "format/crypto.h"
#include "meta/log.h"

struct qcow2_conn {
  struct qcow2_image *img;
  struct qcow2_pool *pool;
  size_t staging_size;

  /* Free lists, under LOCK. */
  struct qcow2_mutex lock;
  struct request *free_requests;
  struct compress_ctx *free_batches;

  /* Sequential small reads: decode the next clusters ahead of the client
   * into the cluster cache, in the pool, while the client works.
   */
  _Atomic uint64_t last_end;
  struct qcow2_mutex ra_lock;       /* only ever tried */
  struct chunk *ra;

  /* Sequential reads of the image file: its bytes fetched ahead, or NULL
   * (paths/fetchahead.h).
   */
  struct fetch_ahead *fetch_ahead;
};

static void *
thread_state_new (void *arg)
{
  struct qcow2_image *img = arg;
  struct thread_state *ts = calloc (1, sizeof *ts);

  if (ts == NULL)
    return NULL;
  ts->dec = qcow2_decoder_new ();
  ts->scratch = malloc (img->header.cluster_size);
  if (qcow2_image_encrypted (img))
    ts->cipher = qcow2_crypt_cipher_new (img);
  if (ts->dec == NULL || ts->scratch == NULL ||
      (qcow2_image_encrypted (img) && ts->cipher == NULL)) {
    qcow2_decoder_free (ts->dec);
    qcow2_sector_cipher_free (ts->cipher);
    free (ts->scratch);
    free (ts);
    return NULL;
  }
  return ts;
}

static void
thread_state_free (void *state)
{
  struct thread_state *ts = state;

  if (ts == NULL)
    return;
  qcow2_decoder_free (ts->dec);
  qcow2_sector_cipher_free (ts->cipher);
  free (ts->scratch);
  free (ts);
}

size_t
qcow2_staging_size (const struct qcow2_image *img)
{
  /* The largest compressed range one descriptor can name is
   * 2^(cluster_bits-8) sectors of 512 bytes.
   */
  if (img->opts.request_size < 2 * (uint64_t) img->header.cluster_size)
    return 2 * (size_t) img->header.cluster_size;
  return img->opts.request_size;
}

struct qcow2_image *
qcow2_conn_image (struct qcow2_conn *conn)
{
  return conn->img;
}

/* ---------------------------------------------------------- requests */

static void
request_free (struct request *req)
{
  if (req == NULL)
    return;
  free (req->chunk[0].staging);
  free (req->chunk[1].staging);
  free (req->l2buf);
  free (req->crypt_buf);
  qcow2_decoder_free (req->caller.dec);
  qcow2_sector_cipher_free (req->caller.cipher);
  free (req->caller.scratch);
  free (req);
}

struct request *
qcow2_conn_request_get (struct qcow2_conn *conn)
{
  struct qcow2_image *img = conn->img;
  struct request *req;
  struct thread_state *ts;
  unsigned i;

  qcow2_mutex_lock (&conn->lock);
  req = conn->free_requests;
  if (req)
    conn->free_requests = req->next_free;
  qcow2_mutex_unlock (&conn->lock);
  if (req)
    return req;

  req = calloc (1, sizeof *req);
  if (req == NULL)
    goto nomem;
  for (i = 0; i < 2; ++i) {
    req->chunk[i].img = img;
    req->chunk[i].staging = malloc (conn->staging_size);
    if (req->chunk[i].staging == NULL)
      goto nomem;
  }
  req->l2buf = malloc (img->header.cluster_size);
  ts = thread_state_new (img);
  if (req->l2buf == NULL || ts == NULL)
    goto nomem;
  req->caller = *ts;
  free (ts);
  return req;

 nomem:
  request_free (req);
  qcow2_error (img, "out of memory for a read request");
  return NULL;
}

int
qcow2_conn_request_crypt_buf (struct qcow2_conn *conn, struct request *req)
{
  if (req->crypt_buf == NULL &&
      (req->crypt_buf = malloc (conn->img->opts.request_size)) == NULL) {
    qcow2_error (conn->img, "out of memory for encrypting a write");
    return -ENOMEM;
  }
  return 0;
}

void
qcow2_conn_request_put (struct qcow2_conn *conn, struct request *req)
{
  qcow2_mutex_lock (&conn->lock);
  req->next_free = conn->free_requests;
  conn->free_requests = req;
  qcow2_mutex_unlock (&conn->lock);
}

/* ----------------------------------------------------------- batches */

static void
batch_free (struct compress_ctx *ctx)
{
  if (ctx == NULL)
    return;
  free (ctx->src);
  free (ctx->src_len);
  free (ctx->result);
  free (ctx->hash);
  free (ctx->dedup);
  free (ctx->placed);
  free (ctx->entry);
  free (ctx->out);
  pthread_cond_destroy (&ctx->finished);
  free (ctx);
}

/* A batch grows to the largest the connection has needed, and keeps that
 * size on the free list.
 */
struct compress_ctx *
qcow2_conn_batch_get (struct qcow2_conn *conn, size_t clusters)
{
  struct qcow2_image *img = conn->img;
  struct compress_ctx *ctx;

  qcow2_mutex_lock (&conn->lock);
  ctx = conn->free_batches;
  if (ctx)
    conn->free_batches = ctx->next_free;
  qcow2_mutex_unlock (&conn->lock);

  if (ctx == NULL) {
    ctx = calloc (1, sizeof *ctx);
    if (ctx == NULL)
      goto nomem;
    ctx->img = img;
    pthread_cond_init (&ctx->finished, NULL);
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
    uint64_t *hash = realloc (ctx->hash, clusters * sizeof *hash);
    if (hash)
      ctx->hash = hash;
    uint64_t *dedup = realloc (ctx->dedup, clusters * sizeof *dedup);
    if (dedup)
      ctx->dedup = dedup;
    uint8_t *placed = realloc (ctx->placed, clusters);
    if (placed)
      ctx->placed = placed;
    uint64_t *entry = realloc (ctx->entry, clusters * sizeof *entry);
    if (entry)
      ctx->entry = entry;
    free (ctx->out);
    ctx->out = malloc (clusters * (size_t) img->header.cluster_size);
    if (!src || !src_len || !result || !hash || !dedup || !placed ||
        !entry || !ctx->out) {
      batch_free (ctx);
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
qcow2_conn_batch_put (struct qcow2_conn *conn, struct compress_ctx *ctx)
{
  qcow2_mutex_lock (&conn->lock);
  ctx->next_free = conn->free_batches;
  conn->free_batches = ctx;
  qcow2_mutex_unlock (&conn->lock);
}

/* -------------------------------------------------------------- pool */

unsigned
qcow2_conn_workers (const struct qcow2_conn *conn)
{
  return qcow2_pool_threads (conn->pool);
}

void
qcow2_conn_submit (struct qcow2_conn *conn, struct qcow2_batch *batch)
{
  qcow2_pool_submit (conn->pool, batch);
}

void
qcow2_conn_wait (struct qcow2_conn *conn, struct qcow2_batch *batch,
                 struct thread_state *caller_state)
{
  qcow2_pool_wait (conn->pool, batch, caller_state);
}

/* --------------------------------------------------------- readahead */

bool
qcow2_conn_continues (struct qcow2_conn *conn, uint64_t offset, uint64_t end)
{
  return atomic_exchange (&conn->last_end, end) == offset;
}

struct chunk *
qcow2_conn_readahead_claim (struct qcow2_conn *conn)
{
  if (!qcow2_mutex_trylock (&conn->ra_lock))
    return NULL;
  if (conn->ra == NULL) {
    conn->ra = calloc (1, sizeof *conn->ra);
    if (conn->ra &&
        (conn->ra->staging = malloc (conn->staging_size)) == NULL) {
      free (conn->ra);
      conn->ra = NULL;
    }
    if (conn->ra == NULL) {
      qcow2_mutex_unlock (&conn->ra_lock);
      return NULL;
    }
    conn->ra->img = conn->img;
  }
  return conn->ra;
}

void
qcow2_conn_readahead_release (struct qcow2_conn *conn)
{
  qcow2_mutex_unlock (&conn->ra_lock);
}

int
qcow2_conn_pread (struct qcow2_conn *conn, struct qcow2_io *io, void *buf,
                  uint64_t len, uint64_t host)
{
  return qcow2_fetchahead_pread (conn->fetch_ahead, conn->img, io, buf, len,
                                 host);
}

void
qcow2_conn_fetch_in_background (struct qcow2_conn *conn,
                                const struct qcow2_background_io *io)
{
  qcow2_fetchahead_background (conn->fetch_ahead, io);
}

/* --------------------------------------------------- new and free */

struct qcow2_conn *
qcow2_conn_new (struct qcow2_image *img)
{
  struct qcow2_conn *conn = calloc (1, sizeof *conn);

  if (conn == NULL) {
    qcow2_error (img, "out of memory for a connection");
    return NULL;
  }
  conn->img = img;
  conn->staging_size = qcow2_staging_size (img);
  conn->pool = qcow2_pool_new (img->opts.threads, thread_state_new,
                               thread_state_free, img);
  if (conn->pool == NULL) {
    qcow2_error (img, "cannot start %u worker threads", img->opts.threads);
    free (conn);
    return NULL;
  }
  qcow2_mutex_init (&conn->lock, QCOW2_RANK_CONN,
                    "a connection's free lists");
  qcow2_mutex_init (&conn->ra_lock, QCOW2_RANK_TRIED_ONLY,
                    "a connection's readahead");
  conn->fetch_ahead = qcow2_fetchahead_new (img);
  return conn;
}

void
qcow2_conn_free (struct qcow2_conn *conn)
{
  struct request *req;
  struct compress_ctx *ctx;

  if (conn == NULL)
    return;
  if (conn->ra) {
    /* A readahead still decoding must finish before its chunk goes. */
    if (conn->ra->in_flight) {
      req = qcow2_conn_request_get (conn);
      qcow2_pool_wait (conn->pool, &conn->ra->batch,
                       req ? &req->caller : NULL);
      if (req)
        qcow2_conn_request_put (conn, req);
    }
    free (conn->ra->staging);
    free (conn->ra);
  }
  qcow2_pool_free (conn->pool);
  while ((req = conn->free_requests) != NULL) {
    conn->free_requests = req->next_free;
    request_free (req);
  }
  while ((ctx = conn->free_batches) != NULL) {
    conn->free_batches = ctx->next_free;
    batch_free (ctx);
  }
  qcow2_fetchahead_free (conn->fetch_ahead);
  qcow2_mutex_destroy (&conn->ra_lock);
  qcow2_mutex_destroy (&conn->lock);
  free (conn);
}
