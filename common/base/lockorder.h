/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the order of every lock, and the locks that check it.
 *
 * Every lock of the engine and of the front ends is a struct qcow2_mutex
 * or a struct qcow2_rwlock made with its rank from the list below.  A
 * thread that holds a lock takes only locks of a higher rank, never one
 * of the same or a lower rank; a trylock may be tried at any time (it
 * cannot wait, so it cannot close a cycle), and a lock that is only ever
 * tried (QCOW2_RANK_TRIED_ONLY) orders nothing while it is held.  Leaves
 * are taken last and hold no other lock inside.
 *
 * Built with --enable-debug (QCOW2_DEBUG), each thread keeps the
 * locks it holds and every lock call asserts the order: a break aborts
 * at once, naming both locks, instead of deadlocking one day under load.
 * Otherwise the calls are pthread's and cost nothing more.
 *
 * Waiting is not locking, and has rules of its own: nothing waits for a
 * claim or a grace period (base/inflight.h) with the image lock held, or
 * while it holds a claim or is registered for a grace period itself;
 * nothing waits for the writeback lock in those states either, since the
 * writeback waits for grace periods.
 *
 * Offers: the ranks, qcow2_mutex_*, qcow2_rwlock_*, qcow2_cond_wait.
 * Needs: nothing.
 */
#ifndef QCOW2_LOCKORDER_H
#define QCOW2_LOCKORDER_H

#include <pthread.h>
#include <stdbool.h>
#include <time.h>

enum qcow2_lock_rank {
  /* Front ends (nbdkit-glue/README.md): a filter connection's finalize
   * lock, held across its last flush and the release of its image (which
   * may close it) and across a prefetch.
   */
  QCOW2_RANK_FINALIZE = 10,
  /* The front ends' file locks on images served (nbdkit-glue/locks.c),
   * held across opening and locking files, under no other lock.
   */
  QCOW2_RANK_EXPORT_LOCKS = 20,
  /* The image's first change (meta/first-change.c): one at a time, its
   * writes and flush made under it with no image lock held; the bitmaps'
   * in_use flags are set under the store's lock, taken inside.
   */
  QCOW2_RANK_FIRST_CHANGE = 35,
  /* The persistent bitmaps' store (meta/bitmap-store.c): one store at a
   * time; a store runs writebacks.
   */
  QCOW2_RANK_BITMAP_STORE = 40,
  /* One metadata writeback at a time (meta/writeback.c). */
  QCOW2_RANK_WRITEBACK = 50,
  /* The image lock (meta/image.h): the metadata, exclusive to change it,
   * shared to look it up; never held across guest data I/O, compression
   * or decompression, nor across the writeback's I/O, and held
   * exclusively across no storage call but the few meta/image.h names.
   * A backing file is
   * read with no lock of the image above held, so the image locks of a
   * chain never nest.
   */
  QCOW2_RANK_IMAGE = 60,
  /* The table of compressed clusters by content (paths/dedup.c). */
  QCOW2_RANK_DEDUP = 70,
  /* A connection's free lists (paths/conn.c). */
  QCOW2_RANK_CONN = 80,
  /* A pool's queue of batches (base/pool.c). */
  QCOW2_RANK_POOL = 90,
  /* A cache shard (base/cache.c). */
  QCOW2_RANK_CACHE = 100,
  /* Leaves: the in-flight table (base/inflight.c), the write buffers'
   * free list (paths/scratch.c), the bitmaps' bits, the start of the
   * compressor threads, a key cache, a connection's bytes fetched ahead
   * (paths/fetchahead.c: never held across a read), and the front ends'
   * registry of images (nbdkit-glue/registry.c: never held across an
   * open, a close or an engine call).
   */
  QCOW2_RANK_LEAF = 200,
  /* A lock that is only ever tried, never waited for: a connection's
   * readahead (paths/conn.c), which holds it while it looks up entries
   * under the image lock.  Holding it orders nothing, as nobody waits
   * for it.
   */
  QCOW2_RANK_TRIED_ONLY = 1000,
};

struct qcow2_mutex {
  pthread_mutex_t m;
  enum qcow2_lock_rank rank;
  const char *name;
};

struct qcow2_rwlock {
  pthread_rwlock_t l;
  enum qcow2_lock_rank rank;
  const char *name;
};

/* A mutex of static storage:
 *     static struct qcow2_mutex m = QCOW2_MUTEX_INITIALIZER (RANK, "name");
 */
#define QCOW2_MUTEX_INITIALIZER(rank, lock_name) \
  { PTHREAD_MUTEX_INITIALIZER, (rank), (lock_name) }

