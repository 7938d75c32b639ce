/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-qcow2zstd-filter: serve the guest disk inside a qcow2 image.
 *
 * The nbdkit callbacks, and what the filter learns of the stack under
 * it.  next-io.c adapts the plugin under the filter to the engine's
 * struct qcow2_io; the rest is the glue both forms share
 * (nbdkit-glue/: the parameters, the registry of images, the start-up
 * checks, the locks), and everything about qcow2 is in common/.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "next-io.h"
#include "cmdline.h"
#include "glue.h"
#include "params.h"
#include "registry.h"
#include "startup.h"
#include "base/lockorder.h"

/* Set once, in .config_complete; only read afterwards. */
static struct glue_options options;
/* nbdkit's file plugin is right under the filter (nbdkit's command
 * line says so): it serves the file its file= names to every export,
 * or with dir= the file each export is named after, byte for byte.
 * That file is known, then: checked at start-up (file=), and given
 * room with truncate.
 */
static bool file_plugin_under;
/* Why the plugin under the filter cannot write the image although it
 * says it can (the export is then read-only), or NULL.
 */
static const char *plugin_cannot_write;
/* The plugin right under the filter serves a second context beside a
 * connection's, at once, and serves the same bytes in it although that
 * context knows no export name (next-io.h: struct next_background):
 * nbdkit's curl and ssh plugins (thread model serialize_requests, no
 * export names) and its file plugin with file= (parallel; with dir= it
 * needs the export's name).  Elsewhere (a plugin that serializes all
 * its requests or opens one handle at a time, a filter between) the
 * bytes ahead are fetched by the reads that need them.
 */
static bool plugin_reads_beside;

struct handle {
  char *exportname;
  struct registry_image *image;
  struct qcow2_image *engine;
  struct qcow2_conn *conn;
  /* The engine's background reads of a read-only image; closed once
   * CONN is freed.
   */
  struct next_background background;
  bool writable;
  bool plugin_can_flush;        /* flush and FUA are offered only then */
  /* Front-end lock 1 (nbdkit-glue/README.md): held for reading by
   * .cache, for writing by .finalize (see there), above every other
   * lock: .finalize holds it across the connection's last flush and the
   * registry_release that may close the image, .cache across a
   * prefetch.
   */
  struct qcow2_rwlock finalize_lock;
};

static void
qcow2zstd_load (void)
{
  params_dump_if_asked ();
}

static void
qcow2zstd_cleanup (nbdkit_backend *backend)
{
  registry_cleanup ();
}

static void
qcow2zstd_unload (void)
{
  registry_unload ();
  params_unload ();
}

static int
qcow2zstd_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                  const char *key, const char *value)
{
  int r = params_config (key, value);

  return r == 1 ? next (nxdata, key, value) : r;
}

/* What nbdkit's command line shows under the filter: which plugin, and
 * whether a filter lies between.  nbdkit's curl plugin says it can
 * write, but each write it sends is an HTTP PUT of the bytes with a
 * Content-Range, which web servers refuse (nginx: 405) or take as the
 * whole new file, and it cannot grow the image: the export is read-only
 * over it, unless nbdkit-cow-filter between the two keeps the writes.
 */
static void
learn_stack (void)
{
  struct nbdkit_cmdline cl;
  size_t first, n, i;
  bool cow = false;

  if (cmdline_read (&cl) == 0 &&
      cmdline_under (&cl, "qcow2zstd", &first, &n) == 0) {
    file_plugin_under = n == 0 && strcmp (cl.plugin, "file") == 0;
    plugin_reads_beside = n == 0 &&
      ((file_plugin_under && options.image_file) ||
       strcmp (cl.plugin, "curl") == 0 || strcmp (cl.plugin, "ssh") == 0);
    for (i = first; i < first + n; i++)
      cow |= strcmp (cl.filters[i], "cow") == 0;
    if (strcmp (cl.plugin, "curl") == 0 && !cow)
      plugin_cannot_write = "nbdkit's curl plugin cannot write the image "
        "(it would send each write as an HTTP PUT, which web servers "
        "refuse or take as the whole new file)";
  }
  cmdline_free (&cl);
}

