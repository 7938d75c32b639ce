/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: host I/O and messages. */

#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "meta/hostio.h"

static void
vlog (void (*fn) (void *, const char *), void *opaque,
      const char *fmt, va_list ap)
{
  char msg[1024];

  if (fn == NULL)
    return;
  vsnprintf (msg, sizeof msg, fmt, ap);
  fn (opaque, msg);
}

void
qcow2_error (struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vlog (img->log.error, img->log.opaque, fmt, ap);
  va_end (ap);
}

void
qcow2_warning (struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vlog (img->log.warning, img->log.opaque, fmt, ap);
  va_end (ap);
}

void
qcow2_debug (struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;

  if (img->log.debug == NULL || !(img->opts.debug & QCOW2_DEBUG_IMAGE))
    return;
  va_start (ap, fmt);
  vlog (img->log.debug, img->log.opaque, fmt, ap);
  va_end (ap);
}

void
qcow2_debug_if (struct qcow2_image *img, unsigned flag, const char *fmt, ...)
{
  va_list ap;

  if (img->log.debug == NULL || !(img->opts.debug & flag))
    return;
  va_start (ap, fmt);
  vlog (img->log.debug, img->log.opaque, fmt, ap);
  va_end (ap);
}

int
qcow2_pread_clamped (struct qcow2_image *img, struct qcow2_io *io,
                     void *buf, uint64_t len, uint64_t offset)
{
  uint64_t avail = offset < img->file_size ? img->file_size - offset : 0;
  uint64_t from_file = len < avail ? len : avail;
  int r;

  if (from_file > 0) {
    r = io->pread (io->opaque, buf, from_file, offset);
    if (r < 0) {
      qcow2_error (img, "read of %" PRIu64 " bytes at host offset "
                   "0x%" PRIx64 " failed: %s", from_file, offset,
                   strerror (-r));
      return r;
    }
    atomic_fetch_add_explicit (&img->bytes_read_underneath, from_file,
                               memory_order_relaxed);
    atomic_fetch_add_explicit (&img->reads_underneath, 1,
                               memory_order_relaxed);
  }
  if (from_file < len)
    memset ((uint8_t *) buf + from_file, 0, len - from_file);
  return 0;
}

int
qcow2_pwrite_logged (struct qcow2_image *img, struct qcow2_io *io,
                     const void *buf, uint64_t len, uint64_t offset)
{
  int r;

  if (offset > img->file_size || len > img->file_size - offset) {
    qcow2_error (img, "internal error: write of %" PRIu64 " bytes at 0x%"
                 PRIx64 " would go past the end of the file", len, offset);
    return -EIO;
  }
  if (atomic_load_explicit (&img->first_change_pending,
                           memory_order_relaxed)) {
    qcow2_error (img, "internal error: a write of %" PRIu64 " bytes at 0x%"
                 PRIx64 " before the image's first change", len, offset);
    return -EIO;
  }
  r = io->pwrite (io->opaque, buf, len, offset);
  if (r < 0)
    qcow2_error (img, "write of %" PRIu64 " bytes at host offset 0x%" PRIx64
                 " failed: %s", len, offset, strerror (-r));
  else
    atomic_fetch_add_explicit (&img->unflushed_bytes, len,
                               memory_order_relaxed);
  return r;
}

int
qcow2_flush_logged (struct qcow2_image *img, struct qcow2_io *io)
{
  int r;

  atomic_store_explicit (&img->unflushed_bytes, 0, memory_order_relaxed);
  r = io->flush (io->opaque);
  if (r < 0)
    qcow2_error (img, "flush failed: %s", strerror (-r));
  return r;
}

unsigned
qcow2_online_cpus (void)
{
  long cpus = sysconf (_SC_NPROCESSORS_ONLN);

  return cpus > 0 ? (unsigned) cpus : 1;
}
