/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the files an image names in its header.
 *
 * A header names its backing file and its external data file, and a
 * hostile image could name any file of the server (or a device, or a
 * json: or protocol name that qemu would open).  A name is opened only
 * if it is a plain file name (no colon before its first slash, as qemu
 * tells a protocol prefix) and leads, once symbolic links are resolved,
 * to a regular file inside one of opts.backing_dirs (the served image's
 * directory and those the user added); otherwise the image is refused,
 * naming the file, the header's name and the parameter that allows it.
 * A path the user gives (qcow2-backing, qcow2-data-file) is opened as
 * it is.  Such files are locked as qemu locks them: as an image opened
 * read-only.
 *
 * Offers: qcow2_named_file_path, qcow2_named_file_lock.
 * Locks: none.
 * Needs: the image's options and log, file locking.
 */
#ifndef QCOW2_NAMEDFILE_H
#define QCOW2_NAMEDFILE_H

#include "meta/image.h"

/* Where the file the header calls NAME is, for its WHAT ("backing
 * file", "data file", in messages): *PATH (freed by the caller) is
 * OVERRIDE if the user gave one (with parameter PARAM), else where NAME
 * leads, taken from the image's directory, if it may be opened.  0, or
 * -errno after logging.
 */
int qcow2_named_file_path (struct qcow2_image *img, const char *what,
                           const char *param, const char *override,
                           const char *name, char **path);

/* Lock the file at PATH, open as IO, as qemu locks the files an image
 * names, unless opts.locking says not to.  0, or -errno after logging.
 */
int qcow2_named_file_lock (struct qcow2_image *img, const char *what,
                           struct qcow2_io *io, const char *path);

#endif /* QCOW2_NAMEDFILE_H */
