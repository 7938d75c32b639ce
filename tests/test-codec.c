/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: decoding one compressed cluster.
 *
 * The compressed inputs are made here the way qemu makes them: raw
 * deflate with a 4 KiB window (deflateInit2 (level, Z_DEFLATED, -12, 9,
 * Z_DEFAULT_STRATEGY)) and one zstd frame per cluster.  Inputs and
 * outputs live in buffers of exactly their size so that the sanitizer
 * build catches any access outside them; a guard check catches writes past
 * the output in the plain build too.
 */
#include <config.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>
#include <zstd.h>

#include "format/codec.h"
#include "unit.h"
#include "util.h"

/* Reproducible pseudo-random bytes. */
static uint64_t rng_state = 0x2545f4914f6cdd1d;

/* A compressed stream in a buffer of exactly LEN bytes. */
struct blob {
  uint8_t *data;
  size_t len;
};

static struct blob
blob_copy (const uint8_t *data, size_t len, size_t extra, uint8_t extra_fill)
{
  struct blob b = { .data = xmalloc (len + extra), .len = len + extra };

  memcpy (b.data, data, len);
  memset (b.data + len, extra_fill, extra);
  return b;
}

/* Raw deflate as qemu writes it; FLUSH is Z_FINISH for a terminated
 * stream or Z_SYNC_FLUSH for one that qemu still accepts.
 */
static struct blob
deflate_raw (const uint8_t *src, size_t len, int level, int flush)
{
  z_stream zs;
  size_t cap = deflateBound (NULL, len) + 64;
  uint8_t *out = xmalloc (cap);
  struct blob b;
  int r;

  memset (&zs, 0, sizeof zs);
  if (deflateInit2 (&zs, level, Z_DEFLATED, -12, 9, Z_DEFAULT_STRATEGY)
      != Z_OK) {
    fprintf (stderr, "deflateInit2 failed\n");
    exit (1);
  }
  zs.next_in = (Bytef *) src;
  zs.avail_in = len;
  zs.next_out = out;
  zs.avail_out = cap;
  r = deflate (&zs, flush);
  if (flush == Z_FINISH ? r != Z_STREAM_END : r != Z_OK || zs.avail_in) {
    fprintf (stderr, "deflate failed: %d\n", r);
    exit (1);
  }
  b = blob_copy (out, cap - zs.avail_out, 0, 0);
  deflateEnd (&zs);
  free (out);
  return b;
}

static struct blob
zstd_frame (const uint8_t *src, size_t len, int level)
{
  size_t cap = ZSTD_compressBound (len);
  uint8_t *out = xmalloc (cap);
  size_t r = ZSTD_compress (out, cap, src, len, level);
  struct blob b;

  if (ZSTD_isError (r)) {
    fprintf (stderr, "ZSTD_compress: %s\n", ZSTD_getErrorName (r));
    exit (1);
  }
  b = blob_copy (out, r, 0, 0);
  free (out);
  return b;
}

/* A zstd frame without the content size field, as a streaming writer
 * makes it (the decoder must not need that field), and with a checksum,
 * which qemu does not write but a decoder has to skip.
 */
static struct blob
zstd_frame_no_size (const uint8_t *src, size_t len)
{
  ZSTD_CCtx *cctx = ZSTD_createCCtx ();
  size_t cap = ZSTD_compressBound (len) + 64;
  uint8_t *out = xmalloc (cap);
  ZSTD_inBuffer in = { src, len, 0 };
  ZSTD_outBuffer outb = { out, cap, 0 };
  struct blob b;
  size_t r;

  ZSTD_CCtx_setParameter (cctx, ZSTD_c_contentSizeFlag, 0);
  ZSTD_CCtx_setParameter (cctx, ZSTD_c_checksumFlag, 1);
  do
    r = ZSTD_compressStream2 (cctx, &outb, &in, ZSTD_e_end);
  while (!ZSTD_isError (r) && r != 0);
  if (ZSTD_isError (r)) {
    fprintf (stderr, "ZSTD_compressStream2: %s\n", ZSTD_getErrorName (r));
    exit (1);
  }
  b = blob_copy (out, outb.pos, 0, 0);
  ZSTD_freeCCtx (cctx);
  free (out);
  return b;
}

