/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd tests: an nbdkit plugin that serves a file and records
 * every write and flush it does (record-log.h), for the power-loss
 * harness to rebuild crash states from.
 *
 *   nbdkit --filter=qcow2zstd tests/.libs/record-plugin.so \
 *          file=DEVICE log=LOG
 *
 * Every write and flush takes one lock, so the log's order is the order
 * in which the file saw them: a write logged before a flush completed
 * before that flush began.  The log is written with write(2), so a
 * client that sees a flush return can read the log's size and know
 * every record of that flush is in it.
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "record-log.h"

static char *filename, *logname;
static int fd = -1, log_fd = -1;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void
record_unload (void)
{
  if (fd >= 0)
    close (fd);
  if (log_fd >= 0)
    close (log_fd);
  free (filename);
  free (logname);
}

static int
record_config (const char *key, const char *value)
{
  char **dst;

  if (strcmp (key, "file") == 0)
    dst = &filename;
  else if (strcmp (key, "log") == 0)
    dst = &logname;
  else {
    nbdkit_error ("record: unknown parameter '%s'", key);
    return -1;
  }
  free (*dst);
  *dst = nbdkit_absolute_path (value);
  return *dst ? 0 : -1;
}

static int
record_get_ready (void)
{
  if (filename == NULL || logname == NULL) {
    nbdkit_error ("record: file= and log= are needed");
    return -1;
  }
  fd = open (filename, O_RDWR | O_CLOEXEC);
  if (fd == -1) {
    nbdkit_error ("record: %s: %m", filename);
    return -1;
  }
  log_fd = open (logname, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC,
                 0644);
  if (log_fd == -1) {
    nbdkit_error ("record: %s: %m", logname);
    return -1;
  }
  return 0;
}

static void *
record_open (int readonly)
{
  return &fd;
}

static int64_t
record_get_size (void *handle)
{
  struct stat st;

  if (fstat (fd, &st) == -1) {
    nbdkit_error ("record: fstat: %m");
    return -1;
  }
  return st.st_size;
}

static int
record_can_multi_conn (void *handle)
{
  return 1;
}

static int
record_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  char *p = buf;

  while (count > 0) {
    ssize_t n = pread (fd, p, count, offset);
    if (n == -1 && errno == EINTR)
      continue;
    if (n == -1) {
      nbdkit_error ("record: pread: %m");
      return -1;
    }
    if (n == 0) {
      memset (p, 0, count);
      break;
    }
    p += n;
    count -= n;
    offset += n;
  }
  return 0;
}

static int
record_pwrite (void *handle, const void *buf, uint32_t count,
               uint64_t offset, uint32_t flags)
{
  const char *p = buf;
  uint32_t left = count;
  uint64_t pos = offset;
  int r = 0;

  pthread_mutex_lock (&lock);
  while (left > 0) {
    ssize_t n = pwrite (fd, p, left, pos);
    if (n == -1 && errno == EINTR)
      continue;
    if (n == -1) {
      nbdkit_error ("record: pwrite: %m");
      r = -1;
      break;
    }
    p += n;
    left -= n;
    pos += n;
  }
  /* What reached the file is logged, even after a failure part way. */
  if (count - left > 0)
    record_log_write (log_fd, offset, buf, count - left);
  pthread_mutex_unlock (&lock);
  return r;
}

static int
record_flush (void *handle, uint32_t flags)
{
  int r;

  pthread_mutex_lock (&lock);
  r = fdatasync (fd);
  if (r == 0)
    record_log_flush (log_fd);
  else
    nbdkit_error ("record: fdatasync: %m");
  pthread_mutex_unlock (&lock);
  return r;
}

static struct nbdkit_plugin plugin = {
  .name = "record",
  .longname = "qcow2zstd test: a file whose writes and flushes are logged",
  .unload = record_unload,
  .config = record_config,
  .magic_config_key = "file",
  .get_ready = record_get_ready,
  .open = record_open,
  .get_size = record_get_size,
  .can_multi_conn = record_can_multi_conn,
  .pread = record_pread,
  .pwrite = record_pwrite,
  .flush = record_flush,
};

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
NBDKIT_REGISTER_PLUGIN (plugin)
