/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: file I/O for backing files and the plugin. */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qcow2-fileio.h"

struct fileio {
  int fd;
};

static int
file_pread (void *opaque, void *buf, size_t count, uint64_t offset)
{
  struct fileio *f = opaque;

  while (count > 0) {
    ssize_t n = pread (f->fd, buf, count, offset);
    if (n == -1) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0) {
      /* Past the end of a file that grows: allocated, not written yet. */
      memset (buf, 0, count);
      return 0;
    }
    buf = (char *) buf + n;
    count -= n;
    offset += n;
  }
  return 0;
}

static int
file_pwrite (void *opaque, const void *buf, size_t count, uint64_t offset)
{
  struct fileio *f = opaque;

  while (count > 0) {
    ssize_t n = pwrite (f->fd, buf, count, offset);
    if (n == -1) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    buf = (const char *) buf + n;
    count -= n;
    offset += n;
  }
  return 0;
}

static int
file_flush (void *opaque)
{
  struct fileio *f = opaque;

  return fdatasync (f->fd) == -1 ? -errno : 0;
}

static int64_t
file_size (void *opaque)
{
  struct fileio *f = opaque;
  struct stat st;

  if (fstat (f->fd, &st) == -1)
    return -errno;
  return st.st_size;
}

int
qcow2_fileio_open (const char *path, bool writable, struct qcow2_io *io)
{
  struct fileio *f = malloc (sizeof *f);
  int err;

  if (f == NULL)
    return -ENOMEM;
  f->fd = open (path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (f->fd == -1) {
    err = errno;
    free (f);
    return -err;
  }
  io->opaque = f;
  io->pread = file_pread;
  io->pwrite = writable ? file_pwrite : NULL;
  io->flush = writable ? file_flush : NULL;
  io->size = file_size;
  return 0;
}

int
qcow2_fileio_fd (const struct qcow2_io *io)
{
  const struct fileio *f = io->opaque;

  return f->fd;
}

void
qcow2_fileio_close (struct qcow2_io *io)
{
  struct fileio *f = io->opaque;

  if (f == NULL)
    return;
  close (f->fd);
  free (f);
  io->opaque = NULL;
}
