/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: compressing whole clusters, and placing the results.
 *
 * A write of whole clusters with compression on is compressed before the
 * image lock is taken, one job per cluster, on the image's compressor
 * threads; only placing the results (packing the compressed bytes,
 * sharing a copy of the same data, or storing a cluster plain or as
 * zeros) needs the lock.  The batches (struct compress_ctx) are the
 * connection's; the write entry fills them.
 *
 * Offers: qcow2_compress_batch_max, qcow2_compress_run,
 * qcow2_compress_place, qcow2_compress_free.
 * Locks: qcow2_compress_run without the image lock (it takes the
 * compressors lock alone, then waits on the pool); qcow2_compress_place
 * with it held exclusively.
 * Needs: the pool, the codec, the dedup table, the allocator (packing),
 * the writeback (L2 tables to change), the one-cluster writes.
 */
#ifndef QCOW2_COMPRESS_H
#define QCOW2_COMPRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qcow2-types.h"

/* Most clusters compressed in one batch. */
size_t qcow2_compress_batch_max (const struct qcow2_image *img);

/* Compress CTX's clusters on the image's compressor threads (starting
 * them on first use) and wait for them: CTX->result then says for each
 * cluster what to store.  0, or -errno after logging.
 */
int qcow2_compress_run (struct compress_ctx *ctx);

/* Store the results of CTX, whose clusters are guest clusters FIRST_GC
 * on: the compressed ones first, then those stored plain, from *STEP on
 * (0 the first time).  0, or -errno after logging, or QCOW2_RECLAIM: the
 * steps before *STEP are done, the one at *STEP is not; write back and
 * call again.
 */
int qcow2_compress_place (struct qcow2_image *img, struct qcow2_io *io,
                          struct compress_ctx *ctx, uint64_t first_gc,
                          size_t *step);

/* Stop the compressor threads and free what compressing kept. */
void qcow2_compress_free (struct qcow2_image *img);

#endif /* QCOW2_COMPRESS_H */
