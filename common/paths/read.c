/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the read path.
 *
 * A read walks the L2 entries of the request in order.  Zero and
 * unallocated clusters are filled in place (or from the backing file);
 * runs of normal clusters that are contiguous on the host become one
 * read underneath, straight into the caller's buffer; compressed
 * clusters go into chunks (paths/chunk.h) that the connection's pool
 * decodes.  A small read that continues the previous one starts the
 * readahead (paths/readahead.h).  In an encrypted image each run is
 * decrypted on the pool while the next one is read (paths/encrypt.h).
 *
 * Implements qcow2_read and qcow2_prefetch (qcow2.h, the contract).  The
 * image lock is held shared only while a batch of L2 entries is fetched;
 * the reads underneath, the decoding and the backing file's reads run
 * without it.  The read is registered for a grace period from its first
 * lookup until its last read underneath (and its last decode into the
 * cluster cache), so that no cluster it looked up is handed out again
 * meanwhile (base/inflight.h).  A read therefore never waits for a
 * write's data, nor for a writeback's I/O.
 */

#include <config.h>

#include "qcow2.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "base/cache.h"
#include "paths/chunk.h"
#include "paths/conn.h"
#include "paths/encrypt.h"
#include "paths/run.h"
#include "meta/hostio.h"
#include "meta/log.h"
#include "base/inflight.h"
#include "meta/map.h"
#include "paths/readahead.h"
#include "base/lockorder.h"

/* L2 entries fetched at a time (on the stack). */
#define ENTRY_BATCH 512

/* One read in progress. */
struct read_ctx {
  struct qcow2_image *img;
  struct qcow2_conn *conn;
  struct qcow2_io *io;
  struct request *req;
  struct data_run run;          /* host-contiguous normal clusters */
};

/* The mover of a request's read runs: read the run.  In an encrypted
 * image its decryption then goes to the pool, while the caller reads on;
 * the previous run's must be over first, as the request has one batch
 * for it.
 */
static int
read_mover (struct data_run *run, void *opaque)
{
  struct read_ctx *rc = opaque;
  struct qcow2_image *img = rc->img;
  struct request *req = rc->req;
  int r = img->data_io
    ? qcow2_pread_data (img, rc->io, run->buf, run->len, run->host)
    : qcow2_conn_pread (rc->conn, rc->io, run->buf, run->len, run->host);

  if (qcow2_image_encrypted (img)) {
    int r2 = qcow2_encrypt_finish (rc->conn, &req->crypt, &req->caller);
    if (r == 0)
      r = r2;
    if (r == 0)
      qcow2_encrypt_start (rc->conn, &req->crypt, &req->caller, false,
                           run->buf, run->len, run->host);
  }
  return r;
}

/* Part of a sector of an encrypted image: decrypt the sectors around it
 * in the calling thread's scratch.
 */
static int
read_sectors_around (struct qcow2_image *img, struct request *req,
                     struct qcow2_io *io, uint64_t host, uint8_t *dst,
                     uint64_t len)
{
  uint64_t start = host & ~UINT64_C (511);
  uint64_t end = (host + len + 511) & ~UINT64_C (511);
  int r = qcow2_pread_data (img, io, req->caller.scratch, end - start,
                            start);

  if (r == 0)
    r = qcow2_encrypt_here (img, req->caller.cipher, false,
                            req->caller.scratch, end - start, start);
  if (r == 0)
    memcpy (dst, req->caller.scratch + (host - start), len);
  return r;
}

/* LEN bytes of a normal cluster at HOST, for DST. */
static int
add_normal (struct read_ctx *rc, uint64_t host, uint8_t *dst, uint64_t len)
{
  struct qcow2_image *img = rc->img;

  if (qcow2_image_encrypted (img) && ((host | len) & 511)) {
    int r = qcow2_run_flush (&rc->run);
    if (r == 0)
      r = read_sectors_around (img, rc->req, rc->io, host, dst, len);
    return r;
  }
  return qcow2_run_add (&rc->run, dst, host, len);
}

/* With extended L2 entries, read [LO, HI) of the cluster at CSTART
 * (normal or unallocated, MAP) into DST subcluster by subcluster:
 * allocated ones from the host cluster, zero ones as zeros, the rest from
 * the backing file or as zeros.  Runs of alike subclusters go together.
 */
static int
read_subclusters (struct read_ctx *rc, const struct cluster_map *map,
                  uint64_t bitmap, uint64_t cstart, uint64_t lo, uint64_t hi,
                  uint8_t *dst)
{
  struct qcow2_image *img = rc->img;
  uint64_t pos, end;
  int r = 0;

  for (pos = lo - cstart; pos < hi - cstart && r == 0; pos = end) {
    uint8_t *d = dst + (cstart + pos - lo);

    switch (qcow2_subcluster_run (img, map, bitmap, pos, hi - cstart, &end)) {
    case SUB_HOST:
      r = add_normal (rc, map->host_offset + pos, d, end - pos);
      break;
    case SUB_BACKING:
      r = img->read_backing (img, d, end - pos, cstart + pos);
      break;
    case SUB_ZEROS:
      memset (d, 0, end - pos);
      break;
    }
  }
  return r;
}

