/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: formatting storage as a new qcow2 image.
 *
 * Layout: the header in cluster 0, the refcount table from cluster 1,
 * the L1 table after it, for a LUKS-encrypted image the LUKS area (after
 * the L1 table, as qemu-img puts it), then the refcount blocks that count
 * all of these (one, but for huge L1 tables in small clusters).
 *
 * The header is the commit point.  Everything else the empty image
 * needs is written and flushed first, and the header after it, then
 * flushed: a crash at any moment leaves either a device whose first
 * cluster is still all zeros (so that qcow2-create can run again) or a
 * whole, valid image.
 *
 * Implements qcow2_create_validate and qcow2_create (qcow2.h, the
 * contract).
 */

#include <config.h>

#include "qcow2.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/keycache.h"
#include "base/zeros.h"
#include "format/codec.h"
#include "format/crypto.h"
#include "format/header.h"
#include "format/endian.h"
#include "format/luks.h"
#include "meta/image.h"
#include "meta/log.h"

/* qemu 7.2 writes 112-byte v3 headers: 104 + compression type + padding. */
#define CREATE_HEADER_LENGTH 112
/* The header and the end-of-extensions marker after it fit one sector,
 * the smallest cluster there is.
 */
#define HEADER_WRITE_BYTES 512
/* The master key of aes-256-xts-plain64, the cipher of new LUKS images:
 * two 256-bit keys.
 */
#define CREATE_KEY_BYTES 64

static void
create_error (const struct qcow2_log *log, const char *msg)
{
  if (log && log->error)
    log->error (log->opaque, msg);
}

int
qcow2_create_validate (const struct qcow2_create_options *create,
                       char *errbuf, size_t errlen)
{
  const uint32_t bits = create->cluster_bits;
  uint64_t l2_coverage, l1_size;

  if (bits < QCOW2_MIN_CLUSTER_BITS || bits > QCOW2_MAX_CLUSTER_BITS) {
    snprintf (errbuf, errlen, "qcow2-cluster-size: must be a power of 2 "
              "from 512 bytes to 2 MiB");
    return -1;
  }
  l2_coverage = (UINT64_C (1) << bits) / 8 << bits;
  if (create->virtual_size > INT64_MAX - l2_coverage) {
    snprintf (errbuf, errlen, "qcow2-create: the virtual size is too large");
    return -1;
  }
  l1_size = (create->virtual_size + l2_coverage - 1) / l2_coverage;
  if (l1_size * 8 > QCOW2_MAX_L1_BYTES) {
    snprintf (errbuf, errlen, "qcow2-create: a virtual size of %" PRIu64
              " bytes needs an L1 table over 32 MiB with %" PRIu64
              "-byte clusters; use a larger qcow2-cluster-size",
              create->virtual_size, UINT64_C (1) << bits);
    return -1;
  }
  return 0;
}

/* Where a new image's clusters go. */
struct layout {
  uint32_t bits;
  uint64_t rt_clusters;         /* the refcount table, from cluster 1 */
  uint64_t meta_clusters;       /* the metadata ends here ... */
  uint64_t rb_clusters;         /* ... and these refcount blocks follow */
  uint64_t total_clusters;
  const uint8_t *area;          /* a LUKS area, or NULL */
  size_t area_len;
  uint64_t area_first;          /* its first cluster */
};

/* Lay out the metadata: META_CLUSTERS of it, and the refcount blocks,
 * which count themselves too.
 */
static void
lay_out (struct layout *l, uint64_t meta_clusters)
{
  uint64_t refs_per_block = (UINT64_C (1) << l->bits) / 2;

  l->meta_clusters = meta_clusters;
  l->rb_clusters = (meta_clusters + refs_per_block - 2) / (refs_per_block - 1);
  l->total_clusters = meta_clusters + l->rb_clusters;
}

/* Does the device hold the metadata, its refcount blocks, and one
 * cluster of data at least?  0, or -ENOSPC after saying how much it
 * needs.
 */
