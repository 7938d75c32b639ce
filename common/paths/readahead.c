/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: decoding ahead of a sequential reader. */

#include <config.h>

#include <pthread.h>

#include "paths/readahead.h"
#include "base/cache.h"
#include "paths/chunk.h"
#include "paths/conn.h"
#include "meta/map.h"
#include "base/lockorder.h"

/* L2 entries looked at, at most (on the stack). */
#define ENTRY_BATCH 512

void
qcow2_readahead (struct qcow2_conn *conn, struct request *req,
                 struct qcow2_io *io, uint64_t first)
{
  struct qcow2_image *img = qcow2_conn_image (conn);
  const uint32_t bits = img->header.cluster_bits;
  uint64_t last_cluster = (img->header.virtual_size - 1) >> bits;
  uint64_t entries[ENTRY_BATCH];
  size_t n = QCOW2_READAHEAD_BYTES >> bits, i;
  struct chunk *c;
  int r;

  if (img->header.virtual_size == 0 || first > last_cluster)
    return;
  c = qcow2_conn_readahead_claim (conn);
  if (c == NULL)
    return;
  qcow2_chunk_wait (conn, c, &req->caller);
  c->njobs = 0;

  if (n == 0)
    n = 1;
  if (n > ENTRY_BATCH)
    n = ENTRY_BATCH;
  if (n > last_cluster - first + 1)
    n = last_cluster - first + 1;
  /* The decoding may outlast the read that started it (and its grace
   * period): what it puts into the cache is checked against releases
   * applied since these entries were looked up.
   */
  qcow2_rwlock_rdlock (&img->lock);
  c->generation = atomic_load (&img->free_generation);
  r = qcow2_l2_entries (img, io, first, &n, entries, NULL, req->l2buf);
  qcow2_rwlock_unlock (&img->lock);
  if (r < 0)
    goto out;
  for (i = 0; i < n && c->njobs < QCOW2_MAX_CHUNK_CLUSTERS; ++i) {
    struct cluster_map map;

    if (qcow2_classify (img, first + i, entries[i], &map) < 0)
      break;
    if (map.kind != CLUSTER_COMPRESSED ||
        qcow2_cache_get (img->cluster_cache, map.l2_entry, 0, NULL, 0))
      continue;
    /* Only what one read underneath fetches. */
    if (c->njobs > 0 &&
        !qcow2_chunk_fits (c, map.host_offset,
                           map.host_offset + map.compressed_len,
                           qcow2_staging_size (img)))
      break;
    qcow2_chunk_append (c, &map, (first + i) << bits, NULL, 0, 0);
  }
  if (c->njobs == 0 || qcow2_chunk_fetch (conn, io, c, 1) < 0)
    goto out;
  c->readahead = true;
  c->in_flight = true;
  qcow2_conn_submit (conn, &c->batch);
 out:
  qcow2_conn_readahead_release (conn);
}
