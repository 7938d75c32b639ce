/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: where guest clusters live.
 *
 * The map (img->map, this module's) holds the L1 table in memory (host
 * order) while the image is open, and the cache of L2 tables as read
 * from disk; a changed L2 table not written back yet is found in the
 * dirty set first (meta/dirty.h).  Every entry is validated before use:
 * a bad one is an error naming the guest offset, never a read elsewhere.
 *
 * Offers: opening and closing the map, L1 entries, L2 lookups, the
 * classification of an entry, the L2 cache's tables and counters.
 * Locks: the caller holds the image lock (shared is enough) around a
 * lookup, so that no writer changes a table meanwhile, and holds it
 * exclusively to set an L1 entry.
 * Needs: host I/O, the dirty set, the L2 cache.
 */
#ifndef QCOW2_MAP_H
#define QCOW2_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/cache.h"
#include "meta/image.h"

enum cluster_kind {
  CLUSTER_UNALLOCATED,
  CLUSTER_ZERO,
  CLUSTER_NORMAL,
  CLUSTER_COMPRESSED,
};

/* Where one guest cluster's data lives. */
struct cluster_map {
  enum cluster_kind kind;
  uint64_t host_offset;       /* normal: cluster start; compressed: byte */
  uint64_t compressed_len;    /* compressed: bytes in the range */
  uint64_t l2_entry;          /* the raw entry (cache key) */
};

/* Read the L1 table the header names and make the L2 cache
 * (L2_CACHE_BYTES).  0, or -errno after logging.
 */
/* Is [OFFSET, OFFSET + COUNT) inside the guest disk?  0, or -EINVAL with
 * a message that names the request as WHAT ("read", "request").
 */
int qcow2_guest_range_check (struct qcow2_image *img, const char *what,
                             uint64_t count, uint64_t offset);

int qcow2_map_open (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t l2_cache_bytes);
void qcow2_map_close (struct qcow2_image *img);

/* L1 entry L1_INDEX (inside the table), as held in memory. */
uint64_t qcow2_l1_entry (const struct qcow2_image *img, uint64_t l1_index);

/* Set L1 entry L1_INDEX in memory, with the image lock held
 * exclusively (or while the image opens); the caller marks it changed
 * (qcow2_l1_mark_changed) or writes it.
 */
void qcow2_l1_set_entry (struct qcow2_image *img, uint64_t l1_index,
                         uint64_t entry);

/* With the image lock held exclusively: L1 entry L1_INDEX changed (it is
 * written back with the next writeback), and has it changed since the
 * last writeback copied it?
 */
void qcow2_l1_mark_changed (struct qcow2_image *img, uint64_t l1_index);
bool qcow2_l1_changed (const struct qcow2_image *img, uint64_t l1_index);
/* Has any L1 entry changed since the last writeback copied them? */
bool qcow2_l1_any_changed (const struct qcow2_image *img);

/* The changed L1 entries a writeback writes: copied under the image lock
 * held exclusively (they count as unchanged from then on), written with
 * none, in runs of consecutive entries, and then, if the write failed
 * (WRITTEN false), counted as changed again.  qcow2_l1_copy: 0, or
 * -ENOMEM after logging (nothing copied).
 */
struct l1_copy {
  size_t count;
  uint32_t *index;                  /* the changed entries, rising */
  uint8_t *data;                    /* their values, big-endian */
};
int qcow2_l1_copy (struct qcow2_image *img, struct l1_copy *copy);
int qcow2_l1_copy_write (struct qcow2_image *img, struct qcow2_io *io,
                         const struct l1_copy *copy);
void qcow2_l1_copy_done (struct qcow2_image *img, struct l1_copy *copy,
                         bool written);

/* Does L1 entry L1_INDEX have no L2 table (all its clusters
 * unallocated)?  False for an entry that is not simply empty, which
 * qcow2_l2_entries then checks.
 */
bool qcow2_l1_unallocated (const struct qcow2_image *img, uint64_t l1_index);

/* The L2 table L1 entry L1_INDEX names, as on disk (from the cache or
 * its run, or read and cached), into BUF (a cluster).  0, or -errno after
 * logging.
 */
int qcow2_l2_table_read (struct qcow2_image *img, struct qcow2_io *io,
                         uint64_t l1_index, uint8_t *buf);

