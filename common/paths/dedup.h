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
 * stored under, and says whether that entry's data is still being
 * written (pending).  It is only a hint: before an entry is reused, the
 * range is read back, decompressed and compared with the new data (with
 * no lock held, qcow2_dedup_verify), and then, under the image lock, its
 * refcounts are checked and no release may have been applied since the
 * read (the image's free_generation), so a hash collision or a range
 * freed and reused since costs time, never data.
 *
 * Offers: qcow2_dedup_hash, qcow2_dedup_init, qcow2_dedup_free,
 * qcow2_dedup_find, qcow2_dedup_remember, qcow2_dedup_written,
 * qcow2_dedup_forget, qcow2_dedup_verify, qcow2_dedup_can_reference,
 * qcow2_dedup_reference.
 * Locks: the table's calls take the dedup lock themselves and may be
 * called with or without the image lock; verify needs no lock;
 * can_reference and reference need the image lock held exclusively.
 * Needs: the map, the refcounts, host I/O, the codec.
 */
#ifndef QCOW2_DEDUP_H
#define QCOW2_DEDUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/image.h"

struct write_scratch;

/* A hash of LEN bytes of DATA. */
uint64_t qcow2_dedup_hash (const uint8_t *data, size_t len);

/* The table, sized by the disk, made by the image's open when it is
 * written with compression (before any other thread can see the image);
 * 0 or -ENOMEM after logging.  Without it find finds nothing and
 * remember remembers nothing.
 */
int qcow2_dedup_init (struct qcow2_image *img);
void qcow2_dedup_free (struct qcow2_image *img);

/* The compressed L2 entry last stored with data of hash HASH, or 0; with
 * *PENDING set if its data is still being written.
 */
uint64_t qcow2_dedup_find (struct qcow2_image *img, uint64_t hash,
                           bool *pending);

/* Remember ENTRY for data of hash HASH, its data still being written if
 * PENDING; once written, qcow2_dedup_written, or if that failed
 * qcow2_dedup_forget (each does nothing if the table holds another entry
 * for HASH by then).
 */
void qcow2_dedup_remember (struct qcow2_image *img, uint64_t hash,
                           uint64_t entry, bool pending);
void qcow2_dedup_written (struct qcow2_image *img, uint64_t hash,
                          uint64_t entry);
void qcow2_dedup_forget (struct qcow2_image *img, uint64_t hash,
                         uint64_t entry);

/* Does compressed L2 ENTRY hold exactly SRC (SRC_LEN bytes, zero padded to
 * a cluster)?  Reads and decodes it with WS's buffers, with no lock held:
 * the answer holds only if no release was applied since the caller read
 * img->free_generation before calling.  1 yes, 0 no, or -errno on an I/O
 * error.
 */
int qcow2_dedup_verify (struct qcow2_image *img, struct qcow2_io *io,
                        struct write_scratch *ws, uint64_t guest_cluster,
                        uint64_t entry, const uint8_t *src, uint32_t src_len);

/* Can compressed L2 ENTRY take one more reference: is every host cluster
 * it touches in use, and below the largest refcount?  1 yes, 0 no, or
 * -errno.
 */
int qcow2_dedup_can_reference (struct qcow2_image *img, struct qcow2_io *io,
                               uint64_t entry);

/* Add that reference (after qcow2_dedup_can_reference said yes, in the
 * same hold of the lock).  0, or -errno after logging.
 */
int qcow2_dedup_reference (struct qcow2_image *img, struct qcow2_io *io,
                           uint64_t entry);

#endif /* QCOW2_DEDUP_H */
