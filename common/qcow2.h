/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the public interface.
 *
 * An image (struct qcow2_image) is opened once and shared by every
 * connection: it holds the parsed header, the L1 table, the L2 cache and
 * the decompressed-cluster cache.  Each NBD connection makes a struct
 * qcow2_conn: its own worker pool, decoder contexts, staging buffers and
 * readahead.  Every call takes the struct qcow2_io to use for that
 * call, so the caller decides which handle underneath serves it.
 *
 * Errors: functions return 0 or a negative errno, and report a sentence
 * through the image's struct qcow2_log first.
 */
#ifndef QCOW2_H
#define QCOW2_H

#include <stdbool.h>
#include <stdint.h>

#include "base/io.h"
#include "base/options.h"
#include "format/header.h"

/* What qcow2_create makes. */
struct qcow2_create_options {
  uint64_t virtual_size;
  uint32_t cluster_bits;
  enum qcow2_compression compression_type;
  /* LUKS encryption (aes-256-xts-plain64, sha256, as qemu-img's default)
   * with qcow2_options.passphrase in key slot 0, PBKDF2 tuned to
   * ITER_TIME_MS milliseconds (0: qemu's 2000).
   */
  bool encrypt;
  uint32_t iter_time_ms;
};

#define QCOW2_DEFAULT_REQUEST_SIZE       (UINT64_C (4) << 20)
#define QCOW2_DEFAULT_L2_CACHE_SIZE      (UINT64_C (32) << 20)
#define QCOW2_DEFAULT_CLUSTER_CACHE_SIZE (UINT64_C (64) << 20)
#define QCOW2_MIN_REQUEST_SIZE           (UINT64_C (4) << 10)
#define QCOW2_MAX_REQUEST_SIZE           (UINT64_C (64) << 20)

/* Counters kept by the image, for statistics and debugging. */
struct qcow2_stats {
  uint64_t clusters_decompressed;
  uint64_t cluster_cache_hits;
  uint64_t cluster_cache_misses;
  uint64_t cluster_cache_evictions;
  uint64_t cluster_cache_refused; /* decoded clusters not admitted */
  uint64_t l2_cache_hits;
  uint64_t l2_cache_misses;
  uint64_t l2_cache_evictions;
  uint64_t bytes_read_underneath;
  uint64_t reads_underneath;
  uint64_t reads_fetched_ahead; /* served from bytes fetched ahead */
  uint64_t fetches_in_background; /* those bytes read by a thread of ours */
};

struct qcow2_image;
struct qcow2_conn;
struct qcow2_key_cache;

/* A key cache remembers the master keys of the LUKS images unlocked with
 * it, by the digest of the image's LUKS area and of the passphrase, so
 * that opening the same image again (the filter opens an export's image
 * anew for each run of connections) does not pay PBKDF2's seconds again.
 * Thread safe.  Returns NULL if memory runs out.  Free wipes the keys.
 */
struct qcow2_key_cache *qcow2_key_cache_new (void);
void qcow2_key_cache_free (struct qcow2_key_cache *cache);

/* Open the image that IO reads: parse and validate the header, read the
 * L1 table, set up the caches.  LOG receives errors (and, if set,
 * debug messages) for the life of the image.  An encrypted image is
 * unlocked with OPTS->passphrase (-EPERM, after saying so, if it is
 * wrong; nothing is written then); OPTS->snapshot selects an internal
 * snapshot to serve (read-only).
 */
int qcow2_image_open (struct qcow2_io *io, const struct qcow2_log *log,
                      const struct qcow2_options *opts,
                      struct qcow2_image **image);
void qcow2_image_close (struct qcow2_image *image);

/* Check CREATE's sizes without touching storage: 0, or -1 with a
 * sentence naming the parameter in ERRBUF.
 */
int qcow2_create_validate (const struct qcow2_create_options *create,
                           char *errbuf, size_t errlen);

/* Format the storage IO reads and writes as a new, empty qcow2 v3 image
 * (refcount width 16; with CREATE->encrypt, a LUKS area after the L1
 * table and its header extension), then open it like qcow2_image_open
 * with OPTS (which must be writable).  Refuses, changing nothing, unless
 * the first cluster of the storage is all zeros, and if the storage is
 * too small for the image's metadata.
 */
int qcow2_create (struct qcow2_io *io, const struct qcow2_log *log,
                  const struct qcow2_create_options *create,
                  const struct qcow2_options *opts,
                  struct qcow2_image **image);

const struct qcow2_header *qcow2_image_header (const struct qcow2_image *image);
bool qcow2_image_writable (const struct qcow2_image *image);
/* Call FN with the path of each file that IMAGE opened beside itself
 * and holds open, to lock as it is locked: its external data file, its
 * backing file, then that one's data and backing files, down the chain.
 * WRITTEN says the file is written (the data file of an image open for
 * writing): the engine locks the files it only reads itself, but leaves
 * a file it writes to its caller to lock for writing, as the image.
 * Stops at the first nonzero result of FN and returns it; 0 when every
 * call returned 0 (or there is no such file).
 */
