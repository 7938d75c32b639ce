/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: backing files.
 *
 * An image whose header names a backing file reads its unallocated
 * clusters from it, and a partial write into such a cluster copies the
 * rest of the cluster from it.  The backing file is raw or qcow2 (which
 * may have a backing file of its own: a chain, up to 16 deep), is opened
 * read-only by the engine itself, and is read in the calling thread.
 * Past its end it reads as zeros.
 *
 * Which files: the header names its backing file, found by the rule of
 * namedfile.h; opts.backing_path, which the user names, is opened as it
 * is.
 *
 * Its map: a qcow2 backing file reports what its own chain reports, a
 * raw one its holes (SEEK_DATA/SEEK_HOLE) as zeros and the rest as data,
 * and past its end the disk is zeros.
 *
 * Offers: qcow2_backing_open, qcow2_backing_close; the paths read and
 * map the backing file through img->read_backing and
 * img->backing_extents, which the open sets.
 * Locks: the paths read the backing file with no lock of the image held
 * (a read after its lookup, a copy-on-write before its link); a qcow2
 * backing file's read takes that image's own lock, as any read does.
 * The map of the backing file is asked for with the image lock held
 * shared; a qcow2 backing file's own image lock is taken below it.
 * Needs: file I/O, and the engine's own image open and read for a qcow2
 * backing file.
 */
#ifndef QCOW2_BACKING_H
#define QCOW2_BACKING_H

#include <stddef.h>
#include <stdint.h>

#include "meta/image.h"

/* Open the backing file the header in FIRST (FIRST_LEN bytes, the first
 * cluster) names, or the one opts.backing_path overrides it with, as
 * img->backing, and set img->read_backing.  0, or -errno after logging.
 */
int qcow2_backing_open (struct qcow2_image *img, const uint8_t *first,
                        size_t first_len);
void qcow2_backing_close (struct qcow2_image *img);

#endif /* QCOW2_BACKING_H */
