/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the plain path of writes, zeroes and trims.
 *
 * A range is changed commit by commit (paths/commit.h: at most
 * QCOW2_COMMIT_MAX clusters of one L2 table), with the policy of this
 * file: data goes in place into a normal cluster the image alone owns
 * (COPIED), or whole into the host cluster a zero cluster kept (its entry
 * then becomes normal), else into a new cluster filled with the old
 * content around the new bytes (copy-on-write of a compressed, shared or
 * backing cluster); a whole cluster zeroed or trimmed only changes its
 * entry.  With qcow2-detect-zeroes, a whole cluster of zeros written is
 * zeroed instead.
 *
 * In an encrypted image the data is encrypted on the connection's pool on
 * its way out; a write into part of a sector reads, decrypts and
 * re-encrypts the sectors around it, so every write in place there claims
 * its clusters (two such writes into one sector would otherwise each put
 * back the other's old bytes).  With snapshots a cluster is written in
 * place only if its refcount is 1.  Both decide with the image lock held
 * exclusively.
 *
 * Offers: qcow2_change_range, qcow2_zero_needs_writes,
 * qcow2_reads_as_zeros, qcow2_read_old_cluster, and the mover of write
 * runs (qcow2_write_mover).
 * Locks: qcow2_change_range and qcow2_zero_needs_writes take the image
 * lock themselves (called with no lock held); qcow2_reads_as_zeros with
 * it held; qcow2_read_old_cluster with none.
 * Needs: the commit protocol, the map, the refcounts (whether a snapshot
 * shares a cluster), host I/O, the codec and the cluster cache (a
 * compressed cluster's old content), the encryption, the backing file,
 * the write buffers, the runs.
 */
#ifndef QCOW2_CLUSTER_H
#define QCOW2_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "meta/image.h"
#include "meta/map.h"
#include "paths/run.h"

struct qcow2_conn;
struct request;
struct write_scratch;

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

/* How a range's change ended. */
enum change_outcome {
  CHANGE_DONE,                  /* all of it changed */
  CHANGE_NEEDS_ROOM,            /* the first *DONE bytes are changed (and
                                   their data written), the rest not: no
                                   room until a writeback */
  CHANGE_FAILED,                /* *ERROR, after logging */
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
 * fills that cluster whole and makes it normal.  With extended L2
 * entries (subclusters), as qemu: a write copies on write only the
 * subclusters it covers in part and allocates those it wrote (a whole
 * cluster only out of a compressed one, or one a snapshot shares); a
 * whole cluster zeroed or trimmed gets every subcluster zero, whole
 * subclusters zeroed their zero bits (a zero must cover subclusters
 * whole, or reach the disk's end: qcow2_zero writes the rest as data),
 * part of a compressed cluster zeroed is written with zeros, and a trim
 * of part of a cluster is ignored.  Sets the flags of *RESULT (the
 * caller clears them).
 */
enum change_outcome qcow2_change_range (struct qcow2_image *img,
                                        struct qcow2_io *io,
                                        struct qcow2_conn *conn,
                                        struct request *req, enum qcow2_op op,
                                        const uint8_t *buf, uint64_t count,
                                        uint64_t offset, uint64_t *done,
                                        struct change_result *result,
                                        int *error);

/* Would zeroing [OFFSET, OFFSET+COUNT) have to write data (a part of a
 * cluster that does not read as zeros, or any of a v2 image over a
 * backing file)?  Sets *NEEDS.  0, or -errno after logging.  Not for
 * images with extended L2 entries (qcow2_sub_edge).
 */
int qcow2_zero_needs_writes (struct qcow2_image *img, struct qcow2_io *io,
                             uint64_t count, uint64_t offset, bool *needs);

/* Does the cluster MAP describes read as zeros now? */
bool qcow2_reads_as_zeros (const struct qcow2_image *img,
                           const struct cluster_map *map);

/* With extended L2 entries, how a zero of [START, END), part of one
 * subcluster, goes, as qemu's qcow2_co_pwrite_zeroes: *WHOLE_SUB if the
 * subcluster is zero or unallocated and the rest of it reads as zeros
 * by what the metadata says (the whole subcluster is then zeroed), else
 * the zeros are written as data; *COMPRESSED if its cluster is
 * compressed.  Takes the image lock itself.  0, or -errno after logging.
 */
int qcow2_sub_edge (struct qcow2_image *img, struct qcow2_io *io,
                    uint64_t start, uint64_t end, bool *whole_sub,
                    bool *compressed);

/* Fill OUT (a cluster) with the content of guest cluster GUEST_CLUSTER as
 * MAP describes it (decrypted, in an encrypted image), using WS's
 * buffers, decoder and cipher: the caller keeps MAP from changing (it
 * claimed the cluster).  0, or -errno after logging.
 */
int qcow2_read_old_cluster (struct qcow2_image *img, struct qcow2_io *io,
                            struct write_scratch *ws,
                            const struct cluster_map *map,
                            uint64_t guest_cluster, uint8_t *out);

/* Where write runs go: the data of guest clusters, through qcow2_run_add
 * with qcow2_write_mover and a struct write_target as its opaque.  In an
 * encrypted image a run is encrypted into REQ's crypt_buf on CONN's pool,
 * or without a request (zeroes) a cluster at a time on this thread with
 * WS's cipher; the run's own bytes are never changed (the mover only
 * reads them, whatever its pointer says).
 */
struct write_target {
  struct qcow2_image *img;
  struct qcow2_io *io;
  struct qcow2_conn *conn;
  struct request *req;
  struct write_scratch *ws;
};

int qcow2_write_mover (struct data_run *run, void *target);

#endif /* QCOW2_CLUSTER_H */
