/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: changing the guest clusters of one range.
 *
 * The plain (uncompressed) path of writes, zeroes and trims, and the
 * single-cluster helpers the compressed path shares.  A range is changed
 * piece by piece (at most QCOW2_PIECE_MAX clusters of one L2 table).  A
 * piece whose clusters are all written in place (normal, COPIED: the
 * image alone owns them) looks them up with the image lock held shared,
 * and changes no metadata.  Any other piece decides under the lock held
 * exclusively: it allocates the new clusters (or takes the host cluster
 * a zero cluster kept, whose entry changes as a new cluster's does),
 * claims the guest clusters (base/inflight.h), and lets the lock go;
 * it then reads the old content around the new bytes (copy-on-write: a
 * compressed, shared or backing cluster), writes the data, and only then,
 * under the lock again, points the L2 entries at the new clusters and
 * queues the release of the old ones.  No crash shows a cluster before
 * its data.
 *
 * In an encrypted image a run is encrypted on the connection's pool on
 * its way out; a write into part of a sector reads, decrypts and
 * re-encrypts the sectors around it, so every write in place there claims
 * its clusters as an allocating piece does.  With snapshots a cluster is
 * written in place only if its refcount is 1 (asked under the lock held
 * exclusively), and an L2 table a snapshot shares is copied before it
 * changes (qcow2_l2_for_write).
 *
 * Offers: qcow2_change_range, qcow2_run_add, qcow2_run_flush,
 * qcow2_zero_needs_writes, qcow2_release, qcow2_reads_as_zeros,
 * qcow2_read_old_cluster.
 * Locks: qcow2_change_range and qcow2_zero_needs_writes take the image
 * lock themselves (called with no lock held); qcow2_release and
 * qcow2_reads_as_zeros with it held exclusively; qcow2_read_old_cluster
 * with none.
 * Needs: the map, the allocator (new clusters, releases), the refcounts
 * (whether a snapshot shares a cluster), the writeback (L2 tables to
 * change), the claims and grace periods, host I/O, the codec and the
 * cluster cache (a compressed cluster's old content), the encryption,
 * the backing file, the write buffers.
 */
#ifndef QCOW2_CLUSTER_H
#define QCOW2_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "meta/types.h"

enum qcow2_op { QCOW2_OP_WRITE, QCOW2_OP_ZERO, QCOW2_OP_TRIM };

/* What a change did that its caller acts on. */
struct change_result {
  /* Metadata changed, or an in-place write went into a cluster whose L2
   * entry may not be on disk yet: a FUA request must write the metadata
   * back, not only flush.
   */
  bool needs_writeback;
  /* So much changed metadata has piled up that it is time to write it
   * back (qcow2_writeback_if_idle).
   */
  bool too_much_dirty;
};

/* Make OP's change to every guest cluster of [OFFSET, OFFSET+COUNT):
 * write BUF there, zero it, or discard it (BUF NULL for both).  A write to
 * an encrypted image needs CONN and REQ (with its crypt_buf) to encrypt
 * the data; zeroes and trims pass NULL.  A whole cluster zeroed or
 * trimmed becomes a zero cluster on v3 (releasing what it held),
 * unallocated on v2 without a backing file, and is written with zeros on
 * v2 with one; part of a cluster is written with zeros when zeroing and
 * left alone when trimming.  With img->opts.detect_zeroes, a whole
 * cluster of zeros written is zeroed instead (with "on", a normal cluster
 * the image alone owns keeps its host cluster as a zero cluster; v2
 * writes it).  A write into a zero cluster that kept its host cluster
 * fills that cluster whole and makes it normal.  Sets the flags of
 * *RESULT (the caller clears them).  0, or -errno after logging, or
 * QCOW2_RECLAIM: the first *DONE bytes are changed (and their data
 * written), the rest not; write back and change the rest.
 */
int qcow2_change_range (struct qcow2_image *img, struct qcow2_io *io,
                        struct qcow2_conn *conn, struct request *req,
                        enum qcow2_op op, const uint8_t *buf, uint64_t count,
                        uint64_t offset, uint64_t *done,
                        struct change_result *result);

/* A run of guest data bound for contiguous host bytes, written with one
 * request underneath (at most request_size bytes).  In an encrypted image
 * it is encrypted into REQ's crypt_buf on CONN's pool, or without a
 * request (zeroes) a cluster at a time on this thread with WS's cipher.
 */
struct data_run {
  const uint8_t *src;
  uint64_t host;
  uint64_t len;
  struct qcow2_conn *conn;
  struct request *req;
  struct write_scratch *ws;
};

/* Add LEN bytes from SRC for host offset HOST to RUN, writing what RUN
 * held first if they do not continue it; qcow2_run_flush writes what is
 * left.  No lock needed.  0, or -errno after logging.
 */
int qcow2_run_add (struct qcow2_image *img, struct qcow2_io *io,
                   struct data_run *run, const uint8_t *src, uint64_t host,
                   uint64_t len);
int qcow2_run_flush (struct qcow2_image *img, struct qcow2_io *io,
                     struct data_run *run);

/* Would zeroing [OFFSET, OFFSET+COUNT) have to write data (a part of a
 * cluster that does not read as zeros, or any of a v2 image over a
 * backing file)?  Sets *NEEDS.  0, or -errno after logging.
 */
int qcow2_zero_needs_writes (struct qcow2_image *img, struct qcow2_io *io,
                             uint64_t count, uint64_t offset, bool *needs);

/* Queue the release of whatever MAP held, for after the next writeback.
 * 0, or -ENOMEM after logging.
 */
int qcow2_release (struct qcow2_image *img, const struct cluster_map *map);

/* Does the cluster MAP describes read as zeros now? */
bool qcow2_reads_as_zeros (const struct qcow2_image *img,
                           const struct cluster_map *map);

/* Fill OUT (a cluster) with the content of guest cluster GUEST_CLUSTER as
 * MAP describes it (decrypted, in an encrypted image), using WS's
 * buffers, decoder and cipher: the caller keeps MAP from changing (it
 * claimed the cluster).  0, or -errno after logging.
 */
int qcow2_read_old_cluster (struct qcow2_image *img, struct qcow2_io *io,
                            struct write_scratch *ws,
                            const struct cluster_map *map,
                            uint64_t guest_cluster, uint8_t *out);

#endif /* QCOW2_CLUSTER_H */
