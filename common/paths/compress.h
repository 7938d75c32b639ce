/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: compressing whole clusters, and placing the results.
 *
 * A write of whole clusters with compression on is compressed with no
 * image lock held, one job per cluster, on the image's compressor
 * threads.  Placing the results takes the lock only to decide: where the
 * compressed bytes are packed, which copy of the same data a cluster
 * shares, which plain or zero clusters it becomes.  The compressed bytes
 * and plain data are written with no lock held (the batch's guest
 * clusters claimed meanwhile: base/inflight.h), and the entries point at
 * them under the lock once written.  A copy to share is read back and
 * compared with no lock held, and used only if no release was applied
 * since.  The batches (struct compress_ctx) are the connection's; the
 * write entry fills them.
 *
 * Placing is a policy of the commit protocol (paths/commit.h), a commit
 * per L2 table the batch touches.
 *
 * Offers: qcow2_compress_open, qcow2_compress_free,
 * qcow2_compress_batch_max, qcow2_compress_run, qcow2_compress_place.
 * Locks: qcow2_compress_run without the image lock (it takes the
 * compressors lock alone, then waits on the pool); qcow2_compress_place
 * takes the image lock itself, and is called with no lock held.
 * Needs: the pool, the codec, the dedup table, the allocator (packing),
 * the writeback (L2 tables to change), the claims and grace periods, the
 * data runs and releases of the one-range path, the write buffers.
 */
#ifndef QCOW2_COMPRESS_H
#define QCOW2_COMPRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pthread.h>

#include "meta/image.h"
#include "paths/cluster.h"
#include "paths/scratch.h"

/* A batch of whole clusters to compress on the image's compressor
 * threads (filled by write.c, compressed and placed by
 * paths/compress.c, kept by the connection: paths/conn.c).  RESULT holds
 * for each cluster the compressed length, 0 to store it plain, or:
 */
#define QCOW2_COMPRESS_ALL_ZERO INT64_MIN        /* every byte is zero */
#define QCOW2_COMPRESS_DUPLICATE (INT64_MIN + 1)  /* dedup[i] is to be
                                                     checked and shared */
#define QCOW2_COMPRESS_PENDING (INT64_MIN + 2)    /* sharing failed: to be
                                                     compressed now */
/* In dedup[i]: a copy was tried and held other data, or the tries are
 * used up; try no other.
 */
#define QCOW2_DEDUP_NO_SHARE 1
struct compress_ctx {
  struct compress_ctx *next_free;
  struct qcow2_image *img;
  size_t count;                 /* clusters in this batch */
  size_t capacity;              /* clusters OUT can hold */
  const uint8_t **src;          /* per cluster */
  uint32_t *src_len;            /* < cluster size: zero padded */
  int64_t *result;              /* length, 0: store plain, ALL_ZERO,
                                   DUPLICATE */
  uint64_t *hash;               /* qcow2_dedup_hash; 0: last, partial */
  uint64_t *dedup;              /* an L2 entry that may hold the same
                                   data (the writer looked), 0, or
                                   QCOW2_DEDUP_NO_SHARE */
  uint64_t verified_generation; /* free_generation before the DUPLICATE
                                   clusters' copies were read back */
  /* Placing (paths/compress.c): which clusters are placed, the
   * compressed entry each was given (0: none), and whether the copies
   * were read back once.
   */
  uint8_t *placed;
  uint64_t *entry;
  bool verified;
  uint8_t *out;                 /* capacity * cluster_size */
  _Atomic int failed;
  char errmsg[400];
  pthread_cond_t finished;      /* the compressors finished the batch */
};

/* Most clusters compressed in one batch. */
size_t qcow2_compress_batch_max (const struct qcow2_image *img);

/* Compress CTX's clusters on the image's compressor threads (starting
 * them on first use) and wait for them: CTX->result then says for each
 * cluster what to store.  0, or -errno after logging.
 */
int qcow2_compress_run (struct compress_ctx *ctx);

/* Store the results of CTX, whose clusters are guest clusters FIRST_GC
 * on, with WS's buffers (the same WS on every call for one batch).  Sets
 * RESULT's flags.  CHANGE_NEEDS_ROOM: some are placed, the rest wait for
 * room that a writeback makes; call again with the same batch after it.
 */
enum change_outcome qcow2_compress_place (struct qcow2_image *img,
                                          struct qcow2_io *io,
                                          struct compress_ctx *ctx,
                                          struct write_scratch *ws,
                                          uint64_t first_gc,
                                          struct change_result *result,
                                          int *error);

/* The image's compressor threads, started on first use (images written
 * with compression): qcow2_compress_open, 0 or -ENOMEM after logging.
 */
int qcow2_compress_open (struct qcow2_image *img);
/* Stop the compressor threads and free what compressing kept. */
void qcow2_compress_free (struct qcow2_image *img);

#endif /* QCOW2_COMPRESS_H */
