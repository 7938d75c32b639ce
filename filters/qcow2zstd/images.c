/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-qcow2zstd-filter: the images being served, one per export.
 *
 * Connections to the same export share one engine image, so that they
 * share its caches and its metadata: writes from one are seen by the
 * others, and a flush through any of them writes everyone's changes.
 * The image opens with the export's first connection and closes with
 * its last; each connection that can write flushes as it finalizes.
 * The locks stay from the first connection until nbdkit exits.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "qcow2zstd.h"
#include "locks.h"

struct shared_image {
  struct shared_image *next;
  char *exportname;
  struct qcow2_image *engine;
  unsigned users;
  bool stats_logged;            /* by images_cleanup, before the close */
};

static pthread_mutex_t images_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shared_image *images;

/* Exports already formatted by qcow2-create in this run. */
static struct created { struct created *next; char *exportname; } *created;

int
next_pread (void *opaque, void *buf, size_t count, uint64_t offset)
{
  nbdkit_next *next = opaque;
  int err = 0;

  while (count > 0) {
    /* Requests to a plugin are 32-bit sized. */
    uint32_t n = count > (UINT32_C (1) << 30) ? UINT32_C (1) << 30 : count;
    if (next->pread (next, buf, n, offset, 0, &err) == -1)
      return -(err ? err : EIO);
    buf = (char *) buf + n;
    offset += n;
    count -= n;
  }
  return 0;
}

int
next_pwrite (void *opaque, const void *buf, size_t count, uint64_t offset)
{
  nbdkit_next *next = opaque;
  int err = 0;

  while (count > 0) {
    uint32_t n = count > (UINT32_C (1) << 30) ? UINT32_C (1) << 30 : count;
    if (next->pwrite (next, buf, n, offset, 0, &err) == -1)
      return -(err ? err : EIO);
    buf = (const char *) buf + n;
    offset += n;
    count -= n;
  }
  return 0;
}

int
next_flush (void *opaque)
{
  nbdkit_next *next = opaque;
  int err = 0;
  int can_flush = next->can_flush (next);

  /* nbdkit asserts on a flush to a plugin without one.  Such a plugin's
   * writes are as durable as it ever makes them once they return, so
   * the engine's ordering still holds.
   */
  if (can_flush == -1)
    return -EIO;
  if (can_flush == 0)
    return 0;
  if (next->flush (next, 0, &err) == -1)
    return -(err ? err : EIO);
  return 0;
}

/* Released clusters, passed on as trims where the plugin takes them
 * (nbdkit's file plugin punches holes).
 */
int
next_discard (void *opaque, uint64_t count, uint64_t offset)
{
  nbdkit_next *next = opaque;
  int err = 0;
  int can_trim = next->can_trim (next);

  /* nbdkit asserts on a trim to a plugin that did not say it takes them. */
  if (can_trim == -1)
    return -EIO;
  if (can_trim == 0)
    return -EOPNOTSUPP;
  while (count > 0) {
    uint32_t n = count > (UINT32_C (1) << 30) ? UINT32_C (1) << 30 : count;
    if (next->trim (next, n, offset, 0, &err) == -1)
      return -(err ? err : EIO);
    offset += n;
    count -= n;
  }
  return 0;
}

int64_t
next_size (void *opaque)
{
  nbdkit_next *next = opaque;
  int64_t size = next->get_size (next);

  return size < 0 ? -EIO : size;
}

static bool
was_created (const char *exportname)
{
  struct created *c;

  for (c = created; c; c = c->next)
    if (strcmp (c->exportname, exportname) == 0)
      return true;
  return false;
}

/* Whether the plugin serves the file open on FD (of SIZE bytes): the
 * same size, or the same first bytes.  The size alone is not enough:
 * another process writing the image may grow it between the two
 * looks, and that writer is just who the lock must find.  Different
 * first bytes with a different size mean a filter between us and the
 * file (a partition, a decompressor) serves something else.
 */
static bool
serves_file (void *opaque, int fd, uint64_t size, const char *path,
             char *why, size_t whylen)
{
  nbdkit_next *next = opaque;
  char served_head[4096], file_head[4096];
  int64_t served = next->get_size (next);
  size_t n;
  int err = 0;

  if (served < 0) {
    snprintf (why, whylen, "the plugin's size is not known, so it cannot "
              "be told whether it serves %s", path);
    return false;
  }
  if ((uint64_t) served == size)
    return true;
  n = sizeof served_head;
  if ((uint64_t) served < n)
    n = served;
  if (size < n)
    n = size;
  if (n >= 4 &&
      next->pread (next, served_head, n, 0, 0, &err) == 0 &&
      pread (fd, file_head, n, 0) == (ssize_t) n &&
      memcmp (served_head, file_head, n) == 0)
    return true;
  snprintf (why, whylen, "the plugin serves %" PRId64 " bytes, not the %"
            PRIu64 " of %s, and they begin differently: it is not that "
            "file", served, size, path);
  return false;
}

