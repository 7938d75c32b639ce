/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: storage calls made with the image lock held
 * exclusively.
 *
 * A storage call made while the image lock is held exclusively stops
 * every reader and writer of the image for a device round trip: the
 * engine makes none (meta/image.h, meta/writeback.h).  A watch goes in
 * front of the struct qcow2_io a test hands the engine, in place, and
 * counts every call, and those made while the lock is held for writing.
 *
 * It tells "held for writing" by trying the lock for reading, which
 * fails only then as long as no thread waits for it for writing: so
 * only a test whose engine calls come from one thread can use it (pool
 * workers never take the image lock).
 */
#ifndef QCOW2ZSTD_TEST_LOCK_WATCH_H
#define QCOW2ZSTD_TEST_LOCK_WATCH_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/io.h"

enum lock_watch_call {
  WATCH_PREAD, WATCH_PWRITE, WATCH_FLUSH, WATCH_SIZE, WATCH_DISCARD,
  WATCH_TRUNCATE, WATCH_BLOCK_STATUS, WATCH_CALLS,
};

struct lock_watch {
  struct qcow2_io *io;          /* the watched io, changed in place */
  struct qcow2_io under;        /* what it was */
  pthread_rwlock_t *lock;
  atomic_ulong calls[WATCH_CALLS];
  atomic_ulong exclusive[WATCH_CALLS];
};

/* Put W in front of *IO (whose optional calls stay NULL where they
 * were), watching LOCK (the image's: &img->lock.l).
 */
void lock_watch_install (struct lock_watch *w, struct qcow2_io *io,
                         pthread_rwlock_t *lock);
/* *IO as it was. */
void lock_watch_remove (struct lock_watch *w);

/* The calls made with the lock held for writing, of every kind. */
unsigned long lock_watch_exclusive (struct lock_watch *w);
/* Say on stderr which kinds those were (for a failed check). */
void lock_watch_report (struct lock_watch *w, const char *ctx);

#endif /* QCOW2ZSTD_TEST_LOCK_WATCH_H */
