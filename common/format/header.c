/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: header parsing and validation. */

#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "format/header.h"
#include "format/errbuf.h"
#include "format/luks.h"
#include "format/endian.h"


/* Byte offsets of the header fields (qcow2.txt). */
enum {
  OFF_MAGIC = 0, OFF_VERSION = 4, OFF_BACKING_OFFSET = 8,
  OFF_BACKING_SIZE = 16, OFF_CLUSTER_BITS = 20, OFF_SIZE = 24,
  OFF_CRYPT = 32, OFF_L1_SIZE = 36, OFF_L1_OFFSET = 40,
  OFF_REFTABLE_OFFSET = 48,
  OFF_REFTABLE_CLUSTERS = 56,
  OFF_NB_SNAPSHOTS = 60, OFF_SNAPSHOTS_OFFSET = 64,
  OFF_INCOMPAT = 72, OFF_COMPAT = 80, OFF_AUTOCLEAR = 88,
  OFF_REFCOUNT_ORDER = 96, OFF_HEADER_LENGTH = 100,
  OFF_COMPRESSION_TYPE = 104,
  V2_HEADER_LENGTH = 72, V3_MIN_HEADER_LENGTH = 104,
};

void
qcow2_header_field (const struct qcow2_header *h,
                    enum qcow2_header_field field,
                    struct qcow2_field_bytes *out)
{
  switch (field) {
  case QCOW2_FIELD_REFCOUNT_TABLE:
    out->offset = OFF_REFTABLE_OFFSET;
    out->len = 12;
    put_be64 (out->bytes, h->refcount_table_offset);
    put_be32 (out->bytes + 8, h->refcount_table_clusters);
    _Static_assert (OFF_REFTABLE_CLUSTERS == OFF_REFTABLE_OFFSET + 8,
                    "the refcount table's fields are written together");
    return;
  case QCOW2_FIELD_INCOMPATIBLE_FEATURES:
    out->offset = OFF_INCOMPAT;
    out->len = 8;
    put_be64 (out->bytes, h->incompatible_features);
    return;
  case QCOW2_FIELD_AUTOCLEAR_FEATURES:
    out->offset = OFF_AUTOCLEAR;
    out->len = 8;
    put_be64 (out->bytes, h->autoclear_features);
    return;
  }
}

size_t
qcow2_header_build (const struct qcow2_header *h, uint8_t *buf, size_t len)
{
  if (len < h->header_length || h->header_length < V3_MIN_HEADER_LENGTH)
    return 0;
  put_be32 (buf + OFF_MAGIC, QCOW2_MAGIC);
  put_be32 (buf + OFF_VERSION, h->version);
  put_be64 (buf + OFF_BACKING_OFFSET, h->backing_file_offset);
  put_be32 (buf + OFF_BACKING_SIZE, h->backing_file_size);
  put_be32 (buf + OFF_CLUSTER_BITS, h->cluster_bits);
  put_be64 (buf + OFF_SIZE, h->virtual_size);
  put_be32 (buf + OFF_CRYPT, h->crypt_method);
  put_be32 (buf + OFF_L1_SIZE, h->l1_size);
  put_be64 (buf + OFF_L1_OFFSET, h->l1_table_offset);
  put_be64 (buf + OFF_REFTABLE_OFFSET, h->refcount_table_offset);
  put_be32 (buf + OFF_REFTABLE_CLUSTERS, h->refcount_table_clusters);
  put_be32 (buf + OFF_NB_SNAPSHOTS, h->nb_snapshots);
  put_be64 (buf + OFF_SNAPSHOTS_OFFSET, h->snapshots_offset);
  put_be64 (buf + OFF_INCOMPAT, h->incompatible_features);
  put_be64 (buf + OFF_COMPAT, h->compatible_features);
  put_be64 (buf + OFF_AUTOCLEAR, h->autoclear_features);
  put_be32 (buf + OFF_REFCOUNT_ORDER, h->refcount_order);
  put_be32 (buf + OFF_HEADER_LENGTH, h->header_length);
  if (h->header_length > OFF_COMPRESSION_TYPE)
    buf[OFF_COMPRESSION_TYPE] = h->compression_type;
  return h->header_length;
}

int
qcow2_header_put_extension (uint8_t *buf, size_t buflen, size_t *pos,
                            uint32_t type, const void *data, uint32_t len)
{
  size_t padded = ((size_t) len + 7) & ~(size_t) 7;

  if (*pos > buflen || buflen - *pos < 8 + padded)
    return -1;
  put_be32 (buf + *pos, type);
  put_be32 (buf + *pos + 4, len);
  memcpy (buf + *pos + 8, data, len);
  memset (buf + *pos + 8 + len, 0, padded - len);
  *pos += 8 + padded;
  return 0;
}

