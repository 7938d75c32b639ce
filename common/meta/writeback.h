/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the metadata writeback.
 *
 * Guest data is written at once, either in place (a normal cluster with
 * COPIED set, i.e. refcount exactly 1) or into a newly allocated cluster
 * whose L2 entry is changed only once the data write has returned; an
 * L2 table shared with a snapshot is copied before it changes.  L2 and
 * L1 changes and refcounts stay in memory until qcow2_flush (or until
 * enough have piled up), which writes them in the order that keeps the
 * image consistent on disk at every moment:
 *
 *   refcount blocks (increments) -> flush -> refcount table -> flush ->
 *   header if the table moved -> flush -> L2 tables -> flush -> L1 ->
 *   flush -> decrements of what was released -> refcount blocks -> flush
 *   -> discards of the clusters now free, with no image lock held
 *   (qcow2_alloc_discard_released) -> they become reusable
 *
 * A crash anywhere leaks clusters at worst, and no discarded byte is
 * referred to by anything on disk.
 *
 * Lazy refcounts (opts.lazy_refcounts): once the first change has set
 * the image's dirty bit, the refcount steps are left out and the counts
 * stay in memory (a crash is repaired from the tables by the next open,
 * meta/repair.h, as qemu repairs its own); qcow2_writeback_clean, at a
 * clean close, writes them in the order above and only then clears the
 * bit, durably.  Releases still wait for the tables that dropped them
 * to be durable before their clusters are reused.
 *
 * The writeback holds the image lock only to copy what changed (and, at
 * the end, to count it clean, to apply the releases and to make the
 * clusters they freed reusable); the writes and flushes run without it,
 * while reads and writes go on.  What changes meanwhile waits for the
 * next writeback.  One writeback runs at a time, under a lock of its
 * own.  A release is applied only after the metadata that stopped
 * pointing at it is durable and once no read or write that may still
 * touch its clusters is in flight (base/inflight.h); the clusters it
 * brings to refcount 0 are discarded (and become reusable) only after
 * that, once the decrements are durable too.
 *
 * The writeback's state (img->writeback, this module's) is its lock: one
 * writeback at a time.
 *
 * Offers: qcow2_writeback_open, qcow2_writeback_close,
 * qcow2_too_much_dirty, qcow2_writeback, qcow2_writeback_clean,
 * qcow2_writeback_if_idle.
 * Locks: qcow2_too_much_dirty with the image lock held; the writebacks
 * take the writeback lock and then the image lock themselves, so they
 * are called with no lock held, no claim and not registered for a grace
 * period (they wait for grace periods).
 * Needs: the refcounts, the dirty set and the changed L1 entries (their
 * copies), the releases, the grace periods, host I/O, the L2 cache.
 */
#ifndef QCOW2_WRITEBACK_H
#define QCOW2_WRITEBACK_H

#include <stdbool.h>
#include <stdint.h>

#include "meta/image.h"

/* Make the writeback's lock, and free it. */
int qcow2_writeback_open (struct qcow2_image *img);
void qcow2_writeback_close (struct qcow2_image *img);

/* Has so much changed metadata piled up in memory that it is time to
 * write it back?
 */
bool qcow2_too_much_dirty (struct qcow2_image *img);

/* Write all changed metadata back in the order above; with
 * FLUSH_UNDERNEATH, flush at the end even if nothing was released.
 * Waits for a writeback in progress first.  Written L2 tables move to
 * the L2 cache.  0, or -errno after logging.
 */
int qcow2_writeback (struct qcow2_image *img, struct qcow2_io *io,
                     bool flush_underneath);

/* qcow2_writeback (IMG, IO, true) with the refcounts written even if
 * they were deferred, and then, if the dirty bit was set, the bit
 * cleared, durably, once nothing is left changed.  For a clean close,
 * with no request in flight.  0, or -errno after logging (the bit then
 * stays set).
 */
int qcow2_writeback_clean (struct qcow2_image *img, struct qcow2_io *io);

/* qcow2_writeback (IMG, IO, false), unless one is in progress already
 * (then 0 at once): for writers that found too much piled up.
 */
int qcow2_writeback_if_idle (struct qcow2_image *img, struct qcow2_io *io);

#endif /* QCOW2_WRITEBACK_H */
