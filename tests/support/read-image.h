/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: qcow2 images assembled byte by byte, for reading.
 *
 * An image is built from a spec (header, L1, L2, data, compressed streams
 * made with zlib and zstd as qemu makes them), so the test knows every
 * guest byte and every host offset: data clusters partly out of order
 * with garbage between them, compressed streams packed from an unaligned
 * offset, clusters sharing another one's data, and the last stream's
 * sectors running past the end of the file.  Only for reading: the
 * refcounts are not filled in.
 */
#ifndef QCOW2ZSTD_TEST_READ_IMAGE_H
#define QCOW2ZSTD_TEST_READ_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qcow2.h"

#define L2E_ZERO       (UINT64_C (1) << 0)
#define L2E_COMPRESSED (UINT64_C (1) << 62)
#define COPIED         (UINT64_C (1) << 63)

/* Filler of unused host space: 0xee is neither valid deflate (block type
 * 3) nor a zstd magic, and it is not zero, so reading it by mistake shows.
 */
#define GARBAGE 0xee

enum kind { UNALLOC, ZERO, ZERO_ALLOC, NORMAL, COMPRESSED };

struct range { uint64_t first, end; };  /* guest clusters [first, end) */

struct image_spec {
  const char *name;
  unsigned version;
  unsigned cluster_bits;
  enum qcow2_compression compression;
  uint64_t nclusters;
  uint64_t short_by;            /* the header's size = nclusters * C - short_by */
  struct range populated[2];    /* clusters that may hold anything */
  uint64_t seed;
  /* If set, the kinds of all clusters, one letter each: '.' unallocated,
   * 'z' zero, 'a' zero-allocated, 'n' normal, 'c' compressed, 's'
   * compressed sharing the previous compressed cluster's data.
   */
  const char *layout;
};

struct image {
  const struct image_spec *spec;
  uint64_t cluster_size;
  /* The header's size field, and the disk served: that size in whole
   * 512-byte sectors, rounded down, as qemu serves it.
   */
  uint64_t size_field;
  uint64_t virtual_size;
  uint64_t nclusters;
  uint8_t *kind;                /* enum kind, per guest cluster */
  uint8_t **content;            /* NORMAL/COMPRESSED: the cluster's bytes */
  uint64_t *entry;              /* the L2 entry written */
  uint64_t *entry_pos;          /* its host offset; 0: no L2 table */
  uint64_t *csize;              /* COMPRESSED: length of the stream */
  uint64_t l1_offset;
  uint32_t l1_size;
  uint64_t garbage_offset;      /* a host cluster full of GARBAGE */
  uint64_t compressed_start;    /* host offset of the first stream */
  uint8_t *file;
  uint64_t file_size;
};

/* The images every read test runs on: cluster sizes from 512 bytes to
 * 2 MiB, v2 and v3, zlib and zstd.
 */
extern const struct image_spec read_image_specs[];
extern const size_t read_image_nspecs;

struct image *image_new (const struct image_spec *spec);
void image_free (struct image *img);

/* The guest bytes [OFFSET, OFFSET+LEN) as the image defines them. */
void expected_bytes (const struct image *img, uint8_t *buf, uint64_t offset,
                     uint64_t len);
bool reads_as_zero (const struct image *img, uint64_t k);

/* The first guest cluster at or after FROM of kind KIND, whose successor
 * is of kind NEXT_KIND (or any if NEXT_KIND < 0); UINT64_MAX if none.
 */
uint64_t find_cluster (const struct image *img, uint64_t from,
                       enum kind kind, int next_kind);

/* Compress LEN bytes of SRC into DST (CAP bytes) as qemu stores a
 * compressed cluster of TYPE; returns the length.
 */
uint64_t compress_cluster (enum qcow2_compression type, const uint8_t *src,
                           uint64_t len, uint8_t *dst, uint64_t cap);

/* Ranges to read: offsets around every populated cluster's edges,
 * lengths from one byte to several clusters, random pairs, and whole
 * regions.
 */
struct pair { uint64_t offset, len; };
struct pairs {
  struct pair *p;
  size_t n, cap;
};
struct pairs make_pairs (const struct image *img);

#endif /* QCOW2ZSTD_TEST_READ_IMAGE_H */
