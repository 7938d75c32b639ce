/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: the images being served, one per export (see
 * registry.h).
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nbdkit.h"
#include "glue.h"
#include "registry.h"
#include "base/fileio.h"
#include "base/lockorder.h"

/* An image is OPENING from its first acquire until the open is done,
 * without the registry's lock; other acquires of its export wait for
 * it.  It is CLOSING from its last release until it is closed and gone;
 * an acquire of its export waits for that too, so that one export never
 * has two images open on one file.
 */
enum image_state { OPENING, OPEN, CLOSING };

struct registry_image {
  struct registry_image *next;
  char *key;
  char *name;                   /* in messages: the export, or the file */
  char *room_file;              /* the engine keeps a pointer to it */
  enum image_state state;
  unsigned users;
  struct qcow2_image *engine;
  struct qcow2_io file_io;      /* the plugin form's own file */
  bool has_file_io;
  bool log_stats;               /* -D qcow2zstd.stats=1 */
  bool stats_logged;            /* by registry_cleanup */
  struct registry_image *cleanup_next;
};

/* Exports already formatted by qcow2-create in this run. */
struct created {
  struct created *next;
  char *key;
};

/* Guards IMAGES (the list, each image's state and users) and CREATED.
 * Held only to look at and change them: never across an open, a close,
 * an engine call, file I/O or a wait for anything but itself, and no
 * other lock is taken under it, so it has no place among the engine's
 * locks but that of a leaf.  IMAGE_CHANGED is signalled whenever an
 * image leaves OPENING or CLOSING.
 */
static struct qcow2_mutex registry_lock =
  QCOW2_MUTEX_INITIALIZER (QCOW2_RANK_LEAF, "image registry");
static pthread_cond_t image_changed = PTHREAD_COND_INITIALIZER;
static struct registry_image *images;
static struct created *created;

static bool
was_created (const char *key)
{
  struct created *c;

  for (c = created; c; c = c->next)
    if (strcmp (c->key, key) == 0)
      return true;
  return false;
}

static struct registry_image *
find (const char *key)
{
  struct registry_image *img;

  for (img = images; img; img = img->next)
    if (strcmp (img->key, key) == 0)
      return img;
  return NULL;
}

static void
unlink_image (struct registry_image *img)
{
  struct registry_image **link;

  for (link = &images; *link != img; link = &(*link)->next)
    ;
  *link = img->next;
}

static void
free_image (struct registry_image *img)
{
  free (img->key);
  free (img->name);
  free (img->room_file);
  free (img);
}

/* Open (or for qcow2-create, format) the image of IMG's export.  Runs
 * with no lock of the registry held: only this thread touches IMG
 * until it leaves OPENING.  0, or -1 after nbdkit_error.
 */
static int
open_image (struct registry_image *img, const struct glue_options *options,
            bool writable, const struct registry_storage *storage,
            bool create)
{
  struct qcow2_options opts = options->engine;
  enum qcow2_lock_policy policy = options->engine.locking;
  /* The plugin form's messages name its file; the filter's say
   * "export '...'" where they name the export at all.
   */
  const char *lock_key = storage->own_file ? NULL : img->key;
  const struct qcow2_log log =
    glue_engine_log (storage->own_file ? img->name : NULL);
  struct qcow2_io next_io = storage->next_io, *io = &next_io;
  int r, fd;

  opts.writable = writable;
  opts.growable = storage->own_file != NULL;
  opts.room_file = img->room_file;
  if (create && !writable) {
    nbdkit_error ("qcow2-create: cannot create an image read-only (%s)",
                  storage->own_file ? "nbdkit -r"
                  : "nbdkit -r, or a plugin that cannot write");
    return -1;
  }
  if (create && storage->own_file) {
    fd = open (storage->own_file, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd == -1) {
      nbdkit_error ("qcow2-create: %s: %m", storage->own_file);
      return -1;
    }
    close (fd);
  }
  /* Locked before anything is read (unless locked at start-up already),
   * until nbdkit exits.
   */
  if (storage->lock_path &&
      locks_hold_image (policy, lock_key, storage->lock_path, writable,
                        storage->confirm, storage->confirm_opaque) < 0)
    return -1;
  if (storage->own_file) {
    r = qcow2_fileio_open (storage->own_file, writable, &img->file_io);
    if (r < 0) {
      nbdkit_error ("%s: %s", storage->own_file, strerror (-r));
      return -1;
    }
    img->has_file_io = true;
    io = &img->file_io;
  }
  if (create)
    r = qcow2_create (io, &log, &options->create_options, &opts,
                      &img->engine);
  else
    r = qcow2_image_open (io, &log, &opts, &img->engine);
  if (r == 0 && locks_hold_named_files (policy, lock_key, img->engine) < 0)
    r = -1;
  if (r < 0) {
    qcow2_image_close (img->engine);
    img->engine = NULL;
    if (img->has_file_io)
      qcow2_fileio_close (&img->file_io);
    img->has_file_io = false;
    return -1;
  }
  return 0;
}

