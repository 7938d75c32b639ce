/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: the image locks of what is served (see locks.h). */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nbdkit.h"
#include "locks.h"
#include "base/lockorder.h"

/* One file locked on a descriptor of our own. */
struct held_file {
  struct held_file *next;
  char *path;
  dev_t dev;
  ino_t ino;
  int fd;
  bool writable;
};

struct export_locks {
  struct export_locks *next;
  char *key;
  struct held_file *image;      /* NULL: nothing held */
  struct held_file *named;      /* its data and backing files seen so far */
};

/* Guards EXPORTS and what they hold.  It is held across opening and
 * locking files and across a locks_confirm_fn (which reads through the
 * plugin under the filter: nbdkit's locks, none of ours or the
 * engine's), so it is taken with no lock of the glue or the engine
 * held, and nothing takes one under it.  Exports open one at a time
 * here, but nothing waits for it long: no image is opened under it.
 */
static struct qcow2_mutex locks_lock =
  QCOW2_MUTEX_INITIALIZER (QCOW2_RANK_EXPORT_LOCKS, "export locks");
static struct export_locks *exports;

static void
free_files (struct held_file *f)
{
  while (f) {
    struct held_file *next = f->next;
    close (f->fd);
    free (f->path);
    free (f);
    f = next;
  }
}

/* The entry of KEY, made if there is none; NULL if out of memory. */
static struct export_locks *
export_of (const char *key)
{
  struct export_locks *e;

  for (e = exports; e; e = e->next)
    if (strcmp (e->key, key) == 0)
      return e;
  e = calloc (1, sizeof *e);
  if (e == NULL || (e->key = strdup (key)) == NULL) {
    free (e);
    nbdkit_error ("qcow2zstd: out of memory");
    return NULL;
  }
  e->next = exports;
  exports = e;
  return e;
}

/* Is F the file PATH names now? */
static bool
same_file (const struct held_file *f, const char *path)
{
  struct stat st;

  return stat (path, &st) == 0 && st.st_dev == f->dev && st.st_ino == f->ino;
}

static struct held_file *
keep (int fd, const char *path, bool writable)
{
  struct held_file *f = calloc (1, sizeof *f);
  struct stat st;

  if (f == NULL || (f->path = strdup (path)) == NULL ||
      fstat (fd, &st) == -1) {
    if (f)
      free (f->path);
    free (f);
    nbdkit_error ("qcow2zstd: cannot keep the lock of %s: %m", path);
    return NULL;
  }
  f->dev = st.st_dev;
  f->ino = st.st_ino;
  f->fd = fd;
  f->writable = writable;
  return f;
}

/* "export 'NAME': " for the filter's exports, nothing for the plugin's
 * one image (its messages name the file).
 */
static const char *
subject (const char *key, char *buf, size_t len)
{
  if (key == NULL)
    return "";
  snprintf (buf, len, "export '%s': ", key);
  return buf;
}

/* The served file cannot be locked, for REASON: what the policy says
 * to do about it (see locks.h).
 */
static int
cannot_lock (enum qcow2_lock_policy policy, const char *key, bool writable,
             const char *reason)
{
  char who[300];

  if (policy == QCOW2_LOCK_AUTO) {
    nbdkit_error ("qcow2zstd: warning: %s%s: the image is served without a "
                  "lock (qcow2-locking=auto): another process writing it "
                  "would go unnoticed", subject (key, who, sizeof who),
                  reason);
    return 0;
  }
  if (!writable) {
    nbdkit_debug ("qcow2zstd: %s%s: the image is read without a lock",
                  subject (key, who, sizeof who), reason);
    return 0;
  }
  nbdkit_error ("qcow2zstd: %s%s, so the image cannot be locked, and it is "
                "not opened for writing unlocked: serve it read-only (-r), "
                "or give qcow2-locking=auto to write it without a lock "
                "(nothing then stops a second writer)",
                subject (key, who, sizeof who), reason);
  return -1;
}

/* Lock FD (open on PATH).  1: locked; 0: the file system has no locks
 * and qcow2-locking=auto goes on without (said so); -1 after
 * nbdkit_error.
 */
static int
lock_or_report (enum qcow2_lock_policy policy, int fd, const char *path,
                bool writable, const char *key)
{
  char err[1024], who[300];
  int r;

  r = qcow2_lock_fd (fd, path, qcow2_lock_perms_for (writable, policy),
                     err, sizeof err);
  if (r == 0)
    return 1;
  if (qcow2_lock_unsupported (r) && policy == QCOW2_LOCK_AUTO) {
    nbdkit_error ("qcow2zstd: warning: %s%s: served without a lock "
                  "(qcow2-locking=auto)", subject (key, who, sizeof who),
                  err);
    return 0;
  }
  nbdkit_error ("qcow2zstd: %s", err);
  return -1;
}

