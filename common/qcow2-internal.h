/* qcow2zstd engine: state shared by the engine's own files. */
#ifndef QCOW2_INTERNAL_H
#define QCOW2_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "qcow2.h"
#include "qcow2-cache.h"
#include "qcow2-tablemap.h"
#include <pthread.h>
#include <inttypes.h>

/* L1 and standard L2 entry bits. */
#define L1E_OFFSET_MASK    UINT64_C (0x00fffffffffffe00)
#define L1E_RESERVED_MASK  UINT64_C (0x7f000000000001ff)
#define L2E_OFFSET_MASK    UINT64_C (0x00fffffffffffe00)
#define L2E_RESERVED_MASK  UINT64_C (0x3f000000000001fe)
#define L2E_ZERO           (UINT64_C (1) << 0)
#define L2E_COMPRESSED     (UINT64_C (1) << 62)
#define L2E_COPIED         (UINT64_C (1) << 63)

/* Refcount table entries: bits 9..63 offset, 0..8 reserved. */
#define RTE_OFFSET_MASK    UINT64_C (0xfffffffffffffe00)
#define RTE_RESERVED_MASK  UINT64_C (0x00000000000001ff)

/* A range of host bytes whose clusters lose one reference once the
 * metadata that stopped pointing at them is on disk.
 */
struct pending_free {
  uint64_t offset;
  uint64_t length;
  uint64_t cache_key;         /* cluster cache key to drop, or 0 */
};

/* Refcount state, loaded when the image is opened for writing. */
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
  uint64_t host_clusters;     /* clusters that fit in the file */
  uint64_t free_hint;         /* no free cluster below this index */
  bool no_reclaim;            /* allocation may not write metadata back */
  /* While compressed data is being packed, single clusters for plain
   * data and tables come from a window of free clusters set apart, so
   * that they interrupt the packing once per window instead of once per
   * cluster (each interruption leaves part of a host cluster unused).
   */
  uint64_t window_next, window_end;
  bool in_window;             /* allocating from the window: no nesting */
  bool for_pack;              /* allocating a host cluster to pack into */
  struct pending_free *pending;
  size_t npending, pending_cap;
};

struct qcow2_image {
  struct qcow2_header header;
  struct qcow2_log log;
  struct qcow2_options opts;
  uint64_t file_size;
  uint64_t *l1;                       /* host order, l1_size entries */
  struct qcow2_cache *l2_cache;       /* raw big-endian L2 tables */
  struct qcow2_cache *cluster_cache;  /* decompressed clusters */

  /* Compressed descriptors: bits below csize_shift are the host byte
   * offset, the csize_bits above them the extra sector count.
   */
  unsigned csize_shift;
  uint64_t csize_mask;
  uint64_t coffset_mask;

  /* Writers hold it exclusively, readers shared: a read never sees an
   * L2 table or the L1 table half changed.
   */
  pthread_rwlock_t lock;

  /* Write state (opts.writable). */
  struct refcounts rc;
  struct tablemap dirty_l2;   /* changed L2 tables not yet on disk */
  uint8_t *l1_dirty;          /* per L1 entry: changed since written */
  bool l1_any_dirty;
  uint64_t pack_cursor;       /* next free byte for compressed data, or 0 */
  uint8_t *wbuf;              /* one cluster of scratch for writers */
  uint8_t *wcompressed;       /* the largest compressed range */
  struct qcow2_decoder *wdecoder;
  /* The header's autoclear bits are still set on the disk: the first
   * write to the image clears them (qcow2_first_change).
   */
  bool autoclear_on_disk;

  struct backing *backing;    /* NULL: unallocated clusters read as zeros */

  /* The compressor threads, started by the first compressing write
   * (qcow2-compress.c).
   */
  pthread_mutex_t compressors_lock;
  struct qcow2_pool *compressors;
  struct qcow2_encoder *wencoder;     /* under the lock, when sharing failed */

  /* Compressed clusters by the hash of their data (qcow2-dedup.c). */
  pthread_mutex_t dedup_lock;
  struct dedup_slot *dedup;
  uint64_t dedup_mask;