/* L2 tables in one run.  A table whose entries inside the disk all
 * follow from its first (consecutive host clusters, as qemu-img convert
 * and preallocation lay a full disk out; or one value throughout), with
 * one bitmap throughout that is none, all allocated or all zero, is kept
 * as that first entry beside its L1 entry (8 bytes each) once read, and
 * answers lookups with no read even after the cache let it go.  What is
 * kept is the disk's table: it is forgotten when the L1 entry changes,
 * and must be forgotten, with the image lock held exclusively, before a
 * table is changed in place (meta/l2table.c does; so does a repair that
 * rewrites tables).
 */
void qcow2_l2_run_forget (struct qcow2_image *img, uint64_t l1_index);

/* The L2 table at OFFSET is on disk as DATA now (written back): keep it
 * in the cache.  Or it moved and is no one's any more: forget it.
 */
void qcow2_l2_table_written (struct qcow2_image *img, uint64_t offset,
                             const uint8_t *data);
void qcow2_l2_table_forget (struct qcow2_image *img, uint64_t offset);

/* The L2 table at OFFSET as the cache holds it, into BUF (a cluster);
 * false if it is not cached.  Only the disk's version: a table in the
 * dirty set may differ (meta/dirty.h).
 */
bool qcow2_l2_table_cached (struct qcow2_image *img, uint64_t offset,
                            uint8_t *buf);

/* Of an image opened for writing: the host offsets of the L2 tables read
 * from disk since the last call, into OFFSETS (QCOW2_L2_LOADED_MAX
 * entries), and how many.  Tables read while the list was full are not
 * in it.  Any lock mode; the allocator calls it (meta/uncounted.c).
 */
#define QCOW2_L2_LOADED_MAX 1024
size_t qcow2_l2_loaded_take (struct qcow2_image *img, uint64_t *offsets);

/* The L2 cache's counters. */
void qcow2_l2_cache_stats (struct qcow2_image *img,
                           struct qcow2_cache_stats *stats);

/* Most entries qcow2_l2_entries returns at once. */
#define QCOW2_L2_BATCH 512

/* Fetch the L2 entries (host order) for guest clusters
 * [FIRST, FIRST + *N) into ENTRIES, and with extended L2 entries their
 * subcluster bitmaps into BITMAPS (if not NULL; zeros otherwise); *N is
 * cut so the range stays inside one L2 table and QCOW2_L2_BATCH.  L2BUF
 * is cluster_size bytes of scratch.  Returns 0 or a negative errno after
 * logging.
 */
int qcow2_l2_entries (struct qcow2_image *img, struct qcow2_io *io,
                      uint64_t first, size_t *n, uint64_t *entries,
                      uint64_t *bitmaps, uint8_t *l2buf);

/* Decode a standard L2 ENTRY for guest cluster GUEST_CLUSTER into *MAP,
 * validating it (a compressed cluster in an encrypted image is invalid).
 * Returns 0, or -EIO after logging what is wrong.
 */
int qcow2_classify (struct qcow2_image *img, uint64_t guest_cluster,
                    uint64_t entry, struct cluster_map *map);

/* qcow2_classify for entry I of what qcow2_l2_entries gave for the
 * clusters from FIRST (ENTRIES, BITMAPS), and with extended L2 the check
 * of its bitmap against *MAP: a compressed cluster's is empty, no
 * subcluster is both allocated and zero, none is allocated without a
 * host offset.  0, or -EIO after logging.
 */
int qcow2_classify_fetched (struct qcow2_image *img, uint64_t first,
                            size_t i, const uint64_t *entries,
                            const uint64_t *bitmaps, struct cluster_map *map);

/* With extended L2 entries, where the guest bytes of a subcluster of a
 * cluster that is not compressed (MAP, BITMAP) come from: the host
 * cluster (allocated), zeros (zero, or unallocated without a backing
 * file), or the backing file.
 */
enum subcluster_source { SUB_HOST, SUB_ZEROS, SUB_BACKING };

/* The run of subclusters alike that holds byte POS of such a cluster
 * (an offset into it): where its bytes come from, and *END, where the
 * run ends, at HI at the latest (POS < HI <= the cluster size).
 */
enum subcluster_source qcow2_subcluster_run (const struct qcow2_image *img,
                                             const struct cluster_map *map,
                                             uint64_t bitmap, uint64_t pos,
                                             uint64_t hi, uint64_t *end);

/* The host bytes compressed MAP is counted in: qemu counts a compressed
 * cluster once in every host cluster its sector-rounded range touches,
 * [*START, *START + *LEN) with *START the sector it begins in.
 */
void qcow2_compressed_span (const struct cluster_map *map, uint64_t *start,
                            uint64_t *len);

#endif /* QCOW2_MAP_H */
