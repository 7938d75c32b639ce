/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: allocating host clusters.
 *
 * The allocator (img->alloc, shared by this file, meta/pack.c and
 * meta/release.c: meta/alloc-internal.h) hands out the first free host
 * cluster, or run of them, so that the file has no holes to leave
 * behind, and makes the refcount blocks (and grows the refcount table)
 * that count what it hands out.  Increments are made in memory and
 * written (then flushed) before any L2 entry that needs them
 * (meta/writeback.h).  A cluster the list of metadata regions holds is
 * never handed out, whatever its refcount says (meta/regions.h): a
 * damaged image whose table is counted 0 is not made worse by one table
 * overwriting another.  Nor is a cluster counted 0 that an L2 table the
 * engine read maps (meta/uncounted.c): the image is marked corrupt
 * instead, and the allocation fails with EIO.
 *
 * Full.  When no cluster is free the allocation fails with -ENOSPC.  If
 * releases wait for a writeback (meta/release.h), the writeback will
 * make room: qcow2_alloc_room_after_writeback says so, and the
 * allocation says nothing, since its caller runs the writeback and tries
 * again (the commit protocol, paths/commit.h, or the bitmaps' store).
 * Otherwise the file is full for good, and the allocation says so, with
 * how much room is missing.
 *
 * Offers: qcow2_alloc_init, qcow2_alloc_free, qcow2_alloc_clusters,
 * qcow2_alloc_room_after_writeback, qcow2_alloc_fetch.
 * Locks: every call with the image lock held exclusively, but
 * qcow2_alloc_fetch, with it held shared.
 * Needs: the refcounts, the regions, host I/O.
 */
#ifndef QCOW2_ALLOC_H
#define QCOW2_ALLOC_H

#include <stdbool.h>
#include <stdint.h>

#include "meta/image.h"
#include "meta/refcount.h"

/* Set up the allocator of an image opened for writing (after the
 * refcounts are loaded), and free what it holds.  qcow2_alloc_init: 0,
 * or -ENOMEM after logging.
 */
int qcow2_alloc_init (struct qcow2_image *img);
void qcow2_alloc_free (struct qcow2_image *img);

/* Allocate COUNT contiguous host clusters with refcount 1; *OFFSET gets
 * the first one's host offset.  0, -ENOSPC (see Full, above: nothing was
 * changed), or another -errno after logging.
 */
int qcow2_alloc_clusters (struct qcow2_image *img, struct qcow2_io *io,
                          uint64_t count, uint64_t *offset);

/* Read into *F the refcount block where the next allocation will look
 * first, if it is not in memory (meta/refcount.h): a commit does this
 * with the image lock held shared before it takes it exclusively to
 * allocate.  0, or -errno after logging.
 */
int qcow2_alloc_fetch (struct qcow2_image *img, struct qcow2_io *io,
                       struct refcount_fetch *f);

/* Would a writeback make room (releases wait for it, or clusters it will
 * make reusable)?
 */
bool qcow2_alloc_room_after_writeback (const struct qcow2_image *img);

/* A writer that found the file full waits for the writeback that makes
 * room (WAITING true), and is done waiting (false).  Any lock mode, or
 * none.  While a writer waits, the writeback stops discarding the
 * clusters it is about to make reusable (meta/release.h).
 */
void qcow2_alloc_room_wanted (struct qcow2_image *img, bool waiting);

#endif /* QCOW2_ALLOC_H */
