/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: image locking the way qemu locks image files.
 *
 * qemu (block/file-posix.c) takes open file description locks
 * (F_OFD_SETLK, so they belong to one open() of the file and go when
 * it is closed or its process dies) on single bytes of the image file:
 * a shared lock on byte 100 + BIT for each permission it holds, and on
 * byte 200 + BIT for each permission it does not share with others.
 * Opening, it takes its bytes first and then tests (F_OFD_GETLK) that
 * no other open file description holds one that conflicts: byte 200 +
 * BIT for a permission it wants, byte 100 + BIT for one it refuses to
 * share.  Taking before testing means that of two processes opening at
 * once, at least one sees the other.
 *
 * This file does the same, so that qemu and we refuse each other as two
 * qemus would.  It knows nothing of nbdkit or of the engine: it works on
 * a file descriptor or a path and reports in a sentence.
 */
#ifndef QCOW2_LOCK_H
#define QCOW2_LOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* qemu 7.2's permission bits (include/block/block-common.h).  qemu 7.2
 * has no graph-modification permission any more: bits 0 to 3 are all
 * it locks.
 */
#define QCOW2_PERM_CONSISTENT_READ  (1u << 0)
#define QCOW2_PERM_WRITE            (1u << 1)
#define QCOW2_PERM_WRITE_UNCHANGED  (1u << 2)
#define QCOW2_PERM_RESIZE           (1u << 3)
#define QCOW2_PERM_ALL              0x0fu

/* The lock bytes. */
#define QCOW2_LOCK_PERM_BASE        100
#define QCOW2_LOCK_SHARED_BASE      200

enum qcow2_lock_policy {
  QCOW2_LOCK_ON = 0,            /* as qemu with locking=on (the default) */
  QCOW2_LOCK_FORCE_SHARE,       /* as qemu-img -U: read, share everything */
  QCOW2_LOCK_OFF,               /* as qemu with locking=off: no locks */
  /* As qemu's locking=auto: the locks of QCOW2_LOCK_ON where the file
   * system has them; where it has none (qcow2_lock_unsupported), the
   * caller goes on without, saying so.
   */
  QCOW2_LOCK_AUTO,
};

struct qcow2_lock_perms {
  unsigned held;                /* QCOW2_PERM_* bits this opener uses */
  unsigned shared;              /* ... and lets others use */
};

/* What qemu 7.2 takes on the file of a qcow2 image (found with
 * qemu-nbd and /proc/locks): opened for writing, it holds consistent
 * read, write and resize, and shares consistent read and write
 * unchanged; opened read-only (qemu-nbd -r, qemu-img info, and every
 * backing file), it holds consistent read and shares the same; with
 * force share (qemu-img -U), it holds consistent read and shares
 * everything.  POLICY QCOW2_LOCK_OFF gives no permissions at all;
 * QCOW2_LOCK_AUTO those of QCOW2_LOCK_ON.
 */
struct qcow2_lock_perms qcow2_lock_perms_for (bool writable,
                                              enum qcow2_lock_policy policy);

/* Lock the image open as FD (open for reading at least) for PERMS, as
 * qemu does.  PATH names the file in messages.  Returns 0, or a
 * negative errno with a sentence in ERRBUF:
 *   -EAGAIN  another open file description, in this process or another,
 *            holds a lock that conflicts (qemu's 'Failed to get "write"
 *            lock ... Is another process using the image [PATH]?');
 *   other    fcntl failed (a filesystem without OFD locks: -EINVAL,
 *            -ENOLCK, -EOPNOTSUPP).
 * On failure FD holds none of the lock bytes.  The locks last until
 * every descriptor of this open file description is closed.
 */
int qcow2_lock_fd (int fd, const char *path, struct qcow2_lock_perms perms,
                   char *errbuf, size_t errlen);

/* Make the locks FD holds for FROM (taken by qcow2_lock_fd) those of
 * TO, which holds and refuses to share at least as much (reading to
 * writing): the bytes TO adds are taken, then the conflicts of TO
 * tested.  0, or as qcow2_lock_fd; on failure FD holds FROM's locks
 * as before.
 */
int qcow2_lock_upgrade (int fd, const char *path, struct qcow2_lock_perms from,
                        struct qcow2_lock_perms to,
                        char *errbuf, size_t errlen);

/* Whether R, a failure of qcow2_lock_fd or qcow2_lock_upgrade, says
 * that the file system cannot lock (rather than that someone holds the
 * image): what QCOW2_LOCK_AUTO goes on without locks for.
 */
bool qcow2_lock_unsupported (int r);

/* Open PATH read-only, for holding locks on it (the filter does this
 * for the file that a plugin under it serves), set *FD and *SIZE (its
 * size in bytes).  Only regular files and block devices are opened.
 * Returns 0 or a negative errno with a sentence in ERRBUF.
 */
int qcow2_lock_open (const char *path, int *fd, uint64_t *size,
                     char *errbuf, size_t errlen);

/* Would PERMS be granted on PATH now?  Only tests, takes nothing (for
 * start-up checks; the real lock is taken when the image opens).
 * 0, -ENOENT if PATH is not there, or as qcow2_lock_fd.
 */
int qcow2_lock_probe (const char *path, struct qcow2_lock_perms perms,
                      char *errbuf, size_t errlen);

/* qemu's name of one permission bit ("consistent read", "write", ...). */
const char *qcow2_lock_perm_name (unsigned bit);

#endif /* QCOW2_LOCK_H */
