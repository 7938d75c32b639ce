/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd tests: the write log of the power-loss harness.
 *
 * The recording plugin (record-plugin.c, under the filter) and the
 * recording shim (record-shim.c, preloaded into nbdkit for the plugin
 * form) serve requests in parallel, and log in device order: a call
 * that changes the storage logs its record (with its data) as it begins
 * and a 'C' record with its number when it has returned, a flush logs
 * 'f' when the storage receives it and 'F' when it has returned.  So the
 * log says which changes were in flight at any point, and a flush makes
 * durable only the changes whose 'C' comes before its 'f' (those still
 * in flight when it was received may or may not be on the storage).
 * Appending a record takes the log's lock, the call itself does not.
 * tests/power-loss-check.py rebuilds crash states from the log.
 * Integers are little-endian.  Changes are numbered from 0 in the order
 * of their records (W, T, A and D); flushes likewise, apart.
 *
 *   'W' u64 offset, u32 length, then LENGTH bytes   a write began
 *   'T' u64 size                                    an ftruncate began
 *   'A' u32 mode, u64 offset, u64 length            an fallocate began
 *   'D' u64 offset, u64 length                      a trim began: the
 *                                                   range may read as
 *                                                   anything after
 *   'C' u64 change                                  that change returned
 *                                                   (a change that failed
 *                                                   never completes)
 *   'f' u64 flush                                   a flush was received
 *   'F' u64 flush                                   that flush returned
 *   'X' u32 length, then LENGTH bytes of text       a call the harness
 *                                                   cannot model
 */
#ifndef QCOW2ZSTD_RECORD_LOG_H
#define QCOW2ZSTD_RECORD_LOG_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline void
record_put_le (uint8_t *p, uint64_t v, int bytes)
{
  for (int i = 0; i < bytes; ++i)
    p[i] = v >> (8 * i);
}

/* Write all of BUF to FD, or abort: a log with a hole in it would make
 * every crash state after the hole wrong.
 */
static inline void
record_write_all (int fd, const void *buf, size_t len)
{
  const char *p = buf;

  while (len > 0) {
    ssize_t n = write (fd, p, len);
    if (n == -1 && errno == EINTR)
      continue;
    if (n <= 0)
      abort ();
    p += n;
    len -= n;
  }
}

/* The log: its descriptor, the lock that keeps each record whole and in
 * order, and the numbers of the next change and flush.
 */
struct record_log {
  int fd;
  pthread_mutex_t lock;
  uint64_t changes, flushes;
};
#define RECORD_LOG_INIT { -1, PTHREAD_MUTEX_INITIALIZER, 0, 0 }

/* Append HEAD (and DATA) as one record; returns the change's number
 * for a change record (W, T, A, D), else 0.
 */
static inline uint64_t
record_append (struct record_log *log, const uint8_t *head, size_t head_len,
               const void *data, size_t data_len)
{
  uint64_t number = 0;

  pthread_mutex_lock (&log->lock);
  record_write_all (log->fd, head, head_len);
  if (data_len)
    record_write_all (log->fd, data, data_len);
  if (strchr ("WTAD", head[0]))
    number = log->changes++;
  pthread_mutex_unlock (&log->lock);
  return number;
}

static inline uint64_t
record_write_begins (struct record_log *log, uint64_t offset,
                     const void *data, uint32_t len)
{
  uint8_t head[13];

  head[0] = 'W';
  record_put_le (head + 1, offset, 8);
  record_put_le (head + 9, len, 4);
  return record_append (log, head, sizeof head, data, len);
}

static inline uint64_t
record_truncate_begins (struct record_log *log, uint64_t size)
{
  uint8_t rec[9];

  rec[0] = 'T';
  record_put_le (rec + 1, size, 8);
  return record_append (log, rec, sizeof rec, NULL, 0);
}

static inline uint64_t
record_fallocate_begins (struct record_log *log, uint32_t mode,
                         uint64_t offset, uint64_t len)
{
  uint8_t rec[21];

  rec[0] = 'A';
  record_put_le (rec + 1, mode, 4);
  record_put_le (rec + 5, offset, 8);
  record_put_le (rec + 13, len, 8);
  return record_append (log, rec, sizeof rec, NULL, 0);
}

static inline uint64_t
record_discard_begins (struct record_log *log, uint64_t offset, uint64_t len)
{
  uint8_t rec[17];

  rec[0] = 'D';
  record_put_le (rec + 1, offset, 8);
  record_put_le (rec + 9, len, 8);
  return record_append (log, rec, sizeof rec, NULL, 0);
}

static inline void
record_completed (struct record_log *log, uint64_t change)
{
  uint8_t rec[9];

  rec[0] = 'C';
  record_put_le (rec + 1, change, 8);
  record_append (log, rec, sizeof rec, NULL, 0);
}

/* A flush received: its number, for record_flush_returned. */
static inline uint64_t
record_flush_begins (struct record_log *log)
{
  uint8_t rec[9];
  uint64_t number;

  pthread_mutex_lock (&log->lock);
  number = log->flushes++;
  rec[0] = 'f';
  record_put_le (rec + 1, number, 8);
  record_write_all (log->fd, rec, sizeof rec);
  pthread_mutex_unlock (&log->lock);
  return number;
}

static inline void
record_flush_returned (struct record_log *log, uint64_t flush)
{
  uint8_t rec[9];

  rec[0] = 'F';
  record_put_le (rec + 1, flush, 8);
  record_append (log, rec, sizeof rec, NULL, 0);
}

/* A pause of up to MAX_US microseconds, different for every call (a
 * cheap generator: the pauses only need to vary), so that calls that
 * run at once overlap on the storage as they would on a slow disk.
 */
static inline void
record_pause (unsigned max_us)
{
  static _Atomic uint64_t state = 0x2545F4914F6CDD1DULL;
  uint64_t x;
  struct timespec ts;

  if (max_us == 0)
    return;
  /* Not "x = state += ...": clang 14 types that value _Atomic and refuses
   * to assign it to x.
   */
  x = atomic_fetch_add (&state, 0x9E3779B97F4A7C15ULL) + 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  ts.tv_sec = 0;
  ts.tv_nsec = (long) (x % max_us) * 1000;
  nanosleep (&ts, NULL);
}

#endif /* QCOW2ZSTD_RECORD_LOG_H */
