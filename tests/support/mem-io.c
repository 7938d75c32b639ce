/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: the engine's storage in memory. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem-io.h"
#include "util.h"

_Thread_local bool mem_io_engine_call;

static bool
touches (uint64_t offset, uint64_t len, uint64_t from, uint64_t to)
{
  return offset < to && offset + len > from;
}

/* Check the contract for an access of LEN bytes at OFFSET. */
static bool
allowed (struct mem_io *m, const char *what, uint64_t offset, uint64_t len)
{
  bool ok = true;

  if (!(m->flags & MEM_IO_ANY_THREAD) && !mem_io_engine_call) {
    atomic_fetch_add (&m->wrong_thread, 1);
    if (m->flags & MEM_IO_ABORT) {
      fprintf (stderr, "%s from a thread outside the engine's call\n", what);
      abort ();
    }
  }
  if (offset > m->size || len > m->size - offset) {
    atomic_fetch_add (&m->outside, 1);
    if (m->flags & MEM_IO_ABORT) {
      fprintf (stderr, "%s of %" PRIu64 " bytes at %" PRIu64 " beyond the "
               "storage's %" PRIu64 " bytes\n", what, len, offset, m->size);
      abort ();
    }
    ok = false;
  }
  return ok;
}

static int
mem_pread (void *opaque, void *buf, size_t count, uint64_t offset)
{
  struct mem_io *m = opaque;

  atomic_fetch_add (&m->preads, 1);
  for (unsigned long seen = atomic_load (&m->largest); count > seen; )
    if (atomic_compare_exchange_weak (&m->largest, &seen, count))
      break;
  if (!allowed (m, "pread", offset, count))
    return -EIO;
  if (m->fail_errno && touches (offset, count, m->fail_from, m->fail_to))
    return -m->fail_errno;
  if (m->pread_hook)
    m->pread_hook (m, offset, count, m->pread_hook_arg);
  /* Under the lock: the engine may read bytes another thread is writing
   * (a read racing a write of the same cluster), which a file does
   * without harm but a memcpy does not.
   */
  pthread_mutex_lock (&m->lock);
  memcpy (buf, m->data + offset, count);
  pthread_mutex_unlock (&m->lock);
  return 0;
}

uint8_t
mem_io_garbage (uint64_t offset)
{
  return 0xd5 ^ (uint8_t) (offset * 131 + (offset >> 9));
}

static void
fill_garbage (uint8_t *dst, uint64_t offset, size_t len)
{
  for (size_t i = 0; i < len; ++i)
    dst[i] = mem_io_garbage (offset + i);
}

/* Apply logged op W (a write or a discard) to STATE. */
static void
apply_op (uint8_t *state, const struct mem_op *w)
{
  if (w->discard)
    fill_garbage (state + w->offset, w->offset, w->len);
  else if (!w->flush)
    memcpy (state + w->offset, w->data, w->len);
}

/* With m->lock held, so that the log's order is the storage's. */
static void
log_op (struct mem_io *m, bool flush, bool discard, const void *buf,
        size_t count, uint64_t offset)
{
  struct mem_op *op;

  if (!(m->flags & MEM_IO_RECORD))
    return;
  m->ops = xgrow (m->ops, m->nops, &m->ops_cap, sizeof *m->ops, 256);
  op = &m->ops[m->nops++];
  op->flush = flush;
  op->discard = discard;
  op->offset = offset;
  op->len = count;
  op->data = NULL;
  if (!flush && !discard) {
    op->data = xmalloc (count);
    memcpy (op->data, buf, count);
  }
  /* A discard may reach the medium at once; a write only by a flush. */
  if (flush || discard)
    for (; m->durable_ops < m->nops; m->durable_ops++)
      apply_op (m->durable, &m->ops[m->durable_ops]);
}

static int
mem_pwrite (void *opaque, const void *buf, size_t count, uint64_t offset)
{
  struct mem_io *m = opaque;

  atomic_fetch_add (&m->pwrites, 1);
  if (!allowed (m, "pwrite", offset, count))
    return -EIO;
  if (m->write_fail_errno &&
      touches (offset, count, m->write_fail_from, m->write_fail_to))
    return -m->write_fail_errno;
  if (m->pwrite_hook)
    m->pwrite_hook (m, offset, count, m->pwrite_hook_arg);
  pthread_mutex_lock (&m->lock);
  memcpy (m->data + offset, buf, count);
  log_op (m, false, false, buf, count, offset);
  pthread_mutex_unlock (&m->lock);
  return 0;
}

static int
mem_flush (void *opaque)
{
  struct mem_io *m = opaque;

  atomic_fetch_add (&m->flushes, 1);
  allowed (m, "flush", 0, 0);
  pthread_mutex_lock (&m->lock);
  log_op (m, true, false, NULL, 0, 0);
  pthread_mutex_unlock (&m->lock);
  return 0;
}

