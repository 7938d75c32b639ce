/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: the parameters of the filter and the plugin. */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nbdkit.h"
#include "params.h"
#include "cmdline.h"
#include "format/codec.h"
#include "format/crypto.h"

/* -D qcow2zstd.FLAG=1: nbdkit sets these before any call of ours, by
 * their names (the only reason they are not static); read once, by
 * params_complete.
 *   image: opening an image: header, extensions, backing.
 *   map: each request: its clusters by kind, cache hits.
 *   pool: each batch: jobs run by the caller and the workers.
 *   stats: counters and cache hit rates when an image closes.
 */
NBDKIT_DLL_PUBLIC int qcow2zstd_debug_image;
NBDKIT_DLL_PUBLIC int qcow2zstd_debug_map;
NBDKIT_DLL_PUBLIC int qcow2zstd_debug_pool;
NBDKIT_DLL_PUBLIC int qcow2zstd_debug_stats;

/* The parameters as they are parsed: written only while nbdkit
 * configures (one thread), then copied out by params_complete.
 */
static struct qcow2_options engine_options = {
  .threads = 0,                 /* set in params_complete */
  .request_size = QCOW2_DEFAULT_REQUEST_SIZE,
  .l2_cache_size = QCOW2_DEFAULT_L2_CACHE_SIZE,
  .cluster_cache_size = QCOW2_DEFAULT_CLUSTER_CACHE_SIZE,
  /* A client's trim already releases clusters inside the image; passing
   * that on is what gives the space back (see the man page).
   */
  .discard = QCOW2_DISCARD_UNMAP,
  .detect_zeroes = QCOW2_DETECT_ZEROES_OFF,     /* qemu's default */
};
static bool create_requested;
static struct qcow2_create_options create_options = {
  .cluster_bits = 16,
  .compression_type = QCOW2_COMPRESSION_ZSTD,
};

static unsigned threads_param;  /* 0: not given */
static int compress_param = -1; /* -1: not given */
static bool create_details_given;
static int force_share_param;   /* qcow2-force-share */
static bool encrypt_details_given;  /* qcow2-encrypt-iter-time */
static char *passphrase;        /* from nbdkit_read_password */
static char *snapshot;

/* nbdkit 1.32 gives filters no way to add --dump-plugin lines, so the
 * filter prints its own when it sees that option on the command line.
 */
void
params_dump_if_asked (void)
{
  struct nbdkit_cmdline cl;
  char versions[128];
  char names[64];

  if (cmdline_read (&cl) == -1)
    return;
  if (cl.dump_plugin) {
    qcow2_codec_versions (versions, sizeof versions);
    /* nbdkit's version= line is nbdkit's own for a filter. */
    printf ("qcow2zstd_version=%s\n", PACKAGE_VERSION);
    qcow2_codec_names (names, sizeof names);
    printf ("qcow2zstd_codecs=%s\n", names);
    printf ("qcow2zstd_codec_versions=%s\n", versions);
#ifdef HAVE_LIBDEFLATE
    printf ("qcow2zstd_deflate_decoder=libdeflate\n");
#else
    printf ("qcow2zstd_deflate_decoder=zlib\n");
#endif
    fflush (stdout);
  }
  cmdline_free (&cl);
}

static uint64_t
physical_memory (void)
{
  long pages = sysconf (_SC_PHYS_PAGES), page_size = sysconf (_SC_PAGESIZE);

  if (pages <= 0 || page_size <= 0)
    return UINT64_C (1) << 40;
  return (uint64_t) pages * page_size;
}

static int
parse_size_param (const char *key, const char *value, uint64_t min,
                  uint64_t max, uint64_t *out)
{
  int64_t size = nbdkit_parse_size (value);

  if (size == -1) {
    nbdkit_error ("%s: cannot parse '%s' as a size", key, value);
    return -1;
  }
  if ((uint64_t) size < min || (uint64_t) size > max) {
    nbdkit_error ("%s: %s is out of range (%" PRIu64 " to %" PRIu64 ")",
                  key, value, min, max);
    return -1;
  }
  *out = size;
  return 0;
}

