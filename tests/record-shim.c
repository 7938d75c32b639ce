/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd tests: an LD_PRELOAD shim that records what a process does
 * to one file, or two, for the power-loss harness (the plugin form opens
 * its own file, and the engine in either form opens an image's external
 * data file itself, so no plugin underneath can record them).
 *
 *   RECORD_FILE=/abs/image [RECORD_FILE2=/abs/data-file] RECORD_LOG=/abs/log \
 *       LD_PRELOAD=record-shim.so nbdkit ...
 *
 * pwrite, fsync, fdatasync, ftruncate and fallocate on those files
 * (found by device and inode, whichever descriptor reaches them) are
 * recorded in the format of record-log.h, in device order: each as it
 * begins and as it returns, the calls themselves running in parallel as
 * the process makes them.  With RECORD_FILE2 the log records two files
 * (its 'M' record): RECORD_FILE is file 0, RECORD_FILE2 file 1, and a
 * flush (fsync, fdatasync) is one of the file it was called on; without
 * it, the log is of one file as before.  RECORD_DELAY_US=N holds each
 * change in flight up to N microseconds longer (after the call, before
 * its completion is logged).  write, writev and pwritev on either are
 * recorded as calls the harness cannot model, so that a change to the
 * process's I/O cannot go unrecorded.
 */

#include <config.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include "record-log.h"

static struct record_log rlog = RECORD_LOG_INIT;
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned delay_us;

