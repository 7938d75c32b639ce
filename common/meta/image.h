/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the open image, as every module receives it.
 *
 * struct qcow2_image has two parts.  The core comes first: what the
 * image is (its header, the options it was opened with, its log), the
 * image lock, the table of what is in flight, the file's size and the
 * counters.  Every module reads the core; who may change a field is
 * written beside it.  Then come the sub-objects, one pointer each, owned
 * by the module named beside it: that module alone defines the struct
 * (in its .c, or in an internal header of its folder), makes it when the
 * image opens and frees it when it closes; everyone else reaches it
 * through the functions of that module's header.  A pointer is NULL
 * where the image has no use for it (no refcounts in memory for an image
 * opened read-only, no dedup table without compression).
 *
 * The image lock.  Held exclusively to change the metadata (the L1 and
 * L2 tables, the refcounts, the allocator's state, the dirty set), held
 * shared to look it up, and only for that: never across guest data I/O,
 * compression or decompression, nor across the writeback's I/O.  Held
 * exclusively, it is held across no storage call at all, which would
 * stop every reader and writer for a device round trip: what a change
 * needs from the storage is read before, with the lock shared (L2
 * tables, refcount blocks: paths/commit.c, meta/writeback.c), the first
 * change is written before it is taken (meta/first-change.h), the free
 * tail cut and the discards after it is let go (meta/release.h).  Left:
 * a refcount block missed all the same (an allocation that runs past
 * the block read ahead, the counts of what an L2 table shared with a
 * snapshot maps when it is copied, the search for a free tail), and the
 * marks of damage (meta/corrupt.h).  Where it ranks among the other locks:
 * base/lockorder.h.
 *
 * Offers: the struct, and small inline facts derived from the core.
 * Needs: the header and entry formats, the options and I/O interfaces,
 * the locks and the in-flight table.
 */
#ifndef QCOW2_IMAGE_H
#define QCOW2_IMAGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/inflight.h"
#include "base/io.h"
#include "base/lockorder.h"
#include "base/options.h"
#include "format/header.h"

struct qcow2_cache;
struct qcow2_map;
struct qcow2_dirty;
struct qcow2_refcounts;
struct qcow2_allocator;
struct qcow2_regions;
struct qcow2_writeback;
struct qcow2_bitmaps;
struct qcow2_crypt;
struct qcow2_scratch_list;
struct qcow2_compressors;
struct qcow2_dedup;
struct qcow2_backing;

/* What the engine counts, for qcow2_image_get_stats and the debug log. */
struct qcow2_counters {
  _Atomic uint64_t clusters_decompressed;     /* paths/chunk.c */
  _Atomic uint64_t bytes_read_underneath;     /* meta/hostio.c */
  _Atomic uint64_t reads_underneath;          /* meta/hostio.c */
  _Atomic uint64_t reads_fetched_ahead;       /* paths/fetchahead.c */
  _Atomic uint64_t fetches_in_background;     /* paths/fetchahead.c */
  /* Bytes written since the last flush began (meta/hostio.c), which
   * write.c flushes early once there are many.
   */
  _Atomic uint64_t unflushed_bytes;
  atomic_bool early_flush_running;            /* write.c */
  _Atomic unsigned active_reads;              /* paths/read.c */
};

struct qcow2_image {
  /* ----------------------------------------------------------- the core */

  /* The header as on disk.  Fixed once the image is open, but for the
   * fields written back while it is served, each changed under the
   * image lock held exclusively by the module that writes it: the
   * refcount table's place (meta/refcount.c), the autoclear bits and
   * the dirty bit of qcow2-lazy-refcounts (meta/first-change.c, cleared
   * by meta/writeback.c; changed atomically, since meta/corrupt.c reads
   * it with no lock held).  The corrupt bit is set on disk only
   * (meta/corrupt.c).  When a snapshot is served, l1_size and
   * l1_table_offset are the snapshot's.
   */
  struct qcow2_header header;
  struct qcow2_log log;
  struct qcow2_options opts;          /* fixed once open */
  bool serving_snapshot;              /* read-only then */
  /* A LUKS-encrypted image's LUKS header and key material, in host bytes
   * (set by paths/encrypt.c as the image opens; zero length without).
   */
  uint64_t luks_area_offset, luks_area_length;

  struct qcow2_rwlock lock;           /* the image lock, above */
  /* Reads and writes between their lookup and their last I/O, and the
   * guest clusters whose new host clusters are being written.
   */
  struct qcow2_inflight inflight;
  /* The file's size: grows (growable storage) under the image lock held
   * exclusively, when clusters are allocated (meta/alloc.c), shrinks
   * under it once the free tail is cut (meta/release.c); read anywhere.
   */
  _Atomic uint64_t file_size;
  /* No byte of the image file at or past this offset has been discarded
   * or cut off since the image opened (meta/release.c raises it before
   * it does either): a hole that the storage reports there is one it had
   * already, not what a discard left, which may read as anything
   * (base/io.h) until it is durable.
   */
  _Atomic uint64_t discarded_end;
  /* The connections' threads that fetch ahead (paths/fetchahead.c):
   * how many are reading the storage now, and whether they may start
   * another read (qcow2_image_stop_background).
   */
  _Atomic unsigned background_reads;
  _Atomic bool background_stopped;
  /* The image's first change of a session is still to come (cleared by
   * meta/first-change.c under the image lock held exclusively once its
   * writes, made without it, are durable; read with it held, or by
   * meta/hostio.c's check of every write).
   */
  atomic_bool first_change_pending;
  /* One first change at a time (meta/first-change.c's). */
  struct qcow2_mutex first_change_lock;
  /* The engine found the image damaged while writing it, and marked it
   * corrupt: no write reaches the file any more (meta/corrupt.h).
   */
  atomic_bool corrupt;
  /* Bumped (meta/release.c) before released clusters' cache entries are
   * dropped, so that a decode started before the release cannot put
   * them back (paths/chunk.c) and a copy verified before it is not
   * shared (paths/compress.c).
   */
  _Atomic uint64_t free_generation;
  struct qcow2_counters counters;

  /* Decoded compressed clusters, by L2 entry: the read paths fill it,
   * a release of the cluster empties its entry (meta/release.c).
   */
  struct qcow2_cache *cluster_cache;

  /* The backing file (backing.c), NULL when unallocated clusters read
   * as zeros, and how to read LEN bytes of its disk at OFFSET (zeros past
   * its end) and what its chain reports for a range, as qcow2_extents
   * reports it.  Pointers, because the paths that call them lie below
   * backing.c, which opens the backing file as an image of its own.
   */
  struct qcow2_backing *backing;
  int (*read_backing) (struct qcow2_image *img, void *buf, uint64_t len,
                       uint64_t offset);
  int (*backing_extents) (struct qcow2_image *img, uint64_t offset,
                          uint64_t len, qcow2_extent_fn fn, void *opaque);
  /* Does [OFFSET, OFFSET+LEN) of the backing file read as zeros by what
   * its metadata says, without reading data (qemu's bdrv_co_is_zero_fast:
   * no byte inside a raw backing file is)?  0, or -errno after logging.
   */
  int (*backing_zero_fast) (struct qcow2_image *img, uint64_t offset,
                            uint64_t len, bool *zero);

  /* The external data file (datafile.c), or NULL: with one, the host
   * offset of a data cluster is an offset into it (the guest offset, as
   * qemu places them), and meta/hostio.c reads and writes data clusters
   * through data_io, reading zeros past its data_size bytes; data_path
   * is where it is (for locking it).  Set as the image opens; data_size
   * grows as writes extend the file (meta/hostio.c, with or without the
   * image lock, before the entries that map what they wrote are linked).
   */
  struct qcow2_data_file *data_file;
  struct qcow2_io *data_io;
  _Atomic uint64_t data_size;
  const char *data_path;

  /* ------------------------------------------------- the sub-objects */

  struct qcow2_map *map;              /* meta/map.c: L1, L2 cache */
  struct qcow2_dirty *dirty;          /* meta/dirty.c: changed tables */
  struct qcow2_refcounts *refcounts;  /* meta/refcount.c */
  struct qcow2_allocator *alloc;      /* meta/alloc.c, pack.c, release.c */
  struct qcow2_regions *regions;      /* meta/regions.c */
  struct qcow2_writeback *writeback;  /* meta/writeback.c */
  struct qcow2_bitmaps *bitmaps;      /* meta/bitmap*.c */
  struct qcow2_crypt *crypt;          /* paths/encrypt.c */
  struct qcow2_scratch_list *scratch; /* paths/scratch.c */
  struct qcow2_compressors *compressors; /* paths/compress.c */
  struct qcow2_dedup *dedup;          /* paths/dedup.c */
};

/* Is the image LUKS-encrypted (its data clusters hold ciphertext)? */
static inline bool
qcow2_image_encrypted (const struct qcow2_image *img)
{
  return img->header.crypt_method == QCOW2_CRYPT_LUKS;
}

/* Does the image keep its external data file a valid raw image of the
 * disk (autoclear bit 1, data_file_raw)?
 */
static inline bool
qcow2_data_file_raw (const struct qcow2_image *img)
{
  return img->data_file &&
    (img->header.autoclear_features & QCOW2_AUTOCLEAR_DATA_FILE_RAW);
}

/* The guest cluster and host cluster arithmetic of the image. */
static inline uint64_t
qcow2_cluster_of (const struct qcow2_image *img, uint64_t offset)
{
  return offset >> img->header.cluster_bits;
}

static inline uint64_t
qcow2_offset_of (const struct qcow2_image *img, uint64_t cluster)
{
  return cluster << img->header.cluster_bits;
}

#endif /* QCOW2_IMAGE_H */
