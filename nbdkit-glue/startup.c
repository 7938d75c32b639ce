/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: the image file checked while nbdkit starts (see
 * startup.h).
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nbdkit.h"
#include "glue.h"
#include "locks.h"
#include "startup.h"
#include "base/fileio.h"

/* qcow2-create over a file that exists: refused unless its first
 * cluster is all zeros, the engine's rule (qcow2_create checks it
 * again; a create a crash interrupted left that cluster zero, so it can
 * run again).  qemu-img create would overwrite whatever is there; the
 * same command line run a second time must not destroy the image the
 * first run made.
 */
static int
check_create_target (const struct glue_options *options, const char *path,
                     const struct stat *st)
{
  size_t cluster_size = (size_t) 1 << options->create_options.cluster_bits;
  uint8_t *buf;
  ssize_t n = -1;
  size_t i;
  int fd, r = -1;

  if (S_ISREG (st->st_mode) && st->st_size == 0)
    return 0;
  fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd == -1) {
    nbdkit_error ("qcow2zstd: %s: %m", path);
    return -1;
  }
  buf = malloc (cluster_size);
  if (buf == NULL)
    nbdkit_error ("qcow2zstd: %s: out of memory", path);
  else if ((n = pread (fd, buf, cluster_size, 0)) == -1)
    nbdkit_error ("qcow2-create: %s: cannot read its first cluster: %m",
                  path);
  else {
    for (i = 0; i < (size_t) n && buf[i] == 0; ++i)
      ;
    if (i < (size_t) n)
      nbdkit_error ("qcow2-create: %s is not empty: its first cluster is "
                    "not all zeros (it may hold an image or a filesystem); "
                    "refusing to format it, which would destroy what it "
                    "holds (qemu-img create would overwrite it).  Remove "
                    "the file first, or serve it without qcow2-create",
                    path);
    else
      r = 0;
  }
  free (buf);
  close (fd);
  return r;
}

/* Open the image in PATH through *IO (a file I/O of its own) as the
 * engine will serve it, WRITABLE or not, with empty caches.  0 with
 * both open (the caller closes them), or -1 after the engine's message,
 * which names PATH.
 */
static int
open_as_served (const struct glue_options *options, const char *path,
                bool writable, struct qcow2_io *io, struct qcow2_image **img)
{
  struct qcow2_options opts = options->engine;
  const struct qcow2_log log = glue_engine_log (path);
  int r;

  r = qcow2_fileio_open (path, writable, io);
  if (r < 0) {
    nbdkit_error ("qcow2zstd: %s: %s", path, strerror (-r));
    return -1;
  }
  /* Nothing is read through the caches or decoded: they stay empty. */
  opts.writable = writable;
  opts.threads = 0;
  opts.l2_cache_size = 0;
  opts.cluster_cache_size = 0;
  r = qcow2_image_open (io, &log, &opts, img);
  if (r < 0) {
    qcow2_fileio_close (io);
    return -1;
  }
  return 0;
}

/* The engine's open, read-only: the header, every feature, the
 * passphrase, the snapshot, the backing chain (whose files are then
 * locked for LOCK_KEY) and the tables; then for WRITES, the open for
 * writing, which also reads the refcounts and the bitmaps and refuses
 * what cannot be written.  An image left dirty is repaired when it is
 * opened for writing, which writes: that is left to the first open.
 */
static int
try_open (const struct glue_options *options, const char *path,
          const char *lock_key, bool writes)
{
  struct qcow2_io io;
  struct qcow2_image *img;
  bool dirty;
  int r;

  if (open_as_served (options, path, false, &io, &img) == -1)
    return -1;
  r = locks_hold_named_files (options->engine.locking, lock_key, img);
  dirty = qcow2_image_header (img)->incompatible_features &
    QCOW2_INCOMPAT_DIRTY;
  qcow2_image_close (img);
  qcow2_fileio_close (&io);
  if (r < 0)
    return -1;
  if (!writes || dirty)
    return 0;
  if (open_as_served (options, path, true, &io, &img) == -1)
    return -1;
  qcow2_image_close (img);
  qcow2_fileio_close (&io);
  return 0;
}

int
startup_check_file (const struct glue_options *options, const char *path,
                    const char *lock_key, bool writes)
{
  struct stat st;

  if (stat (path, &st) == -1) {
    nbdkit_error ("qcow2zstd: %s: %m", path);
    return -1;
  }
  if (!S_ISREG (st.st_mode) && !S_ISBLK (st.st_mode)) {
    nbdkit_error ("qcow2zstd: %s: not a regular file or block device",
                  path);
    return -1;
  }
  if (access (path, R_OK) == -1) {
    nbdkit_error ("qcow2zstd: %s: %m", path);
    return -1;
  }
  if (writes && access (path, W_OK) == -1) {
    nbdkit_error ("qcow2zstd: %s: %m (serve it read-only with -r)", path);
    return -1;
  }
  /* Locked before anything is read, from here until nbdkit exits, as
   * qemu-nbd locks: someone else writing the image is what is found
   * first.
   */
  if (locks_hold_image (options->engine.locking, lock_key, path, writes,
                        NULL, NULL) == -1)
    return -1;
  if (options->create)
    return check_create_target (options, path, &st);
  if (S_ISREG (st.st_mode) && st.st_size == 0) {
    nbdkit_error ("qcow2zstd: %s: the file is empty, not a qcow2 image "
                  "(qcow2-create=SIZE makes one in it)", path);
    return -1;
  }
  return try_open (options, path, lock_key, writes);
}
