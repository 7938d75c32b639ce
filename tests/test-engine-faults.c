/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: broken images and failing storage.  Every broken
 * entry gives -EIO for its cluster only, with a message naming the
 * problem, while the rest reads fine; every storage error comes back as
 * its errno, and nothing bad is cached; images that cannot be served are
 * refused at open.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2.h"
#include "read-image.h"
#include "session.h"
#include "unit.h"
#include "util.h"

/* --------------------------------------------------- corrupt images */

/* A copy of the image's file with one 64-bit value replaced. */
static uint8_t *
patched (const struct image *img, uint64_t pos, uint64_t value)
{
  uint8_t *copy = xmalloc (img->file_size);

  memcpy (copy, img->file, img->file_size);
  put64 (copy + pos, value);
  return copy;
}

enum effect {
  METADATA,     /* read, prefetch and extents fail */
  DATA,         /* read and prefetch fail; extents are fine */
};

/* Open FILE, expect reads touching guest cluster K to fail with -EIO,
 * each failure logged, while cluster GOOD still reads fine, before and
 * after the failures.  WORD must appear in the logged message.
 */
static void
expect_corrupt (const char *what, const struct image *img, uint8_t *file,
                uint64_t k, uint64_t good, enum effect effect,
                const char *word)
{
  const uint64_t C = img->cluster_size;
  static const unsigned thread_counts[] = { 0, 3 };

  for (int t = 0; t < 2; ++t) {
    struct qcow2_options opts = default_options;
    unsigned long before = atomic_load (&unit_failures);
    struct session s;
    uint8_t *buf = xmalloc (3 * C);
    unsigned errors;

    opts.threads = thread_counts[t];
    CHECK_EQ (session_open (&s, file, img->file_size, &opts), 0);
    if (s.conn == NULL) {
      fprintf (stderr, "  %s: open failed: %s\n", what, s.log.last);
      session_close (&s);
      free (buf);
      continue;
    }
    CHECK (read_cluster (&s, img, good, what));

    errors = s.log.errors;
    CHECK_EQ (do_read (&s, buf, C, k * C), -EIO);
    CHECK (logged (&s, &errors));
    CHECK (strstr (s.log.last, word) != NULL);
    if (strstr (s.log.last, word) == NULL)
      fprintf (stderr, "  %s: message without \"%s\": %s\n", what, word,
               s.log.last);
    /* A part of the cluster, and a range around it. */
    CHECK_EQ (do_read (&s, buf, 10, k * C + C / 2), -EIO);
    CHECK (logged (&s, &errors));
    if (k > 0 && (k + 2) * C <= img->virtual_size) {
      CHECK_EQ (do_read (&s, buf, 3 * C - 2, k * C - C + 1), -EIO);
      CHECK (logged (&s, &errors));
    }
    /* The same again: an error is not cached as success. */
    CHECK_EQ (do_read (&s, buf, C, k * C), -EIO);
    CHECK (logged (&s, &errors));
    CHECK_EQ (do_prefetch (&s, k * C, C), -EIO);
    CHECK (logged (&s, &errors));

    {
      struct extent_check ec = { .img = img, .next = k * C };
      int r;

      mem_io_engine_call = true;
      r = qcow2_extents (s.conn, &s.mio.io, k * C, C, check_extent, &ec);
      mem_io_engine_call = false;
      if (effect == METADATA) {
        CHECK_EQ (r, -EIO);
        CHECK (logged (&s, &errors));
      }
      else {
        CHECK_EQ (r, 0);
        CHECK (!ec.bad);
        CHECK_EQ (ec.next, (k + 1) * C);
      }
    }
    /* The connection is still fine for good clusters. */
    CHECK (read_cluster (&s, img, good, what));
    session_close (&s);
    free (buf);
    UNIT_NOTE_IF_FAILED (before, "%s, %s, threads %u", img->spec->name, what,
                         opts.threads);
  }
}

/* Replace guest cluster K's L2 entry by ENTRY and expect corruption. */
static void
corrupt_entry (const char *what, const struct image *img, uint64_t k,
               uint64_t entry, uint64_t good, enum effect effect,
               const char *word)
{
  uint8_t *file;

  CHECK (k != UINT64_MAX && img->entry_pos[k] != 0);
  if (k == UINT64_MAX || img->entry_pos[k] == 0)
    return;
  file = patched (img, img->entry_pos[k], entry);
  expect_corrupt (what, img, file, k, good, effect, word);
  free (file);
}

