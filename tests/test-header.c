/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: header parsing, feature checks, extension walk.
 *
 * Every header here is assembled byte by byte from a struct of field
 * values, so each case changes exactly one field of a header that is
 * otherwise valid: a rejection then proves that this field's check works,
 * not that some earlier check happened to trip.
 */
#include <config.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/header.h"
#include "unit.h"
#include "util.h"

#define KiB (UINT64_C (1) << 10)
#define MiB (UINT64_C (1) << 20)
#define GiB (UINT64_C (1) << 30)

/* One value per on-disk header field.  compression_type < 0 leaves the
 * byte at offset 104 alone (it is only written when header_length > 104).
 */
struct fields {
  uint32_t magic;
  uint32_t version;
  uint64_t backing_file_offset;
  uint32_t backing_file_size;
  uint32_t cluster_bits;
  uint64_t size;
  uint32_t crypt_method;
  uint32_t l1_size;
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
  int compression_type;
};

/* A v3 header for a 1 GiB disk with 64 KiB clusters: cluster 0 header,
 * cluster 1 refcount table, L1 (2 entries) in cluster 3; the file is
 * 1 MiB long.  qemu 7.2 writes header_length 112.
 */
static struct fields
valid_v3 (void)
{
  return (struct fields) {
    .magic = QCOW2_MAGIC, .version = 3, .cluster_bits = 16,
    .size = 1 * GiB, .l1_size = 2, .l1_table_offset = 3 * 64 * KiB,
    .refcount_table_offset = 64 * KiB, .refcount_table_clusters = 1,
    .refcount_order = 4, .header_length = 112, .compression_type = 0,
  };
}

static struct fields
valid_v2 (void)
{
  struct fields f = valid_v3 ();

  f.version = 2;
  /* v2 ignores everything from offset 72 on: prove it with junk there. */
  f.refcount_order = 99;
  f.header_length = 3;
  f.incompatible_features = ~UINT64_C (0);
  f.compression_type = 7;
  return f;
}

#define FILE_SIZE (1 * MiB)

/* Write F into BUF (LEN bytes, zeroed first). */
static void
write_header (uint8_t *buf, size_t len, const struct fields *f)
{
  uint8_t full[128];

  memset (full, 0, sizeof full);
  put32 (full + 0, f->magic);
  put32 (full + 4, f->version);
  put64 (full + 8, f->backing_file_offset);
  put32 (full + 16, f->backing_file_size);
  put32 (full + 20, f->cluster_bits);
  put64 (full + 24, f->size);
  put32 (full + 32, f->crypt_method);
  put32 (full + 36, f->l1_size);
  put64 (full + 40, f->l1_table_offset);
  put64 (full + 48, f->refcount_table_offset);
  put32 (full + 56, f->refcount_table_clusters);
  put32 (full + 60, f->nb_snapshots);
  put64 (full + 64, f->snapshots_offset);
  put64 (full + 72, f->incompatible_features);
  put64 (full + 80, f->compatible_features);
  put64 (full + 88, f->autoclear_features);
  put32 (full + 96, f->refcount_order);
  put32 (full + 100, f->header_length);
  if (f->compression_type >= 0)
    full[104] = (uint8_t) f->compression_type;

  memset (buf, 0, len);
  memcpy (buf, full, len < sizeof full ? len : sizeof full);
}

/* The buffer the engine would pass: the first cluster of the image. */
struct header_buf {
  uint8_t *bytes;
  size_t len;
};

static struct header_buf
make (const struct fields *f, size_t len)
{
  struct header_buf hb = { .bytes = malloc (len), .len = len };

  if (hb.bytes == NULL) {
    perror ("malloc");
    exit (1);
  }
  write_header (hb.bytes, len, f);
  return hb;
}

/* Parse F (in a buffer of LEN bytes) and expect success. */
static bool
parse_ok (const char *what, const struct fields *f, size_t len,
          uint64_t file_size, struct qcow2_header *h)
{
  struct header_buf hb = make (f, len);
  char err[256] = "";
  int r = qcow2_header_parse (hb.bytes, hb.len, file_size, h,
                              err, sizeof err);

  CHECK_EQ (r, 0);
  if (r != 0)
    fprintf (stderr, "  %s: unexpected error: %s\n", what, err);
  free (hb.bytes);
  return r == 0;
}