struct registry_image *
registry_acquire (const struct glue_options *options, const char *key,
                  bool writable, const struct registry_storage *storage)
{
  struct registry_image *img;
  struct created *c = NULL;
  bool create;
  int r;

  /* A snapshot is served read-only (and locked for reading). */
  writable = writable && options->engine.snapshot == NULL;

  qcow2_mutex_lock (&registry_lock);
  while ((img = find (key)) != NULL && img->state != OPEN)
    qcow2_cond_wait (&image_changed, &registry_lock);
  if (img) {
    img->users++;
    qcow2_mutex_unlock (&registry_lock);
    return img;
  }
  img = calloc (1, sizeof *img);
  if (img == NULL || (img->key = strdup (key)) == NULL ||
      (img->name = strdup (storage->own_file ? storage->own_file : key))
      == NULL ||
      (storage->room_file &&
       (img->room_file = strdup (storage->room_file)) == NULL)) {
    qcow2_mutex_unlock (&registry_lock);
    if (img)
      free_image (img);
    nbdkit_error ("qcow2zstd: out of memory");
    return NULL;
  }
  img->state = OPENING;
  img->log_stats = options->log_stats;
  img->next = images;
  images = img;
  create = options->create && !was_created (key);
  qcow2_mutex_unlock (&registry_lock);

  if (create &&
      ((c = calloc (1, sizeof *c)) == NULL ||
       (c->key = strdup (key)) == NULL)) {
    nbdkit_error ("qcow2zstd: out of memory");
    r = -1;
  }
  else
    r = open_image (img, options, writable, storage, create);

  qcow2_mutex_lock (&registry_lock);
  if (r < 0)
    unlink_image (img);
  else {
    img->state = OPEN;
    img->users = 1;
    if (create) {
      c->next = created;
      created = c;
      c = NULL;
    }
  }
  pthread_cond_broadcast (&image_changed);
  qcow2_mutex_unlock (&registry_lock);
  if (c) {
    free (c->key);
    free (c);
  }
  if (r < 0) {
    free_image (img);
    return NULL;
  }
  return img;
}

void
registry_release (struct registry_image *img, struct qcow2_io *finish_io)
{
  qcow2_mutex_lock (&registry_lock);
  if (--img->users > 0) {
    qcow2_mutex_unlock (&registry_lock);
    return;
  }
  img->state = CLOSING;
  qcow2_mutex_unlock (&registry_lock);

  /* No request is in flight and none can come: a new connection waits
   * until the image is gone, and then opens it anew.  Errors were
   * logged; the bitmaps then stay in use.
   */
  if (img->has_file_io)
    finish_io = &img->file_io;
  if (finish_io)
    qcow2_finish (img->engine, finish_io);
  if (img->log_stats && !img->stats_logged)
    params_log_stats (img->engine, img->name);
  qcow2_image_close (img->engine);
  if (img->has_file_io)
    qcow2_fileio_close (&img->file_io);

  qcow2_mutex_lock (&registry_lock);
  unlink_image (img);
  pthread_cond_broadcast (&image_changed);
  qcow2_mutex_unlock (&registry_lock);
  free_image (img);
}

struct qcow2_image *
registry_engine (const struct registry_image *img)
{
  return img->engine;
}

struct qcow2_io *
registry_io (struct registry_image *img)
{
  return img->has_file_io ? &img->file_io : NULL;
}

void
registry_cleanup (void)
{
  struct registry_image *img, *pinned = NULL;

  /* Each open image is held by one more user meanwhile, so that none
   * closes under the work below, which runs without the lock.
   */
  qcow2_mutex_lock (&registry_lock);
  for (img = images; img; img = img->next)
    if (img->state == OPEN) {
      img->users++;
      img->cleanup_next = pinned;
      pinned = img;
    }
  qcow2_mutex_unlock (&registry_lock);

  while (pinned) {
    img = pinned;
    pinned = img->cleanup_next;
    /* A connection left open may have a thread fetching ahead: none
     * reads once the code and the storage below may go away.
     */
    qcow2_image_stop_background (img->engine);
    if (img->has_file_io)
      qcow2_finish (img->engine, &img->file_io);
    if (img->log_stats)
      params_log_stats (img->engine, img->name);
    img->stats_logged = true;
    registry_release (img, NULL);
  }
}

void
registry_unload (void)
{
  locks_release_all ();
  qcow2_mutex_lock (&registry_lock);
  while (created) {
    struct created *c = created;
    created = c->next;
    free (c->key);
    free (c);
  }
  qcow2_mutex_unlock (&registry_lock);
}
