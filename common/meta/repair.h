/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: repairing the refcounts of an image left dirty.
 *
 * The dirty bit (incompatible bit 0) says that qemu was writing the image
 * with lazy refcounts when it stopped: the L1 and L2 tables are right,
 * the refcounts may be stale (new clusters counted 0, released ones still
 * counted).  qemu repairs such an image when it opens it for writing, as
 * its check with fix does (block/meta/refcount.c: qcow2_check_refcounts,
 * rebuild_refcount_structure), and so does this module, before anything
 * else is written:
 *
 * 1. Every reference is counted from the metadata: the header, the active
 *    L1 table and each snapshot's, the L2 tables and the data they point
 *    at (a compressed cluster in every host cluster its sectors touch),
 *    the snapshot table, the LUKS area, the persistent bitmaps, and the
 *    refcount table and blocks themselves.  An entry with reserved bits,
 *    unaligned or outside the file, or two structures on one cluster (an
 *    L2 table shared by snapshots aside), is damage: a clear error, and
 *    nothing is written.
 * 2. The refcounts are set to those counts: in place, in the blocks the
 *    table names, when the table and blocks are sound and cover every
 *    cluster in use; else a new table and new blocks are built in free
 *    clusters, written, flushed, and then the header names them (the old
 *    ones become free), as qemu rebuilds them.
 * 3. The COPIED flags of the active L1 and L2 entries are set to what
 *    the counts say (refcount 1), as qemu's check fixes them.
 * 4. Only once all of it is durable is the dirty bit cleared, and
 *    flushed.  A crash before leaves the dirty bit set, and the next open
 *    (ours or qemu's) repairs again.
 *
 * Offers: qcow2_repair_refcounts.
 * Locks: none (nobody else sees the image while it opens).
 * Needs: the header, the L1 table in memory, the snapshot table, the
 * bitmaps (their clusters), the map's entry checks, the refcounts (loaded
 * or rebuilt), host I/O.
 */
#ifndef QCOW2_REPAIR_H
#define QCOW2_REPAIR_H

#include "format/snapshot.h"
#include "meta/image.h"

/* Repair the refcounts of IMG, which has the dirty bit and is being
 * opened for writing (SNAPSHOTS: its snapshot table, or NULL without
 * snapshots), as above; afterwards the refcounts are loaded as
 * qcow2_refcount_load leaves them.  0; -EINVAL after logging what is
 * damaged, or -ENOSPC after logging how much room a rebuild lacks, with
 * nothing written; or another -errno after logging (the dirty bit is then
 * still set).
 */
int qcow2_repair_refcounts (struct qcow2_image *img, struct qcow2_io *io,
                            const struct qcow2_snapshot_table *snapshots);

#endif /* QCOW2_REPAIR_H */
