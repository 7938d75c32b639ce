/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the commit protocol, how every write changes guest
 * clusters.
 *
 * Every change to guest clusters goes through one protocol: writes of
 * plain data, zeroes and discards (paths/cluster.c), compressed data
 * (paths/compress.c), on images encrypted or with snapshots alike.  A
 * commit is a run of guest clusters of one L2 table, and goes through
 * four steps, each written once, in commit_run:
 *
 *  1. Decide, under the image lock: every cluster's entry is looked up,
 *     and the caller's policy says what becomes of each, through the
 *     calls below: its entry set at once (zeroes, a discard), its data
 *     written in place, into a new cluster, into the host cluster a zero
 *     cluster kept, or packed compressed, and then linked.  Before the
 *     image's first change of a session, that goes first, made before
 *     the lock is taken exclusively (meta/first-change.h).
 *  2. Claim: the guest clusters of a commit that links anything are
 *     claimed (base/inflight.h), so that any other change to them waits;
 *     a commit that writes in place is registered for a grace period, so
 *     that no cluster it writes is handed out again meanwhile.  Then the
 *     lock goes.
 *  3. Data: the policy writes the data, with no lock held.
 *  4. Link, under the image lock: the entries point at what was written
 *     (or, if that failed, what was reserved is given back), what they
 *     held before is released after the next writeback
 *     (meta/release.h), and the claim ends.
 *
 * No crash shows a cluster before its data: an entry changes only once
 * the data is written, and the metadata reaches the disk in the
 * writeback's order (meta/writeback.h).
 *
 * The lock.  A commit whose clusters are all written in place, into
 * clusters the image alone owns, changes no metadata: it decides with
 * the lock held shared, and any call below that would change metadata
 * answers COMMIT_STEP_EXCLUSIVE, after which the commit decides again
 * with the lock held exclusively (or, when clusters before it were
 * decided, commits those and stops there).  A policy whose decisions need
 * the refcounts (snapshots) or that claims what it writes in place
 * (encryption: partial sectors are read, decrypted and encrypted again)
 * asks for the exclusive lock from the start.
 *
 * This is qemu's protocol for allocations in flight (handle_dependencies,
 * handle_copied, handle_alloc, and qcow2_alloc_cluster_link_l2 in
 * block/qcow2-cluster.c), with claims in place of its list of
 * allocations in flight, and grace periods for what qemu's cache
 * references keep.
 *
 * Offers: struct commit, commit_init, commit_run, and the decisions.
 * Locks: commit_run takes the image lock itself (called with no lock
 * held, no claim, not registered); the policy's decide runs with the
 * lock held, its write with none, its linked with it held exclusively.
 * Needs: the map, the L2 tables for change, the allocator, packing and
 * releases, the claims and grace periods, the first change.
 */
#ifndef QCOW2_COMMIT_H
#define QCOW2_COMMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/inflight.h"
#include "base/tablemap.h"
#include "meta/image.h"
#include "meta/map.h"

/* Most guest clusters in one commit (all of one L2 table). */
#define QCOW2_COMMIT_MAX 512

/* What becomes of one guest cluster. */
enum commit_action {
  COMMIT_KEEP,                  /* nothing: it stays as it is */
  COMMIT_SET,                   /* its entry was set in step 1 */
  COMMIT_IN_PLACE,              /* data into the host cluster it has */
  COMMIT_NEW,                   /* data into a new host cluster: host */
  COMMIT_REUSE,                 /* data filling the host cluster its zero
                                   entry kept (host), which becomes normal */
  COMMIT_LINK,                  /* entry, linked after the data */
};

struct commit_cluster {
  struct cluster_map old;       /* what its entry held (step 1) */
  enum commit_action action;
  uint64_t host;                /* NEW, REUSE: the host cluster; LINK:
                                   the host bytes packed for it, or 0 */
  uint64_t entry;               /* LINK: the entry it gets */
  /* Extended L2 entries: the subcluster bitmap the entry had (step 1),
   * and the one it gets whenever its entry is set or linked: the old one
   * until the policy says otherwise before deciding (SET, NEW, REUSE),
   * none for what is packed or linked (compressed data has none).
   */
  uint64_t old_bitmap, bitmap;
};

/* What a policy's decision says. */
enum commit_step {
  COMMIT_STEP_NEXT,             /* decided: on to the next cluster */
  COMMIT_STEP_STOP,             /* commit what was decided, stop before
                                   this one (the reason is the policy's,
                                   or commit->needs_room) */
  COMMIT_STEP_EXCLUSIVE,        /* needs the lock held exclusively (and
                                   the image's first change made) */
  COMMIT_STEP_FAILED,           /* commit->error, logged */
};

/* How commit_run ended. */
enum commit_outcome {
  COMMIT_OK,                    /* commit->done clusters committed (all,
                                   or up to one that needs a commit of
                                   its own: go on from there) */
  COMMIT_NEEDS_ROOM,            /* the same, and the next needs room that
                                   a writeback makes (meta/alloc.h) */
  COMMIT_STOPPED,               /* the same, and the policy stopped */
  COMMIT_FAILED,                /* commit->error; what was reserved is
                                   given back */
};

