/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: opening and closing an image.
 *
 * Implements qcow2_image_open, qcow2_image_close and the image's
 * accessors (qcow2.h, the contract).  Opening parses and checks the
 * header (format/header.h), opens the backing file, unlocks an encrypted
 * image (paths/encrypt.h), reads the snapshot table (and picks the
 * snapshot to serve), loads the L1 table, makes the caches and, for
 * writing, reads the persistent bitmaps, loads the refcounts and sets up
 * the allocator and the dedup table.  No lock: nobody else sees the image
 * until open returns, nor after close begins.
 */

#include <config.h>

#include "qcow2.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backing.h"
#include "datafile.h"
#include "meta/crypt.h"
#include "base/cache.h"
#include "base/inflight.h"
#include "base/lockorder.h"
#include "format/codec.h"
#include "format/entries.h"
#include "format/header.h"
#include "format/snapshot.h"
#include "meta/alloc.h"
#include "meta/bitmap.h"
#include "meta/dirty.h"
#include "meta/first-change.h"
#include "meta/hostio.h"
#include "meta/log.h"
#include "meta/map.h"
#include "meta/refcount.h"
#include "meta/regions.h"
#include "meta/repair.h"
#include "meta/writeback.h"
#include "paths/compress.h"
#include "paths/dedup.h"
#include "paths/scratch.h"

static int
log_extension (void *opaque, uint32_t type, const uint8_t *data, uint32_t len)
{
  struct qcow2_image *img = opaque;

  qcow2_debug (img, "header extension 0x%08x, %u bytes", type, len);
  return 0;
}

/* Add the refcount block at OFFSET to the list of metadata regions. */
static int
add_block_region (void *opaque, uint64_t offset)
{
  struct qcow2_image *img = opaque;

  return qcow2_regions_add (img, QCOW2_REGION_REFCOUNT_BLOCK, offset, 1);
}

/* The list of metadata regions as the image holds them now (the bitmaps
 * add theirs when they are checked): the header, the active L1 table
 * and its L2 tables, the refcount table and blocks, the snapshot table
 * and the snapshots' L1 tables, the LUKS area.  A damaged image that
 * names one cluster twice keeps the first name for it.
 */
static int
build_regions (struct qcow2_image *img,
               const struct qcow2_snapshot_table *snapshots)
{
  const struct qcow2_header *h = &img->header;
  uint64_t rt_offset;
  uint32_t rt_clusters, i;
  int r;

  /* What the header itself names first, then what the tables name: of
   * two structures a damaged image puts in one cluster, the first stays
   * its kind (meta/regions.h).
   */
  qcow2_refcount_table_location (img, &rt_offset, &rt_clusters);
  r = qcow2_regions_open (img);
  if (r == 0)
    r = qcow2_regions_add (img, QCOW2_REGION_HEADER, 0, h->cluster_size);
  if (r == 0)
    r = qcow2_regions_add (img, QCOW2_REGION_REFCOUNT_TABLE, rt_offset,
                           (uint64_t) rt_clusters << h->cluster_bits);
  if (r == 0)
    r = qcow2_regions_add (img, QCOW2_REGION_L1, h->l1_table_offset,
                           (uint64_t) h->l1_size * 8);
  if (r == 0 && snapshots && snapshots->count)
    r = qcow2_regions_add (img, QCOW2_REGION_SNAPSHOT_TABLE,
                           h->snapshots_offset, snapshots->table_bytes);
  if (r == 0)
    r = qcow2_regions_add (img, QCOW2_REGION_LUKS, img->luks_area_offset,
                           img->luks_area_length);
  if (r == 0)
    r = qcow2_refcount_each_block (img, add_block_region, img);
  for (i = 0; i < h->l1_size && r == 0; ++i) {
    uint64_t l2 = qcow2_l1_entry (img, i) & L1E_OFFSET_MASK;
    if (l2)
      r = qcow2_regions_add (img, QCOW2_REGION_L2, l2, h->cluster_size);
  }
  for (i = 0; snapshots && i < snapshots->count && r == 0; ++i)
    r = qcow2_regions_add (img, QCOW2_REGION_SNAPSHOT_L1,
                           snapshots->snapshots[i].l1_table_offset,
                           (uint64_t) snapshots->snapshots[i].l1_size * 8);
  if (r < 0)
    qcow2_error (img, "out of memory for the list of metadata regions");
  return r;
}