/* Parse F and expect a rejection whose message names FIELD; a FIELD
 * starting with '^' must start the message ("size" is also part of
 * "l1_size").
 */
static void
parse_fails (const char *what, const struct fields *f, size_t len,
             uint64_t file_size, const char *field)
{
  struct header_buf hb = make (f, len);
  struct qcow2_header h;
  char err[256] = "";
  int r = qcow2_header_parse (hb.bytes, hb.len, file_size, &h,
                              err, sizeof err);

  bool named = field[0] == '^'
    ? strncmp (err, field + 1, strlen (field + 1)) == 0
    : strstr (err, field) != NULL;

  CHECK_EQ (r, -1);
  CHECK (named);
  CHECK (err[0] != '\0' && err[strlen (err) - 1] != '\n');
  if (r != -1 || !named)
    fprintf (stderr, "  %s: expected an error naming \"%s\", got %d \"%s\"\n",
             what, field, r, err);
  free (hb.bytes);
}

static void
test_valid_headers (void)
{
  struct fields f = valid_v3 ();
  struct qcow2_header h;

  if (parse_ok ("v3", &f, 64 * KiB, FILE_SIZE, &h)) {
    CHECK_EQ (h.version, 3);
    CHECK_EQ (h.cluster_bits, 16);
    CHECK_EQ (h.cluster_size, 64 * KiB);
    CHECK_EQ (h.virtual_size, 1 * GiB);
    CHECK_EQ (h.l1_size, 2);
    CHECK_EQ (h.l1_table_offset, 3 * 64 * KiB);
    CHECK_EQ (h.refcount_table_offset, 64 * KiB);
    CHECK_EQ (h.refcount_table_clusters, 1);
    CHECK_EQ (h.refcount_order, 4);
    CHECK_EQ (h.header_length, 112);
    CHECK_EQ (h.compression_type, QCOW2_COMPRESSION_ZLIB);
    CHECK_EQ (h.l2_bits, 13);
    CHECK_EQ (h.l2_entry_size, 8);
    CHECK (!h.extended_l2);
    CHECK_EQ (h.file_size, FILE_SIZE);
    CHECK_EQ (h.backing_file_offset, 0);
  }

  /* zstd: type 1 with the matching incompatible bit. */
  f.compression_type = 1;
  f.incompatible_features = QCOW2_INCOMPAT_COMPRESSION;
  if (parse_ok ("v3 zstd", &f, 64 * KiB, FILE_SIZE, &h))
    CHECK_EQ (h.compression_type, QCOW2_COMPRESSION_ZSTD);

  /* header_length 104: no compression type byte, so whatever follows
   * (here a 1 at offset 104) belongs to the extensions, and the type is
   * zlib.
   */
  f = valid_v3 ();
  f.header_length = 104;
  f.compression_type = 1;
  if (parse_ok ("v3 104", &f, 64 * KiB, FILE_SIZE, &h)) {
    CHECK_EQ (h.compression_type, QCOW2_COMPRESSION_ZLIB);
    CHECK_EQ (h.header_length, 104);
  }

  /* header_length may be the whole cluster. */
  f = valid_v3 ();
  f.header_length = 64 * KiB;
  parse_ok ("header_length = cluster size", &f, 64 * KiB, FILE_SIZE, &h);

  /* Every refcount_order 0..6 and every cluster size 512 B .. 2 MiB. */
  for (uint32_t order = 0; order <= 6; ++order) {
    f = valid_v3 ();
    f.refcount_order = order;
    if (parse_ok ("refcount_order", &f, 64 * KiB, FILE_SIZE, &h))
      CHECK_EQ (h.refcount_order, order);
  }
  for (uint32_t bits = QCOW2_MIN_CLUSTER_BITS;
       bits <= QCOW2_MAX_CLUSTER_BITS; ++bits) {
    uint64_t cluster = UINT64_C (1) << bits;
    uint64_t per_l1 = (cluster / 8) * cluster;

    f = valid_v3 ();
    f.cluster_bits = bits;
    f.header_length = 104;
    f.refcount_table_offset = cluster;
    f.l1_table_offset = 2 * cluster;
    f.l1_size = (f.size + per_l1 - 1) / per_l1;
    if (parse_ok ("cluster_bits", &f, cluster < 4096 ? cluster : 4096,
                  3 * cluster + f.l1_size * 8, &h)) {
      CHECK_EQ (h.cluster_size, cluster);
      CHECK_EQ (h.l2_bits, bits - 3);
    }
  }

  /* v2: 72 bytes of header; the v3 fields are not read. */
  f = valid_v2 ();
  if (parse_ok ("v2", &f, 64 * KiB, FILE_SIZE, &h)) {
    CHECK_EQ (h.version, 2);
    CHECK_EQ (h.refcount_order, 4);
    CHECK_EQ (h.header_length, 72);
    CHECK_EQ (h.incompatible_features, 0);
    CHECK_EQ (h.compression_type, QCOW2_COMPRESSION_ZLIB);
    CHECK_EQ (h.l2_entry_size, 8);
  }
  /* A v2 file that is nothing but its 72-byte header and a 0-entry L1. */
  f = valid_v2 ();
  f.size = 0;
  f.l1_size = 0;
  f.l1_table_offset = 0;
  parse_ok ("v2, 72 bytes", &f, 72, 72, &h);

  /* Snapshots with an aligned table are fine for a reader. */
  f = valid_v3 ();
  f.nb_snapshots = 2;
  f.snapshots_offset = 5 * 64 * KiB;
  parse_ok ("snapshots", &f, 64 * KiB, FILE_SIZE, &h);

  /* Dirty, corrupt, lazy refcounts and autoclear bits: parse accepts. */
  f = valid_v3 ();
  f.incompatible_features = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT;
  f.compatible_features = QCOW2_COMPAT_LAZY_REFCOUNTS | (UINT64_C (1) << 40);
  f.autoclear_features = 3;
  if (parse_ok ("feature bits", &f, 64 * KiB, FILE_SIZE, &h)) {
    CHECK_EQ (h.incompatible_features,
              QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT);
    CHECK_EQ (h.compatible_features,
              QCOW2_COMPAT_LAZY_REFCOUNTS | (UINT64_C (1) << 40));
    CHECK_EQ (h.autoclear_features, 3);
  }

  /* A backing file name right after the header, inside cluster 0. */
  f = valid_v3 ();
  f.backing_file_offset = 512;
  f.backing_file_size = 1023;
  if (parse_ok ("backing file", &f, 64 * KiB, FILE_SIZE, &h)) {
    CHECK_EQ (h.backing_file_offset, 512);
    CHECK_EQ (h.backing_file_size, 1023);
  }
}

