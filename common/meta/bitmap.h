/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: persistent dirty bitmaps, kept valid as qemu keeps
 * them.
 *
 * An image whose autoclear bit 0 is set holds a bitmap directory (the
 * bitmaps header extension) of named bitmaps, each a table of clusters
 * of bits, one bit per GRANULARITY bytes of the guest disk (qcow2.txt,
 * "Bitmaps").  Backup tools keep an enabled ("auto") bitmap so that the
 * next backup copies only what changed since the last one.  This module
 * keeps them valid, as qemu does (block/meta/bitmap.c):
 *
 * - Opening for writing reads the directory and every bitmap table, and
 *   loads the bits of each enabled bitmap that is not in_use (those are
 *   "tracked").  Disabled bitmaps, and bitmaps already in_use
 *   (inconsistent: qemu reports them so), are never changed.
 * - The image's first change (meta/first-change.h) sets in_use on the
 *   tracked bitmaps' directory entries, durably, before any guest data
 *   changes.
 * - Every write, zero and discard sets the bits of the guest range it
 *   covers (qcow2_bitmaps_mark, called once by each entry point, as qemu
 *   marks whole requests at its block layer).
 * - A flush stores the bits that changed (qcow2_bitmaps_store): new data
 *   clusters and a new table for each bitmap that changed are allocated,
 *   written and made durable (with their refcounts) before the bitmap's
 *   directory entry is pointed at the new table, in place, an aligned
 *   8-byte write that a crash cannot tear; the old table and data
 *   clusters are released after that.  A clean close does the same and
 *   clears in_use (QCOW2_STORE_CLEAN), after the bits are durable, so
 *   that qemu finds the bitmaps consistent; a crash leaves them in_use,
 *   which qemu reports as inconsistent, as after its own crash.
 *
 * Bitmaps this module cannot keep (an unknown flag or type, extra data,
 * a size or granularity qemu would refuse, a broken directory, bad table
 * entries) are not kept: the first change clears autoclear bit 0, as it
 * did before bitmaps were kept, with the reason in the log.  A directory,
 * bitmap table or data cluster that lies outside the file, that overlaps
 * other metadata or another bitmap's, or that the refcounts count free,
 * refuses writing (nothing is written).
 *
 * Offers: qcow2_bitmaps_open, qcow2_bitmaps_check, qcow2_bitmaps_free,
 * qcow2_bitmaps_autoclear, qcow2_bitmaps_tracking, qcow2_bitmaps_first_change,
 * qcow2_bitmaps_mark, qcow2_bitmaps_store, qcow2_bitmaps_each_range.
 * Locks: a lock of its own for the bits, a leaf taken by
 * qcow2_bitmaps_mark and the store's copy; one store at a time under a
 * second lock of its own, taken with no other lock held (a store takes
 * the writeback lock and the image lock inside it).  Open, check and
 * free with nothing else running; qcow2_bitmaps_first_change under the
 * first change's lock (meta/first-change.h), taking the store's lock
 * itself.
 * Needs: the header's extension, host I/O, the allocator (new clusters,
 * releases), the refcounts (the check), the writeback (what a store
 * allocated is counted durably before anything points at it).
 */
#ifndef QCOW2_BITMAP_H
#define QCOW2_BITMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/image.h"

/* Read the bitmaps of an image being opened for writing (FIRST: its
 * first cluster, FIRST_LEN bytes): the extension, the directory and the
 * tables, and the bits of the tracked bitmaps.  Sets img->bitmaps (NULL
 * when the image has no bitmaps extension it vouches for).  Bitmaps it
 * cannot keep are logged and dropped (qcow2_bitmaps_autoclear then keeps
 * no bit).  0, -EINVAL after logging a directory, table or data cluster
 * outside the file, or another -errno after logging.
 */
int qcow2_bitmaps_open (struct qcow2_image *img, struct qcow2_io *io,
                        const uint8_t *first, size_t first_len);

/* Once the refcounts are loaded (or repaired): every cluster the bitmaps
 * use must be counted, and none may overlap the header, the L1 table,
 * the refcount table or blocks, an L2 table, the LUKS area or another
 * bitmap's clusters.  0, or -EINVAL after logging which.
 */
int qcow2_bitmaps_check (struct qcow2_image *img, struct qcow2_io *io);

void qcow2_bitmaps_free (struct qcow2_image *img);

/* The autoclear bits the bitmaps keep set: QCOW2_AUTOCLEAR_BITMAPS when
 * they are kept valid, else 0.
 */
uint64_t qcow2_bitmaps_autoclear (const struct qcow2_image *img);

/* Are bitmaps kept valid and tracked (so that the first change marks
 * them in use)?
 */
bool qcow2_bitmaps_tracking (const struct qcow2_image *img);

/* Set in_use in the directory entries of the tracked bitmaps, in place
 * (aligned 4-byte writes: each is on disk whole or not at all).  The
 * caller flushes before any guest data changes.  Under the first
 * change's lock, with no lock of the bitmaps held.  0, or -errno after
 * logging.
 */
int qcow2_bitmaps_first_change (struct qcow2_image *img, struct qcow2_io *io);

/* Set the bits of the tracked bitmaps that cover guest bytes
 * [OFFSET, OFFSET+COUNT).  No lock needed; never fails.
 */
void qcow2_bitmaps_mark (struct qcow2_image *img, uint64_t offset,
                         uint64_t count);

/* What a store leaves on disk. */
enum qcow2_bitmaps_store_mode {
  QCOW2_STORE_IN_USE,         /* a flush: the bitmaps stay in_use */
  QCOW2_STORE_CLEAN,          /* a clean close: in_use cleared at the end */
};

/* Store the bits that changed (see the top of this file), with a metadata
 * writeback and a flush of the storage inside (qcow2_writeback (IMG, IO,
 * true)), so that a flush needs nothing else.  With QCOW2_STORE_CLEAN,
 * call it with no request in flight and none to come until it returns:
 * in_use is then cleared, and *CLEARED set (else false), so that the
 * next change is a first change again.  No lock held.  0, or -errno
 * after logging (the bitmaps stay in_use).
 */
int qcow2_bitmaps_store (struct qcow2_image *img, struct qcow2_io *io,
                         enum qcow2_bitmaps_store_mode mode, bool *cleared);

/* Call FN for every host range the bitmaps use (the directory, each
 * table, each data cluster), with WHAT naming it, until it returns
 * nonzero (then return that).  For the refcount repair.
 */
typedef int (*qcow2_range_fn) (void *opaque, uint64_t offset,
                               uint64_t length, const char *what);
int qcow2_bitmaps_each_range (struct qcow2_image *img, qcow2_range_fn fn,
                              void *opaque);

#endif /* QCOW2_BITMAP_H */