/* The checks at start-up, where the file is known (startup.h): nbdkit's
 * file plugin right under the filter, with file=.  Its exports all
 * serve that file: one image, under the key "".  Elsewhere the image is
 * checked when the first client of an export connects.
 */
static int
check_at_startup (void)
{
  bool writes;

  if (plugin_cannot_write) {
    if (options.create) {
      nbdkit_error ("qcow2-create: cannot create an image read-only: %s",
                    plugin_cannot_write);
      return -1;
    }
    if (options.readonly == 0)
      nbdkit_error ("qcow2zstd: warning: the export is read-only: %s; "
                    "give -r to say so, or put --filter=cow after "
                    "--filter=qcow2zstd to keep the writes in its "
                    "overlay", plugin_cannot_write);
  }
  if (!file_plugin_under || options.image_file == NULL)
    return 0;
  /* As the file plugin opens it: read-only with -r, or if it may not
   * write it.  A snapshot is served read-only.
   */
  writes = options.readonly == 0 && options.engine.snapshot == NULL &&
    access (options.image_file, W_OK) == 0;
  return startup_check_file (&options, options.image_file, "", writes);
}

static int
qcow2zstd_config_complete (nbdkit_next_config_complete *next,
                           nbdkit_backend *nxdata)
{
  if (params_complete (&options) == -1)
    return -1;
  learn_stack ();
  /* The plugin's own checks first: the file plugin's of file=. */
  if (next (nxdata) == -1)
    return -1;
  return check_at_startup ();
}

#define qcow2zstd_config_help PARAMS_HELP

static int
qcow2zstd_thread_model (void)
{
  return NBDKIT_THREAD_MODEL_PARALLEL;
}

static void *
qcow2zstd_open (nbdkit_next_open *next, nbdkit_context *nxdata,
                int readonly, const char *exportname, int is_tls)
{
  struct handle *h;

  /* A plugin that cannot really write is opened read-only too. */
  if (next (nxdata, readonly || plugin_cannot_write != NULL, exportname)
      == -1)
    return NULL;
  h = calloc (1, sizeof *h);
  if (h == NULL || (h->exportname = strdup (exportname)) == NULL) {
    nbdkit_error ("qcow2zstd: out of memory");
    free (h);
    return NULL;
  }
  qcow2_rwlock_init (&h->finalize_lock, QCOW2_RANK_FINALIZE,
                     "connection finalize");
  h->background.backend = nbdkit_context_get_backend (nxdata);
  h->background.exportname = h->exportname;
  return h;
}

/* Over a plugin that cannot flush, nothing the filter does makes a write
 * more durable than the plugin makes it when it returns: a flush or FUA
 * offered to clients would promise what nothing below gives.  Said once
 * per run, without -v, when the first writable connection finds it out
 * (nbdkit opens the plugin under a filter only then).
 */
static void
say_no_flush (void)
{
  static atomic_bool said;

  if (!atomic_exchange (&said, true))
    nbdkit_error ("qcow2zstd: warning: the plugin cannot flush, so neither "
                  "flush nor FUA is offered to clients: the image's crash "
                  "safety is the plugin's (what its writes make durable "
                  "when they return)");
}

/* Open (or join) the image of H's export through NEXT.  With file=
 * right over the file plugin, every export name is the one file: one
 * image, locked at start-up under "".  The filter locks the local file
 * the plugin under it was given, when it is the one served (locks.h).
 * The messages of a full image say how to give it room (truncate) only
 * when nbdkit's file plugin serves that file as it is, and it is a
 * regular file.
 */
static int
acquire_image (nbdkit_next *next, struct handle *h, bool writable)
{
  const char *key =
    file_plugin_under && options.image_file ? "" : h->exportname;
  char *path = params_local_image (&options, h->exportname);
  struct registry_storage storage = {
    .next_io = next_io (next),
    .confirm = next_serves_file,
    .confirm_opaque = next,
  };
  struct stat st;

  if (options.engine.locking != QCOW2_LOCK_OFF) {
    if (path)
      storage.lock_path = path;
    else
      nbdkit_debug ("qcow2zstd: export '%s': the plugin serves no local "
                    "file named by file= or dir=, so the image is not "
                    "locked (other users of it cannot be detected)",
                    h->exportname);
  }
  if (file_plugin_under && path && stat (path, &st) == 0 &&
      S_ISREG (st.st_mode))
    storage.room_file = path;
  h->image = registry_acquire (&options, key, writable, &storage);
  free (path);
  return h->image ? 0 : -1;
}

