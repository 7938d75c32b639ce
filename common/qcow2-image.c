/* qcow2zstd engine: opening an image, the L1 table, L2 lookups. */

#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qcow2-internal.h"
#include "qcow2-codec.h"
#include "qcow2-endian.h"
#include "qcow2-pool.h"

static void
vlog (void (*fn) (void *, const char *), void *opaque,
      const char *fmt, va_list ap)
{
  char msg[512];

  if (fn == NULL)
    return;
  vsnprintf (msg, sizeof msg, fmt, ap);
  fn (opaque, msg);
}

void
qcow2_error (struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vlog (img->log.error, img->log.opaque, fmt, ap);
  va_end (ap);
}

void
qcow2_debug (struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;

  if (img->log.debug == NULL || !(img->opts.debug & QCOW2_DEBUG_IMAGE))
    return;
  va_start (ap, fmt);
  vlog (img->log.debug, img->log.opaque, fmt, ap);
  va_end (ap);
}

void
qcow2_debug_if (struct qcow2_image *img, unsigned flag, const char *fmt, ...)
{
  va_list ap;

  if (img->log.debug == NULL || !(img->opts.debug & flag))
    return;
  va_start (ap, fmt);
  vlog (img->log.debug, img->log.opaque, fmt, ap);
  va_end (ap);
}

int
qcow2_pread_clamped (struct qcow2_image *img, struct qcow2_io *io,
                     void *buf, uint64_t len, uint64_t offset)
{
  uint64_t avail = offset < img->file_size ? img->file_size - offset : 0;
  uint64_t from_file = len < avail ? len : avail;
  int r;

  if (from_file > 0) {
    r = io->pread (io->opaque, buf, from_file, offset);
    if (r < 0) {
      qcow2_error (img, "read of %" PRIu64 " bytes at host offset "
                   "0x%" PRIx64 " failed: %s", from_file, offset,
                   strerror (-r));
      return r;
    }
    atomic_fetch_add_explicit (&img->bytes_read_underneath, from_file,
                               memory_order_relaxed);
    atomic_fetch_add_explicit (&img->reads_underneath, 1,
                               memory_order_relaxed);
  }
  if (from_file < len)
    memset ((uint8_t *) buf + from_file, 0, len - from_file);
  return 0;
}

static int
log_extension (void *opaque, uint32_t type, const uint8_t *data, uint32_t len)
{
  struct qcow2_image *img = opaque;

  qcow2_debug (img, "header extension 0x%08x, %u bytes", type, len);
  return 0;
}

static int
read_l1 (struct qcow2_image *img, struct qcow2_io *io)
{
  const struct qcow2_header *h = &img->header;
  uint32_t i;
  int r;

  img->l1 = calloc (h->l1_size ? h->l1_size : 1, sizeof *img->l1);
  if (img->l1 == NULL) {
    qcow2_error (img, "out of memory for the L1 table (%u entries)",
                 h->l1_size);
    return -ENOMEM;
  }
  if (h->l1_size == 0)
    return 0;
  r = qcow2_pread_clamped (img, io, img->l1, (uint64_t) h->l1_size * 8,
                           h->l1_table_offset);
  if (r < 0)
    return r;
  for (i = 0; i < h->l1_size; ++i)
    img->l1[i] = be64 (&img->l1[i]);
  return 0;
}

/* What writing needs beyond reading: refusals of what cannot be written
 * safely, the refcounts and scratch space.  Nothing is written yet: see
 * qcow2_first_change.
 */