static void
test_corrupt (const struct image *img)
{
  const uint64_t C = img->cluster_size;
  const unsigned csize_shift = 62 - (img->spec->cluster_bits - 8);
  const uint64_t normal = find_cluster (img, 1, NORMAL, -1);
  const uint64_t compressed = find_cluster (img, 1, COMPRESSED, -1);
  const uint64_t beyond = ((img->file_size + C - 1) / C + 4) * C;
  uint64_t good = UINT64_MAX, good_other_table = UINT64_MAX;
  uint64_t cut = UINT64_MAX;

  if (normal == UINT64_MAX || compressed == UINT64_MAX) {
    CHECK (!"the test image lacks normal or compressed clusters");
    return;
  }
  /* A compressed cluster whose stream still has 8 bytes or more in its
   * last sector: one sector less must cut it (a deflate stream cut by
   * fewer bytes may lose only its end-of-block code, and qemu accepts
   * what still fills the cluster).
   */
  for (uint64_t k = 1; k < img->nclusters && cut == UINT64_MAX; ++k) {
    uint64_t e = img->entry[k];
    uint64_t off = e & ((UINT64_C (1) << csize_shift) - 1);
    uint64_t nsect = ((e >> csize_shift) & ((C >> 8) - 1)) + 1;
    uint64_t tail = (off + img->csize[k]) & 511;

    if (img->kind[k] == COMPRESSED && k != compressed && nsect >= 2 &&
        (tail == 0 || tail >= 8))
      cut = k;
  }
  CHECK (cut != UINT64_MAX);
  /* Clusters to read while others are broken: any cluster that is not
   * broken, and, for broken L1 entries, one under another L1 entry.
   */
  for (uint64_t k = 0; k < img->nclusters; ++k)
    if (k != normal && k != compressed && k != cut &&
        img->kind[k] != UNALLOC) {
      if (good == UINT64_MAX)
        good = k;
      if (k / (C / 8) != normal / (C / 8))
        good_other_table = k;
    }
  CHECK (good != UINT64_MAX);
  if (good == UINT64_MAX)
    return;

  /* Reserved bits, low and high; in a normal, zero and unallocated entry. */
  corrupt_entry ("reserved bit 1", img, normal,
                 img->entry[normal] | 2, good, METADATA, "reserved");
  corrupt_entry ("reserved bit 61", img, normal,
                 img->entry[normal] | UINT64_C (1) << 61, good, METADATA,
                 "reserved");
  corrupt_entry ("reserved bit 8, no offset", img, normal,
                 UINT64_C (1) << 8, good, METADATA, "reserved");
  if (img->spec->version == 3)
    corrupt_entry ("reserved bit 4 on a zero entry", img, normal,
                   L2E_ZERO | 16, good, METADATA, "reserved");

  /* Normal data not on a cluster boundary (only possible above 512 B). */
  if (C > 512)
    corrupt_entry ("unaligned offset", img, normal,
                   (img->entry[normal] + 512) | COPIED, good, METADATA,
                   "aligned");
  corrupt_entry ("data past the end of the file", img, normal,
                 beyond | COPIED, good, METADATA, "end of the file");

  /* The zero flag means nothing in v2: corruption. */
  if (img->spec->version == 2)
    corrupt_entry ("zero flag in v2", img, normal, L2E_ZERO, good, METADATA,
                   "version 2");

  /* Compressed: data past the end; too few sectors; garbage. */
  corrupt_entry ("compressed data past the end of the file", img, compressed,
                 L2E_COMPRESSED | beyond, good, METADATA, "end of the file");
  if (cut != UINT64_MAX) {
    uint64_t e = img->entry[cut];
    uint64_t nsect = ((e >> csize_shift) & ((C >> 8) - 1)) + 1;
    uint64_t off = e & ((UINT64_C (1) << csize_shift) - 1);

    corrupt_entry ("compressed count one too small", img, cut,
                   L2E_COMPRESSED | (nsect - 2) << csize_shift | off, good,
                   DATA, "compressed");
    if (nsect > 2)
      corrupt_entry ("compressed count 0", img, cut, L2E_COMPRESSED | off,
                     good, DATA, "compressed");
  }
  corrupt_entry ("compressed garbage", img, compressed,
                 L2E_COMPRESSED | (C / 512 - 1) << csize_shift |
                 (img->garbage_offset + 3), good, DATA, "compressed");
  /* The header as compressed data: "QFI\xfb..." is no stream either. */
  corrupt_entry ("compressed header", img, compressed,
                 L2E_COMPRESSED | UINT64_C (1) << csize_shift | 0, good, DATA,
                 "compressed");

  /* L1 entries: reserved bits, an unaligned L2 table, one past the end
   * (only if some cluster lives under another L1 entry).
   */
  good = good_other_table;
  if (good != UINT64_MAX) {
    uint64_t l1_index = normal / (C / 8);
    uint64_t pos = img->l1_offset + 8 * l1_index;
    uint64_t l1e = get64 (img->file + pos);
    uint8_t *file;

    file = patched (img, pos, l1e | UINT64_C (1) << 62);
    expect_corrupt ("L1 reserved bit 62", img, file, normal, good, METADATA,
                    "reserved");
    free (file);
    file = patched (img, pos, l1e | 1);
    expect_corrupt ("L1 reserved bit 0", img, file, normal, good, METADATA,
                    "reserved");
    free (file);
    if (C > 512) {
      file = patched (img, pos, l1e + 512);
      expect_corrupt ("L1 unaligned", img, file, normal, good, METADATA,
                      "aligned");
      free (file);
    }
    file = patched (img, pos, beyond | COPIED);
    expect_corrupt ("L2 table past the end", img, file, normal, good,
                    METADATA, "outside the file");
    free (file);
  }
}

