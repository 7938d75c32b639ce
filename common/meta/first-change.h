/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the image's first change.
 *
 * Nothing on disk changes until the first change: opening an image for
 * writing writes nothing (a session that only reads through a writable
 * export leaves the file byte for byte as it was).  What the open would
 * have changed is done here instead, and flushed, so that it is durable
 * before anything it vouches for changes:
 * - the persistent bitmaps kept valid are marked in_use
 *   (qcow2_bitmaps_first_change);
 * - the header's autoclear bits are cleared but those of what this
 *   writer keeps valid (bit 0 for the bitmaps: qcow2_bitmaps_autoclear);
 * - in qcow2-lazy-refcounts mode (opts.lazy_refcounts) the dirty bit is
 *   set: the refcounts on disk may lag behind from then on, until a
 *   clean close writes them and clears it (qcow2_writeback_clean).
 *
 * The contract, which every write path keeps:
 * - It runs, to completion, before the first write of anything to the
 *   image (data, L2 and L1 tables, refcounts, header fields), by any
 *   thread.
 * - Its writes and flush go out with no image lock held, so that readers
 *   and writers already at work do not wait a device round trip for it;
 *   one first change runs at a time, under a lock of its own.  The flag
 *   is cleared only once they are durable, under the image lock held
 *   exclusively.  Data is written without that lock, so a write path
 *   makes the first change before it takes the lock to decide its first
 *   change (paths/commit.c), or sees img->first_change_pending clear
 *   under the lock (held shared is enough) before it lets its data go.
 *   Metadata is written back only once something changed, so after it.
 * - Host I/O (meta/hostio.h) refuses, as an internal error, a write while
 *   the flag is still set, but for the first change's own (made on its
 *   thread: qcow2_hostio_first_change_writes): a path that forgot fails
 *   loudly, having written nothing.
 * A clean close (qcow2_finish) clears the bitmaps' in_use and the dirty
 * bit again; it arms the first change anew (qcow2_first_change_arm), so
 * that a write after it marks them in use and sets the bit first.
 *
 * Offers: qcow2_first_change_arm, qcow2_first_change.
 * Locks: qcow2_first_change with no lock held but its own, which it
 * takes; qcow2_first_change_arm with the image lock held exclusively, or
 * before anyone else sees the image.
 * Needs: the bitmaps, host I/O, the header's autoclear bits.
 */
#ifndef QCOW2_FIRST_CHANGE_H
#define QCOW2_FIRST_CHANGE_H

#include "meta/image.h"

/* Set img->first_change_pending if the first change has anything to do
 * (autoclear bits to clear, bitmaps to mark in use, the dirty bit to
 * set).
 */
void qcow2_first_change_arm (struct qcow2_image *img);

/* Make the first change, if it is still to come: 0 (at once if not), or
 * -errno after logging: the flag stays set, so that the next write tries
 * again, and the write that called it fails having written nothing of
 * its own.  Called with no image lock held, no claim, and not registered
 * for a grace period (it waits for another thread's first change).
 */
int qcow2_first_change (struct qcow2_image *img, struct qcow2_io *io);

#endif /* QCOW2_FIRST_CHANGE_H */