/* B followed by C in one new blob; frees both. */
static struct blob
concat (struct blob b, struct blob c)
{
  struct blob r = { .data = xmalloc (b.len + c.len), .len = b.len + c.len };

  memcpy (r.data, b.data, b.len);
  memcpy (r.data + b.len, c.data, c.len);
  free (b.data);
  free (c.data);
  return r;
}

/* B with LEN random bytes appended (the start of the next cluster). */
static struct blob
with_random_tail (struct blob b, size_t len)
{
  struct blob tail = { .data = xmalloc (len), .len = len };

  for (size_t i = 0; i < len; ++i)
    tail.data[i] = (uint8_t) rng (&rng_state);
  return concat (b, tail);
}

/* Decode IN into a fresh buffer of exactly OUT_LEN bytes.  Returns the
 * decoder's result; on success *OUT holds the data (caller frees).
 */
static int
decode (struct qcow2_decoder *dec, enum qcow2_compression type,
        const struct blob *in, size_t out_len, uint8_t **out,
        char *err, size_t errlen)
{
  uint8_t *buf = xmalloc (out_len);
  int r;

  err[0] = '\0';
  r = qcow2_decode_cluster (dec, type, in->data, in->len, buf, out_len,
                            err, errlen);
  if (r == 0 && out)
    *out = buf;
  else
    free (buf);
  return r;
}

/* Decode and expect exactly EXPECTED back. */
static void
expect_ok (const char *what, struct qcow2_decoder *dec,
           enum qcow2_compression type, const struct blob *in,
           const uint8_t *expected, size_t out_len)
{
  uint8_t *out = NULL;
  char err[256];
  int r = decode (dec, type, in, out_len, &out, err, sizeof err);

  CHECK_EQ (r, 0);
  if (r == 0) {
    CHECK (memcmp (out, expected, out_len) == 0);
    free (out);
  }
  else
    fprintf (stderr, "  %s (%s, cluster %zu): %s\n", what,
             qcow2_compression_name (type), out_len, err);
}

/* Decode and expect a rejection with a message. */
static void
expect_error (const char *what, struct qcow2_decoder *dec,
              enum qcow2_compression type, const struct blob *in,
              size_t out_len)
{
  char err[256];
  int r = decode (dec, type, in, out_len, NULL, err, sizeof err);

  CHECK_EQ (r, -1);
  CHECK (err[0] != '\0');
  if (r != -1)
    fprintf (stderr, "  %s (%s, cluster %zu): accepted\n", what,
             qcow2_compression_name (type), out_len);
}

