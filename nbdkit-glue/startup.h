/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: the image file checked while nbdkit starts.
 *
 * Found when the first client connects, a wrong passphrase or a file
 * that is not an image would tell that client only that there is no
 * export, and nbdkit would have started "fine" and run --run.  So
 * where the file is known at start-up (the plugin form's own file; the
 * filter over nbdkit's file plugin with file=), everything the engine
 * can check without a client is checked here, in nbdkit's
 * .config_complete, and a failure stops nbdkit with the message.
 *
 * Offers: startup_check_file.
 * Locks: none of its own (locks.h's, through locks_hold_*).
 * Needs: params.h (the options), locks.h, qcow2.h, base/fileio.h.
 */
#ifndef QCOW2ZSTD_STARTUP_H
#define QCOW2ZSTD_STARTUP_H

#include <stdbool.h>

#include "params.h"

/* Check the image file PATH (absolute) that an export will serve, and
 * lock it (and its backing files) for export LOCK_KEY (locks.h: NULL in
 * the plugin form) from now until nbdkit exits.  WRITES: the export
 * will be written.  It must be a regular file or a block device that
 * can be read (and written if WRITES).  Then, with qcow2-create, its
 * first cluster must be all zeros, as qcow2_create demands; else it
 * must hold an image the engine opens as the export will open it: the
 * header and its features, a compression level that fits its type, the
 * passphrase (its PBKDF2 run once: the key stays in the key cache for
 * the first open), the snapshot named, the backing chain, and for
 * WRITES what writing needs, unless the image is dirty (its repair is
 * a write, left to the first open).  Nothing is written.
 *
 * 0, or -1 after nbdkit_error with a message that names PATH.
 */
int startup_check_file (const struct glue_options *options, const char *path,
                        const char *lock_key, bool writes);

#endif /* QCOW2ZSTD_STARTUP_H */