static int
check_room (const struct qcow2_log *log, const struct qcow2_options *opts,
            int64_t device_size, uint64_t host_clusters,
            const struct layout *l)
{
  const char *file = opts->room_file;
  char msg[4608];

  if (opts->growable || host_clusters >= l->total_clusters + 1)
    return 0;
  snprintf (msg, sizeof msg, "qcow2-create: the device (%" PRId64
            " bytes) is too small for the image's metadata (%" PRIu64
            " bytes at least); make it larger%s%s%s", device_size,
            (l->total_clusters + 1) << l->bits,
            file ? " (truncate -s SIZE " : "", file ? file : "",
            file ? ")" : "");
  create_error (log, msg);
  return -ENOSPC;
}

/* Fill BUF with new cluster C of the image L lays out.  Returns false if
 * it is all zeros.
 */
static bool
create_cluster (uint8_t *buf, uint64_t c, const struct layout *l)
{
  const uint32_t bits = l->bits;
  const uint64_t rt_clusters = l->rt_clusters;
  const uint64_t meta_clusters = l->meta_clusters;
  const uint64_t rb_clusters = l->rb_clusters;
  const uint64_t cluster_size = UINT64_C (1) << bits;
  const uint64_t refs_per_block = cluster_size / 2;
  const uint64_t total_clusters = meta_clusters + rb_clusters;
  bool data = false;
  uint64_t first, i;

  memset (buf, 0, cluster_size);
  if (l->area && c >= l->area_first &&
      ((c - l->area_first) << bits) < l->area_len) {
    /* The LUKS area, and zeros to the end of its last cluster. */
    uint64_t done = (c - l->area_first) << bits;
    uint64_t n = l->area_len - done < cluster_size ? l->area_len - done
      : cluster_size;
    memcpy (buf, l->area + done, n);
    data = true;
  }
  if (c >= 1 && c < 1 + rt_clusters) {
    /* Table entries [first, ...) point at the blocks. */
    first = (c - 1) * (cluster_size / 8);
    for (i = first; i < rb_clusters && i < first + cluster_size / 8; ++i) {
      put_be64 (buf + 8 * (i - first), (meta_clusters + i) << bits);
      data = true;
    }
  }
  else if (c >= meta_clusters && c < total_clusters) {
    /* Block j counts clusters [j * refs_per_block, ...): one reference
     * each for those of the new image.
     */
    first = (c - meta_clusters) * refs_per_block;
    for (i = first; i < total_clusters && i < first + refs_per_block; ++i) {
      buf[2 * (i - first) + 1] = 1;     /* big-endian 16-bit 1 */
      data = true;
    }
  }
  return data;
}

