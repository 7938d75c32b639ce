/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: sharing one compressed cluster between guest clusters
 * with the same data.
 *
 * qcow2 lets several L2 entries describe the same compressed range, each
 * counted once in every host cluster the range touches (as snapshots
 * do); qemu reads such an image, writes to it (a compressed cluster is
 * never overwritten in place) and checks it clean.  Copying a disk in,
 * the second and later copies of a cluster then cost a hash and a
 * decompression instead of a compression, and take no space.
 *
 * The table maps a hash of a cluster's data to the L2 entry it was last
 * stored under.  It is only a hint: before an entry is reused, under the
 * image lock, the range is read back, decompressed and compared with the
 * new data, and its refcounts are checked, so a hash collision or a
 * range freed and reused since costs time, never data.
 *
 * Offers: qcow2_dedup_hash, qcow2_dedup_init, qcow2_dedup_free,
 * qcow2_dedup_find, qcow2_dedup_remember, qcow2_dedup_share.
 * Locks: find and remember take the dedup lock themselves and may be
 * called with or without the image lock; share needs the image lock held
 * exclusively.
 * Needs: the map, the refcounts, host I/O, the codec.
 */
#ifndef QCOW2_DEDUP_H
#define QCOW2_DEDUP_H

#include <stddef.h>
#include <stdint.h>

#include "qcow2-types.h"

/* A hash of LEN bytes of DATA. */
uint64_t qcow2_dedup_hash (const uint8_t *data, size_t len);

/* The table, sized by the disk, made by the image's open when it is
 * written with compression (before any other thread can see the image);
 * 0 or -ENOMEM after logging.  Without it find finds nothing and
 * remember remembers nothing.
 */
int qcow2_dedup_init (struct qcow2_image *img);
void qcow2_dedup_free (struct qcow2_image *img);

/* The compressed L2 entry last stored with data of hash HASH, or 0. */
uint64_t qcow2_dedup_find (struct qcow2_image *img, uint64_t hash);
void qcow2_dedup_remember (struct qcow2_image *img, uint64_t hash,
                           uint64_t entry);

/* If compressed L2 ENTRY still holds exactly SRC (SRC_LEN bytes, zero
 * padded to a cluster) and each host cluster it touches can take one
 * more reference, add those references and return 1; 0 if it cannot be
 * shared; a negative errno on an I/O error.  Uses img->wbuf and
 * img->wcompressed.
 */
int qcow2_dedup_share (struct qcow2_image *img, struct qcow2_io *io,
                       uint64_t guest_cluster, uint64_t entry,
                       const uint8_t *src, uint32_t src_len);

#endif /* QCOW2_DEDUP_H */