struct commit;

struct commit_policy {
  /* Decide cluster I of COMMIT (its entry in commit->c[I].old), with
   * the image lock held (shared or exclusively: commit->exclusive).
   */
  enum commit_step (*decide) (struct commit *commit, size_t i, void *opaque);
  /* Write the data of the clusters decided IN_PLACE, NEW, REUSE and LINK,
   * with no lock held: 0, or -errno after logging.
   */
  int (*write) (struct commit *commit, void *opaque);
  /* Optional: cluster I was linked (LINKED) or given back, with the image
   * lock held exclusively, before the claim ends.
   */
  void (*linked) (struct commit *commit, size_t i, bool linked,
                  void *opaque);
  /* Optional: the order in which clusters are decided (a permutation of
   * 0 .. n-1), or NULL for their own.
   */
  const size_t *order;
  /* Decide with the lock held exclusively from the start. */
  bool exclusive;
  /* Claim the clusters written in place too, until their data is
   * written.
   */
  bool claim_in_place;
};

struct commit {
  struct qcow2_image *img;
  struct qcow2_io *io;
  uint64_t first;               /* the first guest cluster */
  size_t n;                     /* clusters, one L2 table */
  struct commit_cluster *c;     /* N of them, the caller's */
  /* Set by commit_run. */
  size_t done;                  /* clusters committed, from the first */
  bool exclusive;               /* the lock is held exclusively */
  bool needs_room;              /* a decision found no room */
  /* A FUA request writes the metadata back, not only flushes: metadata
   * changed, or data went in place into a cluster whose entry may not
   * be on disk yet.
   */
  bool needs_writeback;
  bool too_much_dirty;          /* time for a writeback */
  int error;
  /* commit.c's: the L2 table while the lock is held, the scratch for
   * the lookup.
   */
  struct meta_table *table;
  uint64_t *entries, *bitmaps;
  uint8_t *l2buf;
};

/* A commit of guest clusters [FIRST, FIRST+N), inside one L2 table and
 * at most QCOW2_COMMIT_MAX, with the caller's arrays: C, ENTRIES and
 * BITMAPS of N each, L2BUF a cluster.
 */
void commit_init (struct commit *commit, struct qcow2_image *img,
                  struct qcow2_io *io, uint64_t first, size_t n,
                  struct commit_cluster *c, uint64_t *entries,
                  uint64_t *bitmaps, uint8_t *l2buf);

/* Run the protocol once with POLICY (see the top of this file).  The
 * clusters of a claim in the way are waited for and looked at again.
 */
enum commit_outcome commit_run (struct commit *commit,
                                const struct commit_policy *policy,
                                void *opaque);

/* ------------------------------------------------------- the decisions
 *
 * Called by a policy's decide for cluster I; each returns what decide
 * returns for it (COMMIT_STEP_NEXT once decided).  Every one but
 * commit_keep first checks that what the cluster held is guest data, not
 * metadata (a damaged entry): else the image is marked corrupt
 * (meta/corrupt.h) and the commit fails with -EIO, having written
 * nothing.  Those that change metadata answer COMMIT_STEP_EXCLUSIVE with
 * the lock held shared, and those that allocate COMMIT_STEP_STOP with
 * commit->needs_room set when a writeback would make room.
 */

/* Ready for a decision that changes cluster I (what it held checked to be
 * guest data, the lock held exclusively, the image's first change made,
 * the L2 table ready): for a policy that must do something of its own
 * first that cannot be taken back, such as taking a reference to a copy
 * it shares.
 */
enum commit_step commit_prepare (struct commit *commit, size_t i);

/* It stays as it is. */
enum commit_step commit_keep (struct commit *commit, size_t i);

/* Its entry becomes ENTRY now, and what it held is released (but for a
 * host cluster ENTRY keeps: a zero entry that keeps its allocation).
 */
enum commit_step commit_set_entry (struct commit *commit, size_t i,
                                   uint64_t entry);

/* Its data goes into the host cluster it has. */
enum commit_step commit_in_place (struct commit *commit, size_t i);

/* Its data goes whole into a new host cluster (commit->c[i].host). */
enum commit_step commit_new_cluster (struct commit *commit, size_t i);

/* Its data goes into the host cluster its entry kept, which is linked
 * again once written: whole, where a zero entry kept it (which becomes
 * normal); or, with extended L2 entries, into subclusters that were
 * not allocated (which the new bitmap allocates).
 */
enum commit_step commit_reuse_kept (struct commit *commit, size_t i);

/* LEN bytes of compressed data for it are packed (commit->c[i].host),
 * and its entry names them once written.
 */
enum commit_step commit_pack (struct commit *commit, size_t i, uint64_t len);

/* Its entry becomes ENTRY once the commit's data is written: a reference
 * to existing data that the caller took (given back by a release of
 * ENTRY if the commit fails).
 */
enum commit_step commit_link_entry (struct commit *commit, size_t i,
                                    uint64_t entry);

#endif /* QCOW2_COMMIT_H */