static int
open_for_writing (struct qcow2_image *img, struct qcow2_io *io)
{
  const struct qcow2_header *h = &img->header;
  int r;

  if (io->pwrite == NULL || io->flush == NULL) {
    qcow2_error (img, "the storage underneath cannot be written");
    return -EROFS;
  }
  if (h->nb_snapshots > 0) {
    qcow2_error (img, "nb_snapshots: images with internal snapshots (%u) "
                 "cannot be written; serve them read-only (nbdkit -r)",
                 h->nb_snapshots);
    return -EROFS;
  }
  if (h->incompatible_features & QCOW2_INCOMPAT_CORRUPT) {
    qcow2_error (img, "incompatible_features: the image is marked corrupt "
                 "and cannot be written; check it with qemu-img check -r "
                 "or serve it read-only (nbdkit -r)");
    return -EROFS;
  }
  if (h->extended_l2) {
    qcow2_error (img, "incompatible_features: images with extended L2 "
                 "entries (subclusters) can be read but not written; serve "
                 "them read-only (nbdkit -r)");
    return -EROFS;
  }
  if (h->incompatible_features & QCOW2_INCOMPAT_DIRTY) {
    qcow2_error (img, "incompatible_features: the dirty bit is set (the "
                 "refcounts may be stale) and the image cannot be written; "
                 "repair it with qemu-img check -r all or serve it "
                 "read-only (nbdkit -r)");
    return -EROFS;
  }

  r = qcow2_refcount_load (img, io);
  if (r < 0)
    return r;
  img->l1_dirty = calloc (h->l1_size ? h->l1_size : 1, 1);
  img->wbuf = malloc (h->cluster_size);
  img->wcompressed = malloc (2 * (size_t) h->cluster_size);
  img->wdecoder = qcow2_decoder_new ();
  if (!img->l1_dirty || !img->wbuf || !img->wcompressed || !img->wdecoder) {
    qcow2_error (img, "out of memory for the write state");
    return -ENOMEM;
  }

  img->autoclear_on_disk = h->autoclear_features != 0;
  return 0;
}

int
qcow2_first_change (struct qcow2_image *img, struct qcow2_io *io)
{
  uint8_t zero[8] = { 0 };
  int r;

  /* This writer keeps none of the structures the autoclear bits vouch
   * for (persistent bitmaps above all), so they go, durably, before
   * anything they vouch for changes.
   */
  img->autoclear_on_disk = false;
  qcow2_debug (img, "first change: clearing autoclear_features 0x%" PRIx64,
               img->header.autoclear_features);
  r = qcow2_pwrite_logged (img, io, zero, sizeof zero, 88);
  if (r == 0)
    r = qcow2_flush_logged (img, io);
  if (r < 0) {
    img->autoclear_on_disk = true;
    return r;
  }
  img->header.autoclear_features = 0;
  return 0;
}

/* Everything qcow2_header_check_features refuses but a backing file,
 * which the engine opens itself.
 */
static int
check_features_but_backing (const struct qcow2_header *h, char *err,
                            size_t errlen)
{
  struct qcow2_header without = *h;

  without.backing_file_offset = 0;
  return qcow2_header_check_features (&without, err, errlen);
}

unsigned
qcow2_online_cpus (void)
{
  long cpus = sysconf (_SC_NPROCESSORS_ONLN);

  return cpus > 0 ? (unsigned) cpus : 1;
}

int
qcow2_image_open (struct qcow2_io *io, const struct qcow2_log *log,
                  const struct qcow2_options *opts,
                  struct qcow2_image **imagep)
{
  struct qcow2_image *img;
  uint8_t *first = NULL;
  size_t first_len;
  int64_t size;
  char err[256];
  int r;

  *imagep = NULL;
  img = calloc (1, sizeof *img);
  if (img == NULL)
    return -ENOMEM;
  if (log)
    img->log = *log;
  img->opts = *opts;
  pthread_rwlock_init (&img->lock, NULL);
  pthread_mutex_init (&img->compressors_lock, NULL);
  pthread_mutex_init (&img->dedup_lock, NULL);

  size = io->size (io->opaque);
  if (size < 0) {
    qcow2_error (img, "cannot get the size of the image: %s",
                 strerror ((int) -size));
    r = (int) size;
    goto fail;
  }
  img->file_size = size;