  /* Bumped before released clusters' cache entries are dropped, so that
   * a decode started before the release cannot put them back.
   */
  _Atomic uint64_t free_generation;

  /* Bytes written to the file since the last flush began, and whether
   * a write is flushing them early (flush_data_early in qcow2-write.c).
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

/* Decode a standard L2 ENTRY for guest cluster GUEST_CLUSTER into *MAP,
 * validating it.  Returns 0, or -EIO after logging what is wrong.
 */
int qcow2_classify (struct qcow2_image *img, uint64_t guest_cluster,
                    uint64_t entry, struct cluster_map *map);

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

/* With extended L2: is BITMAP valid for the cluster MAP describes?
 * (Compressed: empty; no subcluster both allocated and zero; none
 * allocated without a host offset.)  0, or -EIO after logging.
 */
int qcow2_check_bitmap (struct qcow2_image *img, uint64_t guest_cluster,
                        const struct cluster_map *map, uint64_t bitmap);

/* Read [OFFSET, OFFSET+LEN) of the image underneath into BUF; bytes past
 * the end of the file read as zeros, as qemu reads them.
 */
int qcow2_pread_clamped (struct qcow2_image *img, struct qcow2_io *io,
                         void *buf, uint64_t len, uint64_t offset);

/* What each thread that decodes or encodes keeps (qcow2-read.c). */
struct thread_state {
  struct qcow2_decoder *dec;
  uint8_t *scratch;             /* one cluster */
  char err[256];
};
void *qcow2_thread_state_new (void *image);

struct request;
struct compress_ctx;
struct qcow2_image *qcow2_reader_image (struct qcow2_reader *reader);
struct qcow2_pool *qcow2_reader_pool (struct qcow2_reader *reader);
struct compress_ctx **qcow2_reader_compress_free (struct qcow2_reader *reader);
pthread_mutex_t *qcow2_reader_lock (struct qcow2_reader *reader);
struct request *qcow2_request_get (struct qcow2_reader *reader);
void qcow2_request_put (struct qcow2_reader *reader, struct request *req);
struct thread_state *qcow2_request_caller (struct request *req);

/* Compression of whole clusters in the reader's pool (qcow2-compress.c). */
#define QCOW2_COMPRESS_ALL_ZERO INT64_MIN
/* Not compressed: dedup[i] is to be checked and shared. */
#define QCOW2_COMPRESS_DUPLICATE (INT64_MIN + 1)
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
                                   data (the writer looked), or 0 */
  uint8_t *out;                 /* capacity * cluster_size */
  _Atomic int failed;
  char errmsg[400];
  pthread_cond_t finished;      /* the compressors finished the batch */
};
struct compress_ctx *qcow2_compress_ctx_get (struct qcow2_reader *reader,
                                             size_t clusters);
void qcow2_compress_ctx_put (struct qcow2_reader *reader,
                             struct compress_ctx *ctx);
void qcow2_compress_ctx_free_all (struct qcow2_reader *reader);
/* Compress CTX's clusters on the image's compressor threads (starting
 * them on first use) and wait for them.
 */
int qcow2_compress_run (struct compress_ctx *ctx);
/* The CPUs online, at least 1. */
unsigned qcow2_online_cpus (void);
/* Most clusters compressed in one batch. */
size_t qcow2_compress_batch_max (const struct qcow2_image *img);

/* Sharing compressed clusters with the same data (qcow2-dedup.c). */
uint64_t qcow2_dedup_hash (const uint8_t *data, size_t len);
/* The table, sized by the disk; 0 or -ENOMEM after logging. */
int qcow2_dedup_init (struct qcow2_image *img);
void qcow2_dedup_free (struct qcow2_image *img);
/* The compressed L2 entry last stored with data of hash HASH, or 0. */
uint64_t qcow2_dedup_find (struct qcow2_image *img, uint64_t hash);
void qcow2_dedup_remember (struct qcow2_image *img, uint64_t hash,
                           uint64_t entry);
/* Under the image lock: if compressed L2 ENTRY still holds exactly SRC
 * (SRC_LEN bytes, zero padded to a cluster) and each host cluster it
 * touches can take one more reference, add those references and return
 * 1; 0 if it cannot be shared; a negative errno on an I/O error.
 * Uses img->wbuf and img->wcompressed.
 */
