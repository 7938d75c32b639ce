/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the engine's structs, and the order of its locks.
 *
 * Every engine file includes this header.  It holds the structs and
 * nothing else: the functions are declared by the header of the module
 * that implements them.  Where one file alone writes a struct or a
 * field, the comment says which; the others only read it.
 *
 * The lock order.  A thread that holds one of these locks takes only
 * locks further down the list, never one above:
 *
 *  -1. the bitmaps' store lock (meta/bitmap.c): one store at a time,
 *      taken with no other lock held; a store runs writebacks.
 *   0. qcow2_image.writeback_lock: one metadata writeback at a time
 *      (meta/writeback.c), taken with no other lock held.
 *   1. qcow2_image.lock (rwlock): the metadata.  Held exclusively to
 *      change it, shared to look it up, and only for that: never across
 *      guest data I/O, compression or decompression, nor across the
 *      writeback's I/O.  A backing file is read with no lock of the
 *      image above held (reads and copy-on-writes read it after their
 *      lookup), so the locks of a chain's images are never nested.
 *   2. qcow2_image.dedup_lock: the table of compressed clusters.
 *   3. a connection's lock (its free lists of requests and batches), then
 *      its readahead lock (only ever tried, never waited for).
 *   4. a pool's lock (base/pool.c): queued batches, finished jobs.
 *   5. a cache shard's lock (base/cache.c).
 *
 * Leaves, held with no lock taken inside them: qcow2_image.inflight's
 * lock (base/inflight.c), qcow2_image.scratch_lock (paths/scratch.c),
 * the bitmaps' bits lock (meta/bitmap.c),
 * qcow2_image.compressors_lock, which guards the start of the
 * compressor threads and is held with no other lock, and a key cache's
 * lock (paths/encrypt.c), taken while an image opens.
 *
 * Waiting.  Nothing waits for a claim or a grace period (base/inflight.h)
 * with the image lock held, or while it holds a claim or is registered
 * for a grace period itself; nothing waits for the writeback lock in
 * those states either, since the writeback waits for grace periods.
 */
#ifndef QCOW2_TYPES_H
#define QCOW2_TYPES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/io.h"
#include "base/options.h"
#include "format/header.h"
#include "base/inflight.h"
#include "format/crypto.h"
#include "base/pool.h"
#include "base/tablemap.h"

struct qcow2_cache;
struct qcow2_conn;
struct qcow2_sector_cipher;
struct qcow2_decoder;
struct qcow2_encoder;
struct backing;
struct dedup_slot;
struct qcow2_bitmaps;

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

/* Releases taken out of the allocator's queue by a writeback. */
struct pending_list {
  struct pending_free *frees;
  size_t count;
};

/* The refcounts in memory, loaded when the image is opened for writing
 * (written by meta/refcount.c; the allocator reads the geometry).
 */
struct refcounts {
  uint64_t *table;            /* host order */
  uint64_t table_entries;
  uint64_t table_offset;      /* where the table is, or goes, on disk */
  uint32_t table_clusters;
  bool table_dirty;           /* entries changed since written */
  bool table_moved;           /* grown: write it whole, then the header */
  struct tablemap blocks;     /* every refcount block loaded so far */
  unsigned width_order;       /* refcount_order */
  unsigned block_bits;        /* log2 of refcounts per block */
  uint64_t max_refcount;
};

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

/* Where the next clusters come from, and what waits to be released
 * (written by meta/alloc.c).
 */
struct allocator {
  uint64_t host_clusters;     /* clusters that fit in the file */
  uint64_t free_hint;         /* no free cluster below this index */
  uint64_t pack_cursor;       /* next free byte for compressed data, or 0 */
  /* Gaps that later compressed clusters small enough fill. */
  struct pack_gap gaps[QCOW2_PACK_GAPS];
  unsigned ngaps;
  struct pending_free *pending;
  size_t npending, pending_cap;
  size_t in_writeback;        /* taken by the writeback, not applied yet */
  /* Clusters whose refcount dropped to 0 in memory, held back from
   * allocation until qcow2_alloc_reuse_released has seen the drop
   * durable and discarded them in the storage.  Sorted, apart from each
   * other.
   */
  struct cluster_run *released;
  size_t nreleased, released_cap;
  bool discard_failed;        /* the storage refused a discard: stop */
};

/* A LUKS-encrypted image's key and where its LUKS area lies (written by
 * paths/encrypt.c when the image opens; read by whoever makes a sector
 * cipher: the connections' threads and the image's write scratch).
 */
struct image_crypt {
  bool enabled;
  struct qcow2_cipher_spec spec;
  uint8_t master_key[QCOW2_CRYPTO_MAX_KEY_BYTES];
  uint64_t area_offset, area_length;  /* host bytes of the LUKS area */
};

struct qcow2_image {
  struct qcow2_header header;
  struct qcow2_log log;
  struct qcow2_options opts;
  /* Grows (growable storage) under the lock held exclusively, when
   * clusters are allocated; read anywhere.
   */
  _Atomic uint64_t file_size;
  uint64_t *l1;                       /* host order, l1_size entries */
  struct qcow2_cache *l2_cache;       /* raw big-endian L2 tables */
  struct qcow2_cache *cluster_cache;  /* decompressed clusters */

