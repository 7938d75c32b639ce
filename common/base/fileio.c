/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: file I/O for backing files and the plugin. */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"

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

static int
file_discard (void *opaque, uint64_t count, uint64_t offset)
{
  struct fileio *f = opaque;

  if (fallocate (f->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                 offset, count) == -1)
    return errno == ENOTSUP ? -EOPNOTSUPP : -errno;
  return 0;
}

static int
file_truncate (void *opaque, uint64_t size)
{
  struct fileio *f = opaque;

  return ftruncate (f->fd, size) == -1 ? -errno : 0;
}

/* SEEK_DATA and SEEK_HOLE, as qemu's file-posix driver asks them. */
static int
file_block_status (void *opaque, uint64_t count, uint64_t offset,
                   uint64_t *length, bool *hole)
{
  struct fileio *f = opaque;
  off_t data, end;

  data = lseek (f->fd, offset, SEEK_DATA);
  if (data == -1 && errno == ENXIO)
    data = offset + count;      /* a hole up to the end of the file */
  else if (data == -1) {
    /* The file system cannot say: all data. */
    *length = count;
    *hole = false;
    return 0;
  }
  if ((uint64_t) data > offset) {
    *hole = true;
    *length = (uint64_t) data - offset < count ? (uint64_t) data - offset
      : count;
    return 0;
  }
  end = lseek (f->fd, offset, SEEK_HOLE);
  if (end == -1 || (uint64_t) end <= offset)
    end = offset + count;
  *hole = false;
  *length = (uint64_t) end - offset < count ? (uint64_t) end - offset : count;
  return 0;
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
  io->discard = writable ? file_discard : NULL;
  io->truncate = writable ? file_truncate : NULL;
  io->block_status = file_block_status;
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
