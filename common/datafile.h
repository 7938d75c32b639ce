/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the external data file.
 *
 * An image with incompatible feature bit 2 keeps its guest data in
 * another file, named by its data file header extension, and only its
 * metadata in the image: the host offset of a data cluster is an offset
 * into the data file, the guest offset itself as qemu allocates them
 * (autoclear bit 1, data_file_raw, says the data file is then also a
 * valid raw image of the disk).  The file is found as a backing file is
 * (namedfile.h: opts.data_file_path overrides the header's name, which
 * must otherwise lead to a regular file inside opts.backing_dirs) and
 * opened by the engine as the image is, read-only or for writing.  Read
 * only, it is locked here as qemu locks it; written, its lock is the
 * caller's to take, as the image's (qcow2_image_named_files).  The paths
 * read and write data clusters in it through meta/hostio.c
 * (qcow2_pread_data, qcow2_pwrite_data, qcow2_discard_data); a new one
 * goes at its guest offset, counted by no refcount (paths/commit.c).
 *
 * Offers: qcow2_data_file_open, qcow2_data_file_close; img->data_io,
 * img->data_size and img->data_path, which the open sets.
 * Locks: none; the file is read and written as the image file is, from
 * the threads that call into the engine.
 * Needs: the header's extensions, namedfile.h's naming and locking rule,
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