/* What writing needs beyond reading: refusals of what cannot be written
 * safely, the persistent bitmaps, the refcounts (repaired if the image
 * was left dirty), the list of metadata regions, the allocator and the
 * write state.  Nothing is written yet (but the repair of a dirty
 * image): see meta/first-change.h.  FIRST is the first cluster as read
 * (FIRST_LEN bytes), SNAPSHOTS the snapshot table or NULL.
 */
static int
open_for_writing (struct qcow2_image *img, struct qcow2_io *io,
                  const uint8_t *first, size_t first_len,
                  const struct qcow2_snapshot_table *snapshots)
{
  const struct qcow2_header *h = &img->header;
  int r;

  if (io->pwrite == NULL || io->flush == NULL) {
    qcow2_error (img, "the storage underneath cannot be written");
    return -EROFS;
  }
  if (img->serving_snapshot) {
    qcow2_error (img, "qcow2-snapshot: a snapshot is served read-only");
    return -EROFS;
  }
  if (img->opts.compress && qcow2_image_encrypted (img)) {
    /* qemu-img convert -c's refusal, in its words. */
    qcow2_error (img, "qcow2-compress: Compression and encryption not "
                 "supported at the same time");
    return -EINVAL;
  }
  if (h->incompatible_features & QCOW2_INCOMPAT_CORRUPT) {
    qcow2_error (img, "incompatible_features: the image is marked corrupt "
                 "and cannot be written; check it with qemu-img check -r "
                 "or serve it read-only (nbdkit -r)");
    return -EROFS;
  }
  /* qemu writes neither compressed clusters nor internal snapshots into
   * an image with an external data file: the data file has no room for
   * the one, and no refcounts to share clusters for the other.
   */
  if (img->data_file && img->opts.compress) {
    qcow2_error (img, "qcow2-compress: an image with an external data file "
                 "cannot hold compressed clusters (qemu refuses them too)");
    return -EINVAL;
  }
  if (qcow2_data_file_raw (img) && img->backing) {
    /* qemu-img create's refusal, in its words: the raw data file could
     * not hold what the backing file shows through.
     */
    qcow2_error (img, "data_file_raw: Backing file and data-file-raw "
                 "cannot be used at the same time");
    return -EINVAL;
  }
  if (img->data_file && h->nb_snapshots) {
    qcow2_error (img, "snapshots: an image with an external data file and "
                 "internal snapshots (%" PRIu32 ") cannot be written: its "
                 "data clusters have no refcounts to share them; serve it "
                 "read-only (nbdkit -r)", h->nb_snapshots);
    return -EROFS;
  }
  if (img->opts.lazy_refcounts && h->version < 3) {
    /* qemu refuses lazy_refcounts=on for such an image, in these words. */
    qcow2_error (img, "qcow2-lazy-refcounts: Lazy refcounts require a qcow2 "
                 "image with at least qemu 1.1 compatibility level (this "
                 "image is version %u; qemu-img amend -o compat=1.1 "
                 "upgrades it)", h->version);
    return -EINVAL;
  }

  /* An image left dirty (lazy refcounts) is repaired first, as qemu
   * repairs it when it opens it for writing.
   */
  r = qcow2_bitmaps_open (img, io, first, first_len);
  if (r == 0)
    r = h->incompatible_features & QCOW2_INCOMPAT_DIRTY
      ? qcow2_repair_refcounts (img, io, snapshots)
      : qcow2_refcount_load (img, io);
  if (r == 0)
    r = build_regions (img, snapshots);
  if (r == 0)
    r = qcow2_bitmaps_check (img, io);
  if (r == 0)
    r = qcow2_alloc_init (img);
  if (r == 0)
    r = qcow2_dirty_open (img);
  if (r == 0)
    r = qcow2_writeback_open (img);
  if (r == 0)
    r = qcow2_scratch_open (img);
  if (r == 0 && img->opts.compress)
    r = qcow2_compress_open (img);
  if (r == 0 && img->opts.compress)
    r = qcow2_dedup_init (img);
  if (r < 0)
    return r;
  qcow2_first_change_arm (img);
  return 0;
}

/* Read the snapshot table (qemu refuses an image whose table is bad),
 * list it in the debug output and, with opts.snapshot, make the chosen
 * snapshot's L1 table the one served: the reads then see the snapshot,
 * at the active disk's virtual size (as qemu-img convert -l does).  The
 * table goes to *TABLEP (NULL without snapshots) for the rest of the
 * open.
 */
