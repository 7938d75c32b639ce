/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: storage calls made with the image lock held
 * exclusively (see lock-watch.h).
 */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include "lock-watch.h"

static const char *const call_names[WATCH_CALLS] = {
  "pread", "pwrite", "flush", "size", "discard", "truncate", "block_status",
};

static struct lock_watch *
seen (void *opaque, enum lock_watch_call call)
{
  struct lock_watch *w = opaque;

  atomic_fetch_add (&w->calls[call], 1);
  if (pthread_rwlock_tryrdlock (w->lock) == 0)
    pthread_rwlock_unlock (w->lock);
  else
    atomic_fetch_add (&w->exclusive[call], 1);
  return w;
}

static int
watch_pread (void *opaque, void *buf, size_t count, uint64_t offset)
{
  struct lock_watch *w = seen (opaque, WATCH_PREAD);

  return w->under.pread (w->under.opaque, buf, count, offset);
}

static int
watch_pwrite (void *opaque, const void *buf, size_t count, uint64_t offset)
{
  struct lock_watch *w = seen (opaque, WATCH_PWRITE);

  return w->under.pwrite (w->under.opaque, buf, count, offset);
}

static int
watch_flush (void *opaque)
{
  struct lock_watch *w = seen (opaque, WATCH_FLUSH);

  return w->under.flush (w->under.opaque);
}

static int64_t
watch_size (void *opaque)
{
  struct lock_watch *w = seen (opaque, WATCH_SIZE);

  return w->under.size (w->under.opaque);
}

static int
watch_discard (void *opaque, uint64_t count, uint64_t offset)
{
  struct lock_watch *w = seen (opaque, WATCH_DISCARD);

  return w->under.discard (w->under.opaque, count, offset);
}

static int
watch_truncate (void *opaque, uint64_t size)
{
  struct lock_watch *w = seen (opaque, WATCH_TRUNCATE);

  return w->under.truncate (w->under.opaque, size);
}

static int
watch_block_status (void *opaque, uint64_t count, uint64_t offset,
                    uint64_t *length, bool *hole)
{
  struct lock_watch *w = seen (opaque, WATCH_BLOCK_STATUS);

  return w->under.block_status (w->under.opaque, count, offset, length,
                                hole);
}

void
lock_watch_install (struct lock_watch *w, struct qcow2_io *io,
                    pthread_rwlock_t *lock)
{
  memset (w, 0, sizeof *w);
  w->io = io;
  w->under = *io;
  w->lock = lock;
  io->opaque = w;
  io->pread = watch_pread;
  io->size = watch_size;
  io->pwrite = w->under.pwrite ? watch_pwrite : NULL;
  io->flush = w->under.flush ? watch_flush : NULL;
  io->discard = w->under.discard ? watch_discard : NULL;
  io->truncate = w->under.truncate ? watch_truncate : NULL;
  io->block_status = w->under.block_status ? watch_block_status : NULL;
}

void
lock_watch_remove (struct lock_watch *w)
{
  *w->io = w->under;
}

unsigned long
lock_watch_exclusive (struct lock_watch *w)
{
  unsigned long n = 0;

  for (int k = 0; k < WATCH_CALLS; ++k)
    n += atomic_load (&w->exclusive[k]);
  return n;
}

void
lock_watch_report (struct lock_watch *w, const char *ctx)
{
  for (int k = 0; k < WATCH_CALLS; ++k)
    if (atomic_load (&w->exclusive[k]))
      fprintf (stderr, "%s: %lu of %lu %s calls with the image lock held "
               "exclusively\n", ctx, atomic_load (&w->exclusive[k]),
               atomic_load (&w->calls[k]), call_names[k]);
}