/* The image's directory, when the plugin is nbdkit's file plugin: its
 * file= (or dir=) parameter passes by here too, and relative backing
 * file names are resolved from there.  Taken now, before nbdkit may
 * change directory.
 */
static char *image_dir;
static char *image_file;        /* file=, resolved; NULL with dir= */

/* Where backing files named in headers may be: the image's directory,
 * then each qcow2-backing-dir=, resolved; NULL-terminated for the
 * engine (engine_options.backing_dirs), built by params_complete.
 */
static char **extra_backing_dirs;
static size_t nr_extra_backing_dirs;
static const char **backing_dirs;

static void
note_image_path (const char *key, const char *value)
{
  char *path = realpath (value, NULL), *slash;

  if (path == NULL)
    return;                     /* the plugin will report it */
  free (image_dir);
  image_dir = NULL;
  free (image_file);
  image_file = NULL;
  if (strcmp (key, "dir") == 0)
    image_dir = path;
  else if ((slash = strrchr (path, '/')) != NULL) {
    image_file = strdup (path);
    slash[slash == path ? 1 : 0] = '\0';
    image_dir = path;
  }
  else
    free (path);
  engine_options.image_dir = image_dir;
}

char *
params_local_image (const struct glue_options *options,
                    const char *exportname)
{
  char *path = NULL;

  if (options->image_file)
    return strdup (options->image_file);
  /* The file plugin's dir= serves the file the export is named after. */
  if (options->image_dir && exportname[0] != '\0' &&
      strchr (exportname, '/') == NULL &&
      asprintf (&path, "%s/%s", options->image_dir, exportname) == -1)
    path = NULL;
  return path;
}

/* qcow2-backing-dir=DIR: another directory backing files may be in. */
static int
add_backing_dir (const char *value)
{
  char *dir = realpath (value, NULL), **more;
  struct stat st;

  if (dir == NULL || stat (dir, &st) == -1) {
    nbdkit_error ("qcow2-backing-dir: %s: %m", value);
    free (dir);
    return -1;
  }
  if (!S_ISDIR (st.st_mode)) {
    nbdkit_error ("qcow2-backing-dir: %s is not a directory", value);
    free (dir);
    return -1;
  }
  more = realloc (extra_backing_dirs,
                  (nr_extra_backing_dirs + 1) * sizeof *more);
  if (more == NULL) {
    nbdkit_error ("qcow2-backing-dir: out of memory");
    free (dir);
    return -1;
  }
  extra_backing_dirs = more;
  extra_backing_dirs[nr_extra_backing_dirs++] = dir;
  return 0;
}

/* engine_options.backing_dirs, once file= or dir= is known. */
static int
settle_backing_dirs (void)
{
  size_t i, n = 0;

  free (backing_dirs);
  backing_dirs = calloc (nr_extra_backing_dirs + 2, sizeof *backing_dirs);
  if (backing_dirs == NULL) {
    nbdkit_error ("qcow2zstd: out of memory");
    return -1;
  }
  if (image_dir)
    backing_dirs[n++] = image_dir;
  for (i = 0; i < nr_extra_backing_dirs; i++)
    backing_dirs[n++] = extra_backing_dirs[i];
  engine_options.backing_dirs = backing_dirs;
  return 0;
}

void
params_unload (void)
{
  size_t i;

  for (i = 0; i < nr_extra_backing_dirs; i++)
    free (extra_backing_dirs[i]);
  free (extra_backing_dirs);
  free (backing_dirs);
  free (image_dir);
  free (image_file);
  free ((char *) engine_options.backing_path);
  free ((char *) engine_options.data_file_path);
  if (passphrase) {
    qcow2_wipe (passphrase, strlen (passphrase));
    free (passphrase);
  }
  free (snapshot);
  qcow2_key_cache_free (engine_options.key_cache);
}

