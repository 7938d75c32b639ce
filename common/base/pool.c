/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: per-connection worker pool. */

#include <config.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/pool.h"
#include "base/lockorder.h"

struct worker {
  struct qcow2_pool *pool;
  pthread_t thread;
  void *state;
  bool started;
};

struct qcow2_pool {
  struct qcow2_mutex lock;
  pthread_cond_t work_ready;    /* a batch was queued, or stop */
  pthread_cond_t job_done;      /* some batch finished a job */
  struct qcow2_batch *head, *tail;
  bool stopping;
  void (*fini) (void *state);
  unsigned nthreads;
  struct worker *workers;
};

/* Claim one job of the batch at the head of the queue.  Call with the
 * lock held.  A batch leaves the queue once all its jobs are claimed.
 */
static struct qcow2_batch *
claim (struct qcow2_pool *pool, size_t *index)
{
  struct qcow2_batch *batch = pool->head;

  if (batch == NULL)
    return NULL;
  *index = batch->next++;
  if (batch->next == batch->count) {
    pool->head = batch->queue_next;
    if (pool->head == NULL)
      pool->tail = NULL;
    batch->queued = 0;
  }
  return batch;
}

static void
finish_job (struct qcow2_pool *pool, struct qcow2_batch *batch)
{
  qcow2_mutex_lock (&pool->lock);
  if (++batch->done == batch->count) {
    if (batch->finished)
      pthread_cond_signal (batch->finished);
    else
      pthread_cond_broadcast (&pool->job_done);
  }
  qcow2_mutex_unlock (&pool->lock);
}

static void *
worker_main (void *arg)
{
  struct worker *w = arg;
  struct qcow2_pool *pool = w->pool;

  qcow2_mutex_lock (&pool->lock);
  for (;;) {
    struct qcow2_batch *batch;
    size_t index = 0;

    while (!pool->stopping && pool->head == NULL)
      qcow2_cond_wait (&pool->work_ready, &pool->lock);
    if (pool->stopping)
      break;
    batch = claim (pool, &index);
    qcow2_mutex_unlock (&pool->lock);
    batch->run (batch->arg, index, w->state);
    finish_job (pool, batch);
    qcow2_mutex_lock (&pool->lock);
  }
  qcow2_mutex_unlock (&pool->lock);
  return NULL;
}

struct qcow2_pool *
qcow2_pool_new (unsigned nthreads, void *(*init) (void *arg),
                void (*fini) (void *state), void *arg)
{
  struct qcow2_pool *pool = calloc (1, sizeof *pool);
  unsigned i;

  if (pool == NULL)
    return NULL;
  qcow2_mutex_init (&pool->lock, QCOW2_RANK_POOL, "a pool's queue");
  pthread_cond_init (&pool->work_ready, NULL);
  pthread_cond_init (&pool->job_done, NULL);
  pool->fini = fini;
  pool->workers = calloc (nthreads ? nthreads : 1, sizeof *pool->workers);
  if (pool->workers == NULL)
    goto fail;
  for (i = 0; i < nthreads; ++i) {
    struct worker *w = &pool->workers[i];
    w->pool = pool;
    w->state = init (arg);
    if (w->state == NULL)
      goto fail;
    pool->nthreads++;
    if (pthread_create (&w->thread, NULL, worker_main, w) != 0)
      goto fail;
    w->started = true;
  }
  return pool;

 fail:
  qcow2_pool_free (pool);
  return NULL;
}

void
qcow2_pool_free (struct qcow2_pool *pool)
{
  unsigned i;

  if (pool == NULL)
    return;
  qcow2_mutex_lock (&pool->lock);
  pool->stopping = true;
  pthread_cond_broadcast (&pool->work_ready);
  qcow2_mutex_unlock (&pool->lock);
  for (i = 0; i < pool->nthreads; ++i) {
    if (pool->workers[i].started)
      pthread_join (pool->workers[i].thread, NULL);
    if (pool->fini)
      pool->fini (pool->workers[i].state);
  }
  pthread_cond_destroy (&pool->job_done);
  pthread_cond_destroy (&pool->work_ready);
  qcow2_mutex_destroy (&pool->lock);
  free (pool->workers);
  free (pool);
}

void
qcow2_pool_submit (struct qcow2_pool *pool, struct qcow2_batch *batch)
{
  batch->next = 0;
  batch->done = 0;
  batch->run_by_waiter = 0;
  batch->queue_next = NULL;
  batch->queued = 0;
  if (batch->count == 0)
    return;
  qcow2_mutex_lock (&pool->lock);
  batch->queued = 1;
  if (pool->tail)
    pool->tail->queue_next = batch;
  else
    pool->head = batch;
  pool->tail = batch;
  if (pool->nthreads > 0)
    pthread_cond_broadcast (&pool->work_ready);
  qcow2_mutex_unlock (&pool->lock);
}

/* Remove BATCH from the queue wherever it is.  Lock held. */
static void
unlink_batch (struct qcow2_pool *pool, struct qcow2_batch *batch)
{
  struct qcow2_batch **link = &pool->head, *prev = NULL;

  while (*link && *link != batch) {
    prev = *link;
    link = &(*link)->queue_next;
  }
  if (*link == NULL)
    return;
  *link = batch->queue_next;
  if (pool->tail == batch)
    pool->tail = prev;
  batch->queued = 0;
}

void
qcow2_pool_wait (struct qcow2_pool *pool, struct qcow2_batch *batch,
                 void *caller_state)
{
  if (batch->count == 0)
    return;
  qcow2_mutex_lock (&pool->lock);
  while (caller_state && batch->next < batch->count) {
    size_t index = batch->next++;

    if (batch->next == batch->count)
      unlink_batch (pool, batch);
    qcow2_mutex_unlock (&pool->lock);
    batch->run (batch->arg, index, caller_state);
    qcow2_mutex_lock (&pool->lock);
    batch->done++;
    batch->run_by_waiter++;
  }
  while (batch->done < batch->count)
    qcow2_cond_wait (batch->finished ? batch->finished : &pool->job_done,
                       &pool->lock);
  qcow2_mutex_unlock (&pool->lock);
}

void
qcow2_pool_run_here (struct qcow2_batch *batch, void *state)
{
  size_t i;

  batch->queued = 0;
  batch->queue_next = NULL;
  for (i = 0; i < batch->count; ++i)
    batch->run (batch->arg, i, state);
  batch->next = batch->done = batch->run_by_waiter = batch->count;
}

unsigned
qcow2_pool_threads (const struct qcow2_pool *pool)
{
  return pool->nthreads;
}

unsigned
qcow2_online_cpus (void)
{
  long cpus = sysconf (_SC_NPROCESSORS_ONLN);

  return cpus > 0 ? (unsigned) cpus : 1;
}
