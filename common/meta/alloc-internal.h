/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the allocator's state, for meta/alloc.c, meta/pack.c
 * and meta/release.c only.
 *
 * The four files are one module with four jobs: finding free clusters
 * and making the refcount blocks and table that count them (alloc.c),
 * packing compressed data back to back (pack.c), the queue of releases
 * that frees clusters once the metadata that stopped pointing at them is
 * durable (release.c), and the clusters that look free but that a table
 * maps, which are never handed out (uncounted.c).  Everyone else goes through
 * meta/alloc.h, meta/pack.h and meta/release.h.
 */
#ifndef QCOW2_ALLOC_INTERNAL_H
#define QCOW2_ALLOC_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/image.h"
#include "meta/release.h"

/* A run of host clusters. */
struct cluster_run {
  uint64_t first;
  uint64_t count;
};

/* Room left in a host cluster that compressed data was packed into, when
 * the packing had to move on before filling it.
 */
struct pack_gap {
  uint64_t offset;
  uint64_t length;
};

#define QCOW2_PACK_GAPS 64

/* A host cluster an L2 table maps while its refcount reads 0
 * (meta/uncounted.c).
 */
struct uncounted {
  uint64_t cluster;
  uint64_t table;             /* the L2 table's host offset */
  uint64_t guest;             /* the guest offset, or UINT64_MAX */
};

#define QCOW2_UNCOUNTED_MAX 4096

struct qcow2_allocator {
  uint64_t host_clusters;     /* clusters that fit in the file */
  uint64_t free_hint;         /* no free cluster below this index */

  /* pack.c: the next free byte for compressed data, or 0, and the gaps
   * that later compressed clusters small enough fill.
   */
  uint64_t pack_cursor;
  struct pack_gap gaps[QCOW2_PACK_GAPS];
  unsigned ngaps;

  /* release.c: releases queued, and taken by a writeback but not
   * applied yet.
   */
  struct pending_free *pending;
  size_t npending, pending_cap;
  size_t in_writeback;
  /* Clusters whose refcount dropped to 0 in memory, held back from
   * allocation until qcow2_alloc_reuse_released has seen the drop
   * durable and discarded them in the storage.  Sorted, apart from each
   * other.
   */
  struct cluster_run *released;
  size_t nreleased, released_cap;
  bool discard_failed;        /* the storage refused a discard: stop */
  /* A cut of the file's free tail in flight (no image lock held): no
   * cluster from here on is handed out until it is done, so that nothing
   * is written where the cut drops the bytes.  UINT64_MAX: none.
   */
  uint64_t cut_from;
  /* Writers waiting for a writeback to make room (qcow2_alloc_room_wanted). */
  _Atomic unsigned room_wanted;

  /* uncounted.c: clusters mapped but counted 0, sorted by cluster. */
  struct uncounted *uncounted;
  size_t nuncounted, uncounted_cap;
};

/* The L2 tables read from disk since the last call (meta/map.h) checked
 * against the refcounts: the clusters they map that are counted 0 are
 * remembered.  With the image lock held exclusively, before the
 * allocator looks for free clusters.  0, or -errno after logging.
 */
int qcow2_uncounted_check_loaded (struct qcow2_image *img,
                                  struct qcow2_io *io);

/* CLUSTER, counted 0, is about to be handed out: if an L2 table maps it,
 * mark the image corrupt and return -EIO; else 0.
 */
int qcow2_uncounted_refuse (struct qcow2_image *img, struct qcow2_io *io,
                            uint64_t cluster);

/* Is CLUSTER held back until its release is durable and discarded? */
bool qcow2_alloc_is_released (const struct qcow2_allocator *a,
                              uint64_t cluster);

/* Allocate host cluster INDEX if it is free: 0, -EBUSY if it is not (or
 * its refcount block would need room there is not), or -errno after
 * logging.
 */
int qcow2_alloc_cluster_at (struct qcow2_image *img, struct qcow2_io *io,
                            uint64_t index);

/* On growable storage, clusters handed out past its end extend the size
 * the engine reads up to; the file itself grows when they are written.
 */
void qcow2_alloc_cover (struct qcow2_image *img, uint64_t first_cluster,
                        uint64_t count);

/* pack.c: host cluster CLUSTER was released: no gap in it is room any
 * more, and if compressed data was being packed into it, packing goes
 * elsewhere.
 */
void qcow2_pack_forget_cluster (struct qcow2_image *img, uint64_t cluster);

#endif /* QCOW2_ALLOC_INTERNAL_H */
