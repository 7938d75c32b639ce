/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the refcounts in memory.
 *
 * While an image is open for writing, its refcount table and every
 * refcount block touched so far are held in memory (img->refcounts, this
 * module's) and changed there; qcow2_refcount_writeback writes them back, blocks before the
 * table that points at them.  This module only stores counts: deciding
 * which clusters to hand out, where a new block or a bigger table goes
 * and when a release may be applied is the allocator's (meta/alloc.h).
 *
 * A block not in memory yet is read when a count in it is first asked
 * for.  A change that will need blocks reads them first with the image
 * lock held shared (qcow2_refcount_fetch), and puts them in memory once
 * it holds the lock exclusively (qcow2_refcount_adopt), so that the read
 * does not stop every reader and writer for a device round trip.
 *
 * Offers: loading, reading and changing counts, making a block, growing
 * and moving the table, snapshots of blocks and table and their writing,
 * blocks read ahead of a change, and for a repair setting counts and
 * starting an empty table.
 * Locks: every call with the image lock held exclusively, but
 * qcow2_refcount_write, which needs none, and qcow2_refcount_fetch,
 * with it held shared.
 * Needs: host I/O.
 */
#ifndef QCOW2_REFCOUNT_H
#define QCOW2_REFCOUNT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/tablemap.h"
#include "meta/image.h"

/* Read and check the refcount table the header names; blocks are read as
 * they are needed.  0, or -errno after logging (a table outside the file
 * or with bad entries refuses writing).
 */
int qcow2_refcount_load (struct qcow2_image *img, struct qcow2_io *io);
void qcow2_refcount_free (struct qcow2_image *img);

/* For a repair that rebuilds the refcounts (meta/repair.h): the width
 * and block size from the header only, and then an empty table of
 * ENTRIES entries in memory (forgetting what was loaded), to which blocks
 * are added, counts set and a place given before it is written.
 * qcow2_refcount_start_empty: 0, or -ENOMEM after logging.
 */
int qcow2_refcount_geometry (struct qcow2_image *img);
int qcow2_refcount_start_empty (struct qcow2_image *img, uint64_t entries);

/* The geometry: the largest refcount the width holds, log2 of the
 * clusters one block counts, the table's length in entries and where it
 * is (or goes, once moved) on disk.
 */
uint64_t qcow2_refcount_max (const struct qcow2_image *img);
unsigned qcow2_refcount_block_bits (const struct qcow2_image *img);
uint64_t qcow2_refcount_table_entries (const struct qcow2_image *img);
void qcow2_refcount_table_location (const struct qcow2_image *img,
                                    uint64_t *offset, uint32_t *clusters);

/* Call FN with the host offset of every refcount block the table names,
 * until it returns nonzero (then return that); 0 at the end.
 */
int qcow2_refcount_each_block (const struct qcow2_image *img,
                               int (*fn) (void *opaque, uint64_t offset),
                               void *opaque);

/* The refcount of host cluster CLUSTER (0 where no block counts it). */
int qcow2_refcount_get (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t cluster, uint64_t *refcount);

/* Add DELTA to the refcount of CLUSTER and, if NOW is not NULL, set *NOW
 * to the new count.  To count up, the cluster's block must exist (the
 * allocator makes blocks; everyone else only adds to clusters already
 * counted).  A count that would drop below zero or go past the refcount
 * width marks the image corrupt (meta/corrupt.h): -EIO.
 */
int qcow2_refcount_add (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t cluster, int delta, uint64_t *now);

/* Refcount blocks read ahead of a change (with the image lock held
 * shared), not yet in memory: at most QCOW2_REFCOUNT_FETCH_MAX, the
 * first of them the most wanted.
 */
#define QCOW2_REFCOUNT_FETCH_MAX 8
struct refcount_fetch {
  unsigned n;
  uint64_t rt_index[QCOW2_REFCOUNT_FETCH_MAX];
  struct meta_table *block[QCOW2_REFCOUNT_FETCH_MAX];
};

/* Add to *F the block that counts host cluster CLUSTER, read from the
 * storage, if the table names one that is not in memory (nor in *F)
 * and *F has room.  With the image lock held shared.  0, or -errno
 * after logging.
 */
int qcow2_refcount_fetch (struct qcow2_image *img, struct qcow2_io *io,
                          uint64_t cluster, struct refcount_fetch *f);

/* Put the blocks of *F in memory, but those loaded meanwhile or no longer
 * named by the table (then dropped); empties *F.  With the image lock
 * held exclusively.  Never fails: a block that finds no room in memory
 * is dropped, and read again when needed.
 */
void qcow2_refcount_adopt (struct qcow2_image *img, struct refcount_fetch *f);

/* Set the refcount of CLUSTER, whose block must exist, to VALUE (at most
 * the width's maximum): for a repair.  0, or -errno after logging.
 */
int qcow2_refcount_set (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t cluster, uint64_t value);

/* Is there a block for table index RT_INDEX (loading it)? */
int qcow2_refcount_has_block (struct qcow2_image *img, struct qcow2_io *io,
                              uint64_t rt_index, bool *has);

/* Make an empty block for table index RT_INDEX (inside the table) at host
 * cluster CLUSTER, which the caller counts.  0, or -ENOMEM after logging.
 */
int qcow2_refcount_add_block (struct qcow2_image *img, uint64_t rt_index,
                              uint64_t cluster);

/* Make the table in memory ENTRIES long, the new entries empty.  It must
 * then get a place (qcow2_refcount_place_table) before a writeback
 * copies it.  Shorter than it is only to take a growth back: -EBUSY if
 * an entry that would go names a block.  0, or -errno.
 */
int qcow2_refcount_resize_table (struct qcow2_image *img, uint64_t entries);

/* The table goes whole to CLUSTERS clusters at host OFFSET at the next
 * writeback, and the header then names it.
 */
void qcow2_refcount_place_table (struct qcow2_image *img, uint64_t offset,
                                 uint32_t clusters);

/* A copy of the changed refcount blocks and table, to write while the
 * counts in memory go on changing.
 */
struct refcount_snapshot {
  size_t nblocks;
  struct meta_table **blocks; /* the blocks copied (they stay in memory) */
  uint8_t *data;              /* their contents, a cluster each */
  uint8_t *table;             /* the table, big-endian, or NULL */
  uint64_t table_bytes;
  uint64_t table_offset;
  uint32_t table_clusters;
  bool table_moved;           /* the header must name it */
};

/* Copy what changed into *SNAP and count it as clean (with the image lock
 * held exclusively).  0, or -ENOMEM after logging (nothing copied).
 */
int qcow2_refcount_snapshot (struct qcow2_image *img,
                             struct refcount_snapshot *snap);

/* Write SNAP (no lock needed): the blocks, then, if the table is in it,
 * a flush (if blocks were written) and the table, and if it moved a
 * flush and the header's refcount table fields.  The caller flushes
 * afterwards.  0, or -errno after logging.
 */
int qcow2_refcount_write (struct qcow2_image *img, struct qcow2_io *io,
                          const struct refcount_snapshot *snap);

/* After qcow2_refcount_write (with the image lock held exclusively): if
 * it failed (WRITTEN false), what SNAP held counts as changed again.
 * Frees SNAP.
 */
void qcow2_refcount_snapshot_done (struct qcow2_image *img,
                                   struct refcount_snapshot *snap,
                                   bool written);

/* Is anything changed and not copied by a snapshot? */
bool qcow2_refcount_dirty (struct qcow2_image *img);

#endif /* QCOW2_REFCOUNT_H */
