/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the L2 tables held in memory for change.
 *
 * A write changes an L2 table in memory (img->dirty, this module's),
 * and the table stays here until a writeback has written it: lookups
 * find it here before the L2 cache (meta/map.h).  A writeback takes a
 * copy of the changed tables (the tables go on changing meanwhile),
 * writes the copy, and then lets the tables that stayed clean leave the
 * set for the cache.
 *
 * Offers: the set of tables (find, load, drop), its count, and the copy
 * a writeback writes.
 * Locks: every call with the image lock held (exclusively to change the
 * set or a table; shared is enough to find one and read it), but
 * qcow2_dirty_copy_write, which needs none.
 * Needs: host I/O, the table map.
 */
#ifndef QCOW2_DIRTY_H
#define QCOW2_DIRTY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/tablemap.h"
#include "meta/image.h"

/* Make the empty set (images opened for writing), and free it. */
int qcow2_dirty_open (struct qcow2_image *img);
void qcow2_dirty_close (struct qcow2_image *img);

/* The table at host OFFSET, if the set holds it, else NULL (always NULL
 * on an image opened read-only).
 */
struct meta_table *qcow2_dirty_table (const struct qcow2_image *img,
                                      uint64_t offset);

/* Put the table for host OFFSET into the set, its content a copy of the
 * cluster CONTENT (NULL: a new, empty table).  CHANGED says whether it
 * differs from what is on disk at OFFSET (a new table, or a copy that
 * the L1 entry will point at), so that a table loaded only to be looked
 * at is not written back.  0, or -ENOMEM after logging.
 */
int qcow2_dirty_add (struct qcow2_image *img, uint64_t offset,
                     const uint8_t *content, bool changed,
                     struct meta_table **out);

/* Drop the table at OFFSET from the set, unwritten (it was just added
 * for a change that failed).
 */
void qcow2_dirty_drop (struct qcow2_image *img, uint64_t offset);

/* How many tables the set holds. */
size_t qcow2_dirty_count (const struct qcow2_image *img);

/* What one writeback writes of the set: a copy of every changed table,
 * taken under the image lock; the tables count as clean from then on.
 */
struct dirty_copy {
  size_t count;
  struct meta_table **tables;       /* the tables copied (in the set) */
  uint8_t *data;                    /* their contents, a cluster each */
};

/* Copy the changed tables into *COPY.  0, or -ENOMEM after logging
 * (nothing copied).
 */
int qcow2_dirty_copy (struct qcow2_image *img, struct dirty_copy *copy);

/* Write the copied tables (no lock needed).  0, or -errno after logging. */
int qcow2_dirty_copy_write (struct qcow2_image *img, struct qcow2_io *io,
                            const struct dirty_copy *copy);

/* After the copy was written (WRITTEN) or not: the tables that stayed
 * clean since leave the set, handed to CLEAN (their offset and content)
 * first; if the copy was not written, what it held counts as changed
 * again.  Frees the copy.
 */
void qcow2_dirty_copy_done (struct qcow2_image *img, struct dirty_copy *copy,
                            bool written,
                            void (*clean) (struct qcow2_image *img,
                                           uint64_t offset,
                                           const uint8_t *data));

#endif /* QCOW2_DIRTY_H */