/* The basic cases for one cluster size. */
static void
test_cluster_size (struct qcow2_decoder *dec, size_t cluster)
{
  uint8_t *data = xmalloc (2 * cluster);
  struct blob b;

  fill_pattern (data, 2 * cluster, (unsigned) cluster);

  /* Terminated streams, alone and with trailing bytes (the start of the
   * next compressed cluster, or the zeros at the end of its sector).
   */
  for (int level = 1; level <= 9; level += 4) {
    b = deflate_raw (data, cluster, level, Z_FINISH);
    CHECK (b.len < cluster);
    expect_ok ("deflate", dec, QCOW2_COMPRESSION_ZLIB, &b, data, cluster);
    b = with_random_tail (b, 511);
    expect_ok ("deflate + tail", dec, QCOW2_COMPRESSION_ZLIB, &b, data,
               cluster);
    free (b.data);
  }
  b = deflate_raw (data, cluster, 6, Z_FINISH);
  b = concat (b, blob_copy ((const uint8_t *) "", 0, 300, 0));
  expect_ok ("deflate + zeros", dec, QCOW2_COMPRESSION_ZLIB, &b, data,
             cluster);
  free (b.data);

  for (int level = 1; level <= 9; level += 4) {
    b = zstd_frame (data, cluster, level);
    CHECK (b.len < cluster);
    expect_ok ("zstd", dec, QCOW2_COMPRESSION_ZSTD, &b, data, cluster);
    b = with_random_tail (b, 511);
    expect_ok ("zstd + tail", dec, QCOW2_COMPRESSION_ZSTD, &b, data, cluster);
    free (b.data);
  }
  b = zstd_frame (data, cluster, 3);
  b = concat (b, blob_copy ((const uint8_t *) "", 0, 300, 0));
  expect_ok ("zstd + zeros", dec, QCOW2_COMPRESSION_ZSTD, &b, data, cluster);
  free (b.data);
  b = with_random_tail (zstd_frame_no_size (data, cluster), 100);
  expect_ok ("zstd without content size", dec, QCOW2_COMPRESSION_ZSTD, &b,
             data, cluster);
  free (b.data);

  /* Not terminated (no final block), but yielding the whole cluster:
   * qemu accepts it, so must we.
   */
  b = deflate_raw (data, cluster, 6, Z_SYNC_FLUSH);
  expect_ok ("deflate, sync flush", dec, QCOW2_COMPRESSION_ZLIB, &b, data,
             cluster);
  free (b.data);

  /* More than a cluster in a deflate stream: qemu inflates until the
   * cluster is full and ignores the rest, so the first cluster of data
   * comes out.  The guard bytes after the output must stay untouched.
   */
  b = deflate_raw (data, 2 * cluster, 6, Z_FINISH);
  {
    uint8_t *out = xmalloc (cluster + 64);
    char err[256];

    memset (out + cluster, 0xa5, 64);
    CHECK_EQ (qcow2_decode_cluster (dec, QCOW2_COMPRESSION_ZLIB, b.data,
                                    b.len, out, cluster, err, sizeof err), 0);
    CHECK (memcmp (out, data, cluster) == 0);
    for (size_t i = 0; i < 64; ++i)
      CHECK_EQ (out[cluster + i], 0xa5);
    free (out);
  }
  free (b.data);

  /* Less than a cluster of data: refused, with or without a tail. */
  b = deflate_raw (data, cluster / 2, 6, Z_FINISH);
  expect_error ("deflate, half a cluster", dec, QCOW2_COMPRESSION_ZLIB, &b,
                cluster);
  b = concat (b, blob_copy ((const uint8_t *) "", 0, cluster, 0));
  expect_error ("deflate, half a cluster + zeros", dec,
                QCOW2_COMPRESSION_ZLIB, &b, cluster);
  free (b.data);
  b = deflate_raw (data, cluster - 1, 6, Z_FINISH);
  expect_error ("deflate, one byte short", dec, QCOW2_COMPRESSION_ZLIB, &b,
                cluster);
  free (b.data);
  b = zstd_frame (data, cluster / 2, 3);
  expect_error ("zstd, half a cluster", dec, QCOW2_COMPRESSION_ZSTD, &b,
                cluster);
  b = concat (b, blob_copy ((const uint8_t *) "", 0, cluster, 0));
  expect_error ("zstd, half a cluster + zeros", dec, QCOW2_COMPRESSION_ZSTD,
                &b, cluster);
  free (b.data);
  b = zstd_frame (data, cluster - 1, 3);
  expect_error ("zstd, one byte short", dec, QCOW2_COMPRESSION_ZSTD, &b,
                cluster);
  free (b.data);

  /* A zstd frame holding more than a cluster: qemu refuses it. */
  b = zstd_frame (data, 2 * cluster, 3);
  expect_error ("zstd, two clusters in a frame", dec, QCOW2_COMPRESSION_ZSTD,
                &b, cluster);
  free (b.data);
  b = zstd_frame (data, cluster + 1, 3);
  expect_error ("zstd, one byte too many", dec, QCOW2_COMPRESSION_ZSTD, &b,
                cluster);
  free (b.data);

  /* Two zstd frames that together make exactly one cluster: fine (qemu
   * decodes frame after frame); with three frames making more: refused.
   */
  {
    size_t first = cluster / 3;
    struct blob two = concat (zstd_frame (data, first, 3),
                              zstd_frame (data + first, cluster - first, 3));

    expect_ok ("zstd, two frames", dec, QCOW2_COMPRESSION_ZSTD, &two, data,
               cluster);
    two = with_random_tail (two, 200);
    expect_ok ("zstd, two frames + tail", dec, QCOW2_COMPRESSION_ZSTD, &two,
               data, cluster);
    free (two.data);

    two = concat (zstd_frame (data, first, 3),
                  zstd_frame (data + first, cluster - first + 1, 3));
    expect_error ("zstd, two frames, one byte too many", dec,
                  QCOW2_COMPRESSION_ZSTD, &two, cluster);
    free (two.data);
  }

  free (data);
}

