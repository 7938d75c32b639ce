/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the qcow2 header, parsed and validated.
 *
 * qcow2_header_parse() turns the first cluster of an image into a
 * struct qcow2_header, checking every field against the format and the
 * file size before anything else uses it.  It does no I/O and never
 * allocates, so the fuzz targets can feed it arbitrary bytes.
 */
#ifndef QCOW2_HEADER_H
#define QCOW2_HEADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QCOW2_MAGIC 0x514649fbu     /* "QFI\xfb" */

#define QCOW2_MIN_CLUSTER_BITS 9
#define QCOW2_MAX_CLUSTER_BITS 21

/* Incompatible feature bits. */
#define QCOW2_INCOMPAT_DIRTY        (UINT64_C (1) << 0)
#define QCOW2_INCOMPAT_CORRUPT      (UINT64_C (1) << 1)
#define QCOW2_INCOMPAT_DATA_FILE    (UINT64_C (1) << 2)
#define QCOW2_INCOMPAT_COMPRESSION  (UINT64_C (1) << 3)
#define QCOW2_INCOMPAT_EXTL2        (UINT64_C (1) << 4)
#define QCOW2_INCOMPAT_KNOWN        (UINT64_C (0x1f))

#define QCOW2_COMPAT_LAZY_REFCOUNTS (UINT64_C (1) << 0)

/* Autoclear feature bits: a writer that does not keep what a bit vouches
 * for valid clears the bit before its first change.
 */
#define QCOW2_AUTOCLEAR_BITMAPS       (UINT64_C (1) << 0)
#define QCOW2_AUTOCLEAR_DATA_FILE_RAW (UINT64_C (1) << 1)


/* Header extension types. */
#define QCOW2_EXT_END            0x00000000u
#define QCOW2_EXT_BACKING_FORMAT 0xe2792acau
#define QCOW2_EXT_FEATURE_NAMES  0x6803f857u
#define QCOW2_EXT_BITMAPS        0x23852875u
#define QCOW2_EXT_CRYPTO         0x0537be77u
#define QCOW2_EXT_DATA_FILE      0x44415441u

/* crypt_method. */
#define QCOW2_CRYPT_NONE 0
#define QCOW2_CRYPT_AES  1              /* legacy, refused */
#define QCOW2_CRYPT_LUKS 2

enum qcow2_compression {
  QCOW2_COMPRESSION_ZLIB = 0,
  QCOW2_COMPRESSION_ZSTD = 1,
};

/* L1 tables are at most 32 MiB (qemu's limit). */
#define QCOW2_MAX_L1_BYTES (UINT64_C (32) << 20)

/* Host offsets must stay below 2^56. */
#define QCOW2_MAX_HOST_OFFSET (UINT64_C (1) << 56)

struct qcow2_header {
  uint32_t version;                 /* 2 or 3 */
  uint64_t backing_file_offset;
  uint32_t backing_file_size;
  uint32_t cluster_bits;
  uint32_t cluster_size;
  uint64_t virtual_size;
  uint32_t crypt_method;
  uint32_t l1_size;                 /* entries */
  uint64_t l1_table_offset;
  uint64_t refcount_table_offset;
  uint32_t refcount_table_clusters;
  uint32_t nb_snapshots;
  uint64_t snapshots_offset;
  uint64_t incompatible_features;
  uint64_t compatible_features;
  uint64_t autoclear_features;
  uint32_t refcount_order;
  uint32_t header_length;
  enum qcow2_compression compression_type;

  /* Derived. */
  uint32_t l2_bits;                 /* log2 of L2 entries per table */
  uint32_t l2_entry_size;           /* 8, or 16 with extended L2 */
  bool extended_l2;
  uint64_t file_size;               /* of the image when parsed */
};

/* Parse the header in BUF (LEN bytes from offset 0 of the image; the
 * whole first cluster, or the whole file if it is shorter).  FILE_SIZE is
 * the size of the image.  On error returns -1 and writes a sentence that
 * names the offending field into ERRBUF (ERRLEN bytes); returns 0 on
 * success.  Checks only what every reader needs; what a particular use
 * refuses (backing files, encryption, ...) is qcow2_header_check_features.
 */