static int
qcow2zstd_prepare (nbdkit_next *next, void *handle, int readonly)
{
  struct handle *h = handle;
  int plugin_can_write = 0, plugin_can_flush = 0;

  /* nbdkit checks every request against the size of this connection's
   * plugin context, which it learns only when someone asks for it.
   * Likewise it asserts that writes and flushes go only to a plugin that
   * said it takes them.
   */
  if (next->get_size (next) == -1)
    return -1;
  readonly |= plugin_cannot_write != NULL;
  if (!readonly) {
    plugin_can_write = next->can_write (next);
    plugin_can_flush = next->can_flush (next);
    if (plugin_can_write == -1 || plugin_can_flush == -1)
      return -1;
  }

  /* The export's first connection decides whether the image is opened
   * for writing: yes unless nbdkit -r or a plugin that cannot write.
   */
  if (acquire_image (next, h, !readonly && plugin_can_write == 1) == -1)
    return -1;
  h->engine = registry_engine (h->image);
  h->writable = !readonly && plugin_can_write == 1 &&
    qcow2_image_writable (h->engine);
  h->plugin_can_flush = plugin_can_flush == 1;
  if (h->writable && !h->plugin_can_flush)
    say_no_flush ();
  h->conn = qcow2_conn_new (h->engine);
  if (h->conn == NULL)
    return -1;
  if (plugin_reads_beside && !h->writable) {
    struct qcow2_background_io bg = next_background_io (&h->background);
    qcow2_conn_fetch_in_background (h->conn, &bg);
  }
  return 0;
}

/* The connection and the image are released here rather than in .close,
 * which nbdkit skips when it is shutting down.  nbdkit's own threads send
 * no request after .finalize, but a filter above may, from a thread of
 * its own: nbdkit 1.32's readahead sends the .cache requests still in
 * its queue until its .close.  .cache therefore holds finalize_lock and
 * ignores what comes after.
 */
static int
qcow2zstd_finalize (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;

  qcow2_rwlock_wrlock (&h->finalize_lock);
  qcow2_conn_free (h->conn);
  h->conn = NULL;
  next_background_close (&h->background);
  if (h->image) {
    /* Every connection that can write flushes: the export's last one to
     * leave may be one that cannot.  Errors were logged; what is on disk
     * is consistent either way.
     */
    struct qcow2_io io = next_io (next);
    if (h->writable)
      qcow2_flush (h->engine, &io);
    registry_release (h->image, h->writable ? &io : NULL);
    h->image = NULL;
  }
  qcow2_rwlock_unlock (&h->finalize_lock);
  return 0;
}

static void
qcow2zstd_close (void *handle)
{
  struct handle *h = handle;

  /* finalize is skipped when prepare failed part way. */
  qcow2_conn_free (h->conn);
  next_background_close (&h->background);
  if (h->image)
    registry_release (h->image, NULL);
  qcow2_rwlock_destroy (&h->finalize_lock);
  free (h->exportname);
  free (h);
}

static int64_t
qcow2zstd_get_size (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  return qcow2_image_header (h->engine)->virtual_size;
}

static int
qcow2zstd_block_size (nbdkit_next *next, void *handle,
                      uint32_t *minimum, uint32_t *preferred,
                      uint32_t *maximum)
{
  struct handle *h = handle;

  glue_block_size (h->engine, minimum, preferred, maximum);
  return 0;
}

static int
qcow2zstd_can_write (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  return h->writable;
}

static int
qcow2zstd_can_flush (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  return h->writable && h->plugin_can_flush;
}

static int
qcow2zstd_can_trim (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  return h->writable;
}

static int
qcow2zstd_can_zero (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  return h->writable ? NBDKIT_ZERO_NATIVE : NBDKIT_ZERO_NONE;
}

static int
qcow2zstd_can_fast_zero (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  return h->writable;
}

static int
qcow2zstd_can_fua (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  return h->writable && h->plugin_can_flush ? NBDKIT_FUA_NATIVE
                                            : NBDKIT_FUA_NONE;
}

