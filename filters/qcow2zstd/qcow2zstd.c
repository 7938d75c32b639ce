/* nbdkit-qcow2zstd-filter: serve the guest disk inside a qcow2 image.
 *
 * This file is only glue between nbdkit and the engine in common/: it
 * parses parameters, adapts nbdkit's next backend to struct qcow2_io and
 * routes the engine's messages to nbdkit_error and nbdkit_debug.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "qcow2.h"
#include "qcow2-codec.h"

/* -D qcow2zstd.image=1: engine messages while opening the image.
 * -D qcow2zstd.stats=1: a statistics line when the image is closed.
 */
NBDKIT_DLL_PUBLIC int qcow2zstd_debug_image;
NBDKIT_DLL_PUBLIC int qcow2zstd_debug_stats;

static struct qcow2_options options = {
  .threads = 0,                 /* set in config_complete */
  .request_size = QCOW2_DEFAULT_REQUEST_SIZE,
  .l2_cache_size = QCOW2_DEFAULT_L2_CACHE_SIZE,
  .cluster_cache_size = QCOW2_DEFAULT_CLUSTER_CACHE_SIZE,
};
static unsigned threads_param;  /* 0: not given */
static int compress_param = -1; /* -1: not given */

/* qcow2-create: format the plugin's storage as a new image, once. */
static bool create_requested, created;
static struct qcow2_create_options create_opts = {
  .cluster_bits = 16,
  .compression_type = QCOW2_COMPRESSION_ZSTD,
};
static bool create_details_given;

/* One image serves every connection, so that they share the caches.  It
 * is opened by the first connection and closed with the last one.
 */
static pthread_mutex_t image_lock = PTHREAD_MUTEX_INITIALIZER;
static struct qcow2_image *image;
static unsigned image_users;

struct handle {
  struct qcow2_reader *reader;
  bool using_image;
  bool writable;
};

static void
log_error (void *opaque, const char *msg)
{
  nbdkit_error ("qcow2zstd: %s", msg);
}

static void
log_debug (void *opaque, const char *msg)
{
  if (qcow2zstd_debug_image)
    nbdkit_debug ("qcow2zstd: %s", msg);
}

static const struct qcow2_log engine_log = {
  .error = log_error,
  .debug = log_debug,
};

static int
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

static int
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

static int
next_flush (void *opaque)
{
  nbdkit_next *next = opaque;
  int err = 0;

  if (next->flush (next, 0, &err) == -1)
    return -(err ? err : EIO);
  return 0;
}

static int64_t
next_size (void *opaque)
{
  nbdkit_next *next = opaque;
  int64_t size = next->get_size (next);

  return size < 0 ? -EIO : size;
}

#define IO_FOR(next) \
  { .opaque = (next), .pread = next_pread, .pwrite = next_pwrite, \
    .flush = next_flush, .size = next_size }

/* nbdkit 1.32 gives filters no way to add --dump-plugin lines, so the
 * filter prints its own when it sees that option on the command line.
 */
static void
dump_codecs_if_asked (void)
{
  char args[8192];
  FILE *fp = fopen ("/proc/self/cmdline", "r");
  size_t len, i;
  char versions[128];

  if (fp == NULL)
    return;
  len = fread (args, 1, sizeof args - 1, fp);
  fclose (fp);
  args[len] = '\0';
  for (i = 0; i < len; i += strlen (args + i) + 1) {
    if (strcmp (args + i, "--dump-plugin") == 0) {
      qcow2_codec_versions (versions, sizeof versions);
      printf ("qcow2zstd_codecs=zlib,zstd\n");
      printf ("qcow2zstd_codec_versions=%s\n", versions);
#ifdef HAVE_LIBDEFLATE
      printf ("qcow2zstd_deflate_decoder=libdeflate\n");
#else
      printf ("qcow2zstd_deflate_decoder=zlib\n");
#endif
      fflush (stdout);
      return;
    }
  }
}

static void
qcow2zstd_load (void)
{
  dump_codecs_if_asked ();
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

static int
qcow2zstd_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                  const char *key, const char *value)
{
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
                             QCOW2_MAX_REQUEST_SIZE, &options.request_size);
  /* The caches reserve their memory when the image opens, so they may
   * not exceed the machine's memory.
   */
  if (strcmp (key, "qcow2-l2-cache-size") == 0)
    return parse_size_param (key, value, 0, physical_memory (),
                             &options.l2_cache_size);
  if (strcmp (key, "qcow2-cluster-cache-size") == 0)
    return parse_size_param (key, value, 0, physical_memory (),
                             &options.cluster_cache_size);
  if (strcmp (key, "qcow2-create") == 0) {
    create_requested = true;
    if (parse_size_param (key, value, 0, INT64_MAX / 2,
                          &create_opts.virtual_size) == -1)
      return -1;
    /* qemu sees a disk in whole 512-byte sectors (it would drop a partial
     * last one), so round up as qemu-img create does.
     */
    create_opts.virtual_size = (create_opts.virtual_size + 511) & ~UINT64_C (511);
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
    create_opts.cluster_bits = __builtin_ctzll (size);
    create_details_given = true;
    return 0;
  }
  if (strcmp (key, "qcow2-compression-type") == 0) {
    if (strcmp (value, "zstd") == 0)
      create_opts.compression_type = QCOW2_COMPRESSION_ZSTD;
    else if (strcmp (value, "zlib") == 0)
      create_opts.compression_type = QCOW2_COMPRESSION_ZLIB;
    else {
      nbdkit_error ("%s: unknown compression type '%s' (zlib or zstd)",
                    key, value);
      return -1;
    }
    create_details_given = true;
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
  if (strcmp (key, "qcow2-compression-level") == 0) {
    if (nbdkit_parse_int (key, value, &options.compression_level) == -1)
      return -1;
    /* The codec's own range is checked when the image's type is known. */
    if (options.compression_level < 1 || options.compression_level > 22) {
      nbdkit_error ("%s: %s is out of range (zlib 1 to 9, zstd 1 to 22)",
                    key, value);
      return -1;
    }
    return 0;
  }
  return next (nxdata, key, value);
}

