/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: L2 tables made ready for change.
 *
 * A write changes an L2 entry only in a table of its own, held in the
 * dirty set (meta/dirty.h): this module finds it there, or loads it, or
 * makes it.  An L1 entry without a table gets a new, empty one; a table
 * that a snapshot shares (COPIED clear in the L1 entry, or, with
 * snapshots, a refcount other than 1) is copied into a new one, which
 * the L1 entry then names, and the old one loses this image's reference
 * once the new one is on disk, as qemu's l2_allocate does.  The data
 * clusters keep their counts: each is still counted once through each
 * table that maps it.
 *
 * Offers: qcow2_l2_for_write, qcow2_l2_dirty.
 * Locks: with the image lock held exclusively (qcow2_l2_dirty: held in
 * either mode).
 * Needs: the map (the L1 table, the L2 cache), the dirty set, the
 * allocator and the releases, the refcounts, the regions.
 */
#ifndef QCOW2_L2TABLE_H
#define QCOW2_L2TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/tablemap.h"
#include "meta/image.h"

/* The L2 table for L1_INDEX, as a table that may be changed: made (and
 * hooked into the L1 table in memory) if the L1 entry is empty, copied
 * as above if a snapshot shares it, else loaded into the dirty set.  A
 * loaded table is not dirty: the caller that changes an entry sets
 * t->dirty, so that a table nothing changed is not written back; a new
 * or copied table is.  With CREATE false and no table, *OUT is NULL.  The
 * pointer is valid only while the image lock stays held.  0, -ENOSPC
 * (no room for a new table: meta/alloc.h), or -errno after logging.
 */
int qcow2_l2_for_write (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t l1_index, bool create,
                        struct meta_table **out);

/* Could the L2 entries of L1_INDEX's table not be on disk yet: the table
 * is in the dirty set (changed, or being written), or the L1 entry
 * naming it is?
 */
bool qcow2_l2_dirty (struct qcow2_image *img, uint64_t l1_index);

#endif /* QCOW2_L2TABLE_H */
