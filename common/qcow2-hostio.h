/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: host I/O and messages.
 *
 * Every byte the engine reads or writes underneath goes through these
 * calls, which keep the image's counters, stay inside the storage's size
 * and turn a failure into a sentence in the image's log.  Errors,
 * warnings and debug lines go to the struct qcow2_log given at open.
 *
 * Offers: qcow2_error, qcow2_warning, qcow2_debug, qcow2_debug_if,
 * qcow2_pread_clamped, qcow2_first_change, qcow2_pwrite_logged,
 * qcow2_flush_logged, qcow2_online_cpus.
 * Locks: none taken.  The I/O calls are made only from a thread that
 * called into the engine, never from pool workers (struct qcow2_io's
 * rule), with or without the image lock: the file size they clamp to
 * only grows (under the image lock, when clusters are allocated) and is
 * read atomically.  qcow2_first_change with the image lock held
 * exclusively.
 * Needs: the image's log, options and counters, and the header's
 * autoclear bits (qcow2_first_change); nothing else.
 */
#ifndef QCOW2_HOSTIO_H
#define QCOW2_HOSTIO_H

#include <inttypes.h>
#include <stdint.h>

#include "qcow2-types.h"

void qcow2_error (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
void qcow2_warning (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
/* A debug message of category QCOW2_DEBUG_IMAGE. */
void qcow2_debug (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
/* A debug message of category FLAG (QCOW2_DEBUG_*). */
void qcow2_debug_if (struct qcow2_image *img, unsigned flag,
                     const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));

/* Read [OFFSET, OFFSET+LEN) of the image underneath into BUF; bytes past
 * the end of the file read as zeros, as qemu reads them.  0, or -errno
 * after logging.
 */
int qcow2_pread_clamped (struct qcow2_image *img, struct qcow2_io *io,
                         void *buf, uint64_t len, uint64_t offset);

/* Nothing on disk changes until the first change: opening an image for
 * writing writes nothing (a session that only reads through a writable
 * export leaves the file byte for byte as it was).  What the open would
 * have changed is done here instead: the header's autoclear bits are
 * cleared (this writer keeps none of the structures they vouch for,
 * persistent bitmaps above all) and flushed, so that they are durably
 * clear before anything they vouch for changes.
 *
 * The contract, which every write path keeps:
 * - It runs, to completion, before the first write of anything to the
 *   image (data, L2 and L1 tables, refcounts, header fields), by any
 *   thread.
 * - It runs with the image lock held exclusively, which it keeps until
 *   the bits are flushed.  Data is written without that lock, so a write
 *   path calls this under the lock before it decides its first change
 *   (qcow2-cluster.c, qcow2-compress.c), or sees img->autoclear_on_disk
 *   clear under the lock (held shared is enough: the flag changes only
 *   under it held exclusively) before it lets its data go.  Metadata is
 *   written back only once something changed, so after it.
 * - qcow2_pwrite_logged refuses, as an internal error, a write while the
 *   flag is still set: a path that forgot fails loudly, having written
 *   nothing.
 * Returns 0 (at once if nothing is left to clear), or -errno after
 * logging: the flag stays set, so that the next write tries again, and
 * the write that called it fails having written nothing of its own.
 */
int qcow2_first_change (struct qcow2_image *img, struct qcow2_io *io);

/* Write [OFFSET, OFFSET+LEN) of the image underneath, which must lie
 * inside the file and not come before qcow2_first_change (-EIO, an
 * internal error, if either does).  Counts the bytes towards the next
 * flush.  0, or -errno after logging.
 */
int qcow2_pwrite_logged (struct qcow2_image *img, struct qcow2_io *io,
                         const void *buf, uint64_t len, uint64_t offset);

/* Flush the image underneath.  0, or -errno after logging. */
int qcow2_flush_logged (struct qcow2_image *img, struct qcow2_io *io);

/* The CPUs online, at least 1. */
unsigned qcow2_online_cpus (void);

#endif /* QCOW2_HOSTIO_H */
