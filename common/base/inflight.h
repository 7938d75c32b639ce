/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: what is in flight outside the image lock.
 *
 * Guest data moves with no image-wide lock held: a read looks up its L2
 * entries under the image lock, lets it go, and then reads the host
 * clusters they named; a write into a cluster it may overwrite in place
 * does the same.  Two things keep that safe, and this module holds both.
 *
 * Grace periods (host clusters).  A host cluster that stops being
 * referenced (an L2 entry changed, a table moved) must not be handed out
 * again while an operation that looked it up before may still read or
 * write it.  Each such operation is registered from before its lookup
 * until its last byte of I/O (qcow2_inflight_enter, _leave); whoever
 * unlinks a cluster takes a mark (qcow2_inflight_mark), and the release
 * that makes the cluster reusable is applied only once the mark has
 * passed: every operation that entered before the mark has left.
 *
 *   Why it holds.  Enter runs with the image lock held (either mode),
 *   before the lookup; mark runs with it held exclusively, in the
 *   section that changes the entry.  So an operation either entered
 *   before the mark was taken (its ticket is below the mark: the release
 *   waits for it), or it took the image lock after the section that
 *   unlinked the cluster, and its lookup cannot find the cluster.
 *
 * Claims (guest clusters).  A write that gives guest clusters new host
 * clusters decides under the image lock, writes the data without it,
 * and links the new clusters under it again.  In between, the guest
 * range is claimed: any other change to a cluster of it waits for that
 * claim alone, as qemu makes a write wait for an allocation in flight of
 * the same cluster.  Reads do not wait: until the link they read the old
 * content, which a grace period keeps.
 *
 * Offers: the two halves below.
 * Locks: its own mutex, held only inside each call (a leaf of the lock
 * order, base/lockorder.h).  The image lock as each call says.  Never wait
 * (qcow2_inflight_wait, qcow2_inflight_wait_claim) with the image lock
 * held, nor while registered or holding a claim: a grace period waits
 * for registered operations, so an operation that waited on one would
 * wait for itself.
 * Needs: nothing.
 */
#ifndef QCOW2_INFLIGHT_H
#define QCOW2_INFLIGHT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/lockorder.h"

/* One operation registered for a grace period (the caller's, usually on
 * its stack, from enter to leave).
 */
struct qcow2_inflight_op {
  struct qcow2_inflight_op *prev, *next;
  uint64_t ticket;
};

/* One claimed range of guest clusters, [first, end). */
struct qcow2_claim {
  struct qcow2_claim *prev, *next;
  uint64_t first, end;
};

struct qcow2_inflight {
  struct qcow2_mutex lock;
  /* Registered operations, oldest first (tickets rise). */
  struct qcow2_inflight_op *oldest, *newest;
  uint64_t next_ticket;
  pthread_cond_t left;          /* the oldest operation left */
  unsigned grace_waiters;
  /* Claims, and how many have ended so far. */
  struct qcow2_claim *claims;
  uint64_t claims_ended;
  pthread_cond_t claim_ended;
  unsigned claim_waiters;
};

void qcow2_inflight_init (struct qcow2_inflight *f);
void qcow2_inflight_destroy (struct qcow2_inflight *f);

/* ------------------------------------------------------- grace periods */

/* Register OP before looking up the host clusters it will read or write,
 * with the image lock held (shared is enough).
 */
void qcow2_inflight_enter (struct qcow2_inflight *f,
                           struct qcow2_inflight_op *op);

/* OP has done its last I/O to the clusters it looked up.  Any lock. */
void qcow2_inflight_leave (struct qcow2_inflight *f,
                           struct qcow2_inflight_op *op);

/* A mark for host clusters that stop being referenced now, taken with
 * the image lock held exclusively in the section that unlinks them.
 */
uint64_t qcow2_inflight_mark (struct qcow2_inflight *f);

/* Has MARK passed: has every operation registered before it left? */
bool qcow2_inflight_passed (struct qcow2_inflight *f, uint64_t mark);

/* Wait until MARK has passed (see the rule above). */
void qcow2_inflight_wait (struct qcow2_inflight *f, uint64_t mark);

/* -------------------------------------------------------------- claims */

/* Is a cluster of guest clusters [FIRST, END) claimed?  With the image
 * lock held (either mode; claims change only under it held exclusively,
 * so the answer holds as long as the lock is held).  *TICKET says what
 * to wait for with qcow2_inflight_wait_claim after letting the image
 * lock go (FIRST == END: nothing is claimed, and the ticket waits for
 * the next claim to end).
 */
bool qcow2_inflight_claimed (struct qcow2_inflight *f, uint64_t first,
                             uint64_t end, uint64_t *ticket);

/* Wait until a claim has ended since qcow2_inflight_claimed gave TICKET
 * (then look again: it may have been another's).  No lock held.
 */
void qcow2_inflight_wait_claim (struct qcow2_inflight *f, uint64_t ticket);

/* Claim guest clusters [FIRST, END) with C (kept by the caller until
 * qcow2_inflight_unclaim), with the image lock held exclusively after
 * qcow2_inflight_claimed said no.
 */
void qcow2_inflight_claim (struct qcow2_inflight *f, struct qcow2_claim *c,
                           uint64_t first, uint64_t end);

/* End claim C and wake whoever waits for a claim; with the image lock
 * held exclusively, once the claimed clusters are linked (or given up).
 */
void qcow2_inflight_unclaim (struct qcow2_inflight *f, struct qcow2_claim *c);

#endif /* QCOW2_INFLIGHT_H */