/* Open, confirm and lock PATH for E.  As locks_hold_image. */
static int
lock_new_image (enum qcow2_lock_policy policy, struct export_locks *e,
                const char *key, const char *path, bool writable,
                locks_confirm_fn *confirm, void *opaque)
{
  char why[1024], who[300];
  uint64_t size;
  int fd, r;

  r = qcow2_lock_open (path, &fd, &size, why, sizeof why);
  if (r < 0)
    return cannot_lock (policy, key, writable, why);
  if (confirm && !confirm (opaque, fd, size, path, why, sizeof why)) {
    close (fd);
    return cannot_lock (policy, key, writable, why);
  }
  r = lock_or_report (policy, fd, path, writable, key);
  if (r <= 0) {
    close (fd);
    return r;
  }
  e->image = keep (fd, path, writable);
  if (e->image == NULL) {
    close (fd);
    return -1;
  }
  nbdkit_debug ("qcow2zstd: %s%s locked for %s until nbdkit exits",
                subject (key, who, sizeof who), path,
                writable ? "writing" : "reading");
  return 0;
}

/* F, held, is to be written from now on: a reader's lock becomes a
 * writer's.  0, or -1 after nbdkit_error.
 */
static int
make_writer (enum qcow2_lock_policy policy, struct held_file *f,
             const char *path)
{
  char err[1024];

  if (f->writable)
    return 0;
  if (qcow2_lock_upgrade (f->fd, path, qcow2_lock_perms_for (false, policy),
                          qcow2_lock_perms_for (true, policy),
                          err, sizeof err) < 0) {
    nbdkit_error ("qcow2zstd: %s", err);
    return -1;
  }
  f->writable = true;
  return 0;
}

int
locks_hold_image (enum qcow2_lock_policy policy, const char *key,
                  const char *path, bool writable,
                  locks_confirm_fn *confirm, void *opaque)
{
  struct export_locks *e;
  int r = 0;

  if (policy == QCOW2_LOCK_OFF)
    return 0;
  qcow2_mutex_lock (&locks_lock);
  e = export_of (key ? key : "");
  if (e == NULL)
    r = -1;
  else if (e->image && same_file (e->image, path)) {
    if (writable)
      r = make_writer (policy, e->image, path);
  }
  else {
    /* Nothing held yet, or the name leads to another file now: what
     * was locked is no longer what is served.
     */
    free_files (e->image);
    free_files (e->named);
    e->image = e->named = NULL;
    r = lock_new_image (policy, e, key, path, writable, confirm, opaque);
  }
  qcow2_mutex_unlock (&locks_lock);
  return r < 0 ? -1 : 0;
}

struct named_walk {
  enum qcow2_lock_policy policy;
  struct export_locks *e;
  const char *key;
};

static int
hold_named_file (void *opaque, const char *path, bool written)
{
  struct named_walk *w = opaque;
  struct held_file *f;
  char err[1024];
  uint64_t size;
  int fd, r;

  for (f = w->e->named; f; f = f->next)
    if (same_file (f, path))
      return written ? make_writer (w->policy, f, path) : 0;
  r = qcow2_lock_open (path, &fd, &size, err, sizeof err);
  if (r < 0) {
    nbdkit_error ("qcow2zstd: %s", err);
    return -1;
  }
  r = lock_or_report (w->policy, fd, path, written, w->key);
  if (r <= 0) {
    close (fd);
    return r;
  }
  f = keep (fd, path, written);
  if (f == NULL) {
    close (fd);
    return -1;
  }
  f->next = w->e->named;
  w->e->named = f;
  return 0;
}

int
locks_hold_named_files (enum qcow2_lock_policy policy, const char *key,
                    const struct qcow2_image *image)
{
  struct named_walk w = { .policy = policy, .key = key };
  int r = 0;

  if (policy == QCOW2_LOCK_OFF)
    return 0;
  qcow2_mutex_lock (&locks_lock);
  w.e = export_of (key ? key : "");
  if (w.e == NULL)
    r = -1;
  else
    r = qcow2_image_named_files (image, hold_named_file, &w);
  qcow2_mutex_unlock (&locks_lock);
  return r;
}

void
locks_release_all (void)
{
  qcow2_mutex_lock (&locks_lock);
  while (exports) {
    struct export_locks *e = exports;
    exports = e->next;
    free_files (e->image);
    free_files (e->named);
    free (e->key);
    free (e);
  }
  qcow2_mutex_unlock (&locks_lock);
}