/* The read path; with BUF NULL it only fills the cluster cache with the
 * compressed clusters of the range that are not in it yet.
 */
static int
read_range (struct qcow2_conn *conn, struct qcow2_io *io,
            uint8_t *buf, uint64_t count, uint64_t offset)
{
  struct qcow2_image *img = qcow2_conn_image (conn);
  struct read_ctx rc = { .img = img, .conn = conn, .io = io };
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  const uint64_t end = offset + count;
  uint64_t entries[ENTRY_BATCH], bitmaps[ENTRY_BATCH];
  uint64_t pos = offset;
  uint64_t kinds[4] = { 0 }, cache_hits = 0;
  struct qcow2_inflight_op reg;
  bool registered = false;
  struct request *req;
  int r = 0, r2;

  if (count == 0)
    return 0;
  r = qcow2_guest_range_check (img, "read", count, offset);
  if (r < 0)
    return r;
  req = qcow2_conn_request_get (conn);
  if (req == NULL)
    return -ENOMEM;
  req->cur = 0;
  rc.req = req;
  rc.run = qcow2_run_new (img->opts.request_size, read_mover, &rc);
  atomic_fetch_add_explicit (&img->counters.active_reads, 1,
                             memory_order_relaxed);

  while (pos < end && r == 0) {
    uint64_t first = pos >> bits;
    uint64_t last = (end - 1) >> bits;
    size_t n = last - first + 1 < ENTRY_BATCH ? last - first + 1 : ENTRY_BATCH;
    size_t i;

    qcow2_rwlock_rdlock (&img->lock);
    if (!registered) {
      qcow2_inflight_enter (&img->inflight, &reg);
      registered = true;
    }
    r = qcow2_l2_entries (img, io, first, &n, entries, bitmaps, req->l2buf);
    qcow2_rwlock_unlock (&img->lock);
    for (i = 0; i < n && r == 0; ++i) {
      uint64_t cstart = (first + i) << bits;
      uint64_t lo = pos > cstart ? pos : cstart;
      uint64_t hi = end < cstart + cluster_size ? end : cstart + cluster_size;
      uint8_t *dst = buf ? buf + (lo - offset) : NULL;
      struct cluster_map map;

      r = qcow2_classify_fetched (img, first, i, entries, bitmaps, &map);
      if (r < 0)
        break;
      kinds[map.kind]++;
      if (img->header.extended_l2 && map.kind != CLUSTER_COMPRESSED) {
        if (buf)
          r = read_subclusters (&rc, &map, bitmaps[i], cstart, lo, hi,
                                buf + (lo - offset));
        pos = hi;
        continue;
      }
      switch (map.kind) {
      case CLUSTER_UNALLOCATED:
        if (dst && img->backing) {
          r = img->read_backing (img, dst, hi - lo, lo);
          break;
        }
        __attribute__ ((fallthrough));
      case CLUSTER_ZERO:
        if (dst)
          memset (dst, 0, hi - lo);
        break;
      case CLUSTER_NORMAL:
        if (dst)
          r = add_normal (&rc, map.host_offset + (lo - cstart), dst,
                          hi - lo);
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
          r = qcow2_chunk_add (conn, req, io, &map, cstart, dst,
                               0, cluster_size);
          break;
        }
        r = qcow2_chunk_add (conn, req, io, &map, cstart, dst,
                             lo - cstart, hi - lo);
        break;
      }
      pos = hi;
    }
  }

  r2 = qcow2_run_flush (&rc.run);
  if (r == 0)
    r = r2;
  r2 = qcow2_encrypt_finish (conn, &req->crypt, &req->caller);
  if (r == 0)
    r = r2;
  if (r == 0)
    r = qcow2_chunk_flush (conn, req, io);
  /* A small read that continues the previous one and enters a new
   * cluster: keep the next clusters decoding ahead of the client.
   */
  if (qcow2_conn_continues (conn, offset, end) && r == 0 && buf &&
      count < QCOW2_READAHEAD_BYTES && qcow2_conn_workers (conn) > 0 &&
      (offset & (cluster_size - 1)) < count)
    qcow2_readahead (conn, req, io, ((end - 1) >> bits) + 1);
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
  r2 = qcow2_chunk_finish (conn, req, &req->chunk[0]);
  if (r == 0)
    r = r2;
  r2 = qcow2_chunk_finish (conn, req, &req->chunk[1]);
  if (r == 0)
    r = r2;
  if (registered)
    qcow2_inflight_leave (&img->inflight, &reg);
  atomic_fetch_sub_explicit (&img->counters.active_reads, 1,
                             memory_order_relaxed);
  qcow2_conn_request_put (conn, req);
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