static void
test_rejections (void)
{
  const size_t C = 64 * KiB;
  struct fields f;

  /* Too short to hold the fields. */
  f = valid_v3 ();
  parse_fails ("empty", &f, 0, 0, "too small");
  parse_fails ("71 bytes", &f, 71, 71, "too small");
  parse_fails ("v3 in 100 bytes", &f, 100, 100, "too small");
  f = valid_v3 ();
  f.header_length = 112;
  parse_fails ("header_length past the end of the file", &f, 108, FILE_SIZE,
               "header_length");

  f = valid_v3 ();
  f.magic = 0x514649fa;
  parse_fails ("magic", &f, C, FILE_SIZE, "magic");
  f.magic = 0;
  parse_fails ("magic 0", &f, C, FILE_SIZE, "magic");

  f = valid_v3 ();
  f.version = 1;
  parse_fails ("version 1", &f, C, FILE_SIZE, "version");
  f.version = 4;
  parse_fails ("version 4", &f, C, FILE_SIZE, "version");

  f = valid_v3 ();
  f.cluster_bits = 8;
  parse_fails ("cluster_bits 8", &f, C, FILE_SIZE, "cluster_bits");
  f.cluster_bits = 22;
  parse_fails ("cluster_bits 22", &f, C, FILE_SIZE, "cluster_bits");
  f.cluster_bits = UINT32_MAX;
  parse_fails ("cluster_bits 2^32-1", &f, C, FILE_SIZE, "cluster_bits");

  f = valid_v3 ();
  f.refcount_order = 7;
  parse_fails ("refcount_order 7", &f, C, FILE_SIZE, "refcount_order");

  f = valid_v3 ();
  f.header_length = 103;
  parse_fails ("header_length 103", &f, C, FILE_SIZE, "header_length");
  f.header_length = 0;
  parse_fails ("header_length 0", &f, C, FILE_SIZE, "header_length");
  f.header_length = C + 8;
  parse_fails ("header_length > cluster", &f, 2 * C, FILE_SIZE,
               "header_length");

  f = valid_v3 ();
  f.compression_type = 2;
  f.incompatible_features = QCOW2_INCOMPAT_COMPRESSION;
  parse_fails ("compression_type 2", &f, C, FILE_SIZE, "compression_type");

  /* The compression bit must be set exactly when the type is not zlib. */
  f = valid_v3 ();
  f.compression_type = 1;
  f.incompatible_features = 0;
  parse_fails ("zstd without the bit", &f, C, FILE_SIZE, "compression");
  f.compression_type = 0;
  f.incompatible_features = QCOW2_INCOMPAT_COMPRESSION;
  parse_fails ("bit with zlib", &f, C, FILE_SIZE, "compression");
  f.header_length = 104;
  parse_fails ("bit without a type byte", &f, C, FILE_SIZE, "compression");

  /* 1 GiB + 1 byte needs a third L1 entry (512 MiB per entry). */
  f = valid_v3 ();
  f.size = 1 * GiB + 1;
  parse_fails ("l1_size too small", &f, C, FILE_SIZE, "l1_size");
  f = valid_v3 ();
  f.l1_size = 0;
  parse_fails ("l1_size 0", &f, C, FILE_SIZE, "l1_size");

  /* 32 MiB of L1 is the limit: one entry more is refused. */
  f = valid_v3 ();
  f.l1_size = (uint32_t) (32 * MiB / 8) + 1;
  parse_fails ("L1 > 32 MiB", &f, C, 64 * MiB, "l1_size");
  f.l1_size = UINT32_MAX;
  parse_fails ("L1 of 2^32-1 entries", &f, C, 64 * MiB, "l1_size");

  f = valid_v3 ();
  f.l1_table_offset = 3 * C + 512;
  parse_fails ("L1 unaligned", &f, C, FILE_SIZE, "l1_table_offset");
  f.l1_table_offset = FILE_SIZE;
  parse_fails ("L1 at the end of the file", &f, C, FILE_SIZE,
               "l1_table_offset");
  f.l1_table_offset = FILE_SIZE - C;
  f.l1_size = C / 8 + 1;
  parse_fails ("L1 running past the end", &f, C, FILE_SIZE, "l1_table_offset");
  f = valid_v3 ();
  f.l1_table_offset = UINT64_C (0xffffffffffff0000);
  parse_fails ("L1 at 2^64 - 64 KiB", &f, C, FILE_SIZE, "l1_table_offset");
  f.l1_table_offset = 0;
  parse_fails ("L1 over the header", &f, C, FILE_SIZE, "l1_table_offset");

  f = valid_v3 ();
  f.refcount_table_offset = C + 4096;
  parse_fails ("refcount table unaligned", &f, C, FILE_SIZE,
               "refcount_table_offset");
  f.refcount_table_offset = 0;
  parse_fails ("refcount table at 0", &f, C, FILE_SIZE,
               "refcount_table_offset");
  f.refcount_table_offset = QCOW2_MAX_HOST_OFFSET;
  parse_fails ("refcount table at 2^56", &f, C, FILE_SIZE,
               "refcount_table_offset");

  f = valid_v3 ();
  f.refcount_table_clusters = 0;
  parse_fails ("refcount_table_clusters 0", &f, C, FILE_SIZE,
               "refcount_table_clusters");
  f.refcount_table_clusters = 129;      /* 129 * 64 KiB > 8 MiB */
  parse_fails ("refcount table > 8 MiB", &f, C, FILE_SIZE,
               "refcount_table_clusters");

  f = valid_v3 ();
  f.nb_snapshots = 1;
  f.snapshots_offset = 5 * C + 8;
  parse_fails ("snapshots unaligned", &f, C, FILE_SIZE, "snapshots_offset");

  /* The backing file name must lie after the header, inside cluster 0. */
  f = valid_v3 ();
  f.backing_file_size = 10;
  f.backing_file_offset = C - 9;
  parse_fails ("backing name crossing cluster 0", &f, C, FILE_SIZE,
               "backing_file_offset");
  f.backing_file_offset = 2 * C;
  parse_fails ("backing name in cluster 2", &f, C, FILE_SIZE,
               "backing_file_offset");
  f.backing_file_offset = 64;
  parse_fails ("backing name inside the header", &f, C, FILE_SIZE,
               "backing_file_offset");
  f.backing_file_offset = 4096;
  parse_fails ("backing name past a short file", &f, 4096, FILE_SIZE,
               "backing_file_offset");
  /* offset + size wraps around 2^64 to a small number: still outside. */
  f.backing_file_offset = UINT64_MAX - 4;
  parse_fails ("backing name offset near 2^64", &f, C, FILE_SIZE,
               "backing_file_offset");
  f = valid_v3 ();
  f.backing_file_offset = 512;
  f.backing_file_size = 1024;
  parse_fails ("backing_file_size 1024", &f, C, FILE_SIZE,
               "backing_file_size");
}

