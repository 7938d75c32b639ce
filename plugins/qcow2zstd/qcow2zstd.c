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
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "glue.h"
#include "params.h"
#include "registry.h"
#include "qcow2-fileio.h"


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

/* The image's header, parsed and its features checked at start-up: a
 * file that is not a qcow2 image (or one with a feature the engine
 * refuses) stops nbdkit here, naming the
 * file, instead of failing every client with "no export".  0, or -1
 * after saying why.
 */
static int
read_header (struct qcow2_header *h)
{
  size_t len = UINT64_C (1) << QCOW2_MAX_CLUSTER_BITS;
  char err[256];
  uint8_t *buf;
  struct stat st;
  ssize_t n = -1;
  int fd, r = -1;

  fd = open (filename, O_RDONLY | O_CLOEXEC);
  if (fd == -1) {
    nbdkit_error ("qcow2zstd: %s: %m", filename);
    return -1;
  }
  buf = malloc (len);
  if (buf == NULL)
    nbdkit_error ("qcow2zstd: %s: out of memory", filename);
  else if (fstat (fd, &st) == -1 || (n = pread (fd, buf, len, 0)) == -1)
    nbdkit_error ("qcow2zstd: %s: %m", filename);
  else if (n == 0)
    nbdkit_error ("qcow2zstd: %s: the file is empty, not a qcow2 image "
                  "(qcow2-create=SIZE makes one in it)", filename);
  else if (qcow2_header_parse (buf, n, st.st_size, h, err, sizeof err) == -1)
    nbdkit_error ("qcow2zstd: %s: invalid or unsupported qcow2 image: %s",
                  filename, err);
  else {
    /* The engine opens a backing file itself: checked as if none. */
    struct qcow2_header without_backing = *h;
    without_backing.backing_file_offset = 0;
    if (qcow2_header_check_features (&without_backing, err, sizeof err) == -1)
      nbdkit_error ("qcow2zstd: %s: invalid or unsupported qcow2 image: %s",
                    filename, err);
    else
      r = 0;
  }
  free (buf);
  close (fd);
  return r;
}

/* qcow2-create over a file that exists: refused at start-up unless its
 * first cluster is all zeros, the engine's rule (qcow2_create checks it
 * again; a create a crash interrupted left that cluster zero, so it can
 * run again).  qemu-img create would overwrite whatever is there; the
 * same command line run a second time must not destroy the image the
 * first run made.
 */
static int
check_create_target (const struct stat *st)
{
  size_t cluster_size = (size_t) 1 << options.create_options.cluster_bits;
  uint8_t *buf;
  ssize_t n = -1;
  size_t i;
  int fd, r = -1;

  if (S_ISREG (st->st_mode) && st->st_size == 0)
    return 0;
  fd = open (filename, O_RDONLY | O_CLOEXEC);
  if (fd == -1) {
    nbdkit_error ("qcow2zstd: %s: %m", filename);
    return -1;
  }
  buf = malloc (cluster_size);
  if (buf == NULL)
    nbdkit_error ("qcow2zstd: %s: out of memory", filename);
  else if ((n = pread (fd, buf, cluster_size, 0)) == -1)
    nbdkit_error ("qcow2-create: %s: cannot read its first cluster: %m",
                  filename);
  else {
    for (i = 0; i < (size_t) n && buf[i] == 0; ++i)
      ;
    if (i < (size_t) n)
      nbdkit_error ("qcow2-create: %s is not empty: its first cluster is "
                    "not all zeros (it may hold an image or a filesystem); "
                    "refusing to format it, which would destroy what it "
                    "holds (qemu-img create would overwrite it).  Remove "
                    "the file first, or serve it without qcow2-create",
                    filename);
    else
      r = 0;
  }
  free (buf);
  close (fd);
  return r;
}

static void
keep_message (void *opaque, const char *msg)
{
  snprintf (opaque, 1024, "%s", msg);
}

/* The trial open is the one that unlocks the key slot, so its warnings
 * are the ones a user gets (the connections' opens take the key cache).
 */
static void
pass_warning (void *opaque, const char *msg)
{
  glue_warning (filename, msg);
}

/* An encrypted image's passphrase and the snapshot to serve, tried at
 * start-up by opening the image read-only, which writes nothing and
 * leaves the unlocked key in the key cache for the first connection: a
 * wrong or missing passphrase, or a snapshot the image does not have,
 * stops nbdkit here instead of refusing every client.  Whatever else
 * the open finds is left for the connections to report.
 */
static int
check_secrets (const struct qcow2_header *h)
{
  struct qcow2_options opts = options.engine;
  char msg[1024] = "";
  struct qcow2_log log = {
    .opaque = msg, .error = keep_message, .warning = pass_warning,
  };
  struct qcow2_io io;
  struct qcow2_image *img;
  int r;

  if (h->crypt_method != 2 && options.engine.snapshot == NULL)
    return 0;
  if (qcow2_fileio_open (filename, false, &io) < 0)
    return 0;
  opts.writable = false;
  opts.compress = false;
  opts.threads = 0;
  r = qcow2_image_open (&io, &log, &opts, &img);
  if (r == 0)
    qcow2_image_close (img);
  qcow2_fileio_close (&io);
  if (r == -EPERM ||
      (r == -ENOENT && strncmp (msg, "qcow2-snapshot:", 15) == 0)) {
    nbdkit_error ("qcow2zstd: %s: %s", filename, msg);
    return -1;
  }
  return 0;
}

/* The image file, checked and locked at start-up: found when the first
 * client connects, all that client would learn is that there is no
 * export.
 */
static int
check_file (void)
{
  struct stat st;
  struct qcow2_header h;
  bool writes;
  int r;

  if (stat (filename, &st) == -1) {
    if (errno == ENOENT && options.create) {
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
    nbdkit_error ("qcow2zstd: %s: %m", filename);
    return -1;
  }
  if (!S_ISREG (st.st_mode) && !S_ISBLK (st.st_mode)) {
    nbdkit_error ("qcow2zstd: %s: not a regular file or block device",
                  filename);
    return -1;
  }
  if (access (filename, R_OK) == -1) {
    nbdkit_error ("qcow2zstd: %s: %m", filename);
    return -1;
  }
  /* A snapshot is served read-only: its file needs no write access. */
  writes = options.readonly == 0 && options.engine.snapshot == NULL;
  if (writes && access (filename, W_OK) == -1) {
    nbdkit_error ("qcow2zstd: %s: %m (serve it read-only with -r)",
                  filename);
    return -1;
  }
  if (options.create) {
    if (check_create_target (&st) == -1)
      return -1;
  }
  else if (read_header (&h) == -1 ||
           (options.engine.compress &&
            params_check_level (&options, h.compression_type) == -1) ||
           check_secrets (&h) == -1)
    return -1;
  /* Locked from here until nbdkit exits, as qemu-nbd locks. */
  return locks_hold_image (options.engine.locking, NULL, filename, writes,
                           NULL, NULL);
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
