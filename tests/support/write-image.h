/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: images to write, and the test's own checks of
 * what the engine wrote.
 *
 * new_image lays out an empty image by hand (any version, cluster size
 * and refcount width, a refcount table of a chosen size), so that write
 * tests need not trust the engine's own qcow2_create.  check_image reads
 * an image from its bytes alone, without the engine: it counts the
 * references to every host cluster from the header, the refcount table
 * and blocks, the L1 and L2 tables and the data they point at, the LUKS
 * area of an encrypted image, the snapshot table and every snapshot's L1
 * table with its L2 tables and data (a table shared by several L1 tables
 * counts once for each, and so do the clusters it maps, as qemu-img check
 * counts them), and compares them with the refcounts stored.  COPIED is
 * checked in the active tables only.
 */
#ifndef QCOW2ZSTD_TEST_WRITE_IMAGE_H
#define QCOW2ZSTD_TEST_WRITE_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qcow2.h"

struct new_image {
  unsigned version;             /* 2 or 3 */
  unsigned cluster_bits;
  unsigned refcount_order;      /* v3: 0..6; v2 has 4 */
  enum qcow2_compression compression;   /* v3 */
  uint64_t virtual_size;
  uint64_t storage_size;        /* bytes of storage, a multiple of clusters */
  unsigned rt_clusters;         /* refcount table clusters; 0: 1 */
};

/* The image, STORAGE_SIZE bytes (zeros after the metadata): the header,
 * the refcount table, one refcount block, the L1 table, each metadata
 * cluster counted once.
 */
uint8_t *new_image (const struct new_image *spec);

/* What a host cluster holds. */
enum write_kind {
  WRITE_DATA,                   /* guest data, compressed or not */
  WRITE_HEADER,                 /* the header (cluster 0) */
  WRITE_REFCOUNT_TABLE,
  WRITE_REFCOUNT_BLOCK,
  WRITE_L1,                     /* the active one or a snapshot's */
  WRITE_L2,
  WRITE_LUKS,                   /* the LUKS header and key material */
  WRITE_SNAPSHOT_TABLE,
};
/* What check_image found. */
struct image_report {
  uint64_t cluster_size;
  uint64_t host_clusters;       /* clusters of the file */
  uint32_t *refs;               /* references per host cluster */
  uint64_t *refcount;           /* refcounts stored per host cluster */
  uint8_t *role;                /* enum write_kind per host cluster */
  uint64_t refcount_table_offset;
  uint32_t refcount_table_clusters;
  uint64_t l1_offset;
  uint32_t l1_size;
  uint64_t leaked;              /* clusters with refcount > references */
  uint64_t short_counted;       /* clusters with refcount < references */
  uint64_t copied_wrong;        /* COPIED set where refcount != 1, or
                                   clear on a plain cluster with 1 */
  uint64_t broken;              /* entries out of the file, misaligned,
                                   reserved bits */
  char first_problem[300];
};

/* Check the image in FILE (SIZE bytes).  With EXACT, every refcount
 * must equal the references counted (what a writeback leaves); else a
 * refcount may exceed them (a leak: what a crash may leave) but never
 * fall short.  Returns true if the image passes; the report says why not.
 * Free the report with image_report_free.
 */
bool check_image (const uint8_t *file, uint64_t size, bool exact,
                  struct image_report *report);
void image_report_free (struct image_report *report);

/* What the write at [OFFSET, OFFSET+LEN) changed, by what the report
 * says its first cluster holds.
 */
enum write_kind classify_write (const struct image_report *report,
                                uint64_t offset, uint64_t len);

#endif /* QCOW2ZSTD_TEST_WRITE_IMAGE_H */