static int
open_snapshots (struct qcow2_image *img, struct qcow2_io *io,
                struct qcow2_snapshot_table **tablep)
{
  struct qcow2_header *h = &img->header;
  const struct qcow2_snapshot_image im = {
    .version = h->version, .cluster_bits = h->cluster_bits,
    .virtual_size = h->virtual_size, .file_size = img->file_size,
    .nb_snapshots = h->nb_snapshots, .snapshots_offset = h->snapshots_offset,
  };
  struct qcow2_snapshot_table *table = NULL;
  const struct qcow2_snapshot *sn;
  size_t len = qcow2_snapshot_table_read_hint (&im), needed = 0;
  uint8_t *buf = NULL;
  char err[768], line[512];
  uint32_t i;
  int r;

  *tablep = NULL;
  if (img->opts.snapshot == NULL && h->nb_snapshots == 0)
    return 0;
  for (;;) {
    uint8_t *more = realloc (buf, len ? len : 1);
    if (more == NULL) {
      qcow2_error (img, "out of memory for the snapshot table");
      r = -ENOMEM;
      goto out;
    }
    buf = more;
    r = len ? qcow2_pread_clamped (img, io, buf, len, h->snapshots_offset) : 0;
    if (r < 0)
      goto out;
    r = qcow2_snapshot_table_parse (buf, len, &im, &table, &needed,
                                    err, sizeof err);
    if (r != 1)
      break;
    len = needed;
  }
  if (r == -1) {
    qcow2_error (img, "invalid or unsupported qcow2 image: %s", err);
    r = -EINVAL;
    goto out;
  }
  for (i = 0; i < table->count; ++i) {
    qcow2_snapshot_describe (&table->snapshots[i], line, sizeof line);
    qcow2_debug (img, "snapshot %s", line);
  }
  /* Writing keeps every snapshot's L1 table in the list of metadata
   * regions, one entry a cluster: one too large or outside the file (as
   * qemu-img check reports it) is refused for writing, before it costs
   * memory in proportion to what a hostile header claims.
   */
  for (i = 0; img->opts.writable && i < table->count; ++i)
    if (qcow2_snapshot_check (&table->snapshots[i], &im, err,
                              sizeof err) == -1) {
      qcow2_error (img, "invalid or unsupported qcow2 image: %s; it can be "
                   "served read-only (nbdkit -r)", err);
      r = -EINVAL;
      goto out;
    }
  r = 0;
  if (img->opts.snapshot == NULL)
    goto out;

  sn = qcow2_snapshot_select (table, img->opts.snapshot, err, sizeof err);
  if (sn == NULL ||
      qcow2_snapshot_check (sn, &im, err, sizeof err) == -1) {
    qcow2_error (img, "qcow2-snapshot: %s", err);
    r = sn ? -EINVAL : -ENOENT;
    goto out;
  }
  qcow2_snapshot_describe (sn, line, sizeof line);
  qcow2_debug (img, "serving snapshot %s, read-only, at the image's virtual "
               "size %" PRIu64, line, h->virtual_size);
  h->l1_size = sn->l1_size;
  h->l1_table_offset = sn->l1_table_offset;
  img->serving_snapshot = true;

 out:
  if (r == 0)
    *tablep = table;
  else
    qcow2_snapshot_table_free (table);
  free (buf);
  return r;
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

int
qcow2_image_open (struct qcow2_io *io, const struct qcow2_log *log,
                  const struct qcow2_options *opts,
                  struct qcow2_image **imagep)
{
  struct qcow2_image *img;
  struct qcow2_snapshot_table *snapshots = NULL;
  uint8_t *first = NULL;
  size_t first_len;
  int64_t size;
  char err[768];
  int r;

