/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the files an image names (see namedfile.h). */

#include <config.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "namedfile.h"
#include "base/fileio.h"
#include "base/filelock.h"
#include "meta/log.h"

/* qemu takes a name with a colon before its first slash for a protocol
 * ("nbd:", "http://", "json:{...}"), not for a file.
 */
static bool
names_protocol (const char *name)
{
  return name[strcspn (name, ":/")] == ':';
}

static bool
inside_dir (const char *path, const char *dir)
{
  size_t n = strlen (dir);

  if (strcmp (dir, "/") == 0)
    return true;
  return strncmp (path, dir, n) == 0 && path[n] == '/';
}

/* The allowed directories, for a message: "DIR, DIR" or a sentence. */
static void
list_dirs (const char *const *dirs, char *buf, size_t len)
{
  size_t used = 0;

  buf[0] = '\0';
  for (; dirs && *dirs && used < len; dirs++)
    used += snprintf (buf + used, len - used, "%s%s", used ? ", " : "", *dirs);
  if (buf[0] == '\0')
    snprintf (buf, len, "none: the served image's directory is not known");
}

/* JOINED, the header's NAME for its WHAT ("backing file", "data file")
 * taken from the image's directory, must lead (symbolic links resolved)
 * to a regular file inside one of the allowed directories; *PATH is set
 * to where it leads.  0, or -errno after saying which file, the
 * header's name for it, and what allows it (PARAM=PATH names one).
 */
static int
check_allowed (struct qcow2_image *img, const char *what, const char *param,
               const char *name, const char *joined, char **path)
{
  const char *const *dirs = img->opts.backing_dirs;
  char *real = realpath (joined, NULL), *slash, allowed[512];
  struct stat st;
  int err;

  if (real == NULL || stat (real, &st) == -1) {
    err = errno;
    qcow2_error (img, "cannot open the %s %s (named '%s' in the image): %s",
                 what, real ? real : joined, name, strerror (err));
    free (real);
    return -err;
  }
  if (!S_ISREG (st.st_mode)) {
    qcow2_error (img, "the %s %s (named '%s' in the image) is not a regular "
                 "file: only regular files are opened as %ss named in an "
                 "image (%s=PATH names one explicitly)", what, real, name,
                 what, param);
    free (real);
    return -EPERM;
  }
  for (; dirs && *dirs; dirs++)
    if (inside_dir (real, *dirs)) {
      *path = real;
      return 0;
    }
  list_dirs (img->opts.backing_dirs, allowed, sizeof allowed);
  slash = strrchr (real, '/');
  qcow2_error (img, "the %s %s (named '%s' in the image) is outside the "
               "directories %ss may be opened from (%s): "
               "qcow2-backing-dir=%.*s allows it, or %s=PATH names the %s",
               what, real, name, what, allowed,
               (int) (slash == real ? 1 : slash - real), real, param, what);
  free (real);
  return -EPERM;
}

int
qcow2_named_file_path (struct qcow2_image *img, const char *what,
                       const char *param, const char *override,
                       const char *name, char **path)
{
  const char *dir = img->opts.image_dir;
  char *joined = NULL;
  int r;

  *path = NULL;
  if (override) {
    *path = strdup (override);
    if (*path == NULL) {
      qcow2_error (img, "out of memory");
      return -ENOMEM;
    }
    return 0;
  }
  if (names_protocol (name)) {
    qcow2_error (img, "the %s name '%s' is a protocol or json: name, which "
                 "only qemu opens: refused (only files are opened as %ss; "
                 "%s=PATH names one)", what, name, what, param);
    return -EPERM;
  }
  if (name[0] == '/')
    joined = strdup (name);
  else if (dir == NULL) {
    qcow2_error (img, "the image has a %s '%s' with a relative name and the "
                 "engine does not know the image's directory; give its path "
                 "with %s=PATH", what, name, param);
    return -EINVAL;
  }
  else if (asprintf (&joined, "%s/%s", dir, name) == -1)
    joined = NULL;
  if (joined == NULL) {
    qcow2_error (img, "out of memory");
    return -ENOMEM;
  }
  r = check_allowed (img, what, param, name, joined, path);
  free (joined);
  return r;
}

int
qcow2_named_file_lock (struct qcow2_image *img, const char *what,
                       struct qcow2_io *io, const char *path)
{
  char lock_err[512];
  int r;

  /* qemu locks the files an image names as it locks an image opened
   * read-only.
   */
  if (img->opts.locking == QCOW2_LOCK_OFF)
    return 0;
  r = qcow2_lock_fd (qcow2_fileio_fd (io), path,
                     qcow2_lock_perms_for (false, img->opts.locking),
                     lock_err, sizeof lock_err);
  if (r < 0 && qcow2_lock_unsupported (r) &&
      img->opts.locking == QCOW2_LOCK_AUTO) {
    qcow2_debug (img, "%s: %s: read without a lock (qcow2-locking=auto)",
                 what, lock_err);
    return 0;
  }
  if (r < 0)
    qcow2_error (img, "%s: %s", what, lock_err);
  return r;
}
