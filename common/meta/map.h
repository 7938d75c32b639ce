/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: where guest clusters live.
 *
 * The L1 table is held in memory (host order) while the image is open;
 * L2 tables are read through the L2 cache, or from the set of changed
 * tables not yet written back.  Every entry is validated before use: a
 * bad one is an error naming the guest offset, never a read elsewhere.
 *
 * Offers: qcow2_l1_load, qcow2_l1_unallocated, qcow2_l2_entries,
 * qcow2_classify, qcow2_classify_fetched, qcow2_compressed_span.
 * Locks: the caller holds the image lock (shared is enough) around
 * qcow2_l2_entries, so that no writer changes a table meanwhile.
 * Needs: host I/O, the L2 cache.
 */
#ifndef QCOW2_MAP_H
#define QCOW2_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/types.h"

/* Read the L1 table the header names into img->l1.  0, or -errno after
 * logging.
 */
int qcow2_l1_load (struct qcow2_image *img, struct qcow2_io *io);

/* Does L1 entry L1_INDEX have no L2 table (all its clusters
 * unallocated)?  False for an entry that is not simply empty, which
 * qcow2_l2_entries then checks.
 */
bool qcow2_l1_unallocated (const struct qcow2_image *img, uint64_t l1_index);

/* Most entries qcow2_l2_entries returns at once. */
#define QCOW2_L2_BATCH 512

/* Fetch the L2 entries (host order) for guest clusters
 * [FIRST, FIRST + *N) into ENTRIES, and with extended L2 entries their
 * subcluster bitmaps into BITMAPS (if not NULL; zeros otherwise); *N is
 * cut so the range stays inside one L2 table and QCOW2_L2_BATCH.  L2BUF
 * is cluster_size bytes of scratch.  Returns 0 or a negative errno after
 * logging.
 */
int qcow2_l2_entries (struct qcow2_image *img, struct qcow2_io *io,
                      uint64_t first, size_t *n, uint64_t *entries,
                      uint64_t *bitmaps, uint8_t *l2buf);

/* Decode a standard L2 ENTRY for guest cluster GUEST_CLUSTER into *MAP,
 * validating it (a compressed cluster in an encrypted image is invalid).
 * Returns 0, or -EIO after logging what is wrong.
 */
int qcow2_classify (struct qcow2_image *img, uint64_t guest_cluster,
                    uint64_t entry, struct cluster_map *map);

/* qcow2_classify for entry I of what qcow2_l2_entries gave for the
 * clusters from FIRST (ENTRIES, BITMAPS), and with extended L2 the check
 * of its bitmap against *MAP: a compressed cluster's is empty, no
 * subcluster is both allocated and zero, none is allocated without a
 * host offset.  0, or -EIO after logging.
 */
int qcow2_classify_fetched (struct qcow2_image *img, uint64_t first,
                            size_t i, const uint64_t *entries,
                            const uint64_t *bitmaps, struct cluster_map *map);

/* The host bytes compressed MAP is counted in: qemu counts a compressed
 * cluster once in every host cluster its sector-rounded range touches,
 * [*START, *START + *LEN) with *START the sector it begins in.
 */
void qcow2_compressed_span (const struct cluster_map *map, uint64_t *start,
                            uint64_t *len);

#endif /* QCOW2_MAP_H */