/* NAME is a string literal naming the lock in a broken-order message. */
void qcow2_mutex_init (struct qcow2_mutex *m, enum qcow2_lock_rank rank,
                       const char *name);
void qcow2_mutex_destroy (struct qcow2_mutex *m);
/* A writer waiting for the lock goes before readers that come after it,
 * so that a stream of readers cannot hold a writer back.
 */
void qcow2_rwlock_init (struct qcow2_rwlock *l, enum qcow2_lock_rank rank,
                        const char *name);
void qcow2_rwlock_destroy (struct qcow2_rwlock *l);

/* The checks of debug builds (base/lockorder.c), called by the lock
 * calls below around pthread's: before waiting for LOCK, once it is
 * held (EXCLUSIVE: not a read lock), once it is let go.  Nothing in
 * other builds.
 */
#ifdef QCOW2_DEBUG
void qcow2_lock_taking (const void *lock, enum qcow2_lock_rank rank,
                        const char *name);
void qcow2_lock_taken (const void *lock, enum qcow2_lock_rank rank,
                       const char *name, bool exclusive);
void qcow2_lock_released (const void *lock, const char *name);
/* Abort unless the calling thread holds LOCK (EXCLUSIVE: not as a read
 * lock): an invariant of a caller's contract.
 */
void qcow2_lock_assert_held (const void *lock, const char *name,
                             bool exclusive);
/* Abort if the calling thread holds LOCK in any way. */
void qcow2_lock_assert_not_held (const void *lock, const char *name);
#else
static inline void
qcow2_lock_taking (const void *lock, enum qcow2_lock_rank rank,
                   const char *name)
{
}
static inline void
qcow2_lock_taken (const void *lock, enum qcow2_lock_rank rank,
                  const char *name, bool exclusive)
{
}
static inline void
qcow2_lock_released (const void *lock, const char *name)
{
}
static inline void
qcow2_lock_assert_held (const void *lock, const char *name, bool exclusive)
{
}
static inline void
qcow2_lock_assert_not_held (const void *lock, const char *name)
{
}
#endif

static inline void
qcow2_mutex_lock (struct qcow2_mutex *m)
{
  qcow2_lock_taking (m, m->rank, m->name);
  pthread_mutex_lock (&m->m);
  qcow2_lock_taken (m, m->rank, m->name, true);
}

/* True if M was free and is now held. */
static inline bool
qcow2_mutex_trylock (struct qcow2_mutex *m)
{
  if (pthread_mutex_trylock (&m->m) != 0)
    return false;
  qcow2_lock_taken (m, m->rank, m->name, true);
  return true;
}

static inline void
qcow2_mutex_unlock (struct qcow2_mutex *m)
{
  qcow2_lock_released (m, m->name);
  pthread_mutex_unlock (&m->m);
}

static inline void
qcow2_rwlock_rdlock (struct qcow2_rwlock *l)
{
  qcow2_lock_taking (l, l->rank, l->name);
  pthread_rwlock_rdlock (&l->l);
  qcow2_lock_taken (l, l->rank, l->name, false);
}

static inline void
qcow2_rwlock_wrlock (struct qcow2_rwlock *l)
{
  qcow2_lock_taking (l, l->rank, l->name);
  pthread_rwlock_wrlock (&l->l);
  qcow2_lock_taken (l, l->rank, l->name, true);
}

static inline void
qcow2_rwlock_unlock (struct qcow2_rwlock *l)
{
  qcow2_lock_released (l, l->name);
  pthread_rwlock_unlock (&l->l);
}

static inline void
qcow2_mutex_assert_held (const struct qcow2_mutex *m)
{
  qcow2_lock_assert_held (m, m->name, true);
}

static inline void
qcow2_rwlock_assert_held (const struct qcow2_rwlock *l, bool exclusive)
{
  qcow2_lock_assert_held (l, l->name, exclusive);
}

static inline void
qcow2_rwlock_assert_not_held (const struct qcow2_rwlock *l)
{
  qcow2_lock_assert_not_held (l, l->name);
}

/* pthread_cond_wait on M, which the caller holds; it holds it again on
 * return (and in debug builds still counts as holding it meanwhile).
 */
static inline void
qcow2_cond_wait (pthread_cond_t *cond, struct qcow2_mutex *m)
{
  pthread_cond_wait (cond, &m->m);
}

static inline int
qcow2_cond_timedwait (pthread_cond_t *cond, struct qcow2_mutex *m,
                      const struct timespec *deadline)
{
  return pthread_cond_timedwait (cond, &m->m, deadline);
}

#endif /* QCOW2_LOCKORDER_H */
