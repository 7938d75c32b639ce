/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the metadata writeback.
 *
 * Every change runs with the image lock held exclusively.  Guest data is
 * written at once, either in place (a normal cluster with COPIED set,
 * i.e. refcount exactly 1) or into a newly allocated cluster; an L2
 * table shared with a snapshot is copied before it changes.  L2 and L1
 * changes stay in memory until qcow2_flush (or until enough have piled
 * up), which writes them in the order that keeps the image consistent on
 * disk at every moment:
 *
 *   refcount blocks (increments) -> flush -> refcount table -> flush ->
 *   header if the table moved -> flush -> L2 tables -> flush -> L1 ->
 *   flush -> decrements of what was released -> refcount blocks -> flush
 *   -> discards of the clusters now free (qcow2_alloc_reuse_released)
 *
 * A crash anywhere leaks clusters at worst, and no discarded byte is
 * referred to by anything on disk.
 *
 * Offers: qcow2_l2_for_write (the dirty set), qcow2_writeback,
 * qcow2_too_much_dirty, and qcow2_flush (declared in qcow2.h).
 * Locks: all but qcow2_flush with the image lock held exclusively;
 * qcow2_flush takes it.
 * Needs: the refcounts (their writeback, the queued releases), the
 * allocator (a new L2 table, the released clusters to discard), host
 * I/O, the L2 cache.
 */
#ifndef QCOW2_WRITEBACK_H
#define QCOW2_WRITEBACK_H

#include <stdbool.h>
#include <stdint.h>

#include "qcow2-types.h"

/* The L2 table for L1_INDEX, as a table that may be changed: made (and
 * hooked into the L1 table in memory) if the L1 entry is empty, copied
 * into a new table (hooked in the same way; the old one is released
 * after the next writeback) if a snapshot shares it (COPIED clear in the
 * L1 entry, or with snapshots a refcount other than 1), else loaded into
 * the dirty set.  A loaded table is not dirty: the caller that changes an
 * entry sets t->dirty, so that a table nothing changed is not written
 * back; a new or copied table is.  With CREATE false and no table, *OUT
 * is NULL.  The table stays valid until the next writeback.  0,
 * QCOW2_RECLAIM (no room for a new table yet: see qcow2-alloc.h), or
 * -errno after logging.
 */
int qcow2_l2_for_write (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t l1_index, bool create,
                        struct meta_table **out);

/* Has so much changed metadata piled up in memory that it is time to
 * write it back?
 */
bool qcow2_too_much_dirty (struct qcow2_image *img);

/* Write all changed metadata back in the order above; with
 * FLUSH_UNDERNEATH, flush at the end even if nothing was released.
 * Written L2 tables move to the L2 cache, so no table from
 * qcow2_l2_for_write may be held across it.  0, or -errno after logging.
 */
int qcow2_writeback (struct qcow2_image *img, struct qcow2_io *io,
                     bool flush_underneath);

#endif /* QCOW2_WRITEBACK_H */