static int
qcow2zstd_can_multi_conn (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;

  /* A flush writes every connection's metadata, but whether it makes
   * every connection's data durable is up to the plugin underneath.
   */
  if (!h->writable)
    return 1;
  return next->can_multi_conn (next);
}

static int
qcow2zstd_can_extents (nbdkit_next *next, void *handle)
{
  return 1;
}

static int
qcow2zstd_can_cache (nbdkit_next *next, void *handle)
{
  return NBDKIT_CACHE_NATIVE;
}

static int
qcow2zstd_pread (nbdkit_next *next, void *handle,
                 void *buf, uint32_t count, uint64_t offset,
                 uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = next_io (next);

  return glue_result (qcow2_read (h->conn, &io, buf, count, offset), err);
}

static int
qcow2zstd_pwrite (nbdkit_next *next, void *handle,
                  const void *buf, uint32_t count, uint64_t offset,
                  uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = next_io (next);

  return glue_result (qcow2_write (h->conn, &io, buf, count, offset,
                                   flags & NBDKIT_FLAG_FUA), err);
}

static int
qcow2zstd_zero (nbdkit_next *next, void *handle,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = next_io (next);

  return glue_result (qcow2_zero (h->engine, &io, count,
                                  offset, flags & NBDKIT_FLAG_FAST_ZERO,
                                  flags & NBDKIT_FLAG_FUA), err);
}

static int
qcow2zstd_trim (nbdkit_next *next, void *handle,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = next_io (next);

  return glue_result (qcow2_trim (h->engine, &io, count,
                                  offset, flags & NBDKIT_FLAG_FUA), err);
}

static int
qcow2zstd_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = next_io (next);

  return glue_result (qcow2_flush (h->engine, &io), err);
}

static int
qcow2zstd_extents (nbdkit_next *next, void *handle,
                   uint32_t count, uint64_t offset, uint32_t flags,
                   struct nbdkit_extents *extents, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = next_io (next);

  /* A client asking for one extent is served by the first run. */
  return glue_result (qcow2_extents (h->conn, &io, offset, count,
                                     params_add_extent, extents), err);
}

static int
qcow2zstd_cache (nbdkit_next *next, void *handle,
                 uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = next_io (next);
  int r = 0;

  /* A prefetch is only advice: after .finalize there is nothing to do. */
  qcow2_rwlock_rdlock (&h->finalize_lock);
  if (h->conn)
    r = qcow2_prefetch (h->conn, &io, offset, count);
  else
    nbdkit_debug ("qcow2zstd: cache request after the connection was "
                  "finalized: ignored");
  qcow2_rwlock_unlock (&h->finalize_lock);
  return glue_result (r, err);
}

static struct nbdkit_filter filter = {
  .name = "qcow2zstd",
  .longname = "nbdkit qcow2 filter (zlib and zstd, parallel)",
  .load = qcow2zstd_load,
  .unload = qcow2zstd_unload,
  .cleanup = qcow2zstd_cleanup,
  .config = qcow2zstd_config,
  .config_complete = qcow2zstd_config_complete,
  .config_help = qcow2zstd_config_help,
  .thread_model = qcow2zstd_thread_model,
  .open = qcow2zstd_open,
  .prepare = qcow2zstd_prepare,
  .finalize = qcow2zstd_finalize,
  .close = qcow2zstd_close,
  .get_size = qcow2zstd_get_size,
  .block_size = qcow2zstd_block_size,
  .can_write = qcow2zstd_can_write,
  .can_flush = qcow2zstd_can_flush,
  .can_trim = qcow2zstd_can_trim,
  .can_zero = qcow2zstd_can_zero,
  .can_fast_zero = qcow2zstd_can_fast_zero,
  .can_fua = qcow2zstd_can_fua,
  .can_multi_conn = qcow2zstd_can_multi_conn,
  .can_extents = qcow2zstd_can_extents,
  .can_cache = qcow2zstd_can_cache,
  .pread = qcow2zstd_pread,
  .pwrite = qcow2zstd_pwrite,
  .zero = qcow2zstd_zero,
  .trim = qcow2zstd_trim,
  .flush = qcow2zstd_flush,
  .extents = qcow2zstd_extents,
  .cache = qcow2zstd_cache,
};

NBDKIT_REGISTER_FILTER (filter)
