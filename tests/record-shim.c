/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd tests: an LD_PRELOAD shim that records what a process does
 * to one file, for the power-loss harness (the plugin form opens its
 * own file, so no plugin underneath can record it).
 *
 *   RECORD_FILE=/abs/image RECORD_LOG=/abs/log LD_PRELOAD=record-shim.so nbdkit ...
 *
 * pwrite, fsync, fdatasync, ftruncate and fallocate on that file (found
 * by device and inode, whichever descriptor reaches it) are recorded in
 * the format of record-log.h, each call and its record under one lock
 * so that the log's order is the order the file saw them.  write,
 * writev and pwritev on it are recorded as calls the harness cannot
 * model, so that a change to the plugin's I/O cannot go unrecorded.
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

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;

#define REAL(name) \
  static __typeof__ (name) *real_##name; \
  if (real_##name == NULL) \
    real_##name = (__typeof__ (name) *) dlsym (RTLD_NEXT, #name)

/* Does FD reach the recorded file?  It is looked up each time: the file
 * may not exist yet when the process starts (qcow2-create makes it).
 */
static bool
is_image (int fd)
{
  const char *path = getenv ("RECORD_FILE");
  struct stat fst, pst;

  return path && fstat (fd, &fst) == 0 && stat (path, &pst) == 0 &&
    fst.st_dev == pst.st_dev && fst.st_ino == pst.st_ino;
}

/* With the lock held. */
static int
log_fd_get (void)
{
  const char *path;

  if (log_fd >= 0)
    return log_fd;
  path = getenv ("RECORD_LOG");
  if (path == NULL)
    abort ();
  log_fd = open (path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd == -1)
    abort ();
  return log_fd;
}

static void
record_unmodelled (const char *what)
{
  uint8_t head[5];
  uint32_t len = strlen (what);

  head[0] = 'X';
  record_put_le (head + 1, len, 4);
  record_write_all (log_fd_get (), head, sizeof head);
  record_write_all (log_fd_get (), what, len);
}

static ssize_t
recorded_pwrite (ssize_t (*real) (int, const void *, size_t, off_t),
                 int fd, const void *buf, size_t count, off_t offset)
{
  ssize_t r;

  pthread_mutex_lock (&lock);
  r = real (fd, buf, count, offset);
  if (r > 0)
    record_log_write (log_fd_get (), offset, buf, r);
  pthread_mutex_unlock (&lock);
  return r;
}

ssize_t
pwrite (int fd, const void *buf, size_t count, off_t offset)
{
  REAL (pwrite);
  if (!is_image (fd))
    return real_pwrite (fd, buf, count, offset);
  return recorded_pwrite (real_pwrite, fd, buf, count, offset);
}

ssize_t
pwrite64 (int fd, const void *buf, size_t count, off_t offset)
{
  REAL (pwrite64);
  if (!is_image (fd))
    return real_pwrite64 (fd, buf, count, offset);
  return recorded_pwrite (real_pwrite64, fd, buf, count, offset);
}

static int
recorded_sync (int (*real) (int), int fd)
{
  int r;

  pthread_mutex_lock (&lock);
  r = real (fd);
  if (r == 0)
    record_log_flush (log_fd_get ());
  pthread_mutex_unlock (&lock);
  return r;
}

int
fsync (int fd)
{
  REAL (fsync);
  return is_image (fd) ? recorded_sync (real_fsync, fd) : real_fsync (fd);
}

int
fdatasync (int fd)
{
  REAL (fdatasync);
  return is_image (fd) ? recorded_sync (real_fdatasync, fd)
    : real_fdatasync (fd);
}

static int
recorded_truncate (int (*real) (int, off_t), int fd, off_t length)
{
  uint8_t rec[9];
  int r;

  pthread_mutex_lock (&lock);
  r = real (fd, length);
  if (r == 0) {
    rec[0] = 'T';
    record_put_le (rec + 1, length, 8);
    record_write_all (log_fd_get (), rec, sizeof rec);
  }
  pthread_mutex_unlock (&lock);
  return r;
}

int
ftruncate (int fd, off_t length)
{
  REAL (ftruncate);
  return is_image (fd) ? recorded_truncate (real_ftruncate, fd, length)
    : real_ftruncate (fd, length);
}

int
ftruncate64 (int fd, off_t length)
{
  REAL (ftruncate64);
  return is_image (fd) ? recorded_truncate (real_ftruncate64, fd, length)
    : real_ftruncate64 (fd, length);
}

static int
recorded_fallocate (int (*real) (int, int, off_t, off_t), int fd, int mode,
                    off_t offset, off_t len)
{
  uint8_t rec[21];
  int r;

  pthread_mutex_lock (&lock);
  r = real (fd, mode, offset, len);
  if (r == 0) {
    rec[0] = 'A';
    record_put_le (rec + 1, (uint32_t) mode, 4);
    record_put_le (rec + 5, offset, 8);
    record_put_le (rec + 13, len, 8);
    record_write_all (log_fd_get (), rec, sizeof rec);
  }
  pthread_mutex_unlock (&lock);
  return r;
}

int
fallocate (int fd, int mode, off_t offset, off_t len)
{
  REAL (fallocate);
  return is_image (fd) ? recorded_fallocate (real_fallocate, fd, mode,
                                             offset, len)
    : real_fallocate (fd, mode, offset, len);
}

int
fallocate64 (int fd, int mode, off_t offset, off_t len)
{
  REAL (fallocate64);
  return is_image (fd) ? recorded_fallocate (real_fallocate64, fd, mode,
                                             offset, len)
    : real_fallocate64 (fd, mode, offset, len);
}

/* Writes at the file position, and vectored ones: not modelled (the
 * harness would have to track the position), so they only leave a mark
 * that fails the check.
 */
static void
mark_unmodelled (int fd, const char *what)
{
  if (fd == log_fd || !is_image (fd))
    return;
  pthread_mutex_lock (&lock);
  record_unmodelled (what);
  pthread_mutex_unlock (&lock);
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
