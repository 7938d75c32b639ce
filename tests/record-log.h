/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd tests: the write log of the power-loss harness.
 *
 * The recording plugin (record-plugin.c, under the filter) and the
 * recording shim (record-shim.c, preloaded into nbdkit) serve requests
 * in parallel, and log in device order: a call that changes the storage
 * logs its record (with its data) as it begins and a 'C' record with its
 * number when it has returned, a flush logs 'f' when the storage
 * receives it and 'F' when it has returned.  So the log says which
 * changes were in flight at any point, and a flush makes durable only
 * the changes of its own file whose 'C' comes before its 'f' (those
 * still in flight when it was received may or may not be on the
 * storage).  Appending a record takes the log's lock, the call itself
 * does not.  tests/power-loss-check.py rebuilds crash states from the
 * log.  Integers are little-endian.  Changes are numbered from 0 in the
 * order of their records (W, T, A and D), whatever their file; flushes
 * likewise, apart.
 *
 * A log records one file, or several (the shim: an image and its
 * external data file).  A log of several starts with an 'M' record, and
 * then every change record (W, T, A, D) and every 'f' has a u8 FILE
 * after its kind byte, the file it belongs to (0 the first, the image);
 * a log without 'M' is of one file, file 0, its records without that
 * byte.  'C' and 'F' name their change or flush by its number.
 *
 *   'M' u32 files                                   the log records
 *                                                   FILES files (first
 *                                                   record only)
 *   'W' [FILE] u64 offset, u32 length, then LENGTH bytes
 *                                                   a write began
 *   'T' [FILE] u64 size                             an ftruncate began
 *   'A' [FILE] u32 mode, u64 offset, u64 length     an fallocate began
 *   'D' [FILE] u64 offset, u64 length               a trim began: the
 *                                                   range may read as
 *                                                   anything after
 *   'C' u64 change                                  that change returned
 *                                                   (a change that failed
 *                                                   never completes)
 *   'f' [FILE] u64 flush                            a flush of FILE was
 *                                                   received
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
 * order, the numbers of the next change and flush, and the number of
 * files it records (1: the format without FILE bytes).
 */
struct record_log {
  int fd;
  pthread_mutex_t lock;
  uint64_t changes, flushes;
  unsigned files;
};
#define RECORD_LOG_INIT { -1, PTHREAD_MUTEX_INITIALIZER, 0, 0, 1 }

/* A log of FILES files: its 'M' record, before any other (the log was
 * just opened, and is empty).
 */
static inline void
record_log_files (struct record_log *log, unsigned files)
{
  uint8_t rec[5];

  if (files < 2 || files > 256)
    abort ();
  rec[0] = 'M';
  record_put_le (rec + 1, files, 4);
  pthread_mutex_lock (&log->lock);
  if (log->changes || log->flushes)
    abort ();
  record_write_all (log->fd, rec, sizeof rec);
  log->files = files;
  pthread_mutex_unlock (&log->lock);
}

/* The start of a change or 'f' record of FILE at P: its kind, then its
 * FILE byte in a log of several files; returns the bytes it took.
 */
static inline size_t
record_head (const struct record_log *log, uint8_t *p, char kind,
             unsigned file)
{
  if (file >= log->files)
    abort ();
  p[0] = kind;
  if (log->files == 1)
    return 1;
  p[1] = file;
  return 2;
}

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

/* The changes of FILE (0 in a log of one file), as they begin. */
static inline uint64_t
record_write_begins (struct record_log *log, unsigned file, uint64_t offset,
                     const void *data, uint32_t len)
{
  uint8_t head[14];
  size_t n = record_head (log, head, 'W', file);

  record_put_le (head + n, offset, 8);
  record_put_le (head + n + 8, len, 4);
  return record_append (log, head, n + 12, data, len);
}

static inline uint64_t
record_truncate_begins (struct record_log *log, unsigned file, uint64_t size)
{
  uint8_t rec[10];
  size_t n = record_head (log, rec, 'T', file);

  record_put_le (rec + n, size, 8);
  return record_append (log, rec, n + 8, NULL, 0);
}

static inline uint64_t
record_fallocate_begins (struct record_log *log, unsigned file, uint32_t mode,
                         uint64_t offset, uint64_t len)
{
  uint8_t rec[22];
  size_t n = record_head (log, rec, 'A', file);

  record_put_le (rec + n, mode, 4);
  record_put_le (rec + n + 4, offset, 8);
  record_put_le (rec + n + 12, len, 8);
  return record_append (log, rec, n + 20, NULL, 0);
}

static inline uint64_t
record_discard_begins (struct record_log *log, unsigned file, uint64_t offset,
                       uint64_t len)
{
  uint8_t rec[18];
  size_t n = record_head (log, rec, 'D', file);

  record_put_le (rec + n, offset, 8);
  record_put_le (rec + n + 8, len, 8);
  return record_append (log, rec, n + 16, NULL, 0);
}

static inline void
record_completed (struct record_log *log, uint64_t change)
{
  uint8_t rec[9];

  rec[0] = 'C';
  record_put_le (rec + 1, change, 8);
  record_append (log, rec, sizeof rec, NULL, 0);
}

/* A flush of FILE received: its number, for record_flush_returned. */
static inline uint64_t
record_flush_begins (struct record_log *log, unsigned file)
{
  uint8_t rec[10];
  size_t n = record_head (log, rec, 'f', file);
  uint64_t number;

  pthread_mutex_lock (&log->lock);
  number = log->flushes++;
  record_put_le (rec + n, number, 8);
  record_write_all (log->fd, rec, n + 8);
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
