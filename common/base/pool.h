/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: a small pool of worker threads running batches of jobs.
 *
 * Each NBD connection has a pool that decodes, and each image written
 * with compression one that compresses.  A batch is N independent jobs
 * of one function (decode or compress cluster i).  Several threads may
 * submit batches at once; a reader keeps working (reading the next chunk
 * underneath) and then joins in on its own batch while waiting for it,
 * so that it never sits idle, while a writer leaves its batch to the
 * compressors.  Every worker owns a per-thread state made by the pool's
 * init callback (decoder or compression contexts, scratch buffers) and
 * reuses it for every job: running a job allocates nothing.
 */
#ifndef QCOW2_POOL_H
#define QCOW2_POOL_H

#include <pthread.h>
#include <stddef.h>

struct qcow2_pool;

struct qcow2_batch {
  /* Set by the submitter. */
  void (*run) (void *arg, size_t index, void *thread_state);
  void *arg;
  size_t count;
  /* Optional: signalled when the batch is done, instead of waking every
   * thread waiting on any batch of the pool.
   */
  pthread_cond_t *finished;

  /* Owned by the pool. */
  size_t next;                  /* next index to hand out */
  size_t done;                  /* jobs finished */
  size_t run_by_waiter;         /* of those, run by qcow2_pool_wait's caller */
  struct qcow2_batch *queue_next;
  int queued;
};

/* Start NTHREADS workers (0 is allowed: the submitters do all the work).
 * INIT makes a worker's state (returning NULL fails the pool's creation),
 * FINI frees it.  Returns NULL on failure.
 */
struct qcow2_pool *qcow2_pool_new (unsigned nthreads,
                                   void *(*init) (void *arg),
                                   void (*fini) (void *state),
                                   void *arg);

/* Stop and join the workers.  No batch may be in flight. */
void qcow2_pool_free (struct qcow2_pool *pool);

/* Hand BATCH to the workers and return at once. */
void qcow2_pool_submit (struct qcow2_pool *pool, struct qcow2_batch *batch);

/* Run every job of BATCH on this thread with STATE, without the workers:
 * when enough other requests already keep the CPUs busy, handing jobs
 * over only costs wake-ups.
 */
void qcow2_pool_run_here (struct qcow2_batch *batch, void *state);

/* Run the batch's unclaimed jobs on this thread with CALLER_STATE, then
 * wait until every job of the batch has finished.  With CALLER_STATE
 * NULL, leave every job to the workers and only wait.
 */
void qcow2_pool_wait (struct qcow2_pool *pool, struct qcow2_batch *batch,
                      void *caller_state);

unsigned qcow2_pool_threads (const struct qcow2_pool *pool);

/* The CPUs online, at least 1: how many workers a pool can keep busy. */
unsigned qcow2_online_cpus (void);

#endif /* QCOW2_POOL_H */
