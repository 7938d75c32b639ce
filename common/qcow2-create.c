/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: formatting storage as a new qcow2 image.
 *
 * Layout: the header in cluster 0, the refcount table from cluster 1,
 * the L1 table after it, then the refcount blocks that count all of
 * these (one, but for huge L1 tables in small clusters).
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

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2-types.h"
#include "qcow2-endian.h"
#include "qcow2-hostio.h"

/* qemu 7.2 writes 112-byte v3 headers: 104 + compression type + padding. */
#define CREATE_HEADER_LENGTH 112
/* The header and the end-of-extensions marker after it fit one sector,
 * the smallest cluster there is.
 */
#define HEADER_WRITE_BYTES 512

static void
create_error (const struct qcow2_log *log, const char *msg)
{
  if (log && log->error)
    log->error (log->opaque, msg);
}

static bool
all_zero (const uint8_t *p, size_t len)
{
  return len == 0 || (p[0] == 0 && memcmp (p, p + 1, len - 1) == 0);
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

/* Fill BUF with new cluster C of an image whose refcount table has
 * RT_CLUSTERS clusters from cluster 1, whose metadata ends at
 * META_CLUSTERS, where RB_CLUSTERS refcount blocks follow.  Returns
 * false if it is all zeros.
 */
static bool
create_cluster (uint8_t *buf, uint64_t c, uint32_t bits, uint64_t rt_clusters,
                uint64_t meta_clusters, uint64_t rb_clusters)
{
  const uint64_t cluster_size = UINT64_C (1) << bits;
  const uint64_t refs_per_block = cluster_size / 2;
  const uint64_t total_clusters = meta_clusters + rb_clusters;
  bool data = false;
  uint64_t first, i;

  memset (buf, 0, cluster_size);
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
  uint64_t host_clusters, meta_clusters, c;
  uint64_t refs_per_block, rb_clusters, total_clusters;
  uint8_t *buf = NULL, *skip = NULL;
  char msg[512];
  int64_t device_size;
  struct qcow2_image *img = NULL;
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
  meta_clusters = 1 + rt_clusters + l1_clusters;
  /* The refcount blocks count themselves too. */
  refs_per_block = cluster_size / 2;
  rb_clusters = (meta_clusters + refs_per_block - 2) / (refs_per_block - 1);
  total_clusters = meta_clusters + rb_clusters;
  /* The metadata, its refcount blocks, and one cluster of data at least. */
  if (!opts->growable && host_clusters < total_clusters + 1) {
    snprintf (msg, sizeof msg, "qcow2-create: the device (%" PRId64
              " bytes) is too small for the image's metadata (%" PRIu64
              " bytes at least); make it larger (for a file: truncate -s "
              "SIZE FILE)", device_size, (total_clusters + 1) << bits);
    create_error (log, msg);
    return -ENOSPC;
  }

  buf = calloc (1, cluster_size);
  if (buf == NULL)
    return -ENOMEM;
  r = io->pread (io->opaque, buf, cluster_size, 0);
  if (r < 0) {
    create_error (log, "qcow2-create: cannot read the first cluster of the "
                  "device");
    goto out;
  }
  if (!all_zero (buf, cluster_size)) {
    create_error (log, "qcow2-create: the first cluster of the device is not "
                  "all zeros (it may hold an image or a filesystem); refusing "
                  "to format it");
    r = -EEXIST;
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
  skip = calloc (total_clusters, 1);
  if (skip == NULL) {
    r = -ENOMEM;
    goto out;
  }
  for (c = 1; c < total_clusters; ++c) {
    if (create_cluster (buf, c, bits, rt_clusters, meta_clusters,
                        rb_clusters))
      continue;
    if (((c + 1) << bits) <= (uint64_t) device_size) {
      r = io->pread (io->opaque, buf, cluster_size, c << bits);
      if (r < 0) {
        create_error (log, "qcow2-create: cannot read the device");
        goto out;
      }
      skip[c] = all_zero (buf, cluster_size);
    }
    else if (opts->growable && (c << bits) >= (uint64_t) device_size)
      skip[c] = 1;
  }
  for (c = 1; c < total_clusters; ++c) {
    if (skip[c])
      continue;
    create_cluster (buf, c, bits, rt_clusters, meta_clusters, rb_clusters);
    r = io->pwrite (io->opaque, buf, cluster_size, c << bits);
    if (r < 0)
      goto write_failed;
  }
  memset (buf, 0, cluster_size);
  if (opts->growable && skip[total_clusters - 1] &&
      (total_clusters << bits) > (uint64_t) device_size) {
    r = io->pwrite (io->opaque, buf, HEADER_WRITE_BYTES,
                    (total_clusters << bits) - HEADER_WRITE_BYTES);
    if (r < 0)
      goto write_failed;
  }
  r = io->flush (io->opaque);
  if (r < 0)
    goto write_failed;

  put_be32 (buf + 0, QCOW2_MAGIC);
  put_be32 (buf + 4, 3);
  put_be32 (buf + 20, bits);
  put_be64 (buf + 24, create->virtual_size);
  put_be32 (buf + 36, l1_size);
  put_be64 (buf + 40, l1_size ? (1 + rt_clusters) << bits : 0);
  put_be64 (buf + 48, cluster_size);
  put_be32 (buf + 56, rt_clusters);
  put_be64 (buf + 72, create->compression_type == QCOW2_COMPRESSION_ZSTD
            ? QCOW2_INCOMPAT_COMPRESSION : 0);
  put_be32 (buf + 96, 4);
  put_be32 (buf + 100, CREATE_HEADER_LENGTH);
  buf[104] = create->compression_type;
  /* The rest of the first cluster was checked to be zeros above. */
  r = io->pwrite (io->opaque, buf, HEADER_WRITE_BYTES, 0);
  if (r == 0)
    r = io->flush (io->opaque);
  if (r < 0)
    goto write_failed;

  r = qcow2_image_open (io, log, opts, &img);
  if (r < 0)
    goto out;
  qcow2_debug (img, "created a qcow2 v3 image: virtual size %" PRIu64
               ", cluster size %" PRIu64 ", %s, %" PRIu64 " bytes of "
               "metadata, room for %" PRIu64 " clusters",
               create->virtual_size, cluster_size,
               create->compression_type == QCOW2_COMPRESSION_ZSTD
               ? "zstd" : "zlib",
               total_clusters << bits, host_clusters - total_clusters);
  *imagep = img;
  r = 0;
  goto out;

 write_failed:
  create_error (log, "qcow2-create: writing the new image failed");
 out:
  free (skip);
  free (buf);
  return r;
}