/* Is [offset, offset+len) inside the file, without overflowing? */
static bool
inside_file (uint64_t offset, uint64_t len, uint64_t file_size)
{
  return offset <= file_size && len <= file_size - offset;
}

int
qcow2_header_parse (const uint8_t *buf, size_t len, uint64_t file_size,
                    struct qcow2_header *h, char *errbuf, size_t errlen)
{
  uint64_t cluster_size, l2_entries, bytes_per_l2, l1_needed;

  memset (h, 0, sizeof *h);
  h->file_size = file_size;

  if (len < V2_HEADER_LENGTH)
    return qcow2_fail (errbuf, errlen,
                       "image is too small for a qcow2 header (%zu bytes)", len);
  if (be32 (buf + OFF_MAGIC) != QCOW2_MAGIC)
    return qcow2_fail (errbuf, errlen,
                       "magic: not a qcow2 image (magic is 0x%08x, expected 0x%08x)",
                       be32 (buf + OFF_MAGIC), QCOW2_MAGIC);

  h->version = be32 (buf + OFF_VERSION);
  if (h->version != 2 && h->version != 3)
    return qcow2_fail (errbuf, errlen,
                       "version: unsupported qcow2 version %u (expected 2 or 3)",
                       h->version);

  h->backing_file_offset = be64 (buf + OFF_BACKING_OFFSET);
  h->backing_file_size = be32 (buf + OFF_BACKING_SIZE);
  h->cluster_bits = be32 (buf + OFF_CLUSTER_BITS);
  h->virtual_size = be64 (buf + OFF_SIZE);
  h->crypt_method = be32 (buf + OFF_CRYPT);
  h->l1_size = be32 (buf + OFF_L1_SIZE);
  h->l1_table_offset = be64 (buf + OFF_L1_OFFSET);
  h->refcount_table_offset = be64 (buf + OFF_REFTABLE_OFFSET);
  h->refcount_table_clusters = be32 (buf + OFF_REFTABLE_CLUSTERS);
  h->nb_snapshots = be32 (buf + OFF_NB_SNAPSHOTS);
  h->snapshots_offset = be64 (buf + OFF_SNAPSHOTS_OFFSET);

  if (h->cluster_bits < QCOW2_MIN_CLUSTER_BITS ||
      h->cluster_bits > QCOW2_MAX_CLUSTER_BITS)
    return qcow2_fail (errbuf, errlen,
                       "cluster_bits: %u is out of range (%d..%d)",
                       h->cluster_bits,
                       QCOW2_MIN_CLUSTER_BITS, QCOW2_MAX_CLUSTER_BITS);
  cluster_size = UINT64_C (1) << h->cluster_bits;
  h->cluster_size = cluster_size;

  if (h->version == 2) {
    h->refcount_order = 4;
    h->header_length = V2_HEADER_LENGTH;
    h->compression_type = QCOW2_COMPRESSION_ZLIB;
  }
  else {
    if (len < V3_MIN_HEADER_LENGTH)
      return qcow2_fail (errbuf, errlen,
                         "image is too small for a qcow2 v3 header (%zu bytes)",
                         len);
    h->incompatible_features = be64 (buf + OFF_INCOMPAT);
    h->compatible_features = be64 (buf + OFF_COMPAT);
    h->autoclear_features = be64 (buf + OFF_AUTOCLEAR);
    h->refcount_order = be32 (buf + OFF_REFCOUNT_ORDER);
    h->header_length = be32 (buf + OFF_HEADER_LENGTH);

    if (h->refcount_order > 6)
      return qcow2_fail (errbuf, errlen,
                         "refcount_order: %u is out of range (0..6)",
                         h->refcount_order);
    if (h->header_length < V3_MIN_HEADER_LENGTH)
      return qcow2_fail (errbuf, errlen,
                         "header_length: %u is too short (at least %d)",
                         h->header_length, V3_MIN_HEADER_LENGTH);
    if (h->header_length > cluster_size)
      return qcow2_fail (errbuf, errlen,
                         "header_length: %u exceeds the cluster size %" PRIu64,
                         h->header_length, cluster_size);
    if (h->header_length > len)
      return qcow2_fail (errbuf, errlen,
                         "header_length: %u runs past the end of the image",
                         h->header_length);

    if (h->header_length > OFF_COMPRESSION_TYPE) {
      uint8_t type = buf[OFF_COMPRESSION_TYPE];
      if (type > QCOW2_COMPRESSION_ZSTD)
        return qcow2_fail (errbuf, errlen,
                           "compression_type: unknown compression type %u", type);
      h->compression_type = type;
    }
    else
      h->compression_type = QCOW2_COMPRESSION_ZLIB;

    /* The compression type bit must be set exactly when the type is not
     * zlib; qemu refuses a mismatch either way.
     */
    if (!!(h->incompatible_features & QCOW2_INCOMPAT_COMPRESSION) !=
        (h->compression_type != QCOW2_COMPRESSION_ZLIB))
      return qcow2_fail (errbuf, errlen,
                         "incompatible_features: the compression type bit does "
                         "not match compression_type %u", h->compression_type);
  }