int qcow2_header_parse (const uint8_t *buf, size_t len, uint64_t file_size,
                        struct qcow2_header *h, char *errbuf, size_t errlen);

/* Refuse what the engine cannot serve: unknown incompatible bits,
 * encryption other than LUKS (legacy AES, with what it is and how to
 * convert it, and unknown methods), external data files, extended L2 entries with clusters
 * below 16 KiB (extended L2 itself is served, read-only), and backing
 * files: qcow2_image_open, which opens a backing file itself, checks the
 * header as if it had none.  Same error convention as
 * qcow2_header_parse.
 */
int qcow2_header_check_features (const struct qcow2_header *h,
                                 char *errbuf, size_t errlen);

/* The header fields the engine writes while it serves an image, each by
 * name: qcow2_header_field gives where one lies in the file and its
 * bytes as H holds it, to be written as one piece.
 */
enum qcow2_header_field {
  QCOW2_FIELD_REFCOUNT_TABLE,       /* refcount_table_offset and
                                       refcount_table_clusters together */
  QCOW2_FIELD_INCOMPATIBLE_FEATURES,
  QCOW2_FIELD_AUTOCLEAR_FEATURES,
};

struct qcow2_field_bytes {
  uint64_t offset;                  /* in the file */
  uint32_t len;
  uint8_t bytes[12];
};

void qcow2_header_field (const struct qcow2_header *h,
                         enum qcow2_header_field field,
                         struct qcow2_field_bytes *out);

/* Build the header H describes into BUF (LEN bytes, at least
 * H->header_length; a version 3 header): every field at its place, the
 * rest of BUF left as it is.  Returns the header's length, where the
 * extensions start (qcow2_header_put_extension).
 */
size_t qcow2_header_build (const struct qcow2_header *h, uint8_t *buf,
                           size_t len);

/* Put header extension TYPE with LEN bytes of DATA at *POS in BUF (BUFLEN
 * bytes), padded to 8 bytes, and move *POS past it; the caller ends the
 * list with an extension of type QCOW2_EXT_END (zeros).  0, or -1 if it
 * does not fit.
 */
int qcow2_header_put_extension (uint8_t *buf, size_t buflen, size_t *pos,
                                uint32_t type, const void *data,
                                uint32_t len);

/* Walk the header extensions.  Calls FN for each extension (type, data,
 * length) until it returns nonzero or the end marker.  Returns -1 with a
 * message in ERRBUF if an extension runs out of its space, else 0.
 */
typedef int (*qcow2_ext_fn) (void *opaque, uint32_t type,
                             const uint8_t *data, uint32_t len);
int qcow2_header_walk_extensions (const uint8_t *buf, size_t len,
                                  const struct qcow2_header *h,
                                  qcow2_ext_fn fn, void *opaque,
                                  char *errbuf, size_t errlen);

/* The bitmaps extension (0x23852875, qcow2.txt "Bitmaps extension"):
 * 24 bytes, nb_bitmaps (u32), reserved (u32), bitmap_directory_size
 * (u64), bitmap_directory_offset (u64).
 */
#define QCOW2_BITMAPS_EXT_BYTES 24
struct qcow2_bitmaps_ext {
  bool found;
  uint32_t len;                     /* of the extension's data */
  uint64_t data_pos;                /* where its data lies in the file */
  uint32_t nb_bitmaps;
  uint32_t reserved;
  uint64_t directory_size;
  uint64_t directory_offset;
};

/* Find the bitmaps extension among the header extensions in BUF (as for
 * qcow2_header_walk_extensions).  EXT->found is false without one; its
 * fields are only filled when the length is QCOW2_BITMAPS_EXT_BYTES.
 * -1 with a sentence in ERRBUF if the extension area is broken, else 0.
 */
int qcow2_header_find_bitmaps (const uint8_t *buf, size_t len,
                               const struct qcow2_header *h,
                               struct qcow2_bitmaps_ext *ext,
                               char *errbuf, size_t errlen);

#endif /* QCOW2_HEADER_H */
