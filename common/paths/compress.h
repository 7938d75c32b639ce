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
 * Offers: qcow2_compress_batch_max, qcow2_compress_run,
 * qcow2_compress_place, qcow2_compress_free.
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

#include "paths/cluster.h"
#include "meta/types.h"

/* Most clusters compressed in one batch. */
size_t qcow2_compress_batch_max (const struct qcow2_image *img);

/* Compress CTX's clusters on the image's compressor threads (starting
 * them on first use) and wait for them: CTX->result then says for each
 * cluster what to store.  0, or -errno after logging.
 */
int qcow2_compress_run (struct compress_ctx *ctx);

/* Store the results of CTX, whose clusters are guest clusters FIRST_GC
 * on: the compressed ones first, then those stored plain, from *STEP on
 * (0 the first time), with WS's buffers (the same WS on every call for
 * one batch).  Sets RESULT's flags.  0, or -errno after logging, or
 * QCOW2_RECLAIM: the steps before *STEP are done, the one at *STEP is
 * not; write back and call again.
 */
int qcow2_compress_place (struct qcow2_image *img, struct qcow2_io *io,
                          struct compress_ctx *ctx, struct write_scratch *ws,
                          uint64_t first_gc, size_t *step,
                          struct change_result *result);

/* Stop the compressor threads and free what compressing kept. */
void qcow2_compress_free (struct qcow2_image *img);

#endif /* QCOW2_COMPRESS_H */