/* Garbage, empty and truncated inputs: an error each time, never a crash
 * and never an out-of-bounds access (the sanitizer build checks that).
 */
static void
test_bad_input (struct qcow2_decoder *dec, size_t cluster)
{
  uint8_t *data = xmalloc (cluster);
  struct blob b;

  fill_pattern (data, cluster, 77);

  /* 0xff...: a deflate block of the invalid type 3; not a zstd magic. */
  b = blob_copy ((const uint8_t *) "", 0, cluster, 0xff);
  expect_error ("0xff bytes", dec, QCOW2_COMPRESSION_ZLIB, &b, cluster);
  expect_error ("0xff bytes", dec, QCOW2_COMPRESSION_ZSTD, &b, cluster);
  free (b.data);
  /* Zero bytes: a stored deflate block whose length check fails; zstd
   * sees no magic.
   */
  b = blob_copy ((const uint8_t *) "", 0, cluster, 0);
  expect_error ("zero bytes", dec, QCOW2_COMPRESSION_ZLIB, &b, cluster);
  expect_error ("zero bytes", dec, QCOW2_COMPRESSION_ZSTD, &b, cluster);
  free (b.data);
  /* Random bytes; for deflate the first byte is forced to a final block
   * of type 3, which no decoder can take for data.
   */
  b = with_random_tail (blob_copy ((const uint8_t *) "\x07", 1, 0, 0),
                        cluster);
  expect_error ("random bytes", dec, QCOW2_COMPRESSION_ZLIB, &b, cluster);
  expect_error ("random bytes", dec, QCOW2_COMPRESSION_ZSTD, &b, cluster);
  free (b.data);

  /* Empty input. */
  b = blob_copy ((const uint8_t *) "", 0, 0, 0);
  expect_error ("empty", dec, QCOW2_COMPRESSION_ZLIB, &b, cluster);
  expect_error ("empty", dec, QCOW2_COMPRESSION_ZSTD, &b, cluster);
  free (b.data);

  /* zstd data in a zlib image and the other way round. */
  b = zstd_frame (data, cluster, 3);
  expect_error ("zstd as zlib", dec, QCOW2_COMPRESSION_ZLIB, &b, cluster);
  free (b.data);
  b = deflate_raw (data, cluster, 6, Z_FINISH);
  expect_error ("zlib as zstd", dec, QCOW2_COMPRESSION_ZSTD, &b, cluster);
  free (b.data);

  /* Truncated: every prefix of a zstd frame is refused (the last block
   * is cut, so the cluster cannot be complete).  A prefix of a deflate
   * stream may still produce the whole cluster when only the end-of-block
   * code is cut, which qemu accepts; then the output must be right.  A
   * cut of 8 bytes or more always loses an output symbol (each is at most
   * 48 bits).
   */
  {
    struct blob zs = zstd_frame (data, cluster, 3);
    struct blob zl = deflate_raw (data, cluster, 6, Z_FINISH);
    size_t step = zs.len > 400 ? zs.len / 200 : 1;

    for (size_t cut = 0; cut < zs.len; cut += step) {
      unsigned long before = atomic_load (&unit_failures);
      struct blob p = blob_copy (zs.data, cut, 0, 0);
      expect_error ("truncated zstd", dec, QCOW2_COMPRESSION_ZSTD, &p,
                    cluster);
      free (p.data);
      UNIT_NOTE_IF_FAILED (before, "zstd cut at %zu of %zu", cut, zs.len);
    }
    step = zl.len > 400 ? zl.len / 200 : 1;
    for (size_t cut = 0; cut < zl.len; cut = cut + step < zl.len - 16
           ? cut + step : cut + 1) {
      unsigned long before = atomic_load (&unit_failures);
      struct blob p = blob_copy (zl.data, cut, 0, 0);
      uint8_t *out = NULL;
      char err[256];
      int r = decode (dec, QCOW2_COMPRESSION_ZLIB, &p, cluster, &out,
                      err, sizeof err);

      if (cut + 8 <= zl.len)
        CHECK_EQ (r, -1);
      if (r == 0) {
        CHECK (memcmp (out, data, cluster) == 0);
        free (out);
      }
      free (p.data);
      UNIT_NOTE_IF_FAILED (before, "deflate cut at %zu of %zu", cut, zl.len);
    }
    free (zs.data);
    free (zl.data);
  }

  free (data);
}

