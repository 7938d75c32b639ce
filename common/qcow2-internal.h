/* qcow2zstd engine: state shared by the engine's own files. */
#ifndef QCOW2_INTERNAL_H
#define QCOW2_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "qcow2.h"
#include "qcow2-cache.h"
#include "qcow2-entries.h"
#include "qcow2-hostio.h"
#include "qcow2-map.h"
#include "qcow2-backing.h"
#include "qcow2-conn.h"
#include "qcow2-writeback.h"
#include "qcow2-refcount.h"
#include "qcow2-alloc.h"
#include "qcow2-tablemap.h"
#include "qcow2-types.h"
#include <pthread.h>
#include <inttypes.h>

/* Compress CTX's clusters on the image's compressor threads (starting
 * them on first use) and wait for them.
 */
int qcow2_compress_run (struct compress_ctx *ctx);
/* Most clusters compressed in one batch. */
size_t qcow2_compress_batch_max (const struct qcow2_image *img);

/* Sharing compressed clusters with the same data (qcow2-dedup.c). */
uint64_t qcow2_dedup_hash (const uint8_t *data, size_t len);
/* The table, sized by the disk; 0 or -ENOMEM after logging. */
int qcow2_dedup_init (struct qcow2_image *img);
void qcow2_dedup_free (struct qcow2_image *img);
/* The compressed L2 entry last stored with data of hash HASH, or 0. */
uint64_t qcow2_dedup_find (struct qcow2_image *img, uint64_t hash);
void qcow2_dedup_remember (struct qcow2_image *img, uint64_t hash,
                           uint64_t entry);
/* Under the image lock: if compressed L2 ENTRY still holds exactly SRC
 * (SRC_LEN bytes, zero padded to a cluster) and each host cluster it
 * touches can take one more reference, add those references and return
 * 1; 0 if it cannot be shared; a negative errno on an I/O error.
 * Uses img->wbuf and img->wcompressed.
 */
int qcow2_dedup_share (struct qcow2_image *img, struct qcow2_io *io,
                       uint64_t guest_cluster, uint64_t entry,
                       const uint8_t *src, uint32_t src_len);

#endif /* QCOW2_INTERNAL_H */
