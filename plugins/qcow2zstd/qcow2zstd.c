/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-qcow2zstd-plugin: serve a qcow2 image file.
 *
 * The plugin form of the filter, on the same engine and with the same
 * parameters.  It opens the file itself, so unlike the filter it can
 * grow the file when writes need room, create the file for qcow2-create,
 * and always knows where relative backing file names start.
 *
 *   nbdkit qcow2zstd disk.qcow2 [qcow2-...=...]
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "glue.h"
#include "params.h"
#include "base/fileio.h"
#include "registry.h"
#include "startup.h"


/* Set while nbdkit configures; only read afterwards. */
static char *filename;
static struct glue_options options;

struct handle {
  struct registry_image *image; /* one for all connections (registry.h) */
  struct qcow2_image *engine;
  struct qcow2_io *io;          /* the image file, the registry's */
  struct qcow2_conn *conn;
  bool readonly;
};

static void
qcow2zstd_load (void)
{
  params_dump_if_asked ();
}

static void
qcow2zstd_unload (void)
{
  registry_unload ();
  free (filename);
  params_unload ();
}

static int
qcow2zstd_config (const char *key, const char *value)
{
  int r = params_config (key, value);

  if (r != 1)
    return r;
  if (strcmp (key, "file") == 0) {
    free (filename);
    /* nbdkit_absolute_path: nbdkit may change directory before opening. */
    filename = nbdkit_absolute_path (value);
    return filename ? 0 : -1;
  }
  nbdkit_error ("unknown parameter '%s'", key);
  return -1;
}

/* The image file, checked and locked at start-up (startup.h): found
 * when the first client connects, all that client would learn is that
 * there is no export.
 */
static int
check_file (void)
{
  struct stat st;
  int r;

  if (stat (filename, &st) == -1 && errno == ENOENT && options.create) {
    /* qcow2-create makes it, in a directory that must let it. */
    char *dir = strdup (filename), *slash;
    if (dir == NULL)
      return -1;
    slash = strrchr (dir, '/');   /* the name is absolute */
    slash[slash == dir ? 1 : 0] = '\0';
    r = access (dir, W_OK | X_OK);
    if (r == -1)
      nbdkit_error ("qcow2-create: cannot create %s in %s: %m",
                    filename, dir);
    free (dir);
    return r;
  }
  /* A snapshot is served read-only: its file needs no write access. */
  return startup_check_file (&options, filename, NULL,
                             options.readonly == 0 &&
                             options.engine.snapshot == NULL);
}

static int
qcow2zstd_config_complete (void)
{
  if (filename == NULL) {
    nbdkit_error ("the image file was not given: nbdkit qcow2zstd FILE");
    return -1;
  }
  if (params_complete (&options) == -1)
    return -1;
  return check_file ();
}

#define qcow2zstd_config_help \
  "[file=]FILE                    The qcow2 image.\n" PARAMS_HELP

static int
qcow2zstd_thread_model (void)
{
  return NBDKIT_THREAD_MODEL_PARALLEL;
}

static void *
qcow2zstd_open (int readonly)
{
  struct handle *h = calloc (1, sizeof *h);
  const struct registry_storage storage = {
    .own_file = filename,
    .lock_path = filename,
  };

  if (h == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  h->readonly = readonly;
  h->image = registry_acquire (&options, "", !readonly, &storage);
  if (h->image == NULL) {
    free (h);
    return NULL;
  }
  h->engine = registry_engine (h->image);
  h->io = registry_io (h->image);
  h->conn = qcow2_conn_new (h->engine);
  if (h->conn == NULL) {
    registry_release (h->image, NULL);
    free (h);
    return NULL;
  }
  /* The file's preads are made for any number of threads at once. */
  struct qcow2_background_io bg = {
    .opaque = h->io->opaque, .pread = h->io->pread,
  };
  qcow2_conn_fetch_in_background (h->conn, &bg);
  return h;
}

static void
qcow2zstd_close (void *handle)
{
  struct handle *h = handle;

  qcow2_conn_free (h->conn);
  /* The last connection finishes the image through its file. */
  registry_release (h->image, NULL);
  free (h);
}

/* When nbdkit shuts down (its --run command exited, or a signal), it may
 * unload the plugin without closing the last connections: nbdkit 1.32
 * skips a connection's .close once it is quitting, even for a client
 * that has already left.  Their close is where the metadata would be
 * written and the image finished (the persistent bitmaps left
 * consistent), so the registry does that here: by now no request runs
 * or can come (nbdkit waited for the connections' threads).
 */
static void
qcow2zstd_cleanup (void)
{
  registry_cleanup ();
}

static int64_t
qcow2zstd_get_size (void *handle)
{
  struct handle *h = handle;
  return qcow2_image_header (h->engine)->virtual_size;
}

static int
qcow2zstd_block_size (void *handle, uint32_t *minimum, uint32_t *preferred,
                      uint32_t *maximum)
{
  struct handle *h = handle;

  glue_block_size (h->engine, minimum, preferred, maximum);
  return 0;
}

static int
qcow2zstd_can_write (void *handle)
{
  struct handle *h = handle;
  return !h->readonly && qcow2_image_writable (h->engine);
}

static int
qcow2zstd_can_fua (void *handle)
{
  return qcow2zstd_can_write (handle) ? NBDKIT_FUA_NATIVE : NBDKIT_FUA_NONE;
}

static int
qcow2zstd_can_zero (void *handle)
{
  return qcow2zstd_can_write (handle);
}

static int
qcow2zstd_can_multi_conn (void *handle)
{
  /* Every connection shares the image and the file: a flush through any
   * of them writes all metadata and syncs the one file.
   */
  return 1;
}

static int
qcow2zstd_can_cache (void *handle)
{
  return NBDKIT_CACHE_NATIVE;
}

static int
qcow2zstd_can_extents (void *handle)
{
  return 1;
}

/* A plugin reports the errno of a failure in errno. */
static int
errno_result (int r)
{
  return glue_result (r, &errno);
}

static int
qcow2zstd_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
                 uint32_t flags)
{
  struct handle *h = handle;
  return errno_result (qcow2_read (h->conn, h->io, buf, count, offset));
}

