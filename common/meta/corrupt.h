/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: a damaged image is never made worse.
 *
 * What the engine finds wrong while it writes an image (a write that
 * would land on metadata of another kind, an L1 entry naming a cluster
 * that is no L2 table, a refcount table entry naming one that is no
 * refcount block, refcounts that would go below zero or past their
 * width) marks the image corrupt, as qemu does: the corrupt bit
 * (incompatible bit 1) is set in the header, durably, the log says what
 * was found and where, and from then on every write is refused with EIO
 * while reads go on.  Nothing of the write that found it reaches the
 * file.  qemu then refuses to open the image read-write until it is
 * checked with qemu-img check -r, and so does the engine.
 *
 * Offers: qcow2_mark_corrupt, qcow2_corrupt_overlap,
 * qcow2_corrupt_bit_write.
 * Locks: none taken; callable with any lock held (the header is written
 * once, by whoever marks first, and again by a header write of the dirty
 * bit that may have raced with it).
 * Needs: the image's header, its storage, the log, the region names.
 */
#ifndef QCOW2_CORRUPT_H
#define QCOW2_CORRUPT_H

#include <stdint.h>

#include "meta/image.h"
#include "meta/regions.h"

/* Mark IMG corrupt, saying why (a sentence from FMT: what was found, and
 * where), unless it is already: returns -EIO, for the caller to fail
 * with.
 */
int qcow2_mark_corrupt (struct qcow2_image *img, struct qcow2_io *io,
                        const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));

/* Write the header's incompatible features as INCOMPATIBLE with the
 * corrupt bit set, and flush: for qcow2_mark_corrupt, and for a header
 * write of those features (meta/hostio.c) that finds the image marked
 * once it has gone out, and so may have landed after the mark and
 * cleared the bit.  0, or -errno after logging.
 */
int qcow2_corrupt_bit_write (struct qcow2_image *img, struct qcow2_io *io,
                             uint64_t incompatible);

/* A write of LEN bytes of WHAT at host offset HOST would have landed on
 * metadata of kind OTHER at host offset WHERE: refuse it, in qemu's
 * words, naming the guest offset GUEST where it has one (UINT64_MAX: a
 * write of metadata).  Returns -EIO.
 */
int qcow2_corrupt_overlap (struct qcow2_image *img, struct qcow2_io *io,
                           enum qcow2_region what, enum qcow2_region other,
                           uint64_t where, uint64_t host, uint64_t len,
                           uint64_t guest);

#endif /* QCOW2_CORRUPT_H */
