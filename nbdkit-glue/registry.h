/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: the images being served, one per export, for both
 * forms.
 *
 * The connections to one export share one engine image, so that they
 * share its caches and its metadata: writes from one are seen by the
 * others, and a flush through any of them writes everyone's changes.
 * The image opens with the export's first connection and closes with
 * its last; the locks stay from the first open (or start-up) until
 * nbdkit exits (locks.h).  An export is a key: the filter's export name
 * (or "" for all of them when they all serve one file), the plugin's
 * "".
 *
 * Offers: registry_acquire, registry_release, registry_engine,
 * registry_io, registry_cleanup, registry_unload.
 * Locks: registry_lock (see registry.c), front-end lock 2 of README.md:
 * held only to look at and change the table, never across an open, a
 * close or any engine call, and no lock is taken under it.  An acquire
 * of an export whose image is being opened or closed waits on a
 * condition variable, holding nothing.
 * Needs: params.h (the options), locks.h, qcow2.h, base/fileio.h.
 */
#ifndef QCOW2ZSTD_REGISTRY_H
#define QCOW2ZSTD_REGISTRY_H

#include <stdbool.h>

#include "qcow2.h"
#include "locks.h"
#include "params.h"

struct registry_image;

/* What the front end knows of the storage an export's image is in. */
struct registry_storage {
  /* The plugin form: the image file.  The registry opens it (making it
   * first for qcow2-create) and serves the image through it until the
   * image closes; it grows as writes need room.  NULL in the filter
   * form.
   */
  const char *own_file;
  /* The filter form: the plugin under the filter, as the connection
   * that opens the image reaches it.  Used for the open only.
   */
  struct qcow2_io next_io;
  /* The local file to lock for the export (locks.h), NULL if none is
   * known; CONFIRM (NULL: it is) says whether it is the file served.
   */
  const char *lock_path;
  locks_confirm_fn *confirm;
  void *confirm_opaque;
  /* The regular file the image is in, when a user can give it room
   * (qcow2_options.room_file), or NULL.
   */
  const char *room_file;
};

/* Open (or join) the image of export KEY, with OPTIONS, in STORAGE.
 * WRITABLE: the export may be written (the export's first connection
 * decides; a snapshot is served read-only all the same).  NULL after
 * nbdkit_error on failure.  Call it with no lock held: it may wait for
 * the export's image to finish opening or closing in another thread.
 */
struct registry_image *registry_acquire (const struct glue_options *options,
                                         const char *key, bool writable,
                                         const struct registry_storage *storage);

/* Leave IMAGE; the last one out closes it.  It does not flush: every
 * connection that could write has flushed before.  FINISH_IO: the
 * leaving connection's way to the storage if it can write, else NULL;
 * the last one out with it (or with the image's own file) finishes the
 * image first (qcow2_finish: the persistent bitmaps left consistent).
 */
void registry_release (struct registry_image *image,
                       struct qcow2_io *finish_io);

struct qcow2_image *registry_engine (const struct registry_image *image);

/* The image's own file (registry_storage.own_file), or NULL. */
struct qcow2_io *registry_io (struct registry_image *image);

/* nbdkit is shutting down and may unload us without closing the last
 * connections: log the statistics of the images still open, and finish
 * those served through their own file (by now no request runs or can
 * come).  Their close, if it still comes, does not log them again.
 */
void registry_cleanup (void);

/* Forget what was created and drop every lock (nbdkit is unloading). */
void registry_unload (void);

#endif /* QCOW2ZSTD_REGISTRY_H */