  /* The header, its extensions and the backing file name all live in the
   * first cluster; read the largest possible one (or the whole file).
   */
  first_len = img->file_size < (UINT64_C (1) << QCOW2_MAX_CLUSTER_BITS)
    ? img->file_size : (UINT64_C (1) << QCOW2_MAX_CLUSTER_BITS);
  first = malloc (first_len ? first_len : 1);
  if (first == NULL) {
    r = -ENOMEM;
    goto fail;
  }
  r = qcow2_pread_clamped (img, io, first, first_len, 0);
  if (r < 0)
    goto fail;

  if (qcow2_header_parse (first, first_len, img->file_size, &img->header,
                          err, sizeof err) == -1 ||
      check_features_but_backing (&img->header, err, sizeof err) == -1 ||
      qcow2_header_walk_extensions (first, first_len, &img->header,
                                    log_extension, img,
                                    err, sizeof err) == -1) {
    qcow2_error (img, "invalid or unsupported qcow2 image: %s", err);
    r = -EINVAL;
    goto fail;
  }
  if (img->header.backing_file_offset != 0) {
    r = qcow2_backing_open (img, first, first_len);
    if (r < 0)
      goto fail;
  }
  else if (opts->backing_path) {
    qcow2_error (img, "qcow2-backing: the image has no backing file");
    r = -EINVAL;
    goto fail;
  }
  free (first);
  first = NULL;

  qcow2_debug (img, "qcow2 v%u, cluster size %u, virtual size %" PRIu64
               ", %s compression, L1 %u entries at 0x%" PRIx64
               ", file size %" PRIu64 "%s%s",
               img->header.version, img->header.cluster_size,
               img->header.virtual_size,
               qcow2_compression_name (img->header.compression_type),
               img->header.l1_size, img->header.l1_table_offset,
               img->file_size,
               img->header.incompatible_features & QCOW2_INCOMPAT_DIRTY
               ? ", dirty" : "",
               img->header.incompatible_features & QCOW2_INCOMPAT_CORRUPT
               ? ", marked corrupt" : "");

  img->csize_shift = 62 - (img->header.cluster_bits - 8);
  img->csize_mask = (UINT64_C (1) << (img->header.cluster_bits - 8)) - 1;
  img->coffset_mask = (UINT64_C (1) << img->csize_shift) - 1;

  r = read_l1 (img, io);
  if (r < 0)
    goto fail;

  img->l2_cache = qcow2_cache_new (img->header.cluster_size,
                                   opts->l2_cache_size);
  img->cluster_cache = qcow2_cache_new (img->header.cluster_size,
                                        opts->cluster_cache_size);
  if (img->l2_cache == NULL || img->cluster_cache == NULL) {
    qcow2_error (img, "out of memory for the caches");
    r = -ENOMEM;
    goto fail;
  }

  if (opts->writable) {
    r = open_for_writing (img, io);
    if (r < 0)
      goto fail;
  }
  if (opts->compress) {
    enum qcow2_compression type = img->header.compression_type;
    int min, max;

    qcow2_compression_level_range (type, &min, &max);
    if (img->opts.compression_level == 0)
      img->opts.compression_level = qcow2_compression_default_level (type);
    if (img->opts.compression_level < min ||
        img->opts.compression_level > max) {
      qcow2_error (img, "qcow2-compression-level: %d is out of range for "
                   "%s (%d to %d)", img->opts.compression_level,
                   qcow2_compression_name (type), min, max);
      r = -EINVAL;
      goto fail;
    }
  }

  *imagep = img;
  return 0;

 fail:
  free (first);
  qcow2_image_close (img);
  return r;
}

void
qcow2_image_close (struct qcow2_image *img)
{
  if (img == NULL)
    return;
  qcow2_cache_free (img->l2_cache);
  qcow2_cache_free (img->cluster_cache);
  qcow2_backing_close (img);
  qcow2_refcount_free (img);
  tablemap_clear (&img->dirty_l2);
  free (img->l1_dirty);
  free (img->wbuf);
  free (img->wcompressed);
  qcow2_decoder_free (img->wdecoder);
  qcow2_pool_free (img->compressors);
  qcow2_encoder_free (img->wencoder);
  qcow2_dedup_free (img);
  free (img->l1);
  pthread_mutex_destroy (&img->compressors_lock);
  pthread_mutex_destroy (&img->dedup_lock);
  pthread_rwlock_destroy (&img->lock);
  free (img);
}