  h->extended_l2 = (h->incompatible_features & QCOW2_INCOMPAT_EXTL2) != 0;
  h->l2_entry_size = h->extended_l2 ? 16 : 8;
  h->l2_bits = h->cluster_bits - (h->extended_l2 ? 4 : 3);

  /* The virtual size must be addressable: below 2^63 so that offsets
   * fit in int64_t, and covered by the L1 table.
   */
  if (h->virtual_size > INT64_MAX - cluster_size)
    return qcow2_fail (errbuf, errlen,
                       "size: virtual size %" PRIu64 " is too large",
                       h->virtual_size);
  l2_entries = UINT64_C (1) << h->l2_bits;
  bytes_per_l2 = l2_entries << h->cluster_bits;
  l1_needed = (h->virtual_size + bytes_per_l2 - 1) >> (h->l2_bits + h->cluster_bits);
  if (l1_needed > h->l1_size)
    return qcow2_fail (errbuf, errlen,
                       "l1_size: %u entries are too few for the virtual size "
                       "%" PRIu64 " (need %" PRIu64 ")",
                       h->l1_size, h->virtual_size, l1_needed);
  if ((uint64_t) h->l1_size * 8 > QCOW2_MAX_L1_BYTES)
    return qcow2_fail (errbuf, errlen,
                       "l1_size: %u entries exceed the 32 MiB limit", h->l1_size);
  /* The L1 table covers the size field as written, but qemu serves the
   * disk in whole 512-byte sectors, rounded down (qcow2_do_open:
   * total_sectors = size / 512): a size that is not a multiple of 512
   * serves less, and as a backing file reads as zeros from there.
   */
  h->virtual_size &= ~UINT64_C (511);

  if (h->l1_size > 0) {
    if (h->l1_table_offset & (cluster_size - 1))
      return qcow2_fail (errbuf, errlen,
                         "l1_table_offset: 0x%" PRIx64 " is not cluster aligned",
                         h->l1_table_offset);
    if (h->l1_table_offset == 0)
      return qcow2_fail (errbuf, errlen,
                         "l1_table_offset: the L1 table overlaps the header");
    if (!inside_file (h->l1_table_offset, (uint64_t) h->l1_size * 8,
                      file_size))
      return qcow2_fail (errbuf, errlen,
                         "l1_table_offset, l1_size: the L1 table (0x%" PRIx64 ", %u entries) "
                         "lies outside the file (%" PRIu64 " bytes)",
                         h->l1_table_offset, h->l1_size, file_size);
  }

  if (h->refcount_table_offset & (cluster_size - 1))
    return qcow2_fail (errbuf, errlen,
                       "refcount_table_offset: 0x%" PRIx64 " is not cluster aligned",
                       h->refcount_table_offset);
  if (h->refcount_table_clusters == 0)
    return qcow2_fail (errbuf, errlen,
                       "refcount_table_clusters: the refcount table is empty");
  if ((uint64_t) h->refcount_table_clusters << h->cluster_bits >
      (UINT64_C (8) << 20))
    return qcow2_fail (errbuf, errlen,
                       "refcount_table_clusters: %u clusters exceed the 8 MiB limit",
                       h->refcount_table_clusters);
  if (h->refcount_table_offset == 0 ||
      h->refcount_table_offset >= QCOW2_MAX_HOST_OFFSET)
    return qcow2_fail (errbuf, errlen,
                       "refcount_table_offset: 0x%" PRIx64 " is not a valid offset",
                       h->refcount_table_offset);

