/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: chunks of compressed clusters.
 *
 * A read gathers the compressed clusters it meets into a chunk whose
 * compressed bytes lie (nearly) back to back on the host.  The chunk is
 * fetched with one read of at most the staging size into a staging
 * buffer, and its clusters are decoded by the connection's pool, straight
 * into the caller's buffer when the request covers a whole cluster, else
 * through the cluster cache.  A request has two chunks: while the pool
 * decodes one, the calling thread reads the next into the other.
 *
 * Offers: qcow2_chunk_add, qcow2_chunk_flush and qcow2_chunk_finish for
 * the read path; qcow2_chunk_fits, qcow2_chunk_append, qcow2_chunk_fetch
 * and qcow2_chunk_wait for the readahead, which builds its own chunk.
 * Locks: none held.  The caller is registered for a grace period from
 * before it looked up the entries until the last finish, so that the
 * bytes read still belong to those entries (base/inflight.h); a
 * readahead chunk may finish decoding after that (see chunk.generation).
 * Needs: the connection (its pool), host I/O, the codec, the cluster
 * cache.
 */
#ifndef QCOW2_CHUNK_H
#define QCOW2_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"
#include "meta/map.h"

struct qcow2_conn;
struct request;
struct thread_state;

/* One compressed cluster to decode (paths/chunk.c). */
struct job {
  uint32_t in_off;              /* of its data in the staging buffer */
  uint32_t in_len;
  uint8_t *whole_dst;           /* the request covers the cluster: decode here */
  uint8_t *part_dst;            /* else copy part_len bytes from part_off */
  uint32_t part_off, part_len;
  uint64_t key;                 /* L2 entry, the cluster cache key */
  uint64_t guest_offset;        /* for messages */
};

/* Most clusters in one chunk. */
#define QCOW2_MAX_CHUNK_CLUSTERS 1024

/* Compressed clusters whose bytes lie (nearly) back to back on the host,
 * fetched with one read and decoded by the connection's pool
 * (paths/chunk.c).
 */
struct chunk {
  struct qcow2_batch batch;
  struct qcow2_image *img;
  size_t clusters_per_job;
  uint8_t *staging;
  struct job jobs[QCOW2_MAX_CHUNK_CLUSTERS];
  size_t njobs;
  uint64_t host_start, host_end;
  bool in_flight;
  bool readahead;               /* nobody waits: results only go to the cache */
  uint64_t generation;          /* img->free_generation when it was read */
  _Atomic int failed;
  char errmsg[400];
};


/* Add compressed cluster MAP (at GUEST_OFFSET) to the request's current
 * chunk: decoded whole into DST if PART_OFF is 0 and PART_LEN a cluster,
 * else PART_LEN bytes from PART_OFF copied to DST (DST NULL: into the
 * cluster cache only).  A chunk it does not fit in is handed to the pool
 * first (qcow2_chunk_flush).  0, or -errno after logging.
 */
int qcow2_chunk_add (struct qcow2_conn *conn, struct request *req,
                     struct qcow2_io *io, const struct cluster_map *map,
                     uint64_t guest_offset, uint8_t *dst,
                     uint32_t part_off, uint32_t part_len);

/* Fetch the current chunk's bytes and hand it to the pool (or decode it
 * here when enough reads already keep the CPUs busy), then make the
 * other chunk current, waiting for what it still had first.  0, or
 * -errno after logging.
 */
int qcow2_chunk_flush (struct qcow2_conn *conn, struct request *req,
                       struct qcow2_io *io);

/* Wait for chunk C if the pool has it and empty it; returns its decoding
 * error (-EIO, logged).
 */
int qcow2_chunk_finish (struct qcow2_conn *conn, struct request *req,
                        struct chunk *c);

/* Does compressed range [START, END) join chunk C (not empty), within
 * STAGING bytes and the most clusters a chunk holds?
 */
bool qcow2_chunk_fits (const struct chunk *c, uint64_t start, uint64_t end,
                       size_t staging);

/* Add MAP to chunk C as qcow2_chunk_add does, C having room for it. */
void qcow2_chunk_append (struct chunk *c, const struct cluster_map *map,
                         uint64_t guest_offset, uint8_t *dst,
                         uint32_t part_off, uint32_t part_len);

/* Read chunk C's bytes into its staging buffer (through the bytes
 * CONN fetched ahead, paths/conn.h) and set up its batch,
 * CLUSTERS_PER_JOB clusters a job.  0, or -errno after logging.
 */
int qcow2_chunk_fetch (struct qcow2_conn *conn, struct qcow2_io *io,
                       struct chunk *c, size_t clusters_per_job);

/* If chunk C is in the pool's hands, wait for it, helping with
 * CALLER_STATE (NULL: only wait).
 */
void qcow2_chunk_wait (struct qcow2_conn *conn, struct chunk *c,
                       struct thread_state *caller_state);

#endif /* QCOW2_CHUNK_H */