const struct qcow2_header *
qcow2_image_header (const struct qcow2_image *img)
{
  return &img->header;
}

bool
qcow2_image_writable (const struct qcow2_image *img)
{
  return img->opts.writable;
}

void
qcow2_image_get_stats (struct qcow2_image *img, struct qcow2_stats *stats)
{
  struct qcow2_cache_stats cs;

  memset (stats, 0, sizeof *stats);
  stats->clusters_decompressed = atomic_load (&img->clusters_decompressed);
  stats->bytes_read_underneath = atomic_load (&img->bytes_read_underneath);
  stats->reads_underneath = atomic_load (&img->reads_underneath);
  qcow2_cache_get_stats (img->cluster_cache, &cs);
  stats->cluster_cache_hits = cs.hits;
  stats->cluster_cache_misses = cs.misses;
  stats->cluster_cache_evictions = cs.evictions;
  qcow2_cache_get_stats (img->l2_cache, &cs);
  stats->l2_cache_hits = cs.hits;
  stats->l2_cache_misses = cs.misses;
  stats->l2_cache_evictions = cs.evictions;
}

int
qcow2_classify (struct qcow2_image *img, uint64_t guest_cluster,
                uint64_t entry, struct cluster_map *map)
{
  const struct qcow2_header *h = &img->header;
  uint64_t guest = guest_cluster << h->cluster_bits;
  uint64_t offset;

  map->l2_entry = entry;
  map->compressed_len = 0;

  if (entry & L2E_COMPRESSED) {
    uint64_t sectors = ((entry >> img->csize_shift) & img->csize_mask) + 1;

    offset = entry & img->coffset_mask;
    map->kind = CLUSTER_COMPRESSED;
    map->host_offset = offset;
    map->compressed_len = sectors * 512 - (offset & 511);
    if (offset >= img->file_size) {
      qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": compressed "
                   "data at host offset 0x%" PRIx64 " lies past the end of "
                   "the file (%" PRIu64 " bytes)",
                   guest, offset, img->file_size);
      return -EIO;
    }
    return 0;
  }

  if (entry & L2E_RESERVED_MASK) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": reserved "
                 "bits are set (entry 0x%016" PRIx64 ")", guest, entry);
    return -EIO;
  }
  offset = entry & L2E_OFFSET_MASK;
  if (offset & (h->cluster_size - 1)) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": host offset "
                 "0x%" PRIx64 " is not cluster aligned", guest, offset);
    return -EIO;
  }
  map->host_offset = offset;

  if ((entry & L2E_ZERO) && h->extended_l2) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": the zero "
                 "flag is reserved with extended L2 entries", guest);
    return -EIO;
  }
  if (entry & L2E_ZERO) {
    if (h->version < 3) {
      qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": the zero "
                   "flag is set in a version 2 image", guest);
      return -EIO;
    }
    map->kind = CLUSTER_ZERO;
    return 0;
  }
  if (offset == 0) {
    map->kind = CLUSTER_UNALLOCATED;
    return 0;
  }
  if (offset >= img->file_size) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": host offset "
                 "0x%" PRIx64 " lies past the end of the file "
                 "(%" PRIu64 " bytes)", guest, offset, img->file_size);
    return -EIO;
  }
  map->kind = CLUSTER_NORMAL;
  return 0;
}

