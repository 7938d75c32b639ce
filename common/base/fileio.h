/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: a struct qcow2_io over a file of the local
 * filesystem.  Backing files are read through it (their holes found with
 * SEEK_DATA and SEEK_HOLE), and the plugin form serves its image through
 * it: it grows that file, punches holes in it and cuts its free tail.
 */
#ifndef QCOW2_FILEIO_H
#define QCOW2_FILEIO_H

#include <stdbool.h>

#include "base/io.h"

/* Open PATH (for writing too if WRITABLE) and fill IO.  Returns 0 or
 * -errno; IO is untouched on failure.
 */
int qcow2_fileio_open (const char *path, bool writable, struct qcow2_io *io);

/* The file descriptor under IO (to lock the file: base/filelock.h). */
int qcow2_fileio_fd (const struct qcow2_io *io);

/* Close what qcow2_fileio_open opened. */
void qcow2_fileio_close (struct qcow2_io *io);

#endif /* QCOW2_FILEIO_H */