  /* Compressed descriptors: bits below csize_shift are the host byte
   * offset, the csize_bits above them the extra sector count.
   */
  unsigned csize_shift;
  uint64_t csize_mask;
  uint64_t coffset_mask;

  /* Held exclusively to change the metadata below, shared to look it
   * up: a lookup never sees an L2 table or the L1 table half changed.
   * Never held across guest data I/O (see the lock order above).
   */
  pthread_rwlock_t lock;
  /* One metadata writeback at a time (meta/writeback.c). */
  pthread_mutex_t writeback_lock;
  /* Reads and writes between their lookup and their last I/O, and the
   * guest clusters whose new host clusters are being written
   * (base/inflight.h).
   */
  struct qcow2_inflight inflight;

  /* Write state (opts.writable), changed only under the lock held
   * exclusively.
   */
  struct refcounts rc;
  struct allocator alloc;
  /* The changed L2 tables not yet on disk, and the changed L1 entries
   * (written by meta/writeback.c; the map and the allocator read them).
   */
  struct tablemap dirty_l2;
  uint8_t *l1_dirty;          /* per L1 entry: changed since written */
  bool l1_any_dirty;
  /* Buffers of the writes in progress (paths/scratch.c), and one
   * cluster of zeros that nothing writes.
   */
  pthread_mutex_t scratch_lock;
  struct write_scratch *free_scratch;
  uint8_t *zero_cluster;
  /* The image's first change is still to come: autoclear bits to clear,
   * bitmaps to mark in use (meta/first-change.h: set when the image
   * opens and after a clean close, cleared by qcow2_first_change, under
   * the lock held exclusively; read under the lock, or by
   * qcow2_pwrite_logged).
   */
  atomic_bool first_change_pending;
  /* The persistent bitmaps (meta/bitmap.c), NULL without any. */
  struct qcow2_bitmaps *bitmaps;

  /* Encryption (crypt_method 2), and the internal snapshot served
   * instead of the active disk: then the header's l1_size and
   * l1_table_offset are the snapshot's, and the image is read-only.
   */
  struct image_crypt crypt;
  bool serving_snapshot;

  /* The backing file (backing.c), NULL when unallocated clusters
   * read as zeros, and how to read LEN bytes of its disk at OFFSET (zeros
   * past its end).  Pointers, because a qcow2 backing file is read (and
   * mapped) by the very path that calls them.
   */
  struct backing *backing;
  int (*read_backing) (struct qcow2_image *img, void *buf, uint64_t len,
                       uint64_t offset);
  /* And what its chain reports for LEN bytes of its disk at OFFSET, as
   * qcow2_extents reports it (all of the range; zeros past its end).
   */
  int (*backing_extents) (struct qcow2_image *img, uint64_t offset,
                          uint64_t len, qcow2_extent_fn fn, void *opaque);

  /* The compressor threads, started by the first compressing write
   * (paths/compress.c).
   */
  pthread_mutex_t compressors_lock;
  struct qcow2_pool *compressors;

  /* Compressed clusters by the hash of their data (paths/dedup.c). */
  pthread_mutex_t dedup_lock;
  struct dedup_slot *dedup;
  uint64_t dedup_mask;

  /* Bumped before released clusters' cache entries are dropped, so that
   * a decode started before the release cannot put them back.
   */
  _Atomic uint64_t free_generation;

  /* Bytes written to the file since the last flush began, and whether
   * a write is flushing them early (flush_data_early in write.c).
   */
  _Atomic uint64_t unflushed_bytes;
  atomic_bool early_flush_running;

  _Atomic unsigned active_reads;      /* reads in progress, all readers */
  _Atomic uint64_t clusters_decompressed;
  _Atomic uint64_t bytes_read_underneath;
  _Atomic uint64_t reads_underneath;
};

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

/* Most guest clusters one write looks at and changes between two
 * sections under the image lock (a piece: paths/cluster.c).
 */
#define QCOW2_PIECE_MAX 512

/* What a piece does to one of its guest clusters (paths/cluster.c). */
struct piece_cluster {
  struct cluster_map old;     /* what its L2 entry held */
  uint64_t new_host;          /* the host cluster (or compressed bytes)
                                 allocated for it, or 0 */
  uint64_t entry;             /* compressed: the entry it gets, or 0 */
  int action;                 /* what is done: paths/cluster.c and
                                 paths/compress.c each have their enum */
};

/* What one write uses outside the image lock; the image keeps them on
 * a free list (paths/scratch.c), so a write allocates nothing.
 */