static int
mem_discard (void *opaque, uint64_t count, uint64_t offset)
{
  struct mem_io *m = opaque;

  atomic_fetch_add (&m->discards, 1);
  if (!allowed (m, "discard", offset, count))
    return -EIO;
  if (m->discard_hook)
    m->discard_hook (m, offset, count, m->discard_hook_arg);
  if (m->discard_errno)
    return -m->discard_errno;
  pthread_mutex_lock (&m->lock);
  fill_garbage (m->data + offset, offset, count);
  log_op (m, false, true, NULL, count, offset);
  pthread_mutex_unlock (&m->lock);
  atomic_fetch_add (&m->discarded_bytes, count);
  return 0;
}

static int64_t
mem_size (void *opaque)
{
  struct mem_io *m = opaque;

  if (m->size_errno)
    return -m->size_errno;
  return (int64_t) m->size;
}

void
mem_io_init (struct mem_io *m, const uint8_t *data, size_t len,
             uint64_t size, unsigned flags)
{
  memset (m, 0, sizeof *m);
  m->flags = flags;
  m->size = size;
  if (flags & MEM_IO_BORROW) {
    if (data == NULL || len < size ||
        (flags & (MEM_IO_WRITABLE | MEM_IO_RECORD))) {
      fprintf (stderr, "mem_io_init: only all of a read-only storage's "
               "bytes can be borrowed\n");
      abort ();
    }
    m->data = (uint8_t *) data;
  }
  else {
    m->data = xcalloc (1, size);
    if (data)
      memcpy (m->data, data, len);
  }
  m->io.opaque = m;
  m->io.pread = mem_pread;
  m->io.size = mem_size;
  if (flags & MEM_IO_WRITABLE) {
    m->io.pwrite = mem_pwrite;
    m->io.flush = mem_flush;
    if (flags & MEM_IO_DISCARD)
      m->io.discard = mem_discard;
  }
  pthread_mutex_init (&m->lock, NULL);
  if (flags & MEM_IO_RECORD) {
    m->initial = xmalloc (size);
    memcpy (m->initial, m->data, size);
    m->durable = xmalloc (size);
    memcpy (m->durable, m->data, size);
  }
}

static void
free_ops (struct mem_io *m)
{
  for (size_t i = 0; i < m->nops; ++i)
    free (m->ops[i].data);
  free (m->ops);
  m->ops = NULL;
  m->nops = m->ops_cap = m->durable_ops = 0;
}

void
mem_io_free (struct mem_io *m)
{
  free_ops (m);
  if (!(m->flags & MEM_IO_BORROW))
    free (m->data);
  free (m->initial);
  free (m->durable);
  pthread_mutex_destroy (&m->lock);
  m->data = m->initial = m->durable = NULL;
}

void
mem_io_log_reset (struct mem_io *m)
{
  pthread_mutex_lock (&m->lock);
  free_ops (m);
  if (m->initial) {
    memcpy (m->initial, m->data, m->size);
    memcpy (m->durable, m->data, m->size);
  }
  pthread_mutex_unlock (&m->lock);
}

uint8_t *
mem_io_state_at (const struct mem_io *m, size_t nops)
{
  uint8_t *state = xmalloc (m->size);

  memcpy (state, m->initial, m->size);
  for (size_t i = 0; i < nops && i < m->nops; ++i)
    apply_op (state, &m->ops[i]);
  return state;
}

void
mem_replay_init (struct mem_replay *r, const struct mem_io *m)
{
  *r = (struct mem_replay) { .m = m, .state = xmalloc (m->size) };
  memcpy (r->state, m->initial, m->size);
}

void
mem_replay_apply (struct mem_replay *r, const struct mem_op *op)
{
  struct mem_undo *u;

  if (op->flush)
    return;
  r->undo = xgrow (r->undo, r->nundo, &r->undo_cap, sizeof *r->undo, 16);
  u = &r->undo[r->nundo++];
  u->offset = op->offset;
  u->len = op->len;
  u->saved = xmalloc (op->len);
  memcpy (u->saved, r->state + op->offset, op->len);
  apply_op (r->state, op);
}

void
mem_replay_undo (struct mem_replay *r)
{
  while (r->nundo > 0) {
    struct mem_undo *u = &r->undo[--r->nundo];

    memcpy (r->state + u->offset, u->saved, u->len);
    free (u->saved);
  }
}

const uint8_t *
mem_replay_to (struct mem_replay *r, size_t nops)
{
  mem_replay_undo (r);
  if (nops < r->at) {
    fprintf (stderr, "mem_replay_to: op %zu is behind the replay (op %zu)\n",
             nops, r->at);
    abort ();
  }
  for (; r->at < nops && r->at < r->m->nops; ++r->at)
    apply_op (r->state, &r->m->ops[r->at]);
  return r->state;
}

void
mem_replay_free (struct mem_replay *r)
{
  mem_replay_undo (r);
  free (r->undo);
  free (r->state);
  r->state = NULL;
  r->undo = NULL;
}

unsigned long
mem_io_violations (struct mem_io *m)
{
  return atomic_load (&m->outside) + atomic_load (&m->wrong_thread);
}
