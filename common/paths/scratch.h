/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the buffers of writes in progress.
 *
 * A write does its copy-on-write, decompression and dedup checks with no
 * image lock held, so each write needs buffers of its own (struct
 * write_scratch, meta/types.h).  The image keeps the ones made so far on
 * a free list: a stream of writes allocates nothing.
 *
 * Offers: qcow2_scratch_get, qcow2_scratch_put, qcow2_scratch_encoder,
 * qcow2_scratch_free_all.
 * Locks: img->scratch_lock, inside each call; any other lock may be held.
 * Needs: the codec (a decoder, and an encoder when asked for), the
 * ciphers (one per write of an encrypted image).
 */
#ifndef QCOW2_SCRATCH_H
#define QCOW2_SCRATCH_H

#include "meta/types.h"

/* Buffers for one write, or NULL after logging.  Give them back with
 * qcow2_scratch_put.
 */
struct write_scratch *qcow2_scratch_get (struct qcow2_image *img);
void qcow2_scratch_put (struct qcow2_image *img, struct write_scratch *ws);

/* WS's encoder, made on first use; NULL after logging. */
struct qcow2_encoder *qcow2_scratch_encoder (struct qcow2_image *img,
                                             struct write_scratch *ws);

/* Free the list (the image is closing: no write is in progress). */
void qcow2_scratch_free_all (struct qcow2_image *img);

#endif /* QCOW2_SCRATCH_H */