/* Virtual sizes at the edge of what 64-bit offsets and a 32 MiB L1 can
 * address: parsing must refuse cleanly (no overflow in the L1 arithmetic)
 * and accept the largest disk that really fits.
 */
static void
test_huge_sizes (void)
{
  const uint64_t C = 2 * MiB;
  struct qcow2_header h;
  struct fields f;

  /* 2 MiB clusters: an L2 table maps 2^18 * 2 MiB = 512 GiB, so a 32 MiB
   * L1 (2^22 entries) maps exactly 2^61 bytes.
   */
  f = valid_v3 ();
  f.cluster_bits = 21;
  f.refcount_table_offset = C;
  f.l1_table_offset = 2 * C;
  f.l1_size = UINT32_C (1) << 22;
  f.size = UINT64_C (1) << 61;
  if (parse_ok ("2^61 bytes", &f, 4096, 2 * C + 32 * MiB, &h)) {
    CHECK_EQ (h.virtual_size, UINT64_C (1) << 61);
    CHECK_EQ (h.l2_bits, 18);
  }
  f.size = (UINT64_C (1) << 61) + 1;
  parse_fails ("2^61 + 1 bytes", &f, 4096, 2 * C + 32 * MiB, "l1_size");

  /* A size that is not a multiple of 512 is served in whole sectors,
   * rounded down, as qemu serves it.
   */
  f = valid_v3 ();
  f.size = 1 * MiB + 4;
  if (parse_ok ("1 MiB + 4 bytes", &f, C, FILE_SIZE, &h))
    CHECK_EQ (h.virtual_size, 1 * MiB);

  /* Near 2^63: an L1 table big enough would exceed 32 MiB. */
  f.l1_size = UINT32_MAX;
  f.size = INT64_MAX - C;
  parse_fails ("2^63 - 2 MiB - 1", &f, 4096, 64 * MiB, "l1_size");
  f.size = INT64_MAX;
  parse_fails ("2^63 - 1", &f, 4096, 64 * MiB, "^size");
  f.size = UINT64_C (1) << 63;
  parse_fails ("2^63", &f, 4096, 64 * MiB, "^size");
  f.size = UINT64_MAX;
  parse_fails ("2^64 - 1", &f, 4096, 64 * MiB, "^size");

  /* 512-byte clusters near 2^63: l1_size (32 bits) can never be enough. */
  f = valid_v3 ();
  f.cluster_bits = 9;
  f.refcount_table_offset = 512;
  f.l1_table_offset = 1024;
  f.l1_size = UINT32_MAX;
  f.size = INT64_MAX - 512;
  parse_fails ("2^63 with 512 B clusters", &f, 512, 64 * MiB, "l1_size");
}

