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
 *   -> discards of the clusters now free (qcow2_alloc_reuse_released)
 *
 * A crash anywhere leaks clusters at worst, and no discarded byte is
 * referred to by anything on disk.
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
 * Offers: qcow2_l2_for_write (the dirty set), qcow2_too_much_dirty,
 * qcow2_l2_dirty, qcow2_writeback, qcow2_writeback_if_idle.
 * Locks: qcow2_l2_for_write, qcow2_too_much_dirty and qcow2_l2_dirty with
 * the image lock held (exclusively but for qcow2_l2_dirty); the
 * writebacks take the writeback lock and then the image lock
 * themselves, so they are called with no lock held, no claim and not
 * registered for a grace period (they wait for grace periods).
 * Needs: the refcounts (their snapshots), the allocator (a new L2 table,
 * the queued releases, the released clusters to discard), the grace
 * periods, host I/O, the L2 cache.
 */
#ifndef QCOW2_WRITEBACK_H
#define QCOW2_WRITEBACK_H

#include <stdbool.h>
#include <stdint.h>

#include "meta/types.h"

/* The L2 table for L1_INDEX, as a table that may be changed: made (and
 * hooked into the L1 table in memory) if the L1 entry is empty, copied
 * into a new table (hooked in the same way; the old one is released
 * after the next writeback) if a snapshot shares it (COPIED clear in the
 * L1 entry, or with snapshots a refcount other than 1), else loaded into
 * the dirty set.  A loaded table is not dirty: the caller that changes an
 * entry sets t->dirty, so that a table nothing changed is not written
 * back; a new or copied table is.  With CREATE false and no table, *OUT
 * is NULL.  The pointer is valid only while the image lock stays held.  0,
 * QCOW2_RECLAIM (no room for a new table yet: see meta/alloc.h), or
 * -errno after logging.
 */
int qcow2_l2_for_write (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t l1_index, bool create,
                        struct meta_table **out);

/* Has so much changed metadata piled up in memory that it is time to
 * write it back?
 */
bool qcow2_too_much_dirty (struct qcow2_image *img);

/* Could the L2 entries of L1_INDEX's table not be on disk yet: the table
 * is in the dirty set (changed, or being written), or the L1 entry
 * naming it is?
 */
bool qcow2_l2_dirty (struct qcow2_image *img, uint64_t l1_index);

/* Write all changed metadata back in the order above; with
 * FLUSH_UNDERNEATH, flush at the end even if nothing was released.
 * Waits for a writeback in progress first.  Written L2 tables move to
 * the L2 cache.  0, or -errno after logging.
 */
int qcow2_writeback (struct qcow2_image *img, struct qcow2_io *io,
                     bool flush_underneath);

/* qcow2_writeback (IMG, IO, false), unless one is in progress already
 * (then 0 at once): for writers that found too much piled up.
 */
int qcow2_writeback_if_idle (struct qcow2_image *img, struct qcow2_io *io);

#endif /* QCOW2_WRITEBACK_H */
