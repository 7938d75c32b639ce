/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: allocating host clusters, and releasing them.
 *
 * Increments are made in memory and written (then flushed) before any L2
 * entry that needs them; releases are queued and applied only after the
 * metadata that stopped referencing the clusters is on disk, so that a
 * freed cluster cannot be reused while the disk still points at it.  A
 * crash can therefore leak clusters but never leave one referenced with
 * refcount 0.
 *
 * Compressed data is packed back to back, as qemu packs it, into host
 * clusters the allocator keeps free for it; while it is, single clusters
 * for plain data and tables come from a window of free clusters set apart,
 * so that they interrupt the packing once per window instead of once per
 * cluster (each interruption leaves part of a host cluster unused).
 *
 * The allocator never writes metadata back.  When the file is full but
 * released clusters wait for a writeback, it answers QCOW2_RECLAIM: the
 * caller (the write entry) then runs qcow2_writeback, which applies the
 * releases, and tries again.
 *
 * Offers: qcow2_alloc_clusters, qcow2_pack_compressed, qcow2_free_later,
 * qcow2_apply_frees, qcow2_pending_frees.
 * Locks: every call with the image lock held exclusively.
 * Needs: the refcounts, host I/O, the cluster cache (released compressed
 * clusters leave it).
 */
#ifndef QCOW2_ALLOC_H
#define QCOW2_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "qcow2-types.h"

/* Not an errno: the file is full, but clusters released since the last
 * writeback will make room once it applies them.  Never returned with
 * QCOW2_ALLOC_NO_RECLAIM, and never out of the engine's public calls.
 */
#define QCOW2_RECLAIM (-0x10000)

/* How to allocate: flags, QCOW2_ALLOC_ANY for none.  An allocation made
 * on the way (a refcount block, a bigger refcount table) keeps the flags.
 */
enum {
  QCOW2_ALLOC_ANY = 0,
  /* A host cluster to pack compressed data into: never from the window. */
  QCOW2_ALLOC_PACK = 1,
  /* Not from the window: the allocation is part of filling it. */
  QCOW2_ALLOC_NO_WINDOW = 2,
  /* Fail with -ENOSPC rather than answer QCOW2_RECLAIM, when a writeback
   * may not run now: the refcount table in memory has outgrown its
   * clusters on disk, or a release could free the host cluster being
   * packed into.
   */
  QCOW2_ALLOC_NO_RECLAIM = 4,
};

/* Set up the allocator of an image opened for writing (after
 * qcow2_refcount_load), and free what it holds.
 */
void qcow2_alloc_init (struct qcow2_image *img);
void qcow2_alloc_free (struct qcow2_image *img);

/* Allocate COUNT contiguous host clusters with refcount 1 (MODE: the
 * flags above); *OFFSET gets the first one's host offset.  0,
 * QCOW2_RECLAIM (nothing changed that matters: try again after a
 * writeback), -ENOSPC after logging how much room is missing, or another
 * -errno after logging.
 */
int qcow2_alloc_clusters (struct qcow2_image *img, struct qcow2_io *io,
                          uint64_t count, unsigned mode, uint64_t *offset);

/* Put LEN bytes of one cluster's compressed data (DATA) into the packing
 * area and write them: back to back with the previous cluster's, running
 * on into the next host cluster if that one can be allocated right after
 * it, else into a new one.  Every host cluster the sector-rounded range
 * touches gets one more reference.  *HOST gets the data's host offset.
 * 0, QCOW2_RECLAIM, or -errno after logging.
 */
int qcow2_pack_compressed (struct qcow2_image *img, struct qcow2_io *io,
                           const uint8_t *data, uint64_t len, uint64_t *host);

/* Queue a release of [OFFSET, OFFSET+LENGTH) (one reference less for each
 * host cluster it touches, and CACHE_KEY, if not 0, out of the cluster
 * cache) for after the next writeback.  0, or -ENOMEM after logging.
 */
int qcow2_free_later (struct qcow2_image *img, uint64_t offset,
                      uint64_t length, uint64_t cache_key);

/* Apply the queued releases to the refcounts in memory: only once the
 * metadata that stopped pointing at them is durable.
 */
int qcow2_apply_frees (struct qcow2_image *img, struct qcow2_io *io);

/* Releases queued and not applied yet. */
size_t qcow2_pending_frees (const struct qcow2_image *img);

#endif /* QCOW2_ALLOC_H */