/* -------------------------------------------------------- I/O errors */

static void
test_io_errors (const struct image *img)
{
  const uint64_t C = img->cluster_size;
  const uint64_t normal = find_cluster (img, 0, NORMAL, -1);
  const uint64_t compressed = find_cluster (img, 0, COMPRESSED, -1);
  static const unsigned thread_counts[] = { 0, 3 };
  struct session s;
  uint8_t *buf = xmalloc (4 * C);

  /* Open: size () fails; the header read fails. */
  memset (&s, 0, sizeof s);
  mem_io_init (&s.mio, img->file, img->file_size, img->file_size, 0);
  session_log_init (&s);
  s.mio.size_errno = ENOTTY;
  mem_io_engine_call = true;
  CHECK_EQ (qcow2_image_open (&s.mio.io, &s.qlog, &default_options, &s.img),
            -ENOTTY);
  CHECK (s.img == NULL);
  CHECK_EQ (s.log.errors, 1);
  s.mio.size_errno = 0;
  s.mio.fail_errno = ENXIO;
  s.mio.fail_from = 0;
  s.mio.fail_to = 1;
  CHECK_EQ (qcow2_image_open (&s.mio.io, &s.qlog, &default_options, &s.img),
            -ENXIO);
  CHECK (s.img == NULL);
  CHECK_EQ (s.log.errors, 2);
  /* The first cluster (for small images it holds the L1 table too) or,
   * for big ones, the L1 table cannot be read.
   */
  s.mio.fail_from = img->l1_offset;
  s.mio.fail_to = img->l1_offset + 8;
  CHECK_EQ (qcow2_image_open (&s.mio.io, &s.qlog, &default_options, &s.img),
            -ENXIO);
  CHECK (s.img == NULL);
  CHECK_EQ (s.log.errors, 3);
  mem_io_engine_call = false;
  session_close (&s);

  for (int t = 0; t < 2; ++t) {
    struct qcow2_options opts = default_options;
    unsigned long before = atomic_load (&unit_failures);
    unsigned errors;
    uint64_t l2 = img->entry_pos[normal] & ~(C - 1);
    uint64_t long_read = img->virtual_size - compressed * C;

    if (long_read > 4 * C)
      long_read = 4 * C;

    opts.threads = thread_counts[t];
    CHECK_EQ (session_open (&s, img->file, img->file_size, &opts), 0);
    if (s.conn == NULL) {
      session_close (&s);
      continue;
    }

    /* The L2 table cannot be read: the errno comes back as it is. */
    s.mio.fail_errno = ENXIO;
    s.mio.fail_from = l2;
    s.mio.fail_to = l2 + C;
    errors = s.log.errors;
    CHECK_EQ (do_read (&s, buf, C, normal * C), -ENXIO);
    CHECK_EQ (s.log.errors, errors + 1);
    CHECK_EQ (do_read (&s, buf, 1, normal * C), -ENXIO);
    CHECK_EQ (s.log.errors, errors + 2);
    CHECK_EQ (do_prefetch (&s, 0, 4 * C), -ENXIO);
    CHECK_EQ (s.log.errors, errors + 3);
    {
      struct extent_check ec = { .img = img, .next = normal * C };
      mem_io_engine_call = true;
      CHECK_EQ (qcow2_extents (s.conn, &s.mio.io, normal * C, C,
                               check_extent, &ec), -ENXIO);
      mem_io_engine_call = false;
      CHECK_EQ (s.log.errors, errors + 4);
    }
    /* Once the storage recovers, so do the reads: no half-read table was
     * kept in the cache.
     */
    s.mio.fail_errno = 0;
    CHECK (read_and_compare (&s, img, normal * C, C, "after an L2 error"));

    /* The data of a normal cluster. */
    s.mio.fail_errno = EROFS;
    s.mio.fail_from = get64 (img->file + img->entry_pos[normal]) & ~COPIED;
    s.mio.fail_to = s.mio.fail_from + C;
    errors = s.log.errors;
    CHECK_EQ (do_read (&s, buf, C, normal * C), -EROFS);
    CHECK_EQ (s.log.errors, errors + 1);
    CHECK_EQ (do_read (&s, buf, 3, normal * C + 7), -EROFS);
    CHECK_EQ (s.log.errors, errors + 2);

    /* The compressed streams: whole cluster, part, prefetch. */
    s.mio.fail_errno = EPIPE;
    s.mio.fail_from = img->compressed_start;
    s.mio.fail_to = img->file_size;
    errors = s.log.errors;
    CHECK_EQ (do_read (&s, buf, C, compressed * C), -EPIPE);
    CHECK_EQ (s.log.errors, errors + 1);
    CHECK_EQ (do_read (&s, buf, 5, compressed * C + 3), -EPIPE);
    CHECK_EQ (s.log.errors, errors + 2);
    CHECK_EQ (do_prefetch (&s, compressed * C, C), -EPIPE);
    CHECK_EQ (s.log.errors, errors + 3);
    /* A long read over many compressed clusters fails as a whole. */
    CHECK_EQ (do_read (&s, buf, long_read, compressed * C), -EPIPE);
    CHECK_EQ (s.log.errors, errors + 4);

    s.mio.fail_errno = 0;
    CHECK (read_and_compare (&s, img, compressed * C, C, "after EPIPE"));
    CHECK (read_and_compare (&s, img, compressed * C + 3, 5, "after EPIPE"));
    session_close (&s);
    UNIT_NOTE_IF_FAILED (before, "%s, I/O errors, threads %u",
                         img->spec->name, opts.threads);
  }
  free (buf);
}

