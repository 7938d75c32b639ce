/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: chunks of compressed clusters, fetched with one read
 * and decoded on the connection's pool.
 */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "paths/chunk.h"
#include "base/cache.h"
#include "format/codec.h"
#include "paths/conn.h"
#include "meta/log.h"
#include "base/pool.h"

/* Compressed ranges this far apart still share one read underneath: a
 * read of a few wasted KiB is cheaper than a second request.
 */
#define MAX_CHUNK_GAP 4096

/* Decoding one small cluster takes less time than waking a thread, so
 * one job decodes at least this many bytes' worth of clusters.
 */
#define MIN_JOB_BYTES (64 * 1024)

static void
decode_one (struct chunk *c, struct job *j, struct thread_state *ts)
{
  struct qcow2_image *img = c->img;
  uint8_t *out = j->whole_dst ? j->whole_dst : ts->scratch;
  int expected = 0;

  if (qcow2_decode_cluster (ts->dec, img->header.compression_type,
                            c->staging + j->in_off, j->in_len,
                            out, img->header.cluster_size,
                            ts->err, sizeof ts->err) < 0) {
    if (atomic_compare_exchange_strong (&c->failed, &expected, 1))
      snprintf (c->errmsg, sizeof c->errmsg,
                "compressed cluster at guest offset 0x%" PRIx64
                " (host offset 0x%" PRIx64 ", %u bytes): %s",
                j->guest_offset, c->host_start + j->in_off, j->in_len,
                ts->err);
    return;
  }
  atomic_fetch_add_explicit (&img->counters.clusters_decompressed, 1,
                             memory_order_relaxed);
  if (j->whole_dst == NULL) {
    if (j->part_len)
      memcpy (j->part_dst, out + j->part_off, j->part_len);
    /* A readahead runs without the image lock: the clusters may have
     * been released since it read them.  What a readahead or a prefetch
     * decodes is stored, as it was decoded for a reader to come; the
     * cluster a reader missed is only offered, so that random misses do
     * not push out clusters read more often.
     */
    if (c->readahead)
      qcow2_cache_put_if (img->cluster_cache, j->key, out,
                          &img->free_generation, c->generation);
    else if (j->part_len)
      qcow2_cache_offer (img->cluster_cache, j->key, out);
    else
      qcow2_cache_put (img->cluster_cache, j->key, out);
  }
}

static void
run_job (void *arg, size_t index, void *state)
{
  struct chunk *c = arg;
  size_t i = index * c->clusters_per_job;
  size_t end = i + c->clusters_per_job;

  if (end > c->njobs)
    end = c->njobs;
  for (; i < end; ++i)
    decode_one (c, &c->jobs[i], state);
}

void
qcow2_chunk_wait (struct qcow2_conn *conn, struct chunk *c,
                  struct thread_state *caller_state)
{
  if (!c->in_flight)
    return;
  qcow2_conn_wait (conn, &c->batch, caller_state);
  c->in_flight = false;
  qcow2_debug_if (c->img, QCOW2_DEBUG_POOL,
                  "pool: %zu clusters in %zu jobs, %zu run by the calling "
                  "thread, %zu by %u workers", c->njobs, c->batch.count,
                  c->batch.run_by_waiter,
                  c->batch.count - c->batch.run_by_waiter,
                  qcow2_conn_workers (conn));
}

int
qcow2_chunk_finish (struct qcow2_conn *conn, struct request *req,
                    struct chunk *c)
{
  int r = 0;

  if (c->in_flight) {
    qcow2_chunk_wait (conn, c, &req->caller);
    if (atomic_load (&c->failed)) {
      qcow2_error (c->img, "%s", c->errmsg);
      r = -EIO;
    }
  }
  c->njobs = 0;
  return r;
}

int
qcow2_chunk_fetch (struct qcow2_conn *conn, struct qcow2_io *io,
                   struct chunk *c, size_t clusters_per_job)
{
  int r = qcow2_conn_pread (conn, io, c->staging,
                            c->host_end - c->host_start, c->host_start);