static int
qcow2zstd_config_complete (nbdkit_next_config_complete *next,
                           nbdkit_backend *nxdata)
{
  unsigned threads = threads_param;

  if (threads == 0) {
    long cpus = sysconf (_SC_NPROCESSORS_ONLN);
    threads = cpus > 0 ? (cpus > 256 ? 256 : cpus) : 1;
  }
  /* The thread that calls pread decodes too, so N threads means N-1
   * workers in the pool.
   */
  options.threads = threads - 1;

  if (create_details_given && !create_requested) {
    nbdkit_error ("qcow2-cluster-size and qcow2-compression-type only "
                  "apply with qcow2-create=SIZE");
    return -1;
  }
  if (create_requested) {
    char err[256];
    if (qcow2_create_validate (&create_opts, err, sizeof err) == -1) {
      nbdkit_error ("%s", err);
      return -1;
    }
  }
  /* Compression is what creating an image is for; an existing image is
   * written the way qemu writes it unless asked.
   */
  options.compress = compress_param == -1 ? create_requested : compress_param;
  return next (nxdata);
}

#define qcow2zstd_config_help \
  "qcow2-threads=N                Threads decoding each request (default: CPUs).\n" \
  "qcow2-request-size=SIZE        Largest read of the plugin (default 4M).\n" \
  "qcow2-l2-cache-size=SIZE       L2 table cache, all connections (default 32M).\n" \
  "qcow2-cluster-cache-size=SIZE  Decompressed cluster cache (default 64M).\n" \
  "qcow2-create=SIZE              Format the plugin as a new image of SIZE.\n" \
  "qcow2-cluster-size=SIZE        Cluster size of a created image (default 64K).\n" \
  "qcow2-compression-type=zlib|zstd  Of a created image (default zstd).\n" \
  "qcow2-compress=BOOL            Store whole-cluster writes compressed.\n" \
  "qcow2-compression-level=N      zlib 1-9 (default 6), zstd 1-22 (default 3)."

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

  if (next (nxdata, readonly, exportname) == -1)
    return NULL;
  h = calloc (1, sizeof *h);
  if (h == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  return h;
}

static void
log_stats (struct qcow2_image *img)
{
  struct qcow2_stats s;

  if (!qcow2zstd_debug_stats)
    return;
  qcow2_image_get_stats (img, &s);
  nbdkit_debug ("qcow2zstd: stats: %" PRIu64 " clusters decompressed, "
                "cluster cache %" PRIu64 " hits %" PRIu64 " misses "
                "%" PRIu64 " evictions, "
                "L2 cache %" PRIu64 " hits %" PRIu64 " misses "
                "%" PRIu64 " evictions, "
                "%" PRIu64 " bytes in %" PRIu64 " reads underneath",
                s.clusters_decompressed,
                s.cluster_cache_hits, s.cluster_cache_misses,
                s.cluster_cache_evictions,
                s.l2_cache_hits, s.l2_cache_misses, s.l2_cache_evictions,
                s.bytes_read_underneath, s.reads_underneath);
}

/* NEXT: the closing connection's backend, to write what is left. */
static void
release_image (nbdkit_next *next)
{
  pthread_mutex_lock (&image_lock);
  if (--image_users == 0) {
    if (next) {
      struct qcow2_io io = IO_FOR (next);
      /* Errors were logged; the image stays consistent on disk. */
      qcow2_flush (image, &io);
    }
    log_stats (image);
    qcow2_image_close (image);
    image = NULL;
  }
  pthread_mutex_unlock (&image_lock);
}

