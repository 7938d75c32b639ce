/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the external data file.
 *
 * An image with incompatible feature bit 2 keeps its guest data in
 * another file, named by its data file header extension, and only its
 * metadata in the image: the host offset of a data cluster is an offset
 * into the data file, the guest offset itself as qemu allocates them
 * (autoclear bit 1, data_file_raw, says the data file is then also a
 * valid raw image of the disk).  The file is found as a backing file is
 * (backing.h: opts.data_file_path overrides the header's name, which
 * must otherwise lead to a regular file inside opts.backing_dirs),
 * opened read-only by the engine and locked as qemu locks it; the paths
 * read data clusters from it through meta/hostio.c's qcow2_pread_data.
 * Such an image is served read-only: writing it is refused as it opens.
 *
 * Offers: qcow2_data_file_open, qcow2_data_file_close; img->data_io,
 * img->data_size and img->data_path, which the open sets.
 * Locks: none; the file is read as the image file is, from the threads
 * that call into the engine.
 * Needs: the header's extensions, backing.h's naming and locking rule,
 * file I/O.
 */
#ifndef QCOW2_DATAFILE_H
#define QCOW2_DATAFILE_H

#include <stddef.h>
#include <stdint.h>

#include "meta/image.h"

/* Open the data file the header in FIRST (FIRST_LEN bytes, the first
 * cluster) names, or opts.data_file_path, as img->data_file.  0, or
 * -errno after logging.
 */
int qcow2_data_file_open (struct qcow2_image *img, const uint8_t *first,
                          size_t first_len);
void qcow2_data_file_close (struct qcow2_image *img);

#endif /* QCOW2_DATAFILE_H */
