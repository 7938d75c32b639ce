/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: what is in flight outside the image lock (see
 * base/inflight.h).
 */

#include <config.h>

#include "base/inflight.h"
#include "base/lockorder.h"

void
qcow2_inflight_init (struct qcow2_inflight *f)
{
  *f = (struct qcow2_inflight) { .next_ticket = 1 };
  qcow2_mutex_init (&f->lock, QCOW2_RANK_LEAF, "the in-flight table");
  pthread_cond_init (&f->left, NULL);
  pthread_cond_init (&f->claim_ended, NULL);
}

void
qcow2_inflight_destroy (struct qcow2_inflight *f)
{
  pthread_cond_destroy (&f->claim_ended);
  pthread_cond_destroy (&f->left);
  qcow2_mutex_destroy (&f->lock);
}

void
qcow2_inflight_enter (struct qcow2_inflight *f, struct qcow2_inflight_op *op)
{
  qcow2_mutex_lock (&f->lock);
  op->ticket = f->next_ticket++;
  op->next = NULL;
  op->prev = f->newest;
  if (f->newest)
    f->newest->next = op;
  else
    f->oldest = op;
  f->newest = op;
  qcow2_mutex_unlock (&f->lock);
}

void
qcow2_inflight_leave (struct qcow2_inflight *f, struct qcow2_inflight_op *op)
{
  bool was_oldest;

  qcow2_mutex_lock (&f->lock);
  was_oldest = op->prev == NULL;
  if (op->prev)
    op->prev->next = op->next;
  else
    f->oldest = op->next;
  if (op->next)
    op->next->prev = op->prev;
  else
    f->newest = op->prev;
  /* Only the oldest leaving can make a mark pass. */
  if (was_oldest && f->grace_waiters)
    pthread_cond_broadcast (&f->left);
  qcow2_mutex_unlock (&f->lock);
}

uint64_t
qcow2_inflight_mark (struct qcow2_inflight *f)
{
  uint64_t mark;

  qcow2_mutex_lock (&f->lock);
  mark = f->next_ticket;
  qcow2_mutex_unlock (&f->lock);
  return mark;
}

/* Under f->lock. */
static bool
passed_locked (const struct qcow2_inflight *f, uint64_t mark)
{
  return f->oldest == NULL || f->oldest->ticket >= mark;
}

bool
qcow2_inflight_passed (struct qcow2_inflight *f, uint64_t mark)
{
  bool passed;

  qcow2_mutex_lock (&f->lock);
  passed = passed_locked (f, mark);
  qcow2_mutex_unlock (&f->lock);
  return passed;
}

void
qcow2_inflight_wait (struct qcow2_inflight *f, uint64_t mark)
{
  qcow2_mutex_lock (&f->lock);
  f->grace_waiters++;
  while (!passed_locked (f, mark))
    qcow2_cond_wait (&f->left, &f->lock);
  f->grace_waiters--;
  qcow2_mutex_unlock (&f->lock);
}

bool
qcow2_inflight_claimed (struct qcow2_inflight *f, uint64_t first,
                        uint64_t end, uint64_t *ticket)
{
  const struct qcow2_claim *c;
  bool claimed = false;

  qcow2_mutex_lock (&f->lock);
  for (c = first < end ? f->claims : NULL; c; c = c->next)
    if (c->first < end && first < c->end) {
      claimed = true;
      break;
    }
  *ticket = f->claims_ended;
  qcow2_mutex_unlock (&f->lock);
  return claimed;
}

void
qcow2_inflight_wait_claim (struct qcow2_inflight *f, uint64_t ticket)
{
  /* A claim is ended under the image lock held exclusively, which the
   * caller held (in some mode) when it got TICKET: any claim it saw has
   * either ended since (the count moved on) or will end and wake us.
   */
  qcow2_mutex_lock (&f->lock);
  f->claim_waiters++;
  while (f->claims_ended == ticket)
    qcow2_cond_wait (&f->claim_ended, &f->lock);
  f->claim_waiters--;
  qcow2_mutex_unlock (&f->lock);
}

void
qcow2_inflight_claim (struct qcow2_inflight *f, struct qcow2_claim *c,
                      uint64_t first, uint64_t end)
{
  c->first = first;
  c->end = end;
  qcow2_mutex_lock (&f->lock);
  c->prev = NULL;
  c->next = f->claims;
  if (f->claims)
    f->claims->prev = c;
  f->claims = c;
  qcow2_mutex_unlock (&f->lock);
}

void
qcow2_inflight_unclaim (struct qcow2_inflight *f, struct qcow2_claim *c)
{
  qcow2_mutex_lock (&f->lock);
  if (c->prev)
    c->prev->next = c->next;
  else
    f->claims = c->next;
  if (c->next)
    c->next->prev = c->prev;
  f->claims_ended++;
  if (f->claim_waiters)
    pthread_cond_broadcast (&f->claim_ended);
  qcow2_mutex_unlock (&f->lock);
}