#define REAL(name) \
  static __typeof__ (name) *real_##name; \
  if (real_##name == NULL) \
    real_##name = (__typeof__ (name) *) dlsym (RTLD_NEXT, #name)

/* Which recorded file FD reaches: 0 (RECORD_FILE), 1 (RECORD_FILE2), or
 * -1 for none.  They are looked up each time: a file may not exist yet
 * when the process starts (qcow2-create makes the image).
 */
static int
file_of (int fd)
{
  static const char *const vars[] = { "RECORD_FILE", "RECORD_FILE2" };
  struct stat fst, pst;

  if (fstat (fd, &fst) == -1)
    return -1;
  for (int i = 0; i < 2; ++i) {
    const char *path = getenv (vars[i]);

    if (path && stat (path, &pst) == 0 &&
        fst.st_dev == pst.st_dev && fst.st_ino == pst.st_ino)
      return i;
  }
  return -1;
}

/* The log, opened on first use (nbdkit's own writes before that go to
 * other files); a log of two files starts with its 'M' record.
 */
static struct record_log *
log_get (void)
{
  const char *path, *delay;

  pthread_mutex_lock (&open_lock);
  if (rlog.fd < 0) {
    path = getenv ("RECORD_LOG");
    if (path == NULL)
      abort ();
    delay = getenv ("RECORD_DELAY_US");
    delay_us = delay ? atoi (delay) : 0;
    rlog.fd = open (path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (rlog.fd == -1)
      abort ();
    if (getenv ("RECORD_FILE2"))
      record_log_files (&rlog, 2);
  }
  pthread_mutex_unlock (&open_lock);
  return &rlog;
}

static void
record_unmodelled (const char *what)
{
  uint8_t head[5];
  uint32_t len = strlen (what);

  head[0] = 'X';
  record_put_le (head + 1, len, 4);
  record_append (log_get (), head, sizeof head, what, len);
}

static ssize_t
recorded_pwrite (ssize_t (*real) (int, const void *, size_t, off_t),
                 int file, int fd, const void *buf, size_t count,
                 off_t offset)
{
  struct record_log *l = log_get ();
  uint64_t change = record_write_begins (l, file, offset, buf, count);
  ssize_t r = real (fd, buf, count, offset);

  /* A short write completes only what it wrote: the rest is a new
   * write (the plugin writes it again) or never happens.
   */
  if (r >= 0 && (size_t) r == count) {
    record_pause (delay_us);
    record_completed (l, change);
  }
  else if (r > 0) {
    uint64_t part = record_write_begins (l, file, offset, buf, r);
    record_completed (l, part);
  }
  return r;
}

ssize_t
pwrite (int fd, const void *buf, size_t count, off_t offset)
{
  int file;

  REAL (pwrite);
  file = file_of (fd);
  if (file < 0)
    return real_pwrite (fd, buf, count, offset);
  return recorded_pwrite (real_pwrite, file, fd, buf, count, offset);
}

ssize_t
pwrite64 (int fd, const void *buf, size_t count, off_t offset)
{
  int file;

  REAL (pwrite64);
  file = file_of (fd);
  if (file < 0)
    return real_pwrite64 (fd, buf, count, offset);
  return recorded_pwrite (real_pwrite64, file, fd, buf, count, offset);
}

/* A flush of the file FD reaches (FILE, or none if -1). */
static int
recorded_sync (int (*real) (int), int file, int fd)
{
  struct record_log *l;
  uint64_t flush;
  int r;

  if (file < 0)
    return real (fd);
  l = log_get ();
  flush = record_flush_begins (l, file);
  r = real (fd);
  if (r == 0)
    record_flush_returned (l, flush);
  return r;
}

int
fsync (int fd)
{
  REAL (fsync);
  return recorded_sync (real_fsync, file_of (fd), fd);
}

int
fdatasync (int fd)
{
  REAL (fdatasync);
  return recorded_sync (real_fdatasync, file_of (fd), fd);
}

static int
recorded_truncate (int (*real) (int, off_t), int file, int fd, off_t length)
{
  struct record_log *l;
  uint64_t change;
  int r;

  if (file < 0)
    return real (fd, length);
  l = log_get ();
  change = record_truncate_begins (l, file, length);
  r = real (fd, length);
  if (r == 0) {
    record_pause (delay_us);
    record_completed (l, change);
  }
  return r;
}

int
ftruncate (int fd, off_t length)
{
  REAL (ftruncate);
  return recorded_truncate (real_ftruncate, file_of (fd), fd, length);
}

int
ftruncate64 (int fd, off_t length)
{
  REAL (ftruncate64);
  return recorded_truncate (real_ftruncate64, file_of (fd), fd, length);
}

static int
recorded_fallocate (int (*real) (int, int, off_t, off_t), int file, int fd,
                    int mode, off_t offset, off_t len)
{
  struct record_log *l;
  uint64_t change;
  int r;

  if (file < 0)
    return real (fd, mode, offset, len);
  l = log_get ();
  change = record_fallocate_begins (l, file, mode, offset, len);
  r = real (fd, mode, offset, len);

  if (r == 0) {
    record_pause (delay_us);
    record_completed (l, change);
  }
  return r;
}

int
fallocate (int fd, int mode, off_t offset, off_t len)
{
  REAL (fallocate);
  return recorded_fallocate (real_fallocate, file_of (fd), fd, mode, offset,
                             len);
}

int
fallocate64 (int fd, int mode, off_t offset, off_t len)
{
  REAL (fallocate64);
  return recorded_fallocate (real_fallocate64, file_of (fd), fd, mode,
                             offset, len);
}

/* Writes at the file position, and vectored ones: not modelled (the
 * harness would have to track the position), so they only leave a mark
 * that fails the check.
 */
static void
mark_unmodelled (int fd, const char *what)
{
  if (fd == rlog.fd || file_of (fd) < 0)
    return;
  record_unmodelled (what);
}

ssize_t
write (int fd, const void *buf, size_t count)
{
  REAL (write);
  mark_unmodelled (fd, "write");
  return real_write (fd, buf, count);
}

ssize_t
writev (int fd, const struct iovec *iov, int iovcnt)
{
  REAL (writev);
  mark_unmodelled (fd, "writev");
  return real_writev (fd, iov, iovcnt);
}

ssize_t
pwritev (int fd, const struct iovec *iov, int iovcnt, off_t offset)
{
  REAL (pwritev);
  mark_unmodelled (fd, "pwritev");
  return real_pwritev (fd, iov, iovcnt, offset);
}