  if (h->nb_snapshots > 0 && (h->snapshots_offset & (cluster_size - 1)))
    return qcow2_fail (errbuf, errlen,
                       "snapshots_offset: 0x%" PRIx64 " is not cluster aligned",
                       h->snapshots_offset);

  if (h->backing_file_offset != 0) {
    if (h->backing_file_size > 1023)
      return qcow2_fail (errbuf, errlen,
                         "backing_file_size: %u is larger than 1023",
                         h->backing_file_size);
    if (h->backing_file_offset < h->header_length ||
        h->backing_file_offset >= cluster_size ||
        h->backing_file_offset >= len ||
        h->backing_file_size > cluster_size - h->backing_file_offset ||
        h->backing_file_size > len - h->backing_file_offset)
      return qcow2_fail (errbuf, errlen,
                         "backing_file_offset: the backing file name "
                         "(0x%" PRIx64 ", %u bytes) lies outside the header cluster",
                         h->backing_file_offset, h->backing_file_size);
  }

  return 0;
}

int
qcow2_header_check_features (const struct qcow2_header *h,
                             char *errbuf, size_t errlen)
{
  uint64_t unknown = h->incompatible_features & ~QCOW2_INCOMPAT_KNOWN;

  if (unknown)
    return qcow2_fail (errbuf, errlen,
                       "incompatible_features: unknown incompatible feature bits "
                       "0x%" PRIx64 " are set", unknown);
  /* LUKS (2) is served, once unlocked (paths/encrypt.h). */
  if (h->crypt_method != 0 && h->crypt_method != 2) {
    qcow2_crypt_method_refusal (h->crypt_method, errbuf, errlen);
    return -1;
  }
  if (h->extended_l2 && h->cluster_bits < 14)
    return qcow2_fail (errbuf, errlen,
                       "incompatible_features: extended L2 entries need clusters "
                       "of 16 KiB at least (cluster_bits %u)", h->cluster_bits);
  if (h->backing_file_offset != 0)
    return qcow2_fail (errbuf, errlen,
                       "backing_file_offset: images with a backing file are not "
                       "supported (convert it with qemu-img convert first)");
  return 0;
}

int
qcow2_header_walk_extensions (const uint8_t *buf, size_t len,
                              const struct qcow2_header *h,
                              qcow2_ext_fn fn, void *opaque,
                              char *errbuf, size_t errlen)
{
  uint64_t pos = h->header_length;
  uint64_t end = h->cluster_size;

  if (h->backing_file_offset != 0 && h->backing_file_offset < end)
    end = h->backing_file_offset;
  if (end > len)
    end = len;

  while (pos + 8 <= end) {
    uint32_t type = be32 (buf + pos);
    uint32_t ext_len = be32 (buf + pos + 4);

    if (type == QCOW2_EXT_END)
      return 0;
    pos += 8;
    if (ext_len > end - pos)
      return qcow2_fail (errbuf, errlen,
                         "header extension 0x%08x: length %u runs past the end of "
                         "the header area", type, ext_len);
    if (fn && fn (opaque, type, buf + pos, ext_len))
      return 0;
    pos += ((uint64_t) ext_len + 7) & ~UINT64_C (7);
  }
  /* qemu accepts a header area with no end marker if it is full. */
  return 0;
}

struct find_bitmaps {
  const uint8_t *buf;
  struct qcow2_bitmaps_ext *ext;
};

static int
find_bitmaps_ext (void *opaque, uint32_t type, const uint8_t *data,
                  uint32_t len)
{
  struct find_bitmaps *fb = opaque;
  struct qcow2_bitmaps_ext *ext = fb->ext;

  if (type != QCOW2_EXT_BITMAPS)
    return 0;
  ext->found = true;
  ext->len = len;
  ext->data_pos = data - fb->buf;
  if (len == QCOW2_BITMAPS_EXT_BYTES) {
    ext->nb_bitmaps = be32 (data);
    ext->reserved = be32 (data + 4);
    ext->directory_size = be64 (data + 8);
    ext->directory_offset = be64 (data + 16);
  }
  return 1;
}

int
qcow2_header_find_bitmaps (const uint8_t *buf, size_t len,
                           const struct qcow2_header *h,
                           struct qcow2_bitmaps_ext *ext,
                           char *errbuf, size_t errlen)
{
  struct find_bitmaps fb = { .buf = buf, .ext = ext };

  memset (ext, 0, sizeof *ext);
  return qcow2_header_walk_extensions (buf, len, h, find_bitmaps_ext, &fb,
                                       errbuf, errlen);
}
