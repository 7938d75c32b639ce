/* qcow2zstd engine: the read path.
 *
 * A read walks the L2 entries of the request in order.  Zero and
 * unallocated clusters are filled in place; runs of normal clusters that
 * are contiguous on the host become one read underneath, straight into
 * the caller's buffer.  Compressed clusters are gathered into a chunk
 * whose compressed bytes lie (nearly) back to back on the host: the chunk
 * is fetched with one read of at most request_size bytes into a staging
 * buffer, and its clusters are decoded by the connection's pool, straight
 * into the caller's buffer when the request covers a whole cluster.  While
 * the pool decodes one chunk the calling thread reads the next one into
 * the second staging buffer.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2-internal.h"
#include "qcow2-codec.h"
#include "qcow2-pool.h"

/* L2 entries fetched at a time (on the stack). */
#define ENTRY_BATCH 512

/* Most clusters in one chunk. */
#define MAX_CHUNK_CLUSTERS 1024

/* Compressed ranges this far apart still share one read underneath: a
 * read of a few wasted KiB is cheaper than a second request.
 */
#define MAX_CHUNK_GAP 4096

/* Decoding one small cluster takes less time than waking a thread, so
 * one job decodes at least this many bytes' worth of clusters.
 */
#define MIN_JOB_BYTES (64 * 1024)

/* One compressed cluster to decode. */
struct job {
  uint32_t in_off;              /* of its data in the staging buffer */
  uint32_t in_len;
  uint8_t *whole_dst;           /* the request covers the cluster: decode here */
  uint8_t *part_dst;            /* else copy part_len bytes from part_off */
  uint32_t part_off, part_len;
  uint64_t key;                 /* L2 entry, the cluster cache key */
  uint64_t guest_offset;        /* for messages */
};

struct chunk {
  struct qcow2_batch batch;
  struct qcow2_image *img;
  size_t clusters_per_job;
  uint8_t *staging;
  struct job jobs[MAX_CHUNK_CLUSTERS];
  size_t njobs;
  uint64_t host_start, host_end;
  bool in_flight;
  bool readahead;               /* nobody waits: results only go to the cache */
  uint64_t generation;          /* img->free_generation when it was read */
  _Atomic int failed;
  char errmsg[400];
};

/* The state of one read in progress.  A connection keeps the ones it
 * made on a free list, so concurrent reads of one connection each get
 * their own without allocating on every request.
 */
struct request {
  struct request *next_free;
  struct chunk chunk[2];
  unsigned cur;
  struct thread_state caller;
  uint8_t *l2buf;

  /* A pending run of host-contiguous normal clusters. */
  uint8_t *run_dst;
  uint64_t run_host, run_len;
};

struct qcow2_conn {
  struct qcow2_image *img;
  struct qcow2_pool *pool;
  size_t staging_size;
  pthread_mutex_t lock;
  struct request *free_list;
  struct compress_ctx *compress_free;

  /* Sequential small reads: decode the next clusters ahead of the client
   * into the cluster cache, in the pool, while the client works.
   */
  _Atomic uint64_t last_end;
  pthread_mutex_t ra_lock;
  struct chunk *ra;
};