/* Lock the file under the export, when the plugin serves a local file
 * the filter knows of, with a descriptor of the filter's own (the
 * plugin's is out of reach), kept until nbdkit exits (locks.h).
 */
static int
lock_image (nbdkit_next *next, const char *exportname, bool writable)
{
  char *path;
  int r;

  if (engine_options.locking == QCOW2_LOCK_OFF)
    return 0;
  path = params_local_image (exportname);
  if (path == NULL) {
    nbdkit_debug ("qcow2zstd: export '%s': the plugin serves no local file "
                  "named by file= or dir=, so the image is not locked "
                  "(other users of it cannot be detected)", exportname);
    return 0;
  }
  r = locks_hold_image (exportname, path, writable, serves_file, next);
  free (path);
  return r;
}

static int
open_engine (nbdkit_next *next, const char *exportname, bool writable,
             struct qcow2_image **engine)
{
  struct qcow2_io io = IO_FOR (next);
  struct qcow2_options opts = engine_options;
  const struct qcow2_log engine_log = glue_engine_log (NULL);
  struct created *c;
  int r;

  opts.writable = writable;
  if (!create_requested || was_created (exportname))
    return qcow2_image_open (&io, &engine_log, &opts, engine);

  if (!writable) {
    nbdkit_error ("qcow2-create: cannot create an image read-only "
                  "(nbdkit -r, or a plugin that cannot write)");
    return -EROFS;
  }
  c = calloc (1, sizeof *c);
  if (c == NULL || (c->exportname = strdup (exportname)) == NULL) {
    free (c);
    nbdkit_error ("qcow2zstd: out of memory");
    return -ENOMEM;
  }
  r = qcow2_create (&io, &engine_log, &create_options, &opts, engine);
  if (r < 0) {
    free (c->exportname);
    free (c);
    return r;
  }
  c->next = created;
  created = c;
  return 0;
}

void
images_unload (void)
{
  locks_release_all ();
  while (created) {
    struct created *c = created;
    created = c->next;
    free (c->exportname);
    free (c);
  }
}

struct shared_image *
images_acquire (nbdkit_next *next, const char *exportname, bool writable)
{
  struct shared_image *s;

  /* A snapshot is served read-only (and locked for reading), so the
   * export is too.
   */
  writable = writable && engine_options.snapshot == NULL;
  pthread_mutex_lock (&images_lock);
  for (s = images; s; s = s->next)
    if (strcmp (s->exportname, exportname) == 0)
      break;
  if (s == NULL) {
    s = calloc (1, sizeof *s);
    if (s == NULL || (s->exportname = strdup (exportname)) == NULL) {
      nbdkit_error ("qcow2zstd: out of memory");
      free (s);
      s = NULL;
    }
    else if (lock_image (next, exportname, writable) < 0 ||
             open_engine (next, exportname, writable, &s->engine) < 0 ||
             locks_hold_backing (exportname, s->engine) < 0) {
      if (s->engine)
        qcow2_image_close (s->engine);
      free (s->exportname);
      free (s);
      s = NULL;
    }
    else {
      s->next = images;
      images = s;
    }
  }
  if (s)
    s->users++;
  pthread_mutex_unlock (&images_lock);
  return s;
}

void
images_release (struct shared_image *shared, struct qcow2_io *io)
{
  struct shared_image **link;

  pthread_mutex_lock (&images_lock);
  if (--shared->users == 0) {
    /* No request is in flight and none can come: a new connection waits
     * for the lock, and then opens the image anew.  Errors were logged;
     * the bitmaps then stay in use.
     */
    if (io)
      qcow2_finish (shared->engine, io);
    if (!shared->stats_logged)
      params_log_stats (shared->engine, shared->exportname);
    qcow2_image_close (shared->engine);
    for (link = &images; *link != shared; link = &(*link)->next)
      ;
    *link = shared->next;
    free (shared->exportname);
    free (shared);
  }
  pthread_mutex_unlock (&images_lock);
}

/* nbdkit may unload the filter while the last connections are still open
 * (after a --run command exits), and then their close never comes: the
 * statistics are logged here for the images still in use.
 */
void
images_cleanup (void)
{
  struct shared_image *s;

  pthread_mutex_lock (&images_lock);
  for (s = images; s != NULL; s = s->next) {
    params_log_stats (s->engine, s->exportname);
    s->stats_logged = true;
  }
  pthread_mutex_unlock (&images_lock);
}

struct qcow2_image *
images_engine (struct shared_image *shared)
{
  return shared->engine;
}