struct write_scratch {
  struct write_scratch *next_free;
  uint8_t *cow[2];            /* a cluster each: old content around
                                 the new bytes */
  uint8_t *compressed;        /* the largest compressed range */
  uint8_t *l2buf;             /* a cluster: an L2 table read for a lookup */
  struct qcow2_decoder *dec;
  struct qcow2_encoder *enc;  /* made on first use */
  /* Encrypted images only: this write's cipher, and a cluster to encrypt
   * into what has no request buffer (zeroes) on this thread.
   */
  struct qcow2_sector_cipher *cipher;
  uint8_t *sealed;
  uint64_t entries[QCOW2_PIECE_MAX];
  struct piece_cluster piece[QCOW2_PIECE_MAX];
};

/* What each thread that decodes keeps: a connection's pool workers, and
 * each read request for its calling thread (paths/conn.c).
 */
struct thread_state {
  struct qcow2_decoder *dec;
  struct qcow2_sector_cipher *cipher;   /* encrypted images only */
  uint8_t *scratch;             /* one cluster */
  char err[256];
};

/* Host sectors of an encrypted image to encrypt or decrypt in place on a
 * connection's pool, a job per JOB_BYTES (paths/encrypt.c).
 */
struct sector_batch {
  struct qcow2_batch batch;
  struct qcow2_image *img;
  uint8_t *buf;
  uint64_t len;
  uint64_t host_offset;         /* of BUF's first byte: the IVs' source */
  uint64_t job_bytes;
  bool encrypt;
  bool in_flight;
  _Atomic int failed;
  char errmsg[400];
};

/* One compressed cluster to decode (paths/chunk.c). */
struct job {
  uint32_t in_off;              /* of its data in the staging buffer */
  uint32_t in_len;
  uint8_t *whole_dst;           /* the request covers the cluster: decode here */
  uint8_t *part_dst;            /* else copy part_len bytes from part_off */
  uint32_t part_off, part_len;
  uint64_t key;                 /* L2 entry, the cluster cache key */
  uint64_t guest_offset;        /* for messages */
};

/* Most clusters in one chunk. */
#define QCOW2_MAX_CHUNK_CLUSTERS 1024

/* Compressed clusters whose bytes lie (nearly) back to back on the host,
 * fetched with one read and decoded by the connection's pool
 * (paths/chunk.c).
 */
struct chunk {
  struct qcow2_batch batch;
  struct qcow2_image *img;
  size_t clusters_per_job;
  uint8_t *staging;
  struct job jobs[QCOW2_MAX_CHUNK_CLUSTERS];
  size_t njobs;
  uint64_t host_start, host_end;
  bool in_flight;
  bool readahead;               /* nobody waits: results only go to the cache */
  uint64_t generation;          /* img->free_generation when it was read */
  _Atomic int failed;
  char errmsg[400];
};

/* The state of one read in progress.  A connection keeps the ones it
 * made on a free list, so concurrent reads of one connection each get
 * their own without allocating on every request (made by paths/conn.c,
 * used by paths/read.c).
 */
struct request {
  struct request *next_free;
  struct chunk chunk[2];
  unsigned cur;
  struct thread_state caller;
  uint8_t *l2buf;

  /* A pending run of host-contiguous normal clusters. */
  uint8_t *run_dst;
  uint64_t run_host, run_len;

  /* Encrypted images: the run being decrypted on the pool while the
   * next one is read, and for writes, request_size bytes to encrypt the
   * client's data into (made on first use).
   */
  struct sector_batch crypt;
  uint8_t *crypt_buf;
};

/* A batch of whole clusters to compress on the image's compressor
 * threads (filled by write.c, compressed and placed by
 * paths/compress.c, kept by the connection: paths/conn.c).  RESULT holds
 * for each cluster the compressed length, 0 to store it plain, or:
 */
#define QCOW2_COMPRESS_ALL_ZERO INT64_MIN        /* every byte is zero */
#define QCOW2_COMPRESS_DUPLICATE (INT64_MIN + 1)  /* dedup[i] is to be
                                                     checked and shared */
#define QCOW2_COMPRESS_PENDING (INT64_MIN + 2)    /* sharing failed: to be
                                                     compressed now */
/* In dedup[i]: a copy was tried and could not be shared; try no other. */
#define QCOW2_DEDUP_NO_SHARE 1
struct compress_ctx {
  struct compress_ctx *next_free;
  struct qcow2_image *img;
  size_t count;                 /* clusters in this batch */
  size_t capacity;              /* clusters OUT can hold */
  const uint8_t **src;          /* per cluster */
  uint32_t *src_len;            /* < cluster size: zero padded */
  int64_t *result;              /* length, 0: store plain, ALL_ZERO,
                                   DUPLICATE */
  uint64_t *hash;               /* qcow2_dedup_hash; 0: last, partial */
  uint64_t *dedup;              /* an L2 entry that may hold the same
                                   data (the writer looked), 0, or
                                   QCOW2_DEDUP_NO_SHARE */
  uint64_t verified_generation; /* free_generation before the DUPLICATE
                                   clusters' copies were read back */
  uint8_t *out;                 /* capacity * cluster_size */
  _Atomic int failed;
  char errmsg[400];
  pthread_cond_t finished;      /* the compressors finished the batch */
};
#endif /* QCOW2_TYPES_H */