  *imagep = NULL;
  img = calloc (1, sizeof *img);
  if (img == NULL)
    return -ENOMEM;
  if (log)
    img->log = *log;
  img->opts = *opts;
  /* Held only briefly, by many readers at once: a writer waiting for it
   * goes before readers that come after it (base/lockorder.h).
   */
  qcow2_rwlock_init (&img->lock, QCOW2_RANK_IMAGE, "the image lock");
  qcow2_mutex_init (&img->first_change_lock, QCOW2_RANK_FIRST_CHANGE,
                    "the first change's lock");
  qcow2_inflight_init (&img->inflight);

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
  if (img->header.incompatible_features & QCOW2_INCOMPAT_DATA_FILE) {
    r = qcow2_data_file_open (img, first, first_len);
    if (r < 0)
      goto fail;
  }
  else if (opts->data_file_path) {
    /* qemu's refusal, in its words. */
    qcow2_error (img, "qcow2-data-file: 'data-file' can only be set for "
                 "images with an external data file");
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
  r = qcow2_crypt_open (img, io, first, first_len);
  if (r < 0)
    goto fail;
  /* qemu too takes a secret for an image that has no use for it. */
  if (opts->passphrase && !qcow2_image_encrypted (img) &&
      opts->backing_depth == 0)
    qcow2_debug (img, "qcow2-passphrase: the image is not encrypted: "
                 "the passphrase is not used");

  qcow2_debug (img, "qcow2 v%u, cluster size %u, virtual size %" PRIu64
               ", %s compression, L1 %u entries at 0x%" PRIx64
               ", file size %" PRIu64 ", %u snapshot(s)%s%s%s",
               img->header.version, img->header.cluster_size,
               img->header.virtual_size,
               qcow2_compression_name (img->header.compression_type),
               img->header.l1_size, img->header.l1_table_offset,
               img->file_size, img->header.nb_snapshots,
               qcow2_image_encrypted (img) ? ", LUKS-encrypted" : "",
               img->header.incompatible_features & QCOW2_INCOMPAT_DIRTY
               ? ", dirty" : "",
               img->header.incompatible_features & QCOW2_INCOMPAT_CORRUPT
               ? ", marked corrupt" : "");

  r = open_snapshots (img, io, &snapshots);
  if (r == 0)
    r = qcow2_map_open (img, io, opts->l2_cache_size);
  if (r < 0)
    goto fail;
  img->cluster_cache = qcow2_cache_new_admitting (img->header.cluster_size,
                                                  opts->cluster_cache_size);
  if (img->cluster_cache == NULL) {
    qcow2_error (img, "out of memory for the cluster cache");
    r = -ENOMEM;
    goto fail;
  }

  if (opts->writable) {
    r = open_for_writing (img, io, first, first_len, snapshots);
    if (r < 0)
      goto fail;
  }
  free (first);
  first = NULL;
  qcow2_snapshot_table_free (snapshots);
  snapshots = NULL;
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
  qcow2_snapshot_table_free (snapshots);
  qcow2_image_close (img);
  return r;
}

void
qcow2_image_close (struct qcow2_image *img)
{
  if (img == NULL)
    return;
  qcow2_compress_free (img);
  qcow2_dedup_free (img);
  qcow2_scratch_close (img);
  qcow2_writeback_close (img);
  qcow2_dirty_close (img);
  qcow2_alloc_free (img);
  qcow2_regions_close (img);
  qcow2_bitmaps_free (img);
  qcow2_refcount_free (img);
  qcow2_cache_free (img->cluster_cache);
  qcow2_map_close (img);
  qcow2_crypt_close (img);
  qcow2_backing_close (img);
  qcow2_data_file_close (img);
  qcow2_inflight_destroy (&img->inflight);
  qcow2_rwlock_destroy (&img->lock);
  qcow2_mutex_destroy (&img->first_change_lock);
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
qcow2_image_stop_background (struct qcow2_image *img)
{
  atomic_store (&img->background_stopped, true);
  while (atomic_load (&img->background_reads) > 0)
    nanosleep (&(struct timespec) { .tv_nsec = 1000000 }, NULL);
}

void
qcow2_image_get_stats (struct qcow2_image *img, struct qcow2_stats *stats)
{
  struct qcow2_cache_stats cs;

  memset (stats, 0, sizeof *stats);
  stats->clusters_decompressed =
    atomic_load (&img->counters.clusters_decompressed);
  stats->bytes_read_underneath =
    atomic_load (&img->counters.bytes_read_underneath);
  stats->reads_underneath = atomic_load (&img->counters.reads_underneath);
  stats->reads_fetched_ahead =
    atomic_load (&img->counters.reads_fetched_ahead);
  stats->fetches_in_background =
    atomic_load (&img->counters.fetches_in_background);
  qcow2_cache_get_stats (img->cluster_cache, &cs);
  stats->cluster_cache_hits = cs.hits;
  stats->cluster_cache_misses = cs.misses;
  stats->cluster_cache_evictions = cs.evictions;
  stats->cluster_cache_refused = cs.refused;
  qcow2_l2_cache_stats (img, &cs);
  stats->l2_cache_hits = cs.hits;
  stats->l2_cache_misses = cs.misses;
  stats->l2_cache_evictions = cs.evictions;
}
