/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: grace periods and claims (base/inflight.h).
 *
 * - a mark passes only once every operation registered before it has
 *   left, in whatever order they leave, and never waits for one that
 *   registered after it;
 * - qcow2_inflight_wait returns when the mark passes, not before;
 * - a claim is seen by every range that overlaps it and by no other, and
 *   a waiter wakes when it ends;
 * - many threads registering, leaving and marking at once never see a
 *   mark pass while an operation registered before it is still in.
 */
#include <config.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sched.h>
#include <unistd.h>

#include "base/inflight.h"
#include "unit.h"
#include "util.h"

static void
test_marks (void)
{
  struct qcow2_inflight f;
  struct qcow2_inflight_op a, b, c;
  uint64_t before_any, after_a, after_b;

  qcow2_inflight_init (&f);
  before_any = qcow2_inflight_mark (&f);
  CHECK (qcow2_inflight_passed (&f, before_any));

  qcow2_inflight_enter (&f, &a);
  after_a = qcow2_inflight_mark (&f);
  /* A registered after BEFORE_ANY was taken: it does not hold it up. */
  CHECK (qcow2_inflight_passed (&f, before_any));
  CHECK (!qcow2_inflight_passed (&f, after_a));

  qcow2_inflight_enter (&f, &b);
  after_b = qcow2_inflight_mark (&f);
  qcow2_inflight_enter (&f, &c);

  /* B leaves first: A still holds both marks. */
  qcow2_inflight_leave (&f, &b);
  CHECK (!qcow2_inflight_passed (&f, after_a));
  CHECK (!qcow2_inflight_passed (&f, after_b));
  /* A leaves: only C is in, and it registered after both marks. */
  qcow2_inflight_leave (&f, &a);
  CHECK (qcow2_inflight_passed (&f, after_a));
  CHECK (qcow2_inflight_passed (&f, after_b));
  CHECK (!qcow2_inflight_passed (&f, qcow2_inflight_mark (&f)));
  qcow2_inflight_leave (&f, &c);
  CHECK (qcow2_inflight_passed (&f, qcow2_inflight_mark (&f)));
  qcow2_inflight_destroy (&f);
}

struct waiter {
  struct qcow2_inflight *f;
  uint64_t mark;
  atomic_bool done;
};

static void *
wait_mark (void *arg)
{
  struct waiter *w = arg;

  qcow2_inflight_wait (w->f, w->mark);
  atomic_store (&w->done, true);
  return NULL;
}

static void *
wait_claim (void *arg)
{
  struct waiter *w = arg;

  qcow2_inflight_wait_claim (w->f, w->mark);
  atomic_store (&w->done, true);
  return NULL;
}

static void
test_wait (void)
{
  struct qcow2_inflight f;
  struct qcow2_inflight_op a;
  struct waiter w = { .f = &f };
  pthread_t t;

  qcow2_inflight_init (&f);
  qcow2_inflight_enter (&f, &a);
  w.mark = qcow2_inflight_mark (&f);
  pthread_create (&t, NULL, wait_mark, &w);
  usleep (50000);
  CHECK (!atomic_load (&w.done));
  qcow2_inflight_leave (&f, &a);
  pthread_join (t, NULL);
  CHECK (atomic_load (&w.done));
  qcow2_inflight_destroy (&f);
}

static void
test_claims (void)
{
  struct qcow2_inflight f;
  struct qcow2_claim c1, c2;
  struct waiter w = { .f = &f };
  uint64_t ticket;
  pthread_t t;

  qcow2_inflight_init (&f);
  CHECK (!qcow2_inflight_claimed (&f, 0, 100, &ticket));
  qcow2_inflight_claim (&f, &c1, 5, 10);
  qcow2_inflight_claim (&f, &c2, 20, 21);
  CHECK (!qcow2_inflight_claimed (&f, 0, 5, &ticket));
  CHECK (qcow2_inflight_claimed (&f, 4, 6, &ticket));
  CHECK (qcow2_inflight_claimed (&f, 9, 12, &ticket));
  CHECK (!qcow2_inflight_claimed (&f, 10, 20, &ticket));
  CHECK (qcow2_inflight_claimed (&f, 20, 21, &ticket));
  CHECK (!qcow2_inflight_claimed (&f, 7, 7, &ticket));

  /* A waiter wakes when a claim ends after it looked. */
  CHECK (qcow2_inflight_claimed (&f, 6, 7, &w.mark));
  pthread_create (&t, NULL, wait_claim, &w);
  usleep (50000);
  CHECK (!atomic_load (&w.done));
  qcow2_inflight_unclaim (&f, &c1);
  pthread_join (t, NULL);
  CHECK (atomic_load (&w.done));
  CHECK (!qcow2_inflight_claimed (&f, 6, 7, &ticket));

  /* A claim that ended between the look and the wait: no wait at all. */
  CHECK (qcow2_inflight_claimed (&f, 20, 21, &ticket));
  qcow2_inflight_unclaim (&f, &c2);
  qcow2_inflight_wait_claim (&f, ticket);
  CHECK (!qcow2_inflight_claimed (&f, 0, 100, &ticket));
  qcow2_inflight_destroy (&f);
}

/* Threads that register, take a mark, leave, and once they see the mark
 * passed check that no operation that registered before it is in.
 */
#define THREADS 4
#define ROUNDS 20000

struct stress {
  struct qcow2_inflight f;
  /* Per thread: the ticket of its operation while it is in, else 0. */
  _Atomic uint64_t in[THREADS];
  atomic_ulong violations;
};

struct stress_arg {
  struct stress *st;
  unsigned id;
};

static void *
stress_thread (void *arg)
{
  struct stress_arg *sa = arg;
  struct stress *st = sa->st;
  uint64_t seed = sa->id + 1;

  for (unsigned i = 0; i < ROUNDS; ++i) {
    struct qcow2_inflight_op op;
    uint64_t mark;

    qcow2_inflight_enter (&st->f, &op);
    atomic_store (&st->in[sa->id], op.ticket);
    mark = qcow2_inflight_mark (&st->f);
    if (rng (&seed) % 4 == 0)
      sched_yield ();
    atomic_store (&st->in[sa->id], 0);
    qcow2_inflight_leave (&st->f, &op);
    if (qcow2_inflight_passed (&st->f, mark)) {
      /* Every operation with a ticket below the mark has left, and each
       * cleared its slot before leaving: a slot now holds 0 or the
       * ticket of an operation that registered after the mark.
       */
      for (unsigned j = 0; j < THREADS; ++j) {
        uint64_t t = atomic_load (&st->in[j]);
        if (t != 0 && t < mark)
          atomic_fetch_add (&st->violations, 1);
      }
    }
    else if (rng (&seed) % 16 == 0)
      qcow2_inflight_wait (&st->f, mark);
  }
  return NULL;
}

static void
test_stress (void)
{
  struct stress st = { 0 };
  struct stress_arg args[THREADS];
  pthread_t t[THREADS];

  qcow2_inflight_init (&st.f);
  for (unsigned i = 0; i < THREADS; ++i) {
    args[i] = (struct stress_arg) { &st, i };
    pthread_create (&t[i], NULL, stress_thread, &args[i]);
  }
  for (unsigned i = 0; i < THREADS; ++i)
    pthread_join (t[i], NULL);
  CHECK_EQ (atomic_load (&st.violations), 0);
  CHECK (qcow2_inflight_passed (&st.f, qcow2_inflight_mark (&st.f)));
  qcow2_inflight_destroy (&st.f);
}

int
main (void)
{
  test_marks ();
  test_wait ();
  test_claims ();
  test_stress ();
  return unit_finish ();
}