  if (r < 0)
    return r;
  atomic_store (&c->failed, 0);
  c->clusters_per_job = clusters_per_job;
  c->batch.run = run_job;
  c->batch.arg = c;
  c->batch.count = (c->njobs + clusters_per_job - 1) / clusters_per_job;
  return 0;
}

int
qcow2_chunk_flush (struct qcow2_conn *conn, struct request *req,
                   struct qcow2_io *io)
{
  struct qcow2_image *img = qcow2_conn_image (conn);
  struct chunk *c = &req->chunk[req->cur];
  size_t clusters_per_job = MIN_JOB_BYTES / img->header.cluster_size;
  int r;

  if (c->njobs == 0)
    return 0;
  r = qcow2_chunk_fetch (conn, io, c,
                         clusters_per_job ? clusters_per_job : 1);
  if (r < 0) {
    c->njobs = 0;
    return r;
  }

  /* As many reads in progress as there are threads to decode: they keep
   * the CPUs busy already, so decode here rather than wake workers.
   */
  if (atomic_load_explicit (&img->counters.active_reads, memory_order_relaxed) >
      qcow2_conn_workers (conn)) {
    qcow2_pool_run_here (&c->batch, &req->caller);
    c->in_flight = true;        /* qcow2_chunk_finish collects the error */
    return qcow2_chunk_finish (conn, req, c);
  }
  c->in_flight = true;
  qcow2_conn_submit (conn, &c->batch);

  req->cur ^= 1;
  return qcow2_chunk_finish (conn, req, &req->chunk[req->cur]);
}

bool
qcow2_chunk_fits (const struct chunk *c, uint64_t start, uint64_t end,
                  size_t staging)
{
  uint64_t new_end = end > c->host_end ? end : c->host_end;

  return start >= c->host_start && start <= c->host_end + MAX_CHUNK_GAP &&
    new_end - c->host_start <= staging &&
    c->njobs < QCOW2_MAX_CHUNK_CLUSTERS;
}

void
qcow2_chunk_append (struct chunk *c, const struct cluster_map *map,
                    uint64_t guest_offset, uint8_t *dst,
                    uint32_t part_off, uint32_t part_len)
{
  uint64_t start = map->host_offset;
  uint64_t end = start + map->compressed_len;
  struct job *j;

  if (c->njobs == 0) {
    c->host_start = start;
    c->host_end = end;
  }
  else if (end > c->host_end)
    c->host_end = end;

  j = &c->jobs[c->njobs++];
  j->in_off = start - c->host_start;
  j->in_len = map->compressed_len;
  j->key = map->l2_entry;
  j->guest_offset = guest_offset;
  if (dst && part_off == 0 && part_len == c->img->header.cluster_size) {
    j->whole_dst = dst;
    j->part_dst = NULL;
    j->part_off = j->part_len = 0;
  }
  else {
    j->whole_dst = NULL;
    j->part_dst = dst;
    j->part_off = part_off;
    j->part_len = dst ? part_len : 0;
  }
}

int
qcow2_chunk_add (struct qcow2_conn *conn, struct request *req,
                 struct qcow2_io *io, const struct cluster_map *map,
                 uint64_t guest_offset, uint8_t *dst,
                 uint32_t part_off, uint32_t part_len)
{
  struct chunk *c = &req->chunk[req->cur];
  int r;

  if (c->njobs > 0 &&
      !qcow2_chunk_fits (c, map->host_offset,
                         map->host_offset + map->compressed_len,
                         qcow2_staging_size (c->img))) {
    r = qcow2_chunk_flush (conn, req, io);
    if (r < 0)
      return r;
    c = &req->chunk[req->cur];
  }
  qcow2_chunk_append (c, map, guest_offset, dst, part_off, part_len);
  return 0;
}
