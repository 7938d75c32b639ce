/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: every read, write and flush of the image file.
 *
 * Every byte the engine reads or writes underneath goes through these
 * calls, which keep the image's counters, stay inside the storage's size
 * and turn a failure into a sentence in the image's log.  A write says
 * what it writes: guest data (plain, compressed, copied on write,
 * encrypted: qcow2_pwrite_data) or metadata of one kind
 * (qcow2_pwrite_meta), and is checked against the list of metadata
 * regions before it goes out (meta/regions.h): guest data may land on no
 * metadata, metadata only on its own kind (or on clusters the list does
 * not hold yet, new ones).  A write that would land elsewhere marks the
 * image corrupt and fails with -EIO, writing nothing (meta/corrupt.h);
 * once the image is marked, every write fails so.
 *
 * Offers: qcow2_pread_clamped, qcow2_pread_data, qcow2_pwrite_data,
 * qcow2_pwrite_meta, qcow2_discard_data, qcow2_pwrite_dirty_bit,
 * qcow2_flush_logged, qcow2_hostio_first_change_writes.
 * Locks: none taken.  The I/O calls are made only from a thread that
 * called into the engine, never from pool workers (struct qcow2_io's
 * rule), with or without the image lock: the file size they clamp to
 * changes only under the image lock and is read atomically.
 * Needs: the image's log, options and counters, the regions, and
 * whether the image's first change is still to come
 * (meta/first-change.h).
 */
#ifndef QCOW2_HOSTIO_H
#define QCOW2_HOSTIO_H

#include <stdbool.h>
#include <stdint.h>

#include "meta/image.h"
#include "meta/regions.h"

/* Read [OFFSET, OFFSET+LEN) of the image underneath into BUF; bytes past
 * the end of the file read as zeros, as qemu reads them.  0, or -errno
 * after logging.
 */
int qcow2_pread_clamped (struct qcow2_image *img, struct qcow2_io *io,
                         void *buf, uint64_t len, uint64_t offset);

/* Read [OFFSET, OFFSET+LEN) of the host bytes of plain data clusters:
 * from the external data file if the image has one (img->data_io, zeros
 * past its end), else as qcow2_pread_clamped from IO.
 */
int qcow2_pread_data (struct qcow2_image *img, struct qcow2_io *io,
                      void *buf, uint64_t len, uint64_t offset);

/* Write [OFFSET, OFFSET+LEN) of the image underneath: guest data
 * (qcow2_pwrite_data), or metadata of KIND (qcow2_pwrite_meta).  The
 * range must lie inside the file and the write must not come before the
 * image's first change (meta/first-change.h): either is an internal
 * error, -EIO.  Counts the bytes towards the next flush.  0, or -errno
 * after logging.  In an image with an external data file, guest data
 * goes there instead (IO unused), unchecked against the regions (none
 * are in that file) and growing the file as needed.
 */
int qcow2_pwrite_data (struct qcow2_image *img, struct qcow2_io *io,
                       const void *buf, uint64_t len, uint64_t offset);
int qcow2_pwrite_meta (struct qcow2_image *img, struct qcow2_io *io,
                       enum qcow2_region kind, const void *buf, uint64_t len,
                       uint64_t offset);

/* The guest clusters of [OFFSET, OFFSET+LEN) of an image with an
 * external data file no longer map its bytes there (zeroed or
 * discarded): give their space back in the data file, as qemu does.
 * With data_file_raw the bytes must then read as zeros, as the guest
 * disk reads them: a discard that the file cannot do is written with
 * zeros instead.  0, or -errno after logging (a failed discard alone is
 * no error).
 */
int qcow2_discard_data (struct qcow2_image *img, uint64_t len,
                        uint64_t offset);

/* Write the header's incompatible_features as img->header has them but
 * with the dirty bit set (DIRTY) or clear, as qcow2_pwrite_meta writes
 * (not flushed; img->header is the caller's to change once it is
 * durable).  0, or -errno after logging.
 */
int qcow2_pwrite_dirty_bit (struct qcow2_image *img, struct qcow2_io *io,
                            bool dirty);

/* Flush the image underneath, and first the external data file if the
 * image has one.  0, or -errno after logging.
 */
int qcow2_flush_logged (struct qcow2_image *img, struct qcow2_io *io);

/* ON: the calling thread is making the image's first change
 * (meta/first-change.h), whose own writes go out although
 * img->first_change_pending is still set; OFF once they are made.
 */
void qcow2_hostio_first_change_writes (bool on);

#endif /* QCOW2_HOSTIO_H */