/* Flip random bits of valid streams: whatever the decoder says, it must
 * say it without crashing and without touching memory outside the
 * buffers.  What it accepts is at least a whole cluster (it cannot tell
 * wrong data from right data without a checksum).
 */
static void
test_mutations (struct qcow2_decoder *dec, size_t cluster, unsigned rounds)
{
  uint8_t *data = xmalloc (cluster);
  struct blob streams[2];
  enum qcow2_compression types[2] = {
    QCOW2_COMPRESSION_ZLIB, QCOW2_COMPRESSION_ZSTD
  };
  unsigned rejected = 0;

  fill_pattern (data, cluster, 1234);
  streams[0] = deflate_raw (data, cluster, 6, Z_FINISH);
  streams[1] = zstd_frame (data, cluster, 3);
  for (unsigned i = 0; i < rounds; ++i) {
    const struct blob *src = &streams[i & 1];
    struct blob m = blob_copy (src->data, src->len, 0, 0);
    uint8_t *out = xmalloc (cluster);
    char err[256];
    int r;

    for (unsigned k = 0; k < 1 + i % 4; ++k)
      m.data[rng (&rng_state) % m.len] ^= (uint8_t) (1u << (rng (&rng_state) % 8));
    if (i % 5 == 0)
      m.len = rng (&rng_state) % m.len;
    r = qcow2_decode_cluster (dec, types[i & 1], m.data, m.len, out, cluster,
                              err, sizeof err);
    CHECK (r == 0 || r == -1);
    rejected += r != 0;
    free (out);
    free (m.data);
  }
  /* And the decoder still works after all those errors. */
  expect_ok ("after mutations", dec, QCOW2_COMPRESSION_ZLIB, &streams[0],
             data, cluster);
  expect_ok ("after mutations", dec, QCOW2_COMPRESSION_ZSTD, &streams[1],
             data, cluster);
  CHECK (rejected > 0);
  free (streams[0].data);
  free (streams[1].data);
  free (data);
}

/* One decoder used for many clusters of both types, good and bad mixed:
 * the state of one decode must never leak into the next.
 */
