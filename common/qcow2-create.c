/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: formatting storage as a new qcow2 image.
 *
 * Layout, as qemu-img create lays out a new image: the header in cluster
 * 0, the refcount table from cluster 1, the L1 table after it.  The
 * refcount blocks are made by the ordinary allocator when the metadata
 * clusters are counted, so there is one code path for refcounts.
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
#include "qcow2-alloc.h"
#include "qcow2-endian.h"
#include "qcow2-hostio.h"
#include "qcow2-writeback.h"

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

int
qcow2_create (struct qcow2_io *io, const struct qcow2_log *log,
              const struct qcow2_create_options *create,
              const struct qcow2_options *opts, struct qcow2_image **imagep)
{
  const uint32_t bits = create->cluster_bits;
  const uint64_t cluster_size = UINT64_C (1) << bits;
  uint64_t l2_coverage, l1_size, l1_clusters, rt_entries, rt_clusters;
  uint64_t host_clusters, meta_clusters, c, pos;
  uint8_t *buf = NULL;
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
  /* The metadata, a refcount block, and one cluster of data at least. */
  if (!opts->growable && host_clusters < meta_clusters + 2) {
    snprintf (msg, sizeof msg, "qcow2-create: the device (%" PRId64
              " bytes) is too small for the image's metadata (%" PRIu64
              " bytes at least); make it larger (for a file: truncate -s "
              "SIZE FILE)", device_size, (meta_clusters + 2) << bits);
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

  /* Clear the refcount table and L1 table, make that durable, and only
   * then write the header that gives them meaning.  Clusters that read
   * as zeros already are left alone: on a sparse file, writing them
   * would allocate space that holds nothing.  Storage that grows reads
   * as zeros past its end: it only has to reach the end of the tables,
   * which its last sector does, leaving a hole before it.
   */
  for (c = 1; c < meta_clusters; ++c) {
    if (((c + 1) << bits) > (uint64_t) device_size && opts->growable)
      break;
    if (((c + 1) << bits) <= (uint64_t) device_size) {
      r = io->pread (io->opaque, buf, cluster_size, c << bits);
      if (r < 0) {
        create_error (log, "qcow2-create: cannot read the device");
        goto out;
      }
      if (all_zero (buf, cluster_size))
        continue;
    }
    memset (buf, 0, cluster_size);
    r = io->pwrite (io->opaque, buf, cluster_size, c << bits);
    if (r < 0)
      goto write_failed;
  }
  memset (buf, 0, cluster_size);
  if (opts->growable && (meta_clusters << bits) > (uint64_t) device_size) {
    r = io->pwrite (io->opaque, buf, HEADER_WRITE_BYTES,
                    (meta_clusters << bits) - HEADER_WRITE_BYTES);
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
  pthread_rwlock_wrlock (&img->lock);
  for (pos = 0; pos < meta_clusters && r == 0; ++pos)
    r = qcow2_alloc_reference (img, io, pos);
  pthread_rwlock_unlock (&img->lock);
  if (r == 0)
    r = qcow2_flush (img, io);
  if (r < 0) {
    qcow2_image_close (img);
    goto out;
  }
  qcow2_debug (img, "created a qcow2 v3 image: virtual size %" PRIu64
               ", cluster size %" PRIu64 ", %s, %" PRIu64 " bytes of "
               "metadata, room for %" PRIu64 " clusters",
               create->virtual_size, cluster_size,
               create->compression_type == QCOW2_COMPRESSION_ZSTD
               ? "zstd" : "zlib",
               meta_clusters << bits, host_clusters - meta_clusters);
  *imagep = img;
  r = 0;
  goto out;

 write_failed:
  create_error (log, "qcow2-create: writing the new image failed");
 out:
  free (buf);
  return r;
}