/* Parse F and run qcow2_header_check_features on the result. */
static void
features_case (const char *what, const struct fields *f, const char *field)
{
  struct qcow2_header h;
  char err[256] = "";
  int r;

  if (!parse_ok (what, f, 64 * KiB, FILE_SIZE, &h))
    return;
  r = qcow2_header_check_features (&h, err, sizeof err);
  if (field == NULL) {
    CHECK_EQ (r, 0);
    if (r != 0)
      fprintf (stderr, "  %s: unexpected error: %s\n", what, err);
    return;
  }
  CHECK_EQ (r, -1);
  CHECK (strstr (err, field) != NULL);
  if (r != -1 || strstr (err, field) == NULL)
    fprintf (stderr, "  %s: expected an error naming \"%s\", got %d \"%s\"\n",
             what, field, r, err);
}

static void
test_check_features (void)
{
  struct fields f;

  f = valid_v3 ();
  features_case ("plain v3", &f, NULL);
  f = valid_v2 ();
  features_case ("plain v2", &f, NULL);

  /* A read-only reader serves dirty and corrupt images, as qemu does
   * read-only; compatible and autoclear bits never matter to it.
   */
  f = valid_v3 ();
  f.incompatible_features = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT;
  f.compatible_features = ~UINT64_C (0);
  f.autoclear_features = ~UINT64_C (0);
  features_case ("dirty, corrupt, all compat and autoclear bits", &f, NULL);
  f = valid_v3 ();
  f.compression_type = 1;
  f.incompatible_features = QCOW2_INCOMPAT_COMPRESSION;
  features_case ("zstd", &f, NULL);

  for (unsigned bit = 5; bit < 64; ++bit) {
    unsigned long before = atomic_load (&unit_failures);
    f = valid_v3 ();
    f.incompatible_features = UINT64_C (1) << bit;
    features_case ("unknown incompatible bit", &f, "incompatible_features");
    UNIT_NOTE_IF_FAILED (before, "incompatible bit %u", bit);
  }

  /* LUKS is served (once unlocked); legacy AES and unknown methods are
   * refused, saying what they are.
   */
  f = valid_v3 ();
  f.crypt_method = 1;
  features_case ("AES", &f, "legacy AES");
  f.crypt_method = 3;
  features_case ("method 3", &f, "unknown encryption method 3");
  f.crypt_method = 2;
  features_case ("LUKS", &f, NULL);

  /* An external data file is the image's to open (datafile.h). */
  f = valid_v3 ();
  f.incompatible_features = QCOW2_INCOMPAT_DATA_FILE;
  features_case ("external data file", &f, NULL);

  /* Extended L2 entries are read (not written); they need clusters of
   * 16 KiB or more.
   */
  f = valid_v3 ();
  f.incompatible_features = QCOW2_INCOMPAT_EXTL2;
  f.l1_size = 4;                /* 16-byte entries: 256 MiB per L2 table */
  features_case ("extended L2", &f, NULL);
  f.cluster_bits = 13;
  f.l1_size = 2048;
  features_case ("extended L2 with 8 KiB clusters", &f, "extended L2");

  f = valid_v3 ();
  f.backing_file_offset = 512;
  f.backing_file_size = 8;
  features_case ("backing file", &f, "backing_file");
}