static void
test_reuse (void)
{
  const size_t cluster = 4 * KiB;
  enum { NCLUSTERS = 8 };
  struct qcow2_decoder *dec = qcow2_decoder_new ();
  uint8_t *data[NCLUSTERS];
  struct blob zl[NCLUSTERS], zs[NCLUSTERS], unterminated, short_stream;
  unsigned long before = atomic_load (&unit_failures);

  CHECK (dec != NULL);
  if (dec == NULL)
    return;
  for (unsigned i = 0; i < NCLUSTERS; ++i) {
    data[i] = xmalloc (cluster);
    fill_pattern (data[i], cluster, i * 1000 + 1);
    zl[i] = with_random_tail (deflate_raw (data[i], cluster, 6, Z_FINISH),
                              i * 37);
    zs[i] = with_random_tail (zstd_frame (data[i], cluster, 3), i * 41);
  }
  unterminated = deflate_raw (data[3], cluster, 6, Z_SYNC_FLUSH);
  short_stream = zstd_frame (data[5], cluster / 2, 3);

  for (unsigned round = 0; round < 3000; ++round) {
    unsigned i = round % NCLUSTERS;
    switch (round % 6) {
    case 0: case 1:
      expect_ok ("reuse", dec, QCOW2_COMPRESSION_ZLIB, &zl[i], data[i],
                 cluster);
      break;
    case 2: case 3:
      expect_ok ("reuse", dec, QCOW2_COMPRESSION_ZSTD, &zs[i], data[i],
                 cluster);
      break;
    case 4:
      expect_ok ("reuse", dec, QCOW2_COMPRESSION_ZLIB, &unterminated,
                 data[3], cluster);
      expect_error ("reuse", dec, QCOW2_COMPRESSION_ZLIB, &zs[i], cluster);
      break;
    case 5:
      expect_error ("reuse", dec, QCOW2_COMPRESSION_ZSTD, &short_stream,
                    cluster);
      /* A half-decoded zstd stream must not carry over either. */
      expect_ok ("reuse", dec, QCOW2_COMPRESSION_ZSTD, &zs[i], data[i],
                 cluster);
      break;
    }
    if (atomic_load (&unit_failures) != before) {
      fprintf (stderr, "  (reuse round %u)\n", round);
      break;
    }
  }

  for (unsigned i = 0; i < NCLUSTERS; ++i) {
    free (data[i]);
    free (zl[i].data);
    free (zs[i].data);
  }
  free (unterminated.data);
  free (short_stream.data);
  qcow2_decoder_free (dec);
}

static void
test_names (void)
{
  char versions[256];

  CHECK (strcmp (qcow2_compression_name (QCOW2_COMPRESSION_ZLIB), "zlib")
         == 0);
  CHECK (strcmp (qcow2_compression_name (QCOW2_COMPRESSION_ZSTD), "zstd")
         == 0);
  qcow2_codec_versions (versions, sizeof versions);
  CHECK (strstr (versions, "zlib=") != NULL);
  CHECK (strstr (versions, "zstd=") != NULL);
  CHECK (strstr (versions, ZSTD_versionString ()) != NULL);
  /* Cut, not overflowed. */
  memset (versions, 'x', sizeof versions);
  qcow2_codec_versions (versions, 6);
  CHECK_EQ (strlen (versions), 5);
  CHECK_EQ (versions[6], 'x');

  qcow2_decoder_free (NULL);
}

int
main (void)
{
  static const size_t sizes[] = { 512, 4 * KiB, 64 * KiB, 2 * MiB };
  struct qcow2_decoder *dec = qcow2_decoder_new ();

  CHECK (dec != NULL);
  if (dec == NULL)
    return unit_finish ();
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    unsigned long before = atomic_load (&unit_failures);
    test_cluster_size (dec, sizes[i]);
    test_bad_input (dec, sizes[i]);
    test_mutations (dec, sizes[i], sizes[i] > 64 * KiB ? 40 : 2000);
    UNIT_NOTE_IF_FAILED (before, "cluster size %zu", sizes[i]);
  }
  qcow2_decoder_free (dec);
  test_reuse ();
  test_names ();
  return unit_finish ();
}
