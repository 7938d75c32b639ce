/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: the image locks of what is served, held as qemu-nbd
 * holds them: from the first open of an export (the plugin form: from
 * start-up) until nbdkit exits, not only while clients are connected.
 *
 * Between two clients of an export, qemu-img info and qemu-io (without
 * -U) and a second server that would write are refused, as while a
 * client is connected: a client that reconnects finds the disk as it
 * left it.  The locks are open file description locks (base/filelock.h) on
 * descriptors of our own, so they go when nbdkit exits or is killed.
 *
 * Each export (a key: the filter's export name; the plugin's "") holds
 * its own lock on its image and on the image's data and backing files: two
 * exports that reach one file conflict as two processes would.
 *
 * Offers: locks_hold_image, locks_hold_named_files, locks_release_all.
 * Locks: locks_lock (see locks.c), front-end lock 3 of README.md: taken
 * with no other lock of the glue's or the engine's held, and none taken
 * under it.
 * Needs: base/filelock.h, the qcow2-locking policy (passed in),
 * nbdkit_error.
 */
#ifndef QCOW2ZSTD_LOCKS_H
#define QCOW2ZSTD_LOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qcow2.h"

/* Whether the file open on FD (SIZE bytes, named PATH) is the one the
 * export serves.  If not, it writes the reason into WHY (a clause such
 * as "the plugin serves 100 bytes, not the 200 of PATH").
 */
typedef bool locks_confirm_fn (void *opaque, int fd, uint64_t size,
                               const char *path, char *why, size_t whylen);

/* Lock PATH for export KEY, for writing if WRITABLE (else for reading),
 * and keep the lock until locks_release_all.  An export that holds its
 * lock on that file already keeps it (made a writer's if it was a
 * reader's); one that held a lock on another file (the name now leads
 * elsewhere) drops it first.  CONFIRM (NULL: the caller opens PATH
 * itself) says whether a newly opened PATH is the file served.
 *
 * POLICY is qcow2-locking's.  Returns 0 when the image may be opened:
 * locked, or with qcow2-locking=off, or served unlocked because nothing could be
 * locked where that is allowed: read-only with qcow2-locking=on, and
 * either way with qcow2-locking=auto (which says so at error level).
 * Returns -1 after nbdkit_error when it may not: someone else holds the
 * image, or with qcow2-locking=on a file to be written that cannot be
 * locked or confirmed (the message names the reason and the remedy).
 */
int locks_hold_image (enum qcow2_lock_policy policy, const char *key,
                      const char *path, bool writable,
                      locks_confirm_fn *confirm, void *opaque);

/* Hold, for export KEY, locks on every file IMAGE opened beside itself,
 * its data and backing files (qcow2_image_named_files): read locks on
 * those it reads (the engine locks them too, but only while the image is
 * open), a writer's lock on a data file it writes (which the engine
 * leaves to us, as the image; a reader's lock held from an earlier
 * read-only open becomes a writer's).  0, or -1 after nbdkit_error.
 */
int locks_hold_named_files (enum qcow2_lock_policy policy, const char *key,
                        const struct qcow2_image *image);

/* Drop every lock (nbdkit is unloading). */
void locks_release_all (void);

#endif /* QCOW2ZSTD_LOCKS_H */