static int
qcow2zstd_prepare (nbdkit_next *next, void *handle, int readonly)
{
  struct handle *h = handle;
  struct qcow2_io io = IO_FOR (next);
  int plugin_can_write = 0;
  int r = 0;

  /* nbdkit checks every request against the size of this connection's
   * plugin context, which it learns only when someone asks for it.
   */
  if (next->get_size (next) == -1)
    return -1;
  /* Likewise nbdkit asserts that writes and flushes go only to a plugin
   * that said it takes them.
   */
  if (!readonly) {
    plugin_can_write = next->can_write (next);
    if (plugin_can_write == -1 || next->can_flush (next) == -1)
      return -1;
  }

  pthread_mutex_lock (&image_lock);
  if (image == NULL) {
    struct qcow2_options opts = options;
    /* The first connection decides: writable unless nbdkit -r or a
     * plugin that cannot write.
     */
    opts.writable = !readonly && plugin_can_write == 1;
    if (create_requested && !created) {
      if (!opts.writable) {
        nbdkit_error ("qcow2-create: cannot create an image on a read-only "
                      "connection or plugin");
        r = -EROFS;
      }
      else
        r = qcow2_create (&io, &engine_log, &create_opts, &opts, &image);
      if (r == 0)
        created = true;
    }
    else
      r = qcow2_image_open (&io, &engine_log, &opts, &image);
  }
  if (r == 0)
    image_users++;
  pthread_mutex_unlock (&image_lock);
  if (r < 0)
    return -1;
  h->using_image = true;
  h->writable = !readonly && plugin_can_write == 1 &&
    qcow2_image_writable (image);

  h->reader = qcow2_reader_new (image);
  if (h->reader == NULL)
    return -1;
  return 0;
}

static int
qcow2zstd_finalize (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;

  qcow2_reader_free (h->reader);
  h->reader = NULL;
  if (h->using_image) {
    h->using_image = false;
    release_image (next);
  }
  return 0;
}

static void
qcow2zstd_close (void *handle)
{
  struct handle *h = handle;

  /* finalize is skipped when prepare failed part way. */
  qcow2_reader_free (h->reader);
  if (h->using_image)
    release_image (NULL);
  free (h);
}

static int64_t
qcow2zstd_get_size (nbdkit_next *next, void *handle)
{
  return qcow2_image_header (image)->virtual_size;
}

static int
qcow2zstd_block_size (nbdkit_next *next, void *handle,
                      uint32_t *minimum, uint32_t *preferred,
                      uint32_t *maximum)
{
  uint32_t cluster_size = qcow2_image_header (image)->cluster_size;

  *minimum = 1;
  /* Whole clusters decode straight into the client's buffer. */
  *preferred = cluster_size > 4096 ? cluster_size : 4096;
  *maximum = 0xffffffff;
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
  return h->writable;
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
  return h->writable ? NBDKIT_FUA_NATIVE : NBDKIT_FUA_NONE;
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
  struct qcow2_io io = IO_FOR (next);
  int r = qcow2_read (h->reader, &io, buf, count, offset);

  if (r < 0) {
    *err = -r;
    return -1;
  }
  return 0;
}

static int
result (int r, int *err)
{
  if (r < 0) {
    *err = -r;
    return -1;
  }
  return 0;
}

static int
qcow2zstd_pwrite (nbdkit_next *next, void *handle,
                  const void *buf, uint32_t count, uint64_t offset,
                  uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = IO_FOR (next);

  return result (qcow2_write (h->reader, &io, buf, count, offset,
                              flags & NBDKIT_FLAG_FUA), err);
}

static int
qcow2zstd_zero (nbdkit_next *next, void *handle,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = IO_FOR (next);

  return result (qcow2_zero (h->reader, &io, count, offset,
                             flags & NBDKIT_FLAG_FAST_ZERO,
                             flags & NBDKIT_FLAG_FUA), err);
}

static int
qcow2zstd_trim (nbdkit_next *next, void *handle,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = IO_FOR (next);

  return result (qcow2_trim (h->reader, &io, count, offset,
                             flags & NBDKIT_FLAG_FUA), err);
}

static int
qcow2zstd_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  struct qcow2_io io = IO_FOR (next);

  return result (qcow2_flush (image, &io), err);
}

static int
add_extent (void *opaque, uint64_t offset, uint64_t length, bool zero)
{
  struct nbdkit_extents *extents = opaque;

  if (nbdkit_add_extent (extents, offset, length,
                         zero ? NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO : 0)
      == -1)
    return -errno;
  return 0;
}

static int
qcow2zstd_extents (nbdkit_next *next, void *handle,
                   uint32_t count, uint64_t offset, uint32_t flags,
                   struct nbdkit_extents *extents, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = IO_FOR (next);
  int r;

  /* A client asking for one extent is served by the first run. */
  r = qcow2_extents (h->reader, &io, offset, count, add_extent, extents);
  if (r < 0) {
    *err = -r;
    return -1;
  }
  return 0;
}

static int
qcow2zstd_cache (nbdkit_next *next, void *handle,
                 uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct qcow2_io io = IO_FOR (next);
  int r = qcow2_prefetch (h->reader, &io, offset, count);

  if (r < 0) {
    *err = -r;
    return -1;
  }
  return 0;
}

static struct nbdkit_filter filter = {
  .name = "qcow2zstd",
  .longname = "nbdkit qcow2 filter (zlib and zstd, parallel)",
  .load = qcow2zstd_load,
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
