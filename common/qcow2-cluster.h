/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: changing the guest clusters of one range.
 *
 * The plain (uncompressed) path of writes, zeroes and trims, one cluster
 * at a time, and the single-cluster helpers the compressed path shares.
 *
 * Offers: qcow2_change_range, qcow2_write_cluster,
 * qcow2_zero_needs_writes, qcow2_release, qcow2_reads_as_zeros.
 * Locks: every call with the image lock held exclusively.
 * Needs: the map, the allocator (new clusters, releases), the refcounts
 * (whether a snapshot shares a cluster), the writeback (L2 tables to
 * change), host I/O, the codec (a compressed cluster's old content), the
 * encryption, the backing file.  Uses img->wbuf, img->wcompressed,
 * img->wdecoder and img->wcipher as scratch.
 */
#ifndef QCOW2_CLUSTER_H
#define QCOW2_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "qcow2-types.h"

enum qcow2_op { QCOW2_OP_WRITE, QCOW2_OP_ZERO, QCOW2_OP_TRIM };

/* Make OP's change to every guest cluster of [OFFSET, OFFSET+COUNT):
 * write BUF there, zero it, or discard it (BUF NULL for both).  A write to
 * an encrypted image needs CONN and REQ (with its crypt_buf) to encrypt
 * the data; zeroes and trims pass NULL.  A whole
 * cluster zeroed or trimmed becomes a zero cluster on v3 (releasing what
 * it held), unallocated on v2 without a backing file, and is written with
 * zeros on v2 with one; part of a cluster is written with zeros when
 * zeroing and left alone when trimming.  Writes the metadata back if too
 * much has piled up.  0, or -errno after logging, or QCOW2_RECLAIM: the
 * first *DONE bytes are changed (and their data written), the rest not;
 * write back and change the rest.
 */
int qcow2_change_range (struct qcow2_image *img, struct qcow2_io *io,
                        struct qcow2_conn *conn, struct request *req,
                        enum qcow2_op op, const uint8_t *buf, uint64_t count,
                        uint64_t offset, uint64_t *done);

/* Write SRC (LEN bytes) at PART_OFF inside guest cluster GUEST_CLUSTER,
 * whose L2 entry is at INDEX in table T (from qcow2_l2_for_write), at
 * once: in place if the image alone owns it, else into a new cluster
 * with the old content around it.  Not for encrypted images (the
 * compressed path, which they refuse, uses it).  0, QCOW2_RECLAIM (nothing changed),
 * or -errno after logging.
 */
int qcow2_write_cluster (struct qcow2_image *img, struct qcow2_io *io,
                         struct meta_table *t, uint64_t index,
                         uint64_t guest_cluster, const uint8_t *src,
                         uint64_t part_off, uint64_t len);

/* Would zeroing [OFFSET, OFFSET+COUNT) have to write data (a part of a
 * cluster that does not read as zeros, or any of a v2 image over a
 * backing file)?  Sets *NEEDS.  0, or -errno after logging.
 */
int qcow2_zero_needs_writes (struct qcow2_image *img, struct qcow2_io *io,
                             uint64_t count, uint64_t offset, bool *needs);

/* Queue the release of whatever MAP held, for after the next writeback.
 * 0, or -ENOMEM after logging.
 */
int qcow2_release (struct qcow2_image *img, const struct cluster_map *map);

/* Does the cluster MAP describes read as zeros now? */
bool qcow2_reads_as_zeros (const struct qcow2_image *img,
                           const struct cluster_map *map);

#endif /* QCOW2_CLUSTER_H */