static int
qcow2zstd_pwrite (void *handle, const void *buf, uint32_t count,
                  uint64_t offset, uint32_t flags)
{
  struct handle *h = handle;
  return errno_result (qcow2_write (h->conn, h->io, buf, count, offset,
                                    flags & NBDKIT_FLAG_FUA));
}

static int
qcow2zstd_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct handle *h = handle;
  return errno_result (qcow2_zero (h->engine, h->io, count, offset,
                                   flags & NBDKIT_FLAG_FAST_ZERO,
                                   flags & NBDKIT_FLAG_FUA));
}

static int
qcow2zstd_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct handle *h = handle;
  return errno_result (qcow2_trim (h->engine, h->io, count, offset,
                                   flags & NBDKIT_FLAG_FUA));
}

static int
qcow2zstd_flush (void *handle, uint32_t flags)
{
  struct handle *h = handle;
  return errno_result (qcow2_flush (h->engine, h->io));
}

static int
qcow2zstd_extents (void *handle, uint32_t count, uint64_t offset,
                   uint32_t flags, struct nbdkit_extents *extents)
{
  struct handle *h = handle;
  return errno_result (qcow2_extents (h->conn, h->io, offset, count,
                                      params_add_extent, extents));
}

static int
qcow2zstd_cache (void *handle, uint32_t count, uint64_t offset,
                 uint32_t flags)
{
  struct handle *h = handle;
  return errno_result (qcow2_prefetch (h->conn, h->io, offset, count));
}

static struct nbdkit_plugin plugin = {
  .name = "qcow2zstd",
  .longname = "nbdkit qcow2 plugin (zlib and zstd, parallel)",
  .version = PACKAGE_VERSION,
  .load = qcow2zstd_load,
  .unload = qcow2zstd_unload,
  .config = qcow2zstd_config,
  .config_complete = qcow2zstd_config_complete,
  .config_help = qcow2zstd_config_help,
  .magic_config_key = "file",
  .cleanup = qcow2zstd_cleanup,
  .thread_model = qcow2zstd_thread_model,
  .open = qcow2zstd_open,
  .close = qcow2zstd_close,
  .get_size = qcow2zstd_get_size,
  .block_size = qcow2zstd_block_size,
  .can_write = qcow2zstd_can_write,
  .can_flush = qcow2zstd_can_write,
  .can_trim = qcow2zstd_can_write,
  .can_zero = qcow2zstd_can_zero,
  .can_fast_zero = qcow2zstd_can_write,
  .can_fua = qcow2zstd_can_fua,
  .can_multi_conn = qcow2zstd_can_multi_conn,
  .can_cache = qcow2zstd_can_cache,
  .can_extents = qcow2zstd_can_extents,
  .pread = qcow2zstd_pread,
  .pwrite = qcow2zstd_pwrite,
  .zero = qcow2zstd_zero,
  .trim = qcow2zstd_trim,
  .flush = qcow2zstd_flush,
  .extents = qcow2zstd_extents,
  .cache = qcow2zstd_cache,
  .errno_is_preserved = 1,
};

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
NBDKIT_REGISTER_PLUGIN (plugin)