/* ------------------------------------------------------- extensions */

struct seen_ext {
  uint32_t type;
  uint32_t len;
  uint8_t first_byte;
};

struct ext_log {
  struct seen_ext ext[16];
  size_t count;
  size_t stop_after;            /* return 1 after this many; 0: never */
};

static int
record_ext (void *opaque, uint32_t type, const uint8_t *data, uint32_t len)
{
  struct ext_log *log = opaque;

  if (log->count < 16)
    log->ext[log->count] = (struct seen_ext) {
      .type = type, .len = len, .first_byte = len ? data[0] : 0,
    };
  log->count++;
  return log->stop_after && log->count >= log->stop_after;
}

/* Append an extension at *POS: header, data filled with FILL, padding. */
static void
put_ext (uint8_t *buf, size_t *pos, uint32_t type, uint32_t len, uint8_t fill)
{
  put32 (buf + *pos, type);
  put32 (buf + *pos + 4, len);
  memset (buf + *pos + 8, fill, len);
  *pos += 8 + ((len + 7) & ~7u);
}

static int
walk (const uint8_t *buf, size_t len, const struct qcow2_header *h,
      struct ext_log *log, char *err, size_t errlen)
{
  memset (log->ext, 0, sizeof log->ext);
  log->count = 0;
  return qcow2_header_walk_extensions (buf, len, h, record_ext, log,
                                       err, errlen);
}

