/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: packing compressed data.
 *
 * Compressed clusters are packed back to back, as qemu packs them,
 * running on into the next host cluster while that one is free.  When a
 * plain cluster or a table has taken the next host cluster (the
 * compressed path places a batch's compressed clusters first and its
 * plain ones after, so that happens once per batch at most), the packing
 * moves on and the rest of its host cluster becomes a gap: later
 * compressed clusters that fit go into the gaps first.  The state is the
 * allocator's (meta/alloc-internal.h).
 *
 * Offers: qcow2_pack_reserve.
 * Locks: with the image lock held exclusively.
 * Needs: the allocator, the refcounts.
 */
#ifndef QCOW2_PACK_H
#define QCOW2_PACK_H

#include <stdint.h>

#include "meta/image.h"

/* Make room for LEN bytes of one cluster's compressed data: in the
 * smallest gap left behind that it fits, else in the packing area, back
 * to back with the previous cluster's, running on into the next host
 * cluster if that one can be allocated right after it, else in a new
 * one.  Every host cluster the sector-rounded range touches gets one
 * more reference.  *HOST gets the data's host offset; the caller writes
 * the data there (outside the lock), and if that fails releases the
 * range (qcow2_free_later of its sector-rounded span).  0, -ENOSPC as
 * qcow2_alloc_clusters, or -errno after logging.
 */
int qcow2_pack_reserve (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t len, uint64_t *host);

#endif /* QCOW2_PACK_H */
