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
 * Compressed data is packed back to back, as qemu packs it, running on
 * into the next host cluster while that one is free.  Every cluster, for
 * packed data, plain data or a table, is the first free one, so the file
 * has no holes to leave behind.  When a plain cluster or a table has
 * taken the next host cluster (the compressed path places a batch's
 * compressed clusters first and its plain ones after, so that happens
 * once per batch at most), the packing moves on and the rest of its host
 * cluster becomes a gap: later compressed clusters that fit go into the
 * gaps first.
 *
 * A cluster whose refcount drops to 0 is not free at once: the
 * allocator holds it back until qcow2_alloc_reuse_released, which the
 * writeback calls once the drop is durable.  That is the one place where
 * a released cluster becomes reusable: it is discarded in the storage
 * there (qcow2-discard=unmap), before anything can be written into it
 * again, and after nothing on disk, and no operation in progress, can
 * still refer to it.
 *
 * The allocator never writes metadata back.  When the file is full but
 * released clusters wait for a writeback, it answers QCOW2_RECLAIM: the
 * caller (the write entry) then runs qcow2_writeback, which applies the
 * releases, and tries again.
 *
 * Offers: qcow2_alloc_clusters, qcow2_pack_reserve, qcow2_free_later,
 * qcow2_take_frees, qcow2_frees_mark, qcow2_apply_frees,
 * qcow2_return_frees, qcow2_pending_frees, qcow2_alloc_released,
 * qcow2_alloc_reuse_released.
 * Locks: every call with the image lock held exclusively.
 * Needs: the refcounts, host I/O (and the storage's discard and
 * truncate), the cluster cache (released compressed clusters leave it),
 * the grace periods (base/inflight.h: a release carries the mark it
 * waits for).
 */
#ifndef QCOW2_ALLOC_H
#define QCOW2_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "meta/types.h"

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
  /* Fail with -ENOSPC rather than answer QCOW2_RECLAIM, when a writeback
   * may not run now: the refcount table in memory has outgrown its
   * clusters on disk, or a release could free the host cluster being
   * packed into.
   */
  QCOW2_ALLOC_NO_RECLAIM = 1,
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

/* Make room for LEN bytes of one cluster's compressed data: in the
 * smallest gap left behind that it fits, else in the packing area, back
 * to back with the previous cluster's, running on into the next host
 * cluster if that one can be allocated right after it, else in a new
 * one.  Every host cluster the sector-rounded range touches
 * gets one more reference.  *HOST gets the data's host offset; the caller
 * writes the data there (outside the lock), and if that fails releases
 * the range (qcow2_free_later of its sector-rounded span).  0,
 * QCOW2_RECLAIM, or -errno after logging.
 */
int qcow2_pack_reserve (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t len, uint64_t *host);

/* Queue a release of [OFFSET, OFFSET+LENGTH) (one reference less for each
 * host cluster it touches, and CACHE_KEY, if not 0, out of the cluster
 * cache) for after the next writeback.  0, or -ENOMEM after logging.
 */
int qcow2_free_later (struct qcow2_image *img, uint64_t offset,
                      uint64_t length, uint64_t cache_key);

/* Take the queued releases out of the queue into *LIST, for a writeback
 * whose metadata no longer points at any of them (it was copied after
 * they were queued).  The allocator still counts them as coming
 * (QCOW2_RECLAIM), until qcow2_apply_frees or qcow2_return_frees.
 */
void qcow2_take_frees (struct qcow2_image *img, struct pending_list *list);

/* The mark every release of LIST waits for (base/inflight.h). */
uint64_t qcow2_frees_mark (const struct pending_list *list);

/* Apply LIST to the refcounts in memory: only once the metadata that
 * stopped pointing at them is durable and their mark has passed.  The
 * clusters whose count drops to 0 stay held back from allocation (until
 * qcow2_alloc_reuse_released).  Frees LIST; on an error, what was not
 * applied goes back to the queue.
 */
int qcow2_apply_frees (struct qcow2_image *img, struct qcow2_io *io,
                       struct pending_list *list);

/* Put LIST back at the head of the queue, unapplied (the writeback
 * failed), and free it.
 */
void qcow2_return_frees (struct qcow2_image *img, struct pending_list *list);

/* Releases queued and not applied yet (taken ones included). */
size_t qcow2_pending_frees (const struct qcow2_image *img);

/* Runs of released clusters held back from allocation. */
size_t qcow2_alloc_released (const struct qcow2_image *img);

/* The released clusters become reusable: call only once their refcount
 * of 0 is durable (written back and flushed) and no operation can read
 * or write them any more (the grace period their releases waited for in
 * the writeback has passed: qcow2_apply_frees comes after it).  With qcow2-discard=unmap they are discarded first, and
 * storage that grows is cut after its last cluster in use.  A failed
 * discard or cut is only a debug message.  0, or -errno after logging
 * (the size of growable storage unknown; the clusters stay held).
 */
int qcow2_alloc_reuse_released (struct qcow2_image *img, struct qcow2_io *io);

#endif /* QCOW2_ALLOC_H */