int qcow2_dedup_share (struct qcow2_image *img, struct qcow2_io *io,
                       uint64_t guest_cluster, uint64_t entry,
                       const uint8_t *src, uint32_t src_len);

/* Allocate host cluster INDEX if it is free; -EBUSY if it is not. */
int qcow2_alloc_cluster_at (struct qcow2_image *img, struct qcow2_io *io,
                            uint64_t index);
/* A fresh host cluster to pack compressed data into, outside the window
 * of clusters set apart for plain data.
 */
int qcow2_alloc_pack_cluster (struct qcow2_image *img, struct qcow2_io *io,
                              uint64_t *offset);
/* The host cluster that compressed data packed up to pack_cursor runs on
 * into next, or UINT64_MAX when nothing is being packed.
 */
uint64_t qcow2_pack_next_cluster (const struct qcow2_image *img);
/* Stop packing compressed data after pack_cursor; the host cluster kept
 * free for it goes back to the allocator.
 */
void qcow2_pack_reset (struct qcow2_image *img);

/* Backing files (qcow2-backing.c). */
int qcow2_backing_open (struct qcow2_image *img, const uint8_t *first,
                        size_t first_len);
void qcow2_backing_close (struct qcow2_image *img);
/* Read LEN bytes of the backing disk at OFFSET (zeros past its end). */
int qcow2_backing_read (struct qcow2_image *img, void *buf, uint64_t len,
                        uint64_t offset);

/* Refcounts (qcow2-refcount.c); all with img->lock held exclusively. */
int qcow2_refcount_load (struct qcow2_image *img, struct qcow2_io *io);
void qcow2_refcount_free (struct qcow2_image *img);
int qcow2_refcount_get (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t cluster, uint64_t *refcount);
int qcow2_refcount_add (struct qcow2_image *img, struct qcow2_io *io,
                        uint64_t cluster, int delta);
/* Allocate COUNT contiguous clusters with refcount 1; *OFFSET gets the
 * first one's host offset.  -ENOSPC after logging if the file is full.
 */
int qcow2_alloc_clusters (struct qcow2_image *img, struct qcow2_io *io,
                          uint64_t count, uint64_t *offset);
/* Queue a release of [OFFSET, OFFSET+LENGTH) for after the next metadata
 * writeback.
 */
int qcow2_free_later (struct qcow2_image *img, uint64_t offset,
                      uint64_t length, uint64_t cache_key);
/* Write dirty refcount blocks, then the table (and the header if the
 * table moved), with flushes in between.
 */
int qcow2_refcount_writeback (struct qcow2_image *img, struct qcow2_io *io);
/* Apply the queued releases to the refcounts in memory. */
int qcow2_refcount_apply_frees (struct qcow2_image *img, struct qcow2_io *io);

/* qcow2-write.c: the metadata writeback, without the final flush and
 * keeping the L2 tables in memory (a caller may hold one), so that
 * released clusters can be reused.  Image lock held exclusively.
 */
int qcow2_writeback_for_room (struct qcow2_image *img, struct qcow2_io *io);

/* Write [OFFSET, OFFSET+LEN) of the image underneath, with a message on
 * failure.
 */
int qcow2_pwrite_logged (struct qcow2_image *img, struct qcow2_io *io,
                         const void *buf, uint64_t len, uint64_t offset);
int qcow2_flush_logged (struct qcow2_image *img, struct qcow2_io *io);

/* Nothing on disk changes until something has to (a read-only session
 * through a writable export leaves the file as it was): what opening
 * for writing would change is done just before the first write to the
 * image, which calls this (qcow2_pwrite_logged does, under the image
 * lock held exclusively, as every writer holds it).
 */
int qcow2_first_change (struct qcow2_image *img, struct qcow2_io *io);

void qcow2_error (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
void qcow2_debug (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
/* A debug message of category FLAG (QCOW2_DEBUG_*). */
void qcow2_debug_if (struct qcow2_image *img, unsigned flag,
                     const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));

#endif /* QCOW2_INTERNAL_H */
