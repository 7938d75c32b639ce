/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: which host clusters hold metadata, and of what kind.
 *
 * The list of metadata regions (img->regions, this module's) holds, for
 * an image opened for writing, every host cluster that holds metadata as
 * the image stands in memory: the header, the active L1 table and its L2
 * tables, the refcount table and blocks, the snapshot table and the
 * snapshots' L1 tables, the bitmap directory and the bitmaps' tables,
 * and the LUKS area.  It is built when the image opens, and kept current
 * by whoever places metadata: a new or copied L2 table, a new refcount
 * block or a grown refcount table, a stored bitmap.  A cluster leaves it
 * only when its refcount drops to 0 (meta/release.c), the moment it may
 * be handed out again, so that a table that moved stays protected until
 * nothing on disk can point at it any more.  All metadata lies in whole
 * clusters, so the list is kept by cluster.
 *
 * Two uses: the allocator never hands out a cluster the list holds, even
 * if a damaged refcount says it is free; and every write to the image
 * file says what it writes (meta/hostio.h), and is checked against the
 * list before it goes out, as qemu's overlap checks do (meta/corrupt.h).
 *
 * A damaged image may name one cluster as two structures (an L1 entry
 * pointing at the refcount table).  The list is built from the most
 * trusted names first (the header's fields, then the tables' entries),
 * and such a cluster keeps its first kind, marked claimed twice: it is
 * then the right place for neither structure, and every check that asks
 * for one kind there fails.
 *
 * Offers: the region kinds and their names, building, adding, removing
 * and finding regions.
 * Locks: changed with the image lock held exclusively; looked up with or
 * without it (a write checks with none).  A lock of its own, a leaf,
 * inside each call.
 * Needs: nothing but the image's geometry.
 */
#ifndef QCOW2_REGIONS_H
#define QCOW2_REGIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "meta/image.h"

/* What a host cluster holds (qemu's names for its overlap checks in
 * qcow2_region_name where it has one).
 */
enum qcow2_region {
  QCOW2_REGION_NONE = 0,            /* guest data, or nothing */
  QCOW2_REGION_HEADER,
  QCOW2_REGION_L1,                  /* the active L1 table */
  QCOW2_REGION_L2,                  /* an L2 table */
  QCOW2_REGION_REFCOUNT_TABLE,
  QCOW2_REGION_REFCOUNT_BLOCK,
  QCOW2_REGION_SNAPSHOT_TABLE,
  QCOW2_REGION_SNAPSHOT_L1,         /* a snapshot's L1 table */
  QCOW2_REGION_BITMAP_DIRECTORY,
  QCOW2_REGION_BITMAP_TABLE,
  QCOW2_REGION_BITMAP_DATA,         /* a bitmap's bits */
  QCOW2_REGION_LUKS,                /* the LUKS header and key material */
  QCOW2_REGION_KINDS
};

/* "active L1 table", "refcount block", ... */
const char *qcow2_region_name (enum qcow2_region kind);

/* Make the empty list (images opened for writing), and free it.
 * qcow2_regions_open: 0, or -ENOMEM (the caller logs).
 */
int qcow2_regions_open (struct qcow2_image *img);
void qcow2_regions_close (struct qcow2_image *img);

/* The clusters [OFFSET, OFFSET+LENGTH) touches hold KIND from now on.
 * 0, or -ENOMEM (nothing added; the caller logs).  A cluster already
 * listed keeps the kind it had: a damaged image may name one cluster
 * twice, and the first name protects it as well as the second.
 */
int qcow2_regions_add (struct qcow2_image *img, enum qcow2_region kind,
                       uint64_t offset, uint64_t length);

/* Host cluster CLUSTER holds no metadata any more. */
void qcow2_regions_remove (struct qcow2_image *img, uint64_t cluster);

/* The kind of host cluster CLUSTER (QCOW2_REGION_NONE on an image opened
 * read-only).
 */
enum qcow2_region qcow2_regions_kind (const struct qcow2_image *img,
                                      uint64_t cluster);

/* The first cluster of [OFFSET, OFFSET+LENGTH) that holds metadata of a
 * kind other than ALLOWED (QCOW2_REGION_NONE for guest data), or that
 * two structures claim: its kind, and its host offset in *WHERE;
 * QCOW2_REGION_NONE if there is none.
 */
enum qcow2_region qcow2_regions_overlap (const struct qcow2_image *img,
                                         enum qcow2_region allowed,
                                         uint64_t offset, uint64_t length,
                                         uint64_t *where);

/* Is the cluster at host OFFSET of KIND, and claimed by nothing else?
 * (True on an image opened read-only: there is no list.)
 */
bool qcow2_regions_is (const struct qcow2_image *img, enum qcow2_region kind,
                       uint64_t offset);

/* How many clusters the list holds. */
uint64_t qcow2_regions_count (const struct qcow2_image *img);

#endif /* QCOW2_REGIONS_H */