int
params_config (const char *key, const char *value)
{
  if (strcmp (key, "file") == 0 || strcmp (key, "dir") == 0) {
    note_image_path (key, value);
    return 1;                   /* the plugin's own parameter */
  }
  if (strcmp (key, "qcow2-backing") == 0) {
    char *path = realpath (value, NULL);
    if (path == NULL) {
      nbdkit_error ("qcow2-backing: %s: %m", value);
      return -1;
    }
    engine_options.backing_path = path;
    return 0;
  }
  if (strcmp (key, "qcow2-data-file") == 0) {
    char *path = realpath (value, NULL);
    if (path == NULL) {
      nbdkit_error ("qcow2-data-file: %s: %m", value);
      return -1;
    }
    free ((char *) engine_options.data_file_path);
    engine_options.data_file_path = path;
    return 0;
  }
  if (strcmp (key, "qcow2-backing-dir") == 0)
    return add_backing_dir (value);
  if (strcmp (key, "qcow2-passphrase") == 0) {
    /* nbdkit's conventions: the value, "-" to prompt, "+FILE", "-FD". */
    if (passphrase) {
      qcow2_wipe (passphrase, strlen (passphrase));
      free (passphrase);
      passphrase = NULL;
    }
    if (nbdkit_read_password (value, &passphrase) == -1)
      return -1;
    engine_options.passphrase = passphrase;
    return 0;
  }
  if (strcmp (key, "qcow2-encrypt-format") == 0) {
    if (strcmp (value, "luks") != 0) {
      nbdkit_error ("%s: '%s' cannot be created: only luks (qcow2's legacy "
                    "aes is not created, as by qemu)", key, value);
      return -1;
    }
    create_options.encrypt = true;
    return 0;
  }
  if (strcmp (key, "qcow2-encrypt-iter-time") == 0) {
    unsigned ms;
    if (nbdkit_parse_unsigned (key, value, &ms) == -1)
      return -1;
    if (ms < 1 || ms > 3600000) {
      nbdkit_error ("%s: %s is out of range (1 to 3600000 milliseconds)",
                    key, value);
      return -1;
    }
    create_options.iter_time_ms = ms;
    encrypt_details_given = true;
    return 0;
  }
  if (strcmp (key, "qcow2-snapshot") == 0) {
    /* Every snapshot has an ID, so no snapshot is named by nothing; an
     * empty value is a variable that was not set.
     */
    if (value[0] == '\0') {
      nbdkit_error ("qcow2-snapshot: empty: give a snapshot's ID or name "
                    "(qemu-img snapshot -l FILE lists them), or leave "
                    "qcow2-snapshot out to serve the image itself");
      return -1;
    }
    free (snapshot);
    snapshot = strdup (value);
    if (snapshot == NULL) {
      nbdkit_error ("qcow2-snapshot: out of memory");
      return -1;
    }
    engine_options.snapshot = snapshot;
    return 0;
  }
  if (strcmp (key, "qcow2-threads") == 0) {
    if (nbdkit_parse_unsigned (key, value, &threads_param) == -1)
      return -1;
    if (threads_param < 1 || threads_param > 256) {
      nbdkit_error ("qcow2-threads: %s is out of range (1 to 256)", value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "qcow2-request-size") == 0)
    return parse_size_param (key, value, QCOW2_MIN_REQUEST_SIZE,
                             QCOW2_MAX_REQUEST_SIZE, &engine_options.request_size);
  /* The caches reserve their memory when the image opens, so they may
   * not exceed the machine's memory.
   */
  if (strcmp (key, "qcow2-l2-cache-size") == 0)
    return parse_size_param (key, value, 0, physical_memory (),
                             &engine_options.l2_cache_size);
  if (strcmp (key, "qcow2-cluster-cache-size") == 0)
    return parse_size_param (key, value, 0, physical_memory (),
                             &engine_options.cluster_cache_size);
  if (strcmp (key, "qcow2-create") == 0) {
    create_requested = true;
    if (parse_size_param (key, value, 0, INT64_MAX / 2,
                          &create_options.virtual_size) == -1)
      return -1;
    /* qemu sees a disk in whole 512-byte sectors (it would drop a partial
     * last one), so round up as qemu-img create does.
     */
    create_options.virtual_size = (create_options.virtual_size + 511) & ~UINT64_C (511);
    return 0;
  }
  if (strcmp (key, "qcow2-cluster-size") == 0) {
    uint64_t size;
    if (parse_size_param (key, value, 512, 2 << 20, &size) == -1)
      return -1;
    if (size & (size - 1)) {
      nbdkit_error ("%s: %s is not a power of 2", key, value);
      return -1;
    }
    create_options.cluster_bits = __builtin_ctzll (size);
    create_details_given = true;
    return 0;
  }
  if (strcmp (key, "qcow2-compression-type") == 0) {
    if (qcow2_compression_by_name (value,
                                   &create_options.compression_type) == -1) {
      char names[64];

      qcow2_codec_names (names, sizeof names);
      nbdkit_error ("%s: unknown compression type '%s' (one of %s)",
                    key, value, names);
      return -1;
    }
    create_details_given = true;
    return 0;
  }
  if (strcmp (key, "qcow2-discard") == 0) {
    if (strcmp (value, "unmap") == 0 || strcmp (value, "on") == 0)
      engine_options.discard = QCOW2_DISCARD_UNMAP;
    else if (strcmp (value, "ignore") == 0 || strcmp (value, "off") == 0)
      engine_options.discard = QCOW2_DISCARD_IGNORE;
    else {
      nbdkit_error ("%s: unknown discard mode '%s' (unmap or ignore)",
                    key, value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "qcow2-detect-zeroes") == 0) {
    if (strcmp (value, "off") == 0)
      engine_options.detect_zeroes = QCOW2_DETECT_ZEROES_OFF;
    else if (strcmp (value, "on") == 0)
      engine_options.detect_zeroes = QCOW2_DETECT_ZEROES_ON;
    else if (strcmp (value, "unmap") == 0)
      engine_options.detect_zeroes = QCOW2_DETECT_ZEROES_UNMAP;
    else {
      nbdkit_error ("%s: unknown detect-zeroes mode '%s' (off, on or unmap)",
                    key, value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "qcow2-compress") == 0) {
    compress_param = nbdkit_parse_bool (value);
    if (compress_param == -1) {
      nbdkit_error ("%s: '%s' is not a boolean", key, value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "qcow2-locking") == 0) {
    if (strcmp (value, "on") == 0)
      engine_options.locking = QCOW2_LOCK_ON;
    else if (strcmp (value, "off") == 0)
      engine_options.locking = QCOW2_LOCK_OFF;
    else if (strcmp (value, "auto") == 0)
      engine_options.locking = QCOW2_LOCK_AUTO;
    else {
      nbdkit_error ("%s: '%s' is not on, auto or off", key, value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "qcow2-lazy-refcounts") == 0) {
    int lazy = nbdkit_parse_bool (value);
    if (lazy == -1) {
      nbdkit_error ("%s: '%s' is not a boolean", key, value);
      return -1;
    }
    engine_options.lazy_refcounts = lazy;
    return 0;
  }
  if (strcmp (key, "qcow2-force-share") == 0) {
    force_share_param = nbdkit_parse_bool (value);
    if (force_share_param == -1) {
      nbdkit_error ("%s: '%s' is not a boolean", key, value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "qcow2-compression-level") == 0) {
    if (nbdkit_parse_int (key, value, &engine_options.compression_level) == -1)
      return -1;
    /* The codec's own range is checked when the image's type is known. */
    if (engine_options.compression_level < 1 || engine_options.compression_level > 22) {
      nbdkit_error ("%s: %s is out of range (zlib 1 to 9, zstd 1 to 22)",
                    key, value);
      return -1;
    }
    return 0;
  }
  return 1;
}

/* A level given on the command line (0: none, the codec's default)
 * fits TYPE.
 */
static int
check_level (int level, enum qcow2_compression type)
{
  int min, max;

  if (level == 0)
    return 0;
  qcow2_compression_level_range (type, &min, &max);
  if (level < min || level > max) {
    nbdkit_error ("qcow2-compression-level: %d is out of range for %s "
                  "(%d to %d)", level, qcow2_compression_name (type),
                  min, max);
    return -1;
  }
  return 0;
}

int
params_check_level (const struct glue_options *options,
                    enum qcow2_compression type)
{
  return check_level (options->engine.compression_level, type);
}

/* What can be wrong on the command line but no single parameter shows,
 * checked before anything is opened or formatted.
 */
static int
check_startup (int readonly)
{
  bool level_given = engine_options.compression_level != 0;

  if (create_requested && readonly == 1) {
    nbdkit_error ("qcow2-create: cannot create an image read-only "
                  "(nbdkit -r)");
    return -1;
  }
  if (create_requested && engine_options.backing_path) {
    nbdkit_error ("qcow2-backing: an image made by qcow2-create has no "
                  "backing file");
    return -1;
  }
  if (create_requested && engine_options.data_file_path) {
    nbdkit_error ("qcow2-data-file: an image made by qcow2-create has no "
                  "external data file");
    return -1;
  }
  /* The type of a created image is known now; an existing image's only
   * when it is opened (or, in the plugin form, read at start-up).
   */
  if (create_requested &&
      check_level (engine_options.compression_level,
                   create_options.compression_type) == -1)
    return -1;
  if (level_given && compress_param == 0) {
    nbdkit_error ("qcow2-compression-level: only applies to compressed "
                  "writes, and qcow2-compress=false turns them off");
    return -1;
  }
  if (force_share_param == 1) {
    /* qemu's force-share=on likewise demands a read-only image. */
    if (readonly != 1) {
      nbdkit_error ("qcow2-force-share: only applies with -r (nbdkit "
                    "--readonly): an image opened for writing cannot "
                    "share its write permission");
      return -1;
    }
    if (engine_options.locking != QCOW2_LOCK_OFF)
      engine_options.locking = QCOW2_LOCK_FORCE_SHARE;
  }
  return 0;
}

int
params_complete (struct glue_options *options)
{
  unsigned threads = threads_param;
  struct nbdkit_cmdline cl;
  int readonly;

  if (threads == 0) {
    long cpus = sysconf (_SC_NPROCESSORS_ONLN);
    threads = cpus > 0 ? (cpus > 256 ? 256 : cpus) : 1;
  }
  /* The thread that calls pread decodes too, so N threads means N-1
   * workers in the pool.
   */
  engine_options.threads = threads - 1;
  engine_options.compress_threads = threads;

  if (create_details_given && !create_requested) {
    nbdkit_error ("qcow2-cluster-size and qcow2-compression-type only "
                  "apply with qcow2-create=SIZE");
    return -1;
  }
  if ((create_options.encrypt || encrypt_details_given) &&
      !create_requested) {
    nbdkit_error ("qcow2-encrypt-format and qcow2-encrypt-iter-time only "
                  "apply with qcow2-create=SIZE");
    return -1;
  }
  if (encrypt_details_given && !create_options.encrypt) {
    nbdkit_error ("qcow2-encrypt-iter-time only applies with "
                  "qcow2-encrypt-format=luks");
    return -1;
  }
  if (create_options.encrypt && passphrase == NULL) {
    nbdkit_error ("qcow2-encrypt-format=luks needs the passphrase: "
                  "qcow2-passphrase=SECRET");
    return -1;
  }
  if (create_requested && passphrase && !create_options.encrypt) {
    nbdkit_error ("qcow2-passphrase with qcow2-create: give "
                  "qcow2-encrypt-format=luks to make an encrypted image");
    return -1;
  }
  if (create_options.encrypt && compress_param == 1) {
    /* qemu-img convert -c -o encrypt.format=luks says the same. */
    nbdkit_error ("qcow2-compress: Compression and encryption not "
                  "supported at the same time");
    return -1;
  }
  if (create_requested && snapshot) {
    nbdkit_error ("qcow2-snapshot: a new image has no snapshots to serve");
    return -1;
  }
  /* The key slot is unlocked once per image: an export opened again for
   * the next client takes the key from here.
   */
  if (passphrase && engine_options.key_cache == NULL &&
      (engine_options.key_cache = qcow2_key_cache_new ()) == NULL) {
    nbdkit_error ("qcow2-passphrase: out of memory");
    return -1;
  }
  if (create_requested) {
    char err[256];
    if (qcow2_create_validate (&create_options, err, sizeof err) == -1) {
      nbdkit_error ("%s", err);
      return -1;
    }
  }
  cmdline_read (&cl);
  readonly = cl.readonly;
  cmdline_free (&cl);
  if (check_startup (readonly) == -1 || settle_backing_dirs () == -1)
    return -1;
  /* nbdkit sets the -D flags before configuring. */
  engine_options.debug =
    (qcow2zstd_debug_image ? QCOW2_DEBUG_IMAGE : 0) |
    (qcow2zstd_debug_map ? QCOW2_DEBUG_MAP : 0) |
    (qcow2zstd_debug_pool ? QCOW2_DEBUG_POOL : 0);
  /* Compression is what creating an image is for; an existing image is
   * written the way qemu writes it unless asked.
   */
  engine_options.compress = compress_param == -1
    ? create_requested && !create_options.encrypt : compress_param;

  *options = (struct glue_options) {
    .engine = engine_options,
    .create = create_requested,
    .create_options = create_options,
    .readonly = readonly,
    .image_file = image_file,
    .image_dir = image_dir,
    .log_stats = qcow2zstd_debug_stats,
  };
  return 0;
}

void
params_log_stats (struct qcow2_image *img, const char *exportname)
{
  struct qcow2_stats s;

  qcow2_image_get_stats (img, &s);
  nbdkit_debug ("qcow2zstd: stats for export '%s': %" PRIu64 " clusters "
                "decompressed, cluster cache %" PRIu64 " hits %" PRIu64
                " misses %" PRIu64 " evictions %" PRIu64 " not admitted "
                "(%.0f%% hits), L2 cache %"
                PRIu64 " hits %" PRIu64 " misses %" PRIu64 " evictions, %"
                PRIu64 " bytes in %" PRIu64 " reads underneath, %" PRIu64
                " reads from bytes fetched ahead (%" PRIu64 " fetches in "
                "the background)", exportname,
                s.clusters_decompressed,
                s.cluster_cache_hits, s.cluster_cache_misses,
                s.cluster_cache_evictions, s.cluster_cache_refused,
                s.cluster_cache_hits + s.cluster_cache_misses
                ? 100.0 * s.cluster_cache_hits /
                  (s.cluster_cache_hits + s.cluster_cache_misses) : 0.0,
                s.l2_cache_hits, s.l2_cache_misses, s.l2_cache_evictions,
                s.bytes_read_underneath, s.reads_underneath,
                s.reads_fetched_ahead, s.fetches_in_background);
}

int
params_add_extent (void *extents, uint64_t offset, uint64_t length, bool zero)
{
  if (nbdkit_add_extent (extents, offset, length,
                         zero ? NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO : 0)
      == -1)
    return -errno;
  return 0;
}
