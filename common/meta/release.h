/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: releasing host clusters.
 *
 * A cluster that stops being referenced is not free at once.  Its
 * release is queued (qcow2_free_later), and applied to the refcounts in
 * memory only after the metadata that stopped pointing at it is on disk
 * and no read or write that looked it up before is still in flight
 * (qcow2_frees_mark, base/inflight.h): the writeback does both
 * (meta/writeback.h).  A cluster whose refcount then drops to 0 leaves
 * the list of metadata regions, but is still held back from allocation
 * until the drop is durable too (qcow2_alloc_reuse_released): that is
 * the one place where a released cluster becomes reusable, and where it
 * is discarded in the storage (qcow2-discard=unmap), before
 * anything can be written into it again, and after nothing on disk, and
 * no operation in progress, can still refer to it.  A crash can
 * therefore leak clusters but never leave one referenced with refcount 0.
 * The state is the allocator's (meta/alloc-internal.h).
 *
 * Offers: the queue (qcow2_free_later, qcow2_take_frees,
 * qcow2_frees_mark, qcow2_frees_fetch, qcow2_apply_frees,
 * qcow2_return_frees, qcow2_pending_frees) and the clusters held back
 * (qcow2_alloc_released, qcow2_alloc_cut_released,
 * qcow2_alloc_discard_released, qcow2_alloc_reuse_released).
 * Locks: every call with the image lock held exclusively, but
 * qcow2_frees_fetch, with it held shared, and
 * qcow2_alloc_discard_released, with none.
 * Needs: the refcounts, the regions, the allocator's packing, the
 * cluster cache (released compressed clusters leave it), the grace
 * periods, host I/O (and the storage's discard and truncate).
 */
#ifndef QCOW2_RELEASE_H
#define QCOW2_RELEASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/image.h"
#include "meta/refcount.h"

/* A range of host bytes whose clusters lose one reference once the
 * metadata that stopped pointing at them is on disk, and once no
 * operation that may still touch them is in flight (MARK has passed:
 * base/inflight.h).
 */
struct pending_free {
  uint64_t offset;
  uint64_t length;
  uint64_t cache_key;         /* cluster cache key to drop, or 0 */
  uint64_t mark;              /* qcow2_inflight_mark when queued */
};

/* Releases taken out of the queue by a writeback. */
struct pending_list {
  struct pending_free *frees;
  size_t count;
};

/* Queue a release of [OFFSET, OFFSET+LENGTH) (one reference less for each
 * host cluster it touches, and CACHE_KEY, if not 0, out of the cluster
 * cache) for after the next writeback.  0, or -ENOMEM after logging.
 */
int qcow2_free_later (struct qcow2_image *img, uint64_t offset,
                      uint64_t length, uint64_t cache_key);

/* Take the queued releases out of the queue into *LIST, for a writeback
 * whose metadata no longer points at any of them (it was copied after
 * they were queued).  They still count as coming
 * (qcow2_alloc_room_after_writeback) until qcow2_apply_frees or
 * qcow2_return_frees.
 */
void qcow2_take_frees (struct qcow2_image *img, struct pending_list *list);

/* The mark every release of LIST waits for (base/inflight.h). */
uint64_t qcow2_frees_mark (const struct pending_list *list);

/* Read into *F the refcount blocks that applying LIST will change and
 * that are not in memory (meta/refcount.h), with the image lock held
 * shared, so that qcow2_apply_frees does not read them with it held
 * exclusively.  As many as *F holds; 0, or -errno after logging.
 */
int qcow2_frees_fetch (struct qcow2_image *img, struct qcow2_io *io,
                       const struct pending_list *list,
                       struct refcount_fetch *f);

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

/* The released clusters become reusable once their refcount of 0 is
 * durable (written back and flushed) and no operation can read or write
 * them any more (the grace period their releases waited for in the
 * writeback has passed: qcow2_apply_frees comes after it).  With
 * qcow2-discard=unmap they are discarded first (but once a writer waits
 * for room, qcow2_alloc_room_wanted, the rest are reused undiscarded),
 * and storage that grows is cut after its last cluster in use; a failed
 * discard or cut is only a debug message.  Three calls, by the writeback alone (with the
 * writeback lock held, so that the runs held do not change under them),
 * so that the storage is told with no image lock held:
 *
 *   qcow2_alloc_cut_released   image lock held exclusively: in *PLAN
 *                              the runs to discard, and where a file
 *                              that grows can be cut; the clusters from
 *                              there on are held back from allocation
 *                              too (an allocation that needs them waits
 *                              for a writeback: meta/alloc.h).  0, or
 *                              -errno after logging (a refcount block
 *                              that cannot be read: nothing to do, the
 *                              clusters stay held).
 *   qcow2_alloc_discard_released  no image lock held: the cut and the
 *                              discards (the clusters are still held
 *                              back, and nothing refers to them); *PLAN
 *                              says what was cut.
 *   qcow2_alloc_reuse_released image lock held exclusively: the runs of
 *                              PLAN can be handed out again, and the
 *                              file's size is what the cut left.
 */
struct qcow2_release_plan {
  size_t runs;                  /* the first RUNS runs held */
  uint64_t storage_end;         /* nothing is discarded from here on */
  uint64_t cut_from;            /* the first cluster cut off, or 0 */
  bool discard;                 /* qcow2-discard=unmap, storage that can */
};

int qcow2_alloc_cut_released (struct qcow2_image *img, struct qcow2_io *io,
                              struct qcow2_release_plan *plan);
void qcow2_alloc_discard_released (struct qcow2_image *img,
                                   struct qcow2_io *io,
                                   struct qcow2_release_plan *plan);
void qcow2_alloc_reuse_released (struct qcow2_image *img,
                                 const struct qcow2_release_plan *plan);

#endif /* QCOW2_RELEASE_H */