static void
test_extensions (void)
{
  const size_t C = 64 * KiB;
  struct fields f = valid_v3 ();
  struct header_buf hb = make (&f, C);
  struct qcow2_header h;
  struct ext_log log = { .stop_after = 0 };
  char err[256];
  size_t pos;
  int r;

  /* No extensions: the area after the header is zero, an end marker. */
  CHECK_EQ (qcow2_header_parse (hb.bytes, C, FILE_SIZE, &h, err, sizeof err),
            0);
  CHECK_EQ (walk (hb.bytes, C, &h, &log, err, sizeof err), 0);
  CHECK_EQ (log.count, 0);

  /* A normal list, as qemu writes it, plus an unknown type, then the end
   * marker and something after it that must not be seen.
   */
  pos = f.header_length;
  put_ext (hb.bytes, &pos, QCOW2_EXT_BACKING_FORMAT, 5, 'q');
  put_ext (hb.bytes, &pos, QCOW2_EXT_FEATURE_NAMES, 48 * 3, 'f');
  put_ext (hb.bytes, &pos, 0x12345678, 0, 0);
  put_ext (hb.bytes, &pos, 0xdeadbeef, 13, 'u');
  put_ext (hb.bytes, &pos, QCOW2_EXT_END, 0, 0);
  put_ext (hb.bytes, &pos, QCOW2_EXT_BITMAPS, 24, 'b');
  r = walk (hb.bytes, C, &h, &log, err, sizeof err);
  CHECK_EQ (r, 0);
  CHECK_EQ (log.count, 4);
  CHECK_EQ (log.ext[0].type, QCOW2_EXT_BACKING_FORMAT);
  CHECK_EQ (log.ext[0].len, 5);
  CHECK_EQ (log.ext[0].first_byte, 'q');
  CHECK_EQ (log.ext[1].type, QCOW2_EXT_FEATURE_NAMES);
  CHECK_EQ (log.ext[1].len, 48 * 3);
  CHECK_EQ (log.ext[1].first_byte, 'f');
  CHECK_EQ (log.ext[2].type, 0x12345678);
  CHECK_EQ (log.ext[2].len, 0);
  CHECK_EQ (log.ext[3].type, 0xdeadbeef);
  CHECK_EQ (log.ext[3].len, 13);
  CHECK_EQ (log.ext[3].first_byte, 'u');

  /* The callback can stop the walk; that is not an error. */
  log.stop_after = 2;
  CHECK_EQ (walk (hb.bytes, C, &h, &log, err, sizeof err), 0);
  CHECK_EQ (log.count, 2);
  log.stop_after = 0;

  /* A NULL callback only validates. */
  CHECK_EQ (qcow2_header_walk_extensions (hb.bytes, C, &h, NULL, NULL,
                                          err, sizeof err), 0);

  /* An extension whose length runs past the end of cluster 0. */
  memset (hb.bytes + f.header_length, 0, C - f.header_length);
  pos = f.header_length;
  put_ext (hb.bytes, &pos, QCOW2_EXT_BACKING_FORMAT, 5, 'q');
  put32 (hb.bytes + pos, QCOW2_EXT_FEATURE_NAMES);
  put32 (hb.bytes + pos + 4, (uint32_t) (C - pos - 8 + 1));
  err[0] = '\0';
  r = walk (hb.bytes, C, &h, &log, err, sizeof err);
  CHECK_EQ (r, -1);
  CHECK (strstr (err, "extension") != NULL);
  CHECK_EQ (log.count, 1);
  /* The largest length: no overflow in the bound check. */
  put32 (hb.bytes + pos + 4, UINT32_MAX);
  CHECK_EQ (walk (hb.bytes, C, &h, &log, err, sizeof err), -1);
  /* Exactly filling the rest of the cluster, no end marker: accepted,
   * as qemu accepts it.
   */
  put32 (hb.bytes + pos + 4, (uint32_t) (C - pos - 8));
  CHECK_EQ (walk (hb.bytes, C, &h, &log, err, sizeof err), 0);
  CHECK_EQ (log.count, 2);

  /* A file shorter than a cluster: the extensions end with the file. */
  memset (hb.bytes + f.header_length, 0, C - f.header_length);
  pos = f.header_length;
  put_ext (hb.bytes, &pos, 0x11111111, 100, 'x');
  CHECK_EQ (walk (hb.bytes, 4096, &h, &log, err, sizeof err), 0);
  CHECK_EQ (log.count, 1);
  CHECK_EQ (walk (hb.bytes, f.header_length + 8 + 99, &h, &log,
                  err, sizeof err), -1);

  /* With a backing file the extensions must end before its name. */
  free (hb.bytes);
  f = valid_v3 ();
  f.backing_file_offset = 512;
  f.backing_file_size = 16;
  hb = make (&f, C);
  memcpy (hb.bytes + 512, "base-image.qcow2", 16);
  CHECK_EQ (qcow2_header_parse (hb.bytes, C, FILE_SIZE, &h, err, sizeof err),
            0);
  pos = f.header_length;
  put_ext (hb.bytes, &pos, QCOW2_EXT_BACKING_FORMAT, 5, 'q');
  put_ext (hb.bytes, &pos, QCOW2_EXT_END, 0, 0);
  CHECK_EQ (walk (hb.bytes, C, &h, &log, err, sizeof err), 0);
  CHECK_EQ (log.count, 1);
  pos = f.header_length;
  put32 (hb.bytes + pos, QCOW2_EXT_FEATURE_NAMES);
  put32 (hb.bytes + pos + 4, 512 - f.header_length - 8 + 1);
  CHECK_EQ (walk (hb.bytes, C, &h, &log, err, sizeof err), -1);

  /* v2 headers have extensions too, right after the 72 bytes. */
  free (hb.bytes);
  f = valid_v2 ();
  hb = make (&f, C);
  memset (hb.bytes + 72, 0, 64);
  CHECK_EQ (qcow2_header_parse (hb.bytes, C, FILE_SIZE, &h, err, sizeof err),
            0);
  pos = 72;
  put_ext (hb.bytes, &pos, QCOW2_EXT_BACKING_FORMAT, 3, 'r');
  CHECK_EQ (walk (hb.bytes, C, &h, &log, err, sizeof err), 0);
  CHECK_EQ (log.count, 1);
  CHECK_EQ (log.ext[0].type, QCOW2_EXT_BACKING_FORMAT);
  free (hb.bytes);
}