int
qcow2_create (struct qcow2_io *io, const struct qcow2_log *log,
              const struct qcow2_create_options *create,
              const struct qcow2_options *opts, struct qcow2_image **imagep)
{
  const uint32_t bits = create->cluster_bits;
  const uint64_t cluster_size = UINT64_C (1) << bits;
  uint64_t l2_coverage, l1_size, l1_clusters, rt_entries, rt_clusters;
  uint64_t host_clusters, c;
  struct layout lay = { .bits = bits };
  uint8_t *buf = NULL, *skip = NULL, *area = NULL;
  size_t area_len = 0;
  uint8_t master_key[QCOW2_CRYPTO_MAX_KEY_BYTES];
  struct qcow2_key_cache *own_cache = NULL;
  struct qcow2_options open_opts = *opts;
  char msg[512];
  int64_t device_size;
  struct qcow2_image *img = NULL;
  struct qcow2_header header;
  size_t ext_pos;
  int r;

  *imagep = NULL;
  if (qcow2_create_validate (create, msg, sizeof msg) == -1) {
    create_error (log, msg);
    return -EINVAL;
  }
  l2_coverage = cluster_size / 8 * cluster_size;
  l1_size = (create->virtual_size + l2_coverage - 1) / l2_coverage;
  l1_clusters = (l1_size * 8 + cluster_size - 1) / cluster_size;

  device_size = io->size (io->opaque);
  if (device_size < 0) {
    create_error (log, "qcow2-create: cannot get the size of the device");
    return (int) device_size;
  }
  host_clusters = (uint64_t) device_size >> bits;
  /* Storage that grows gets a table for the whole disk and then some. */
  if (opts->growable) {
    uint64_t disk_clusters = create->virtual_size >> bits;
    if (host_clusters < disk_clusters + disk_clusters / 8 + 64)
      host_clusters = disk_clusters + disk_clusters / 8 + 64;
  }
  /* One table entry per refcount block of 16-bit refcounts. */
  rt_entries = (host_clusters + cluster_size / 2 - 1) / (cluster_size / 2) + 1;
  rt_clusters = (rt_entries * 8 + cluster_size - 1) / cluster_size;
  lay.rt_clusters = rt_clusters;
  lay_out (&lay, 1 + rt_clusters + l1_clusters);
  r = check_room (log, opts, device_size, host_clusters, &lay);
  if (r < 0)
    return r;

  buf = calloc (1, cluster_size);
  if (buf == NULL)
    return -ENOMEM;
  r = io->pread (io->opaque, buf, cluster_size, 0);
  if (r < 0) {
    create_error (log, "qcow2-create: cannot read the first cluster of the "
                  "device");
    goto out;
  }
  if (!qcow2_all_zero (buf, cluster_size)) {
    create_error (log, "qcow2-create: the first cluster of the device is not "
                  "all zeros (it may hold an image or a filesystem); refusing "
                  "to format it");
    r = -EEXIST;
    goto out;
  }

  /* A LUKS image's area: its header and key slot 0.  Making it runs
   * PBKDF2 for iter-time, so it comes after the checks that need no time.
   */
  if (create->encrypt) {
    struct qcow2_luks_create_params params = {
      .iter_time_ms = create->iter_time_ms,
    };
    if (opts->passphrase == NULL) {
      create_error (log, "qcow2-encrypt-format: a LUKS image needs its "
                    "passphrase: qcow2-passphrase=SECRET");
      r = -EINVAL;
      goto out;
    }
    if (qcow2_luks_create (&params, opts->passphrase,
                           strlen (opts->passphrase), &area, &area_len,
                           master_key, msg, sizeof msg) == -1) {
      create_error (log, msg);
      r = -EINVAL;
      goto out;
    }
    lay.area = area;
    lay.area_len = area_len;
    lay.area_first = lay.meta_clusters;
    lay_out (&lay, lay.meta_clusters + (area_len + cluster_size - 1) / cluster_size);
    r = check_room (log, opts, device_size, host_clusters, &lay);
    if (r < 0)
      goto out;
  }

  /* The refcount table, the L1 table and the refcount blocks, made
   * durable before the header that gives them meaning.  Clusters that
   * are to hold zeros and read as zeros already are left alone: on a
   * sparse file, writing them would allocate space that holds nothing.
   * Storage that grows reads as zeros past its end: it only has to reach
   * the end of the tables, which their last sector does if their last
   * cluster holds nothing, leaving a hole before it.  Every read comes
   * before the first write, so that a device that cannot be read is left
   * as it was.
   */
  skip = calloc (lay.total_clusters, 1);
  if (skip == NULL) {
    r = -ENOMEM;
    goto out;
  }
  for (c = 1; c < lay.total_clusters; ++c) {
    if (create_cluster (buf, c, &lay))
      continue;
    if (((c + 1) << bits) <= (uint64_t) device_size) {
      r = io->pread (io->opaque, buf, cluster_size, c << bits);
      if (r < 0) {
        create_error (log, "qcow2-create: cannot read the device");
        goto out;
      }
      skip[c] = qcow2_all_zero (buf, cluster_size);
    }
    else if (opts->growable && (c << bits) >= (uint64_t) device_size)
      skip[c] = 1;
  }
  for (c = 1; c < lay.total_clusters; ++c) {
    if (skip[c])
      continue;
    create_cluster (buf, c, &lay);
    r = io->pwrite (io->opaque, buf, cluster_size, c << bits);
    if (r < 0)
      goto write_failed;
  }
  memset (buf, 0, cluster_size);
  if (opts->growable && skip[lay.total_clusters - 1] &&
      (lay.total_clusters << bits) > (uint64_t) device_size) {
    r = io->pwrite (io->opaque, buf, HEADER_WRITE_BYTES,
                    (lay.total_clusters << bits) - HEADER_WRITE_BYTES);
    if (r < 0)
      goto write_failed;
  }
  r = io->flush (io->opaque);
  if (r < 0)
    goto write_failed;

  header = (struct qcow2_header) {
    .version = 3, .cluster_bits = bits, .virtual_size = create->virtual_size,
    .crypt_method = create->encrypt ? QCOW2_CRYPT_LUKS : QCOW2_CRYPT_NONE,
    .l1_size = l1_size,
    .l1_table_offset = l1_size ? (1 + rt_clusters) << bits : 0,
    .refcount_table_offset = cluster_size,
    .refcount_table_clusters = rt_clusters,
    .incompatible_features =
      create->compression_type == QCOW2_COMPRESSION_ZSTD
      ? QCOW2_INCOMPAT_COMPRESSION : 0,
    .refcount_order = 4, .header_length = CREATE_HEADER_LENGTH,
    .compression_type = create->compression_type,
  };
  ext_pos = qcow2_header_build (&header, buf, HEADER_WRITE_BYTES);
  if (create->encrypt) {
    uint8_t crypto_ext[16];

    put_be64 (crypto_ext, lay.area_first << bits);
    put_be64 (crypto_ext + 8, area_len);
    qcow2_header_put_extension (buf, HEADER_WRITE_BYTES, &ext_pos,
                                QCOW2_EXT_CRYPTO, crypto_ext,
                                sizeof crypto_ext);
  }
  /* The rest of the first cluster was checked to be zeros above. */
  r = io->pwrite (io->opaque, buf, HEADER_WRITE_BYTES, 0);
  if (r == 0)
    r = io->flush (io->opaque);
  if (r < 0)
    goto write_failed;

  /* The new image opens with the key just made, not with a second run
   * of PBKDF2: through the caller's key cache, or one of its own.
   */
  if (create->encrypt) {
    if (open_opts.key_cache == NULL &&
        (open_opts.key_cache = own_cache = qcow2_key_cache_new ()) == NULL) {
      r = -ENOMEM;
      goto out;
    }
    qcow2_key_cache_put (open_opts.key_cache, area, area_len,
                         opts->passphrase, master_key, CREATE_KEY_BYTES);
  }
  r = qcow2_image_open (io, log, &open_opts, &img);
  if (r < 0)
    goto out;
  img->opts.key_cache = opts->key_cache;
  qcow2_debug (img, "created a qcow2 v3 image: virtual size %" PRIu64
               ", cluster size %" PRIu64 ", %s%s, %" PRIu64 " bytes of "
               "metadata, room for %" PRIu64 " clusters",
               create->virtual_size, cluster_size,
               qcow2_compression_name (create->compression_type),
               create->encrypt ? ", LUKS-encrypted (aes-256-xts-plain64)" : "",
               lay.total_clusters << bits, host_clusters - lay.total_clusters);
  *imagep = img;
  r = 0;
  goto out;

 write_failed:
  create_error (log, "qcow2-create: writing the new image failed");
 out:
  qcow2_key_cache_free (own_cache);
  qcow2_wipe (master_key, sizeof master_key);
  free (area);
  free (skip);
  free (buf);
  return r;
}
