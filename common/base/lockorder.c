/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the locks that check their order (see
 * base/lockorder.h).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>

#include "base/lockorder.h"

void
qcow2_mutex_init (struct qcow2_mutex *m, enum qcow2_lock_rank rank,
                  const char *name)
{
  pthread_mutex_init (&m->m, NULL);
  m->rank = rank;
  m->name = name;
}

void
qcow2_mutex_destroy (struct qcow2_mutex *m)
{
  pthread_mutex_destroy (&m->m);
}

void
qcow2_rwlock_init (struct qcow2_rwlock *l, enum qcow2_lock_rank rank,
                   const char *name)
{
  pthread_rwlockattr_t attr;

  pthread_rwlockattr_init (&attr);
  pthread_rwlockattr_setkind_np (&attr,
                                 PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init (&l->l, &attr);
  pthread_rwlockattr_destroy (&attr);
  l->rank = rank;
  l->name = name;
}

void
qcow2_rwlock_destroy (struct qcow2_rwlock *l)
{
  pthread_rwlock_destroy (&l->l);
}

#ifdef QCOW2_DEBUG

/* The locks a thread holds, in the order taken.  No path of the engine
 * holds more than a handful at once.
 */
#define MAX_HELD 16

struct held {
  const void *lock;
  enum qcow2_lock_rank rank;
  const char *name;
  bool exclusive;
};

struct thread_locks {
  struct held held[MAX_HELD];
  unsigned nheld;
};

/* Each thread's list is its own malloc'd block behind a key, freed by
 * the thread itself when it exits: a __thread array in this module,
 * which nbdkit loads with dlopen, lives in glibc's dynamic TLS, which a
 * joining thread frees without a synchronisation ThreadSanitizer sees.
 * The destructor is libc's free, so a thread may outlive this module.
 */
static pthread_key_t locks_key;
static pthread_once_t locks_key_once = PTHREAD_ONCE_INIT;

static void
make_locks_key (void)
{
  if (pthread_key_create (&locks_key, free) != 0) {
    fprintf (stderr, "qcow2zstd: lock order: pthread_key_create failed\n");
    abort ();
  }
}

static struct thread_locks *
this_thread (void)
{
  struct thread_locks *t;

  pthread_once (&locks_key_once, make_locks_key);
  t = pthread_getspecific (locks_key);
  if (t == NULL) {
    t = calloc (1, sizeof *t);
    if (t == NULL || pthread_setspecific (locks_key, t) != 0) {
      fprintf (stderr, "qcow2zstd: lock order: out of memory\n");
      abort ();
    }
  }
  return t;
}

static void __attribute__ ((noreturn))
broken (const char *what, const char *name, enum qcow2_lock_rank rank)
{
  const struct thread_locks *t = this_thread ();
  unsigned i;

  fprintf (stderr, "qcow2zstd: lock order broken: %s %s (rank %d); this "
           "thread holds:", what, name, (int) rank);
  for (i = 0; i < t->nheld; ++i)
    fprintf (stderr, " %s (rank %d)", t->held[i].name,
             (int) t->held[i].rank);
  fprintf (stderr, "\n");
  abort ();
}

/* Before waiting for LOCK: every lock held must rank below it. */
static void
check_order (const void *lock, enum qcow2_lock_rank rank, const char *name)
{
  const struct thread_locks *t = this_thread ();
  unsigned i;

  if (rank == QCOW2_RANK_TRIED_ONLY)
    broken ("waiting for a lock that is only ever tried:", name, rank);
  for (i = 0; i < t->nheld; ++i) {
    if (t->held[i].lock == lock)
      broken ("taking again", name, rank);
    if (t->held[i].rank >= rank && t->held[i].rank != QCOW2_RANK_TRIED_ONLY)
      broken ("taking", name, rank);
  }
}

static void
push (const void *lock, enum qcow2_lock_rank rank, const char *name,
      bool exclusive)
{
  struct thread_locks *t = this_thread ();

  if (t->nheld == MAX_HELD)
    broken ("holding too many locks with", name, rank);
  t->held[t->nheld++] = (struct held) { lock, rank, name, exclusive };
}

static void
pop (const void *lock, const char *name)
{
  struct thread_locks *t = this_thread ();
  unsigned i;

  for (i = t->nheld; i-- > 0; )
    if (t->held[i].lock == lock) {
      t->held[i] = t->held[--t->nheld];
      return;
    }
  broken ("releasing a lock not held:", name, 0);
}

static const struct held *
find (const void *lock)
{
  const struct thread_locks *t = this_thread ();
  unsigned i;

  for (i = 0; i < t->nheld; ++i)
    if (t->held[i].lock == lock)
      return &t->held[i];
  return NULL;
}

void
qcow2_lock_taking (const void *lock, enum qcow2_lock_rank rank,
                   const char *name)
{
  check_order (lock, rank, name);
}

void
qcow2_lock_taken (const void *lock, enum qcow2_lock_rank rank,
                  const char *name, bool exclusive)
{
  push (lock, rank, name, exclusive);
}

void
qcow2_lock_released (const void *lock, const char *name)
{
  pop (lock, name);
}

void
qcow2_lock_assert_held (const void *lock, const char *name, bool exclusive)
{
  const struct held *h = find (lock);

  if (h == NULL || (exclusive && !h->exclusive))
    broken (exclusive ? "a caller's contract: not holding exclusively"
            : "a caller's contract: not holding", name, 0);
}

void
qcow2_lock_assert_not_held (const void *lock, const char *name)
{
  if (find (lock) != NULL)
    broken ("a caller's contract: held across device I/O:", name, 0);
}

#endif /* QCOW2_DEBUG */