/* A small errbuf: messages are cut, never overflow; errlen 1 leaves "". */
static void
test_small_errbuf (void)
{
  struct fields f = valid_v3 ();
  struct header_buf hb;
  struct qcow2_header h;
  char err[8];

  f.cluster_bits = 30;
  hb = make (&f, 4096);
  memset (err, 'z', sizeof err);
  CHECK_EQ (qcow2_header_parse (hb.bytes, hb.len, FILE_SIZE, &h, err, 4), -1);
  CHECK_EQ (strlen (err), 3);
  CHECK_EQ (err[4], 'z');
  memset (err, 'z', sizeof err);
  CHECK_EQ (qcow2_header_parse (hb.bytes, hb.len, FILE_SIZE, &h, err, 1), -1);
  CHECK_EQ (err[0], '\0');
  CHECK_EQ (err[1], 'z');
  free (hb.bytes);
}

/* Arbitrary bytes must never crash the parser (it is a fuzz target):
 * mutate a valid header and parse it in a buffer of the exact size, so
 * that the sanitizer build catches any read past the end.
 */
static void
test_mutations (void)
{
  struct fields f = valid_v3 ();
  uint8_t good[512];
  uint64_t state = 0x9e3779b97f4a7c15;
  unsigned accepted = 0;

  write_header (good, sizeof good, &f);
  for (unsigned iter = 0; iter < 20000; ++iter) {
    size_t len = 72 + iter % (sizeof good - 72 + 1);
    uint8_t *buf = malloc (len);
    struct qcow2_header h;
    char err[128];

    memcpy (buf, good, len);
    for (int k = 0; k < 3; ++k) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      buf[(state >> 8) % (len < 112 ? len : 112)] ^= (uint8_t) (state >> 40);
    }
    if (qcow2_header_parse (buf, len, FILE_SIZE, &h, err, sizeof err) == 0) {
      accepted++;
      /* Whatever is accepted is self-consistent. */
      CHECK (h.cluster_bits >= 9 && h.cluster_bits <= 21);
      CHECK (h.header_length <= h.cluster_size);
      CHECK (h.version == 2 || h.version == 3);
      qcow2_header_check_features (&h, err, sizeof err);
      qcow2_header_walk_extensions (buf, len, &h, NULL, NULL,
                                    err, sizeof err);
    }
    free (buf);
  }
  /* Most single-byte changes land in fields that are still valid. */
  CHECK (accepted > 0);
}

int
main (void)
{
  test_valid_headers ();
  test_rejections ();
  test_huge_sizes ();
  test_check_features ();
  test_extensions ();
  test_small_errbuf ();
  test_mutations ();
  return unit_finish ();
}