int
qcow2_check_bitmap (struct qcow2_image *img, uint64_t guest_cluster,
                    const struct cluster_map *map, uint64_t bitmap)
{
  uint64_t guest = guest_cluster << img->header.cluster_bits;
  uint32_t alloc = bitmap, zero = bitmap >> 32;

  if (map->kind == CLUSTER_COMPRESSED && bitmap != 0) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": a compressed "
                 "cluster with a subcluster bitmap (0x%016" PRIx64 ")",
                 guest, bitmap);
    return -EIO;
  }
  if (alloc & zero) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": subclusters "
                 "both allocated and zero (bitmap 0x%016" PRIx64 ")",
                 guest, bitmap);
    return -EIO;
  }
  if (map->kind == CLUSTER_UNALLOCATED && alloc) {
    qcow2_error (img, "L2 entry for guest offset 0x%" PRIx64 ": allocated "
                 "subclusters in a cluster without a host offset (bitmap "
                 "0x%016" PRIx64 ")", guest, bitmap);
    return -EIO;
  }
  return 0;
}

int
qcow2_l2_entries (struct qcow2_image *img, struct qcow2_io *io,
                  uint64_t first, size_t *n, uint64_t *entries,
                  uint64_t *bitmaps, uint8_t *l2buf)
{
  const struct qcow2_header *h = &img->header;
  const size_t esize = h->l2_entry_size;
  uint64_t l2_entries = UINT64_C (1) << h->l2_bits;
  uint64_t l1_index = first >> h->l2_bits;
  uint64_t l2_index = first & (l2_entries - 1);
  uint64_t l1e, l2_offset;
  uint8_t raw[QCOW2_L2_BATCH * 16];
  size_t i, count = *n;
  int r;

  if (count > l2_entries - l2_index)
    count = l2_entries - l2_index;
  if (count > QCOW2_L2_BATCH)
    count = QCOW2_L2_BATCH;
  *n = count;
  if (bitmaps)
    memset (bitmaps, 0, count * sizeof *bitmaps);

  if (l1_index >= h->l1_size) {
    /* Cannot happen for offsets inside the virtual size (the header check
     * makes the L1 table cover it); be safe anyway.
     */
    memset (entries, 0, count * sizeof *entries);
    return 0;
  }
  l1e = img->l1[l1_index];
  l2_offset = l1e & L1E_OFFSET_MASK;
  if (l1e & L1E_RESERVED_MASK) {
    qcow2_error (img, "L1 entry %" PRIu64 ": reserved bits are set "
                 "(entry 0x%016" PRIx64 ")", l1_index, l1e);
    return -EIO;
  }
  if (l2_offset == 0) {
    memset (entries, 0, count * sizeof *entries);
    return 0;
  }
  if (l2_offset & (h->cluster_size - 1)) {
    qcow2_error (img, "L1 entry %" PRIu64 ": L2 table offset 0x%" PRIx64
                 " is not cluster aligned", l1_index, l2_offset);
    return -EIO;
  }
  if (l2_offset > img->file_size ||
      h->cluster_size > img->file_size - l2_offset) {
    qcow2_error (img, "L1 entry %" PRIu64 ": L2 table at 0x%" PRIx64
                 " lies outside the file (%" PRIu64 " bytes)",
                 l1_index, l2_offset, img->file_size);
    return -EIO;
  }

  if (img->dirty_l2.count) {
    struct meta_table *t = tablemap_find (&img->dirty_l2, l2_offset);
    if (t) {
      memcpy (raw, t->data + l2_index * esize, count * esize);
      goto convert;
    }
  }
  if (!qcow2_cache_get (img->l2_cache, l2_offset, l2_index * esize,
                        raw, count * esize)) {
    r = qcow2_pread_clamped (img, io, l2buf, h->cluster_size, l2_offset);
    if (r < 0)
      return r;
    qcow2_cache_put (img->l2_cache, l2_offset, l2buf);
    memcpy (raw, l2buf + l2_index * esize, count * esize);
  }
 convert:
  /* Extended entries are the standard entry and then the subcluster
   * bitmap.
   */
  for (i = 0; i < count; ++i) {
    entries[i] = be64 (raw + i * esize);
    if (bitmaps && esize == 16)
      bitmaps[i] = be64 (raw + i * esize + 8);
  }
  return 0;
}
