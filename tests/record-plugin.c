/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd tests: an nbdkit plugin that serves a file and records
 * every write, trim and flush it does (record-log.h, a log of one
 * file), for the power-loss harness to rebuild crash states from.  A
 * trim punches a hole, as nbdkit's file plugin does.  (An image with an
 * external data file is recorded by record-shim.c instead: the filter
 * opens the data file itself.)
 *
 *   nbdkit --filter=qcow2zstd tests/.libs/record-plugin.so \
 *          file=DEVICE log=LOG [delay-us=N]
 *
 * Requests are served in parallel (the parallel thread model, and no
 * lock around the calls on the file): each logs its record as it
 * begins and its completion when the call on the file has returned, so
 * the log is in device order and says what was in flight.  delay-us
 * holds each write and trim in flight up to N microseconds longer
 * (after the call, before its completion is logged), so that requests
 * from the filter's threads overlap.  The log is written with write(2),
 * so a client that sees a request return can read the log's size and
 * know that every record of that request is in it.
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
static int fd = -1;
static struct record_log rlog = RECORD_LOG_INIT;
static unsigned delay_us;

static void
record_unload (void)
{
  if (fd >= 0)
    close (fd);
  if (rlog.fd >= 0)
    close (rlog.fd);
  free (filename);
  free (logname);
}

static int
record_config (const char *key, const char *value)
{
  char **dst;

  if (strcmp (key, "delay-us") == 0)
    return nbdkit_parse_unsigned ("delay-us", value, &delay_us);
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
  rlog.fd = open (logname, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC,
                 0644);
  if (rlog.fd == -1) {
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
  uint64_t change = record_write_begins (&rlog, 0, offset, buf, count);

  while (left > 0) {
    ssize_t n = pwrite (fd, p, left, pos);
    if (n == -1 && errno == EINTR)
      continue;
    if (n == -1) {
      /* Never completed: the log keeps it in flight, as the storage may
       * hold any part of it.
       */
      nbdkit_error ("record: pwrite: %m");
      return -1;
    }
    p += n;
    left -= n;
    pos += n;
  }
  record_pause (delay_us);
  record_completed (&rlog, change);
  return 0;
}

static int
record_can_trim (void *handle)
{
  return 1;
}

static int
record_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  uint64_t change = record_discard_begins (&rlog, 0, offset, count);

  if (fallocate (fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset,
                 count) == -1) {
    nbdkit_error ("record: fallocate: %m");
    return -1;
  }
  record_pause (delay_us);
  record_completed (&rlog, change);
  return 0;
}

static int
record_flush (void *handle, uint32_t flags)
{
  uint64_t flush = record_flush_begins (&rlog, 0);

  if (fdatasync (fd) == -1) {
    nbdkit_error ("record: fdatasync: %m");
    return -1;
  }
  record_flush_returned (&rlog, flush);
  return 0;
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
  .can_trim = record_can_trim,
  .trim = record_trim,
  .flush = record_flush,
};

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
NBDKIT_REGISTER_PLUGIN (plugin)
