/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the buffers of writes in progress.
 *
 * A write does its copy-on-write, decompression and dedup checks with no
 * image lock held, so each write needs buffers of its own (struct
 * write_scratch).  The image keeps the ones made so far on a free list
 * (img->scratch, this module's): a stream of writes allocates nothing.
 * It also keeps one cluster of zeros that nothing writes.
 *
 * Offers: qcow2_scratch_open, qcow2_scratch_close, qcow2_scratch_get,
 * qcow2_scratch_put, qcow2_scratch_encoder, qcow2_scratch_zeros.
 * Locks: the list's lock, a leaf, inside each call; any other lock may
 * be held.
 * Needs: the codec (a decoder, and an encoder when asked for), the
 * ciphers (one per write of an encrypted image).
 */
#ifndef QCOW2_SCRATCH_H
#define QCOW2_SCRATCH_H

#include "meta/image.h"
#include "paths/commit.h"

struct qcow2_decoder;
struct qcow2_encoder;
struct qcow2_sector_cipher;

/* What one write uses outside the image lock; the image keeps them on
 * a free list (paths/scratch.c), so a write allocates nothing.
 */
struct write_scratch {
  struct write_scratch *next_free;
  uint8_t *cow[2];            /* a cluster each: old content around
                                 the new bytes */
  uint8_t *compressed;        /* the largest compressed range */
  uint8_t *l2buf;             /* a cluster: an L2 table read for a lookup */
  struct qcow2_decoder *dec;
  struct qcow2_encoder *enc;  /* made on first use */
  /* Encrypted images only: this write's cipher, and a cluster to encrypt
   * into what has no request buffer (zeroes) on this thread.
   */
  struct qcow2_sector_cipher *cipher;
  uint8_t *sealed;
  /* A commit's lookup and decisions (paths/commit.h). */
  uint64_t entries[QCOW2_COMMIT_MAX];
  uint64_t bitmaps[QCOW2_COMMIT_MAX];
  struct commit_cluster piece[QCOW2_COMMIT_MAX];
};


/* Make the free list and the cluster of zeros (images opened for
 * writing), and free them (no write is in progress then).
 * qcow2_scratch_open: 0, or -ENOMEM after logging.
 */
int qcow2_scratch_open (struct qcow2_image *img);
void qcow2_scratch_close (struct qcow2_image *img);

/* A cluster of zeros, for writes of zeros. */
const uint8_t *qcow2_scratch_zeros (const struct qcow2_image *img);

/* Buffers for one write, or NULL after logging.  Give them back with
 * qcow2_scratch_put.
 */
struct write_scratch *qcow2_scratch_get (struct qcow2_image *img);
void qcow2_scratch_put (struct qcow2_image *img, struct write_scratch *ws);

/* WS's encoder, made on first use; NULL after logging. */
struct qcow2_encoder *qcow2_scratch_encoder (struct qcow2_image *img,
                                             struct write_scratch *ws);


#endif /* QCOW2_SCRATCH_H */
