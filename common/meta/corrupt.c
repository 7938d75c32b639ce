/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: marking an image corrupt (see meta/corrupt.h). */

#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "meta/corrupt.h"
#include "format/header.h"
#include "meta/log.h"
#include "meta/regions.h"

int
qcow2_corrupt_bit_write (struct qcow2_image *img, struct qcow2_io *io,
                         uint64_t incompatible)
{
  struct qcow2_header marked = { 0 };
  struct qcow2_field_bytes field;
  int r;

  /* The bit alone, written past every check of meta/hostio.c (which now
   * refuses writes), as qemu writes it.
   */
  marked.incompatible_features = incompatible | QCOW2_INCOMPAT_CORRUPT;
  qcow2_header_field (&marked, QCOW2_FIELD_INCOMPATIBLE_FEATURES, &field);
  r = io->pwrite ? io->pwrite (io->opaque, field.bytes, field.len,
                               field.offset) : -EROFS;
  if (r == 0)
    r = io->flush (io->opaque);
  if (r < 0)
    qcow2_error (img, "setting the corrupt bit failed: %s", strerror (-r));
  return r;
}

int
qcow2_mark_corrupt (struct qcow2_image *img, struct qcow2_io *io,
                    const char *fmt, ...)
{
  bool already = false;
  char why[768];
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (why, sizeof why, fmt, ap);
  va_end (ap);
  if (!atomic_compare_exchange_strong (&img->corrupt, &already, true)) {
    qcow2_error (img, "%s; the image is marked corrupt already", why);
    return -EIO;
  }
  qcow2_error (img, "Marking image as corrupt: %s; further writes are "
               "refused, reads go on (check the image with qemu-img check "
               "-r all)", why);
  /* The caller may hold no image lock, and the dirty bit changes under
   * it held exclusively: read atomically (the writers change it so).
   */
  (void) qcow2_corrupt_bit_write (img, io,
                                  __atomic_load_n (&img->header.incompatible_features,
                                                   __ATOMIC_RELAXED));
  return -EIO;
}

int
qcow2_corrupt_overlap (struct qcow2_image *img, struct qcow2_io *io,
                       enum qcow2_region what, enum qcow2_region other,
                       uint64_t where, uint64_t host, uint64_t len,
                       uint64_t guest)
{
  char at_guest[64] = "";

  if (guest != UINT64_MAX)
    snprintf (at_guest, sizeof at_guest, " (guest offset 0x%" PRIx64 ")",
              guest);
  return qcow2_mark_corrupt (img, io, "Preventing invalid write on metadata "
                             "(overlaps with %s): %" PRIu64 " bytes of %s at "
                             "host offset 0x%" PRIx64 "%s would have "
                             "overwritten the %s at host offset 0x%" PRIx64,
                             qcow2_region_name (other), len,
                             qcow2_region_name (what), host, at_guest,
                             qcow2_region_name (other), where);
}