void *
qcow2_thread_state_new (void *arg)
{
  struct qcow2_image *img = arg;
  struct thread_state *ts = calloc (1, sizeof *ts);

  if (ts == NULL)
    return NULL;
  ts->dec = qcow2_decoder_new ();
  ts->scratch = malloc (img->header.cluster_size);
  if (ts->dec == NULL || ts->scratch == NULL) {
    qcow2_decoder_free (ts->dec);
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
  free (ts->scratch);
  free (ts);
}

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
  atomic_fetch_add_explicit (&img->clusters_decompressed, 1,
                             memory_order_relaxed);
  if (j->whole_dst == NULL) {
    if (j->part_len)
      memcpy (j->part_dst, out + j->part_off, j->part_len);
    /* A readahead runs without the image lock: the clusters may have
     * been released since it read them.
     */
    if (c->readahead)
      qcow2_cache_put_if (img->cluster_cache, j->key, out,
                          &img->free_generation, c->generation);
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

static void
request_free (struct request *req)
{
  if (req == NULL)
    return;
  free (req->chunk[0].staging);
  free (req->chunk[1].staging);
  free (req->l2buf);
  qcow2_decoder_free (req->caller.dec);
  free (req->caller.scratch);
  free (req);
}

struct request *
qcow2_request_get (struct qcow2_conn *conn)
{
  struct qcow2_image *img = conn->img;
  struct request *req;
  struct thread_state *ts;
  unsigned i;

  pthread_mutex_lock (&conn->lock);
  req = conn->free_list;
  if (req)
    conn->free_list = req->next_free;
  pthread_mutex_unlock (&conn->lock);
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
  ts = qcow2_thread_state_new (img);
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

void
qcow2_request_put (struct qcow2_conn *conn, struct request *req)
{
  pthread_mutex_lock (&conn->lock);
  req->next_free = conn->free_list;
  conn->free_list = req;
  pthread_mutex_unlock (&conn->lock);
}

struct qcow2_image *
qcow2_conn_image (struct qcow2_conn *conn)
{
  return conn->img;
}

struct qcow2_pool *
qcow2_conn_pool (struct qcow2_conn *conn)
{
  return conn->pool;
}

struct compress_ctx **
qcow2_conn_compress_free (struct qcow2_conn *conn)
{
  return &conn->compress_free;
}

pthread_mutex_t *
qcow2_conn_lock (struct qcow2_conn *conn)
{
  return &conn->lock;
}

struct thread_state *
qcow2_request_caller (struct request *req)
{
  return &req->caller;
}

struct qcow2_conn *
qcow2_conn_new (struct qcow2_image *img)
{
  struct qcow2_conn *conn = calloc (1, sizeof *conn);

  if (conn == NULL) {
    qcow2_error (img, "out of memory for a connection");
    return NULL;
  }
  conn->img = img;
  pthread_mutex_init (&conn->lock, NULL);
  pthread_mutex_init (&conn->ra_lock, NULL);
  /* A staging buffer holds at least the largest compressed range one
   * descriptor can name: 2^(cluster_bits-8) sectors of 512 bytes.
   */
  conn->staging_size = img->opts.request_size;
  if (conn->staging_size < 2 * (uint64_t) img->header.cluster_size)
    conn->staging_size = 2 * (uint64_t) img->header.cluster_size;
  conn->pool = qcow2_pool_new (img->opts.threads, qcow2_thread_state_new,
                                 thread_state_free, img);
  if (conn->pool == NULL) {
    qcow2_error (img, "cannot start %u worker threads", img->opts.threads);
    pthread_mutex_destroy (&conn->lock);
    free (conn);
    return NULL;
  }
  return conn;
}

void
qcow2_conn_free (struct qcow2_conn *conn)
{
  struct request *req;

  if (conn == NULL)
    return;
  if (conn->ra) {
    if (conn->ra->in_flight) {
      req = qcow2_request_get (conn);
      qcow2_pool_wait (conn->pool, &conn->ra->batch,
                       req ? &req->caller : NULL);
      if (req)
        qcow2_request_put (conn, req);
    }
    free (conn->ra->staging);
    free (conn->ra);
  }
  pthread_mutex_destroy (&conn->ra_lock);
  qcow2_pool_free (conn->pool);
  qcow2_compress_ctx_free_all (conn);
  while ((req = conn->free_list) != NULL) {
    conn->free_list = req->next_free;
    request_free (req);
  }
  pthread_mutex_destroy (&conn->lock);
  free (conn);
}

/* Wait for chunk C if the pool has it; returns its error. */
static int
chunk_finish (struct qcow2_conn *conn, struct request *req,
              struct chunk *c)
{
  int r = 0;

  if (c->in_flight) {
    qcow2_pool_wait (conn->pool, &c->batch, &req->caller);
    c->in_flight = false;
    qcow2_debug_if (conn->img, QCOW2_DEBUG_POOL,
                    "pool: %zu clusters in %zu jobs, %zu run by the calling "
                    "thread, %zu by %u workers", c->njobs, c->batch.count,
                    c->batch.run_by_waiter,
                    c->batch.count - c->batch.run_by_waiter,
                    qcow2_pool_threads (conn->pool));
    if (atomic_load (&c->failed)) {
      qcow2_error (conn->img, "%s", c->errmsg);
      r = -EIO;
    }
  }
  c->njobs = 0;
  return r;
}

/* Read the current chunk's compressed bytes and hand it to the pool,
 * then make the other chunk current (waiting for it first if needed).
 */
static int
chunk_flush (struct qcow2_conn *conn, struct request *req,
             struct qcow2_io *io)
{
  struct qcow2_image *img = conn->img;
  struct chunk *c = &req->chunk[req->cur];
  int r;

  if (c->njobs == 0)
    return 0;
  r = qcow2_pread_clamped (img, io, c->staging, c->host_end - c->host_start,
                           c->host_start);
  if (r < 0) {
    c->njobs = 0;
    return r;
  }
  atomic_store (&c->failed, 0);
  c->clusters_per_job = MIN_JOB_BYTES / img->header.cluster_size;
  if (c->clusters_per_job == 0)
    c->clusters_per_job = 1;
  c->batch.run = run_job;
  c->batch.arg = c;
  c->batch.count = (c->njobs + c->clusters_per_job - 1) / c->clusters_per_job;

  /* As many reads in progress as there are threads to decode: they keep
   * the CPUs busy already, so decode here rather than wake workers.
   */
  if (atomic_load_explicit (&img->active_reads, memory_order_relaxed) >
      qcow2_pool_threads (conn->pool)) {
    qcow2_pool_run_here (&c->batch, &req->caller);
    c->in_flight = true;        /* chunk_finish collects the error */
    return chunk_finish (conn, req, c);
  }
  c->in_flight = true;
  qcow2_pool_submit (conn->pool, &c->batch);

  req->cur ^= 1;
  return chunk_finish (conn, req, &req->chunk[req->cur]);
}

static int
add_compressed (struct qcow2_conn *conn, struct request *req,
                struct qcow2_io *io, const struct cluster_map *map,
                uint64_t guest_offset, uint8_t *dst,
                uint32_t part_off, uint32_t part_len)
{
  struct qcow2_image *img = conn->img;
  struct chunk *c = &req->chunk[req->cur];
  uint64_t start = map->host_offset;
  uint64_t end = start + map->compressed_len;
  struct job *j;
  int r;

  if (c->njobs > 0) {
    uint64_t new_end = end > c->host_end ? end : c->host_end;
    if (start < c->host_start || start > c->host_end + MAX_CHUNK_GAP ||
        new_end - c->host_start > conn->staging_size ||
        c->njobs == MAX_CHUNK_CLUSTERS) {
      r = chunk_flush (conn, req, io);
      if (r < 0)
        return r;
      c = &req->chunk[req->cur];
    }
  }
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
  if (dst && part_off == 0 && part_len == img->header.cluster_size) {
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
  return 0;
}

static int
run_flush (struct qcow2_image *img, struct request *req, struct qcow2_io *io)
{
  int r = 0;

  if (req->run_len)
    r = qcow2_pread_clamped (img, io, req->run_dst, req->run_len,
                             req->run_host);
  req->run_len = 0;
  return r;
}

static int
add_normal (struct qcow2_conn *conn, struct request *req,
            struct qcow2_io *io, uint64_t host, uint8_t *dst, uint64_t len)
{
  int r;

  if (req->run_len && req->run_host + req->run_len == host &&
      req->run_dst + req->run_len == dst &&
      req->run_len + len <= conn->img->opts.request_size) {
    req->run_len += len;
    return 0;
  }
  r = run_flush (conn->img, req, io);
  req->run_host = host;
  req->run_dst = dst;
  req->run_len = len;
  return r;
}

/* With extended L2 entries, read [LO, HI) of the cluster at CSTART
 * (normal or unallocated, MAP) into DST subcluster by subcluster:
 * allocated ones from the host cluster, zero ones as zeros, the rest from
 * the backing file or as zeros.  Runs of alike subclusters go together.
 */
static int
read_subclusters (struct qcow2_conn *conn, struct request *req,
                  struct qcow2_io *io, const struct cluster_map *map,
                  uint64_t bitmap, uint64_t cstart, uint64_t lo, uint64_t hi,
                  uint8_t *dst)
{
  struct qcow2_image *img = conn->img;
  const uint64_t sub_size = img->header.cluster_size / 32;
  uint64_t pos = lo;
  int r = 0;

  while (pos < hi && r == 0) {
    unsigned x = (pos - cstart) / sub_size;
    bool allocated = bitmap & (UINT64_C (1) << x);
    bool zero = bitmap & (UINT64_C (1) << (32 + x));
    uint64_t end = cstart + (x + 1) * sub_size;
    uint8_t *d = dst + (pos - lo);

    /* Take in the following subclusters of the same kind. */
    while (end < hi) {
      unsigned y = (end - cstart) / sub_size;
      if (!!(bitmap & (UINT64_C (1) << y)) != allocated ||
          !!(bitmap & (UINT64_C (1) << (32 + y))) != zero)
        break;
      end += sub_size;
    }
    if (end > hi)
      end = hi;
    if (allocated)
      r = add_normal (conn, req, io, map->host_offset + (pos - cstart),
                      d, end - pos);
    else if (!zero && img->backing)
      r = qcow2_backing_read (img, d, end - pos, pos);
    else
      memset (d, 0, end - pos);
    pos = end;
  }
  return r;
}

/* Guest bytes decoded ahead of a sequential reader. */
#define READAHEAD_BYTES (256 * 1024)

/* Start decoding the compressed clusters from guest cluster FIRST on
 * (READAHEAD_BYTES' worth) that are not cached yet, without waiting for
 * them.  Called with the image lock held (shared), so the L2 entries and
 * the compressed bytes it reads are consistent; the decoding itself may
 * finish after the lock is gone, hence the generation check on the way
 * into the cache.
 */
static void
readahead (struct qcow2_conn *conn, struct request *req,
           struct qcow2_io *io, uint64_t first)
{
  struct qcow2_image *img = conn->img;
  const uint32_t bits = img->header.cluster_bits;
  uint64_t last_cluster = (img->header.virtual_size - 1) >> bits;
  uint64_t entries[ENTRY_BATCH];
  size_t n = READAHEAD_BYTES >> bits, i;
  struct chunk *c;

  if (img->header.virtual_size == 0 || first > last_cluster ||
      pthread_mutex_trylock (&conn->ra_lock) != 0)
    return;
  if (conn->ra == NULL) {
    conn->ra = calloc (1, sizeof *conn->ra);
    if (conn->ra &&
        (conn->ra->staging = malloc (conn->staging_size)) == NULL) {
      free (conn->ra);
      conn->ra = NULL;
    }
    if (conn->ra == NULL)
      goto out;
    conn->ra->img = img;
  }
  c = conn->ra;
  if (c->in_flight) {
    qcow2_pool_wait (conn->pool, &c->batch, &req->caller);
    c->in_flight = false;
    qcow2_debug_if (conn->img, QCOW2_DEBUG_POOL,
                    "pool: %zu clusters in %zu jobs, %zu run by the calling "
                    "thread, %zu by %u workers", c->njobs, c->batch.count,
                    c->batch.run_by_waiter,
                    c->batch.count - c->batch.run_by_waiter,
                    qcow2_pool_threads (conn->pool));
  }
  c->njobs = 0;

  if (n == 0)
    n = 1;
  if (n > ENTRY_BATCH)
    n = ENTRY_BATCH;
  if (n > last_cluster - first + 1)
    n = last_cluster - first + 1;
  if (qcow2_l2_entries (img, io, first, &n, entries, NULL, req->l2buf) < 0)
    goto out;
  for (i = 0; i < n && c->njobs < MAX_CHUNK_CLUSTERS; ++i) {
    struct cluster_map map;
    struct job *j;

    if (qcow2_classify (img, first + i, entries[i], &map) < 0)
      break;
    if (map.kind != CLUSTER_COMPRESSED ||
        qcow2_cache_get (img->cluster_cache, map.l2_entry, 0, NULL, 0))
      continue;
    if (c->njobs == 0) {
      c->host_start = map.host_offset;
      c->host_end = map.host_offset + map.compressed_len;
    }
    else if (map.host_offset < c->host_start ||
             map.host_offset > c->host_end + MAX_CHUNK_GAP ||
             map.host_offset + map.compressed_len - c->host_start >
             conn->staging_size)
      break;                    /* only what one read underneath fetches */
    else if (map.host_offset + map.compressed_len > c->host_end)
      c->host_end = map.host_offset + map.compressed_len;
    j = &c->jobs[c->njobs++];
    j->in_off = map.host_offset - c->host_start;
    j->in_len = map.compressed_len;
    j->whole_dst = j->part_dst = NULL;
    j->part_off = j->part_len = 0;
    j->key = map.l2_entry;
    j->guest_offset = (first + i) << bits;
  }
  if (c->njobs == 0 ||
      qcow2_pread_clamped (img, io, c->staging, c->host_end - c->host_start,
                           c->host_start) < 0)
    goto out;
  atomic_store (&c->failed, 0);
  c->readahead = true;
  c->generation = atomic_load (&img->free_generation);
  c->clusters_per_job = 1;
  c->batch.run = run_job;
  c->batch.arg = c;
  c->batch.count = c->njobs;
  c->in_flight = true;
  qcow2_pool_submit (conn->pool, &c->batch);
 out:
  pthread_mutex_unlock (&conn->ra_lock);
}

/* The read path; with BUF NULL it only fills the cluster cache with the
 * compressed clusters of the range that are not in it yet.
 */
static int
read_range (struct qcow2_conn *conn, struct qcow2_io *io,
            uint8_t *buf, uint64_t count, uint64_t offset)
{
  struct qcow2_image *img = conn->img;
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  const uint64_t end = offset + count;
  uint64_t entries[ENTRY_BATCH], bitmaps[ENTRY_BATCH];
  uint64_t pos = offset;
  uint64_t kinds[4] = { 0 }, cache_hits = 0;
  struct request *req;
  int r = 0, r2;

  if (count == 0)
    return 0;
  if (offset > img->header.virtual_size ||
      count > img->header.virtual_size - offset) {
    qcow2_error (img, "read of %" PRIu64 " bytes at %" PRIu64
                 " is beyond the virtual size %" PRIu64,
                 count, offset, img->header.virtual_size);
    return -EINVAL;
  }
  req = qcow2_request_get (conn);
  if (req == NULL)
    return -ENOMEM;
  req->cur = 0;
  req->run_len = 0;
  atomic_fetch_add_explicit (&img->active_reads, 1, memory_order_relaxed);
  pthread_rwlock_rdlock (&img->lock);

  while (pos < end && r == 0) {
    uint64_t first = pos >> bits;
    uint64_t last = (end - 1) >> bits;
    size_t n = last - first + 1 < ENTRY_BATCH ? last - first + 1 : ENTRY_BATCH;
    size_t i;

    r = qcow2_l2_entries (img, io, first, &n, entries, bitmaps, req->l2buf);
    for (i = 0; i < n && r == 0; ++i) {
      uint64_t cstart = (first + i) << bits;
      uint64_t lo = pos > cstart ? pos : cstart;
      uint64_t hi = end < cstart + cluster_size ? end : cstart + cluster_size;
      uint8_t *dst = buf ? buf + (lo - offset) : NULL;
      struct cluster_map map;

      r = qcow2_classify (img, first + i, entries[i], &map);
      if (r == 0 && img->header.extended_l2)
        r = qcow2_check_bitmap (img, first + i, &map, bitmaps[i]);
      if (r < 0)
        break;
      kinds[map.kind]++;
      if (img->header.extended_l2 && map.kind != CLUSTER_COMPRESSED) {
        if (buf)
          r = read_subclusters (conn, req, io, &map, bitmaps[i], cstart,
                                lo, hi, buf + (lo - offset));
        pos = hi;
        continue;
      }
      switch (map.kind) {
      case CLUSTER_UNALLOCATED:
        if (dst && img->backing) {
          r = qcow2_backing_read (img, dst, hi - lo, lo);
          break;
        }
        __attribute__ ((fallthrough));
      case CLUSTER_ZERO:
        if (dst)
          memset (dst, 0, hi - lo);
        break;
      case CLUSTER_NORMAL:
        if (dst)
          r = add_normal (conn, req, io, map.host_offset + (lo - cstart),
                          dst, hi - lo);
        break;
      case CLUSTER_COMPRESSED:
        /* Served from the cluster cache if it is there (prefetched, or
         * read in parts before).  Otherwise a whole cluster is decoded
         * straight into the caller's buffer, and a part of one goes
         * through the cache, for the reads of its other parts.
         */
        if (qcow2_cache_get (img->cluster_cache, map.l2_entry, lo - cstart,
                             dst, dst ? hi - lo : 0)) {
          cache_hits++;
          break;
        }
        if (dst && hi - lo == cluster_size) {
          r = add_compressed (conn, req, io, &map, cstart, dst,
                              0, cluster_size);
          break;
        }
        r = add_compressed (conn, req, io, &map, cstart, dst,
                            lo - cstart, hi - lo);
        break;
      }
      pos = hi;
    }
  }

  r2 = run_flush (img, req, io);
  if (r == 0)
    r = r2;
  if (r == 0)
    r = chunk_flush (conn, req, io);
  /* A small read that continues the previous one and enters a new
   * cluster: keep the next clusters decoding ahead of the client.
   */
  if (r == 0 && buf && count < READAHEAD_BYTES &&
      qcow2_pool_threads (conn->pool) > 0 &&
      atomic_load (&conn->last_end) == offset &&
      (offset & (cluster_size - 1)) < count)
    readahead (conn, req, io, ((end - 1) >> bits) + 1);
  atomic_store (&conn->last_end, end);
  qcow2_debug_if (img, QCOW2_DEBUG_MAP,
                  "%s 0x%" PRIx64 "+%" PRIu64 ": %" PRIu64 " unallocated%s, %"
                  PRIu64 " zero, %" PRIu64 " normal, %" PRIu64 " compressed (%"
                  PRIu64 " from the cluster cache)%s",
                  buf ? "read" : "cache", offset, count,
                  kinds[CLUSTER_UNALLOCATED],
                  img->backing ? " (from the backing file)" : "",
                  kinds[CLUSTER_ZERO], kinds[CLUSTER_NORMAL],
                  kinds[CLUSTER_COMPRESSED], cache_hits, r ? ": failed" : "");
  /* Whatever happened, no chunk may still be in the pool's hands. */
  r2 = chunk_finish (conn, req, &req->chunk[0]);
  if (r == 0)
    r = r2;
  r2 = chunk_finish (conn, req, &req->chunk[1]);
  if (r == 0)
    r = r2;
  pthread_rwlock_unlock (&img->lock);
  atomic_fetch_sub_explicit (&img->active_reads, 1, memory_order_relaxed);
  qcow2_request_put (conn, req);
  return r;
}

int
qcow2_read (struct qcow2_conn *conn, struct qcow2_io *io,
            void *buf, uint64_t count, uint64_t offset)
{
  return read_range (conn, io, buf, count, offset);
}

int
qcow2_prefetch (struct qcow2_conn *conn, struct qcow2_io *io,
                uint64_t offset, uint64_t count)
{
  return read_range (conn, io, NULL, count, offset);
}

int
qcow2_extents (struct qcow2_conn *conn, struct qcow2_io *io,
               uint64_t offset, uint64_t count,
               qcow2_extent_fn fn, void *opaque)
{
  struct qcow2_image *img = conn->img;
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t end = offset + count;
  uint64_t entries[ENTRY_BATCH], bitmaps[ENTRY_BATCH];
  uint64_t pos = offset, run_start = offset;
  bool run_zero = false;
  struct request *req;
  int r = 0;

  if (count == 0)
    return 0;
  req = qcow2_request_get (conn);
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
  qcow2_request_put (conn, req);
  return r;
}