int qcow2_image_named_files (const struct qcow2_image *image,
                             int (*fn) (void *opaque, const char *path,
                                        bool written),
                             void *opaque);
/* Stop the connections' threads that fetch ahead from reading the
 * storage: returns once none is reading, and none starts again.  For a
 * front end whose code and storage go away with connections left open
 * (nbdkit's shutdown skips their close).
 */
void qcow2_image_stop_background (struct qcow2_image *image);
void qcow2_image_get_stats (struct qcow2_image *image,
                            struct qcow2_stats *stats);

/* Per-connection state.  Returns NULL (after logging) on failure. */
struct qcow2_conn *qcow2_conn_new (struct qcow2_image *image);
void qcow2_conn_free (struct qcow2_conn *conn);

/* Let CONN fetch the bytes ahead of a sequential reader from IO on a
 * thread of its own, while its reads decode what came before (an image
 * opened read-only, no external data file: paths/fetchahead.h).  Without
 * it the read that needs them fetches them.  Call before the first read.
 */
void qcow2_conn_fetch_in_background (struct qcow2_conn *conn,
                                     const struct qcow2_background_io *io);

/* Read COUNT bytes of the guest disk at OFFSET into BUF.  The range must
 * lie inside the virtual size.  Thread safe: several threads may read
 * through one connection at once.
 */
int qcow2_read (struct qcow2_conn *conn, struct qcow2_io *io,
                void *buf, uint64_t count, uint64_t offset);

/* Report the allocation of [OFFSET, OFFSET+COUNT): FN is called for
 * consecutive ranges in order, with ZERO true for ranges that read as
 * zeros without data behind them (zero clusters, and unallocated ones
 * where no layer of the backing chain has data: what the image does not
 * allocate reports what its backing file reports).  FN returns 0 to go
 * on, or a negative errno to stop with that error.  Reporting stops
 * early only at a bad entry, after at least one range (the next request
 * gets the error).
 */

int qcow2_extents (struct qcow2_conn *conn, struct qcow2_io *io,
                   uint64_t offset, uint64_t count,
                   qcow2_extent_fn fn, void *opaque);

/* Write COUNT bytes from BUF at guest OFFSET (inside the virtual size).
 * Clusters that are not plain, exclusively owned data clusters get a new
 * cluster, filled with their old content around the new bytes.  The
 * metadata reaches the disk at the next qcow2_flush (or earlier, when
 * enough has changed), in an order that a crash can only leak clusters.
 * With FUA true, flushes before returning.  -ENOSPC (after logging how
 * much room is missing) when the image file is full.  With
 * opts.detect_zeroes, whole clusters of zeros in BUF are zeroed instead
 * (keeping their host cluster with QCOW2_DETECT_ZEROES_ON).
 */
int qcow2_write (struct qcow2_conn *conn, struct qcow2_io *io,
                 const void *buf, uint64_t count, uint64_t offset, bool fua);

/* Make [OFFSET, OFFSET+COUNT) read as zeros.  Whole clusters become zero
 * clusters (v3) or unallocated (v2) and release what they held; parts of
 * clusters are written with zeros.  With FAST true, fails with -ENOTSUP
 * before changing anything if zeroes would have to be written.
 */
int qcow2_zero (struct qcow2_image *image, struct qcow2_io *io,
                uint64_t count, uint64_t offset, bool fast, bool fua);

/* Discard [OFFSET, OFFSET+COUNT): whole clusters are released and read as
 * zeros afterwards; parts of clusters are left as they are.  What any
 * call releases is discarded in the storage (opts.discard) by the
 * writeback that makes the release durable.
 */
int qcow2_trim (struct qcow2_image *image, struct qcow2_io *io,
                uint64_t count, uint64_t offset, bool fua);

/* Write all changed metadata in crash-safe order (the bits of the
 * persistent bitmaps included, which stay in use) and flush the image
 * underneath, then discard the clusters that became free.  Called for
 * NBD_CMD_FLUSH and before the image closes.
 */
int qcow2_flush (struct qcow2_image *image, struct qcow2_io *io);

/* The last writer is done: what qcow2_flush does, and then what only a
 * clean close may do: the persistent bitmaps the image keeps valid are
 * marked consistent (in_use cleared) once their bits are durable, and
 * flushed; in qcow2-lazy-refcounts mode the refcounts are written and
 * the dirty bit cleared, durably.  Call it with no request in flight
 * and none to come until it returns (the glue calls it when the image's
 * last connection leaves).
 * A write after it marks the bitmaps in use again first; an image closed
 * without it leaves them in use, as a crash does (qemu then reports them
 * inconsistent), and a lazy image dirty (the next open repairs it).
 */
int qcow2_finish (struct qcow2_image *image, struct qcow2_io *io);

/* Decompress the compressed clusters under [OFFSET, OFFSET+COUNT) into
 * the cluster cache, for NBD_CMD_CACHE.
 */
int qcow2_prefetch (struct qcow2_conn *conn, struct qcow2_io *io,
                    uint64_t offset, uint64_t count);

#endif /* QCOW2_H */