/* Images that open must not be half-checked: each of these is refused
 * with -EINVAL and a message.
 */
static void
test_open_refusals (const struct image *img)
{
  struct {
    const char *what;
    uint64_t pos, value;
    uint64_t size;              /* 0: the image's own */
    const char *word;
  } cases[] = {
    { "bad magic", 0, UINT64_C (0x514649fa00000003), 0, "magic" },
    { "version 4", 0, UINT64_C (0x514649fb00000004), 0, "version" },
    { "backing file", 8, 512, 0, "backing" },
    { "empty file", 0, 0, 1, "small" },
    { "encrypted", 32, UINT64_C (0x0000000100000000) | img->l1_size, 0,
      "crypt" },
  };

  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    uint8_t *file = patched (img, cases[i].pos, cases[i].value);
    struct session s;
    int r;

    if (i == 2)
      put32 (file + 16, 10);           /* backing name of 10 bytes */
    r = session_open (&s, file, cases[i].size ? cases[i].size - 1
                      : img->file_size, &default_options);
    CHECK_EQ (r, -EINVAL);
    CHECK (s.img == NULL);
    CHECK_EQ (s.log.errors, 1);
    CHECK (strstr (s.log.last, cases[i].word) != NULL);
    if (r != -EINVAL || strstr (s.log.last, cases[i].word) == NULL)
      fprintf (stderr, "  %s: %d \"%s\"\n", cases[i].what, r, s.log.last);
    session_close (&s);

    /* Without a log: the same refusal, no crash. */
    {
      struct mem_io m;
      struct qcow2_image *image = NULL;
      uint64_t size = cases[i].size ? cases[i].size - 1 : img->file_size;
      mem_io_init (&m, file, size, size, 0);
      mem_io_engine_call = true;
      CHECK_EQ (qcow2_image_open (&m.io, NULL, &default_options, &image),
                -EINVAL);
      mem_io_engine_call = false;
      CHECK (image == NULL);
      mem_io_free (&m);
    }
    free (file);
  }

  /* A good image without a log still reads, and its errors are silent. */
  {
    struct mem_io m;
    struct qcow2_image *image = NULL;
    struct qcow2_conn *conn;
    uint8_t byte;

    mem_io_init (&m, img->file, img->file_size, img->file_size, 0);
    mem_io_engine_call = true;
    CHECK_EQ (qcow2_image_open (&m.io, NULL, &default_options, &image), 0);
    if (image) {
      conn = qcow2_conn_new (image);
      CHECK (conn != NULL);
      CHECK_EQ (qcow2_read (conn, &m.io, &byte, 1, img->virtual_size),
                -EINVAL);
      CHECK_EQ (qcow2_read (conn, &m.io, &byte, 1, 0), 0);
      qcow2_conn_free (conn);
      qcow2_image_close (image);
    }
    mem_io_engine_call = false;
    mem_io_free (&m);
  }
}

int
main (void)
{
  for (size_t i = 0; i < read_image_nspecs; ++i) {
    struct image *img = image_new (&read_image_specs[i]);
    unsigned long before = atomic_load (&unit_failures);

    test_corrupt (img);
    test_io_errors (img);
    if (i == 0)
      test_open_refusals (img);
    UNIT_NOTE_IF_FAILED (before, "image %s", read_image_specs[i].name);
    image_free (img);
  }
  return unit_finish ();
}
