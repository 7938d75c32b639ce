/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: space, written zeros and packing.
 *
 * - qcow2-detect-zeroes: whole clusters of zeros written take no cluster
 *   (on: a zero cluster keeps the host cluster it had, as qemu's
 *   write-zeroes without unmap; unmap: it is released), parts of
 *   clusters are written as data, and off writes them all; a zero
 *   cluster that kept its host cluster is written in place again;
 * - trims and zeroes release zero clusters that kept their host cluster;
 * - compressed data interrupted by plain clusters leaves gaps that later
 *   compressed clusters fill: the packed data takes no more host clusters
 *   than its bytes need, plus one;
 * - the map of a huge sparse disk (256 TiB) is right, the unallocated L1
 *   ranges each in one step.
 * Each step checks the image exactly (tests/support/write-image.c) and
 * reads it back against a model of the disk.
 */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2.h"
#include "session.h"
#include "unit.h"
#include "util.h"
#include "write-image.h"

/* Host clusters holding guest data, after a flush and an exact check. */
static uint64_t
data_clusters (struct session *s, const char *ctx)
{
  struct image_report report;
  uint64_t n = 0;

  CHECK_EQ (do_flush (s), 0);
  if (!check_file (s->mio.data, s->mio.size, true, ctx))
    return UINT64_MAX;
  check_image (s->mio.data, s->mio.size, true, &report);
  for (uint64_t c = 0; c < report.host_clusters; ++c)
    if (report.role[c] == WRITE_DATA && report.refcount[c])
      n++;
  image_report_free (&report);
  return n;
}

#define ZERO_FLAG UINT64_C (1)
#define OFFSET_MASK UINT64_C (0x00fffffffffffe00)

/* The L2 entry of guest cluster GC in the flushed image of S (4 KiB
 * clusters, so the first L2 table covers it).
 */
static uint64_t
l2_entry (struct session *s, uint64_t gc)
{
  const uint8_t *f = s->mio.data;
  uint64_t l2 = get64 (f + get64 (f + 40)) & OFFSET_MASK;

  return l2 ? get64 (f + l2 + 8 * gc) : 0;
}

static void
test_detect_zeroes (enum qcow2_detect_zeroes mode, unsigned version)
{
  const uint64_t C = 4096;
  const struct new_image spec = {
    version, 12, 4, QCOW2_COMPRESSION_ZLIB, MiB, 4 * MiB, 0,
  };
  static const char *const names[] = { "off", "on", "unmap" };
  struct qcow2_options opts = default_options;
  uint8_t *model = xcalloc (1, MiB), *zeros = xcalloc (1, 64 * KiB);
  unsigned long before = atomic_load (&unit_failures);
  uint64_t host[16], n;
  struct session s;
  char ctx[80];

  snprintf (ctx, sizeof ctx, "detect-zeroes %s, v%u", names[mode], version);
  opts.detect_zeroes = mode;
  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_RECORD, &opts), 0);
  if (s.conn == NULL)
    goto out;

  /* 64 KiB of zeros into clusters never written: 16 clusters, or none. */
  CHECK_EQ (do_write (&s, zeros, 64 * KiB, 0, false), 0);
  n = data_clusters (&s, ctx);
  CHECK_EQ (n, mode == QCOW2_DETECT_ZEROES_OFF ? 16 : 0);

  /* Data, then zeros over it: kept (off: as data; on: zero clusters
   * with their host clusters), or released (unmap).
   */
  fill_pattern (model + 256 * KiB, 64 * KiB, 1);
  CHECK_EQ (do_write (&s, model + 256 * KiB, 64 * KiB, 256 * KiB, false), 0);
  n = data_clusters (&s, ctx);
  for (unsigned k = 0; k < 16 && version == 3; ++k)
    host[k] = l2_entry (&s, 64 + k) & OFFSET_MASK;
  CHECK_EQ (do_write (&s, zeros, 64 * KiB, 256 * KiB, false), 0);
  memset (model + 256 * KiB, 0, 64 * KiB);
  CHECK (matches_model (&s, model, 0, MiB, ctx));
  CHECK_EQ (data_clusters (&s, ctx),
            mode == QCOW2_DETECT_ZEROES_UNMAP ? n - 16 : n);
  if (version == 3 && mode == QCOW2_DETECT_ZEROES_ON)
    for (unsigned k = 0; k < 16; ++k) {
      uint64_t e = l2_entry (&s, 64 + k);
      CHECK (e & ZERO_FLAG);
      CHECK_EQ (e & OFFSET_MASK, host[k]);
    }

  /* Parts of clusters stay writes: 6 KiB of zeros across two clusters
   * never written take two clusters whatever the mode.
   */
  n = data_clusters (&s, ctx);
  CHECK_EQ (do_write (&s, zeros, 6 * KiB, 512 * KiB + 1024, false), 0);
  CHECK_EQ (data_clusters (&s, ctx), n + 2);

  /* A zero cluster that kept its host cluster is written in place, in
   * part and whole: no new cluster, the same host offsets.
   */
  n = data_clusters (&s, ctx);
  fill_pattern (model + 256 * KiB + 100, 3000, 2);
  CHECK_EQ (do_write (&s, model + 256 * KiB + 100, 3000, 256 * KiB + 100,
                      false), 0);
  fill_pattern (model + 256 * KiB + 8 * C, 2 * C, 3);
  CHECK_EQ (do_write (&s, model + 256 * KiB + 8 * C, 2 * C,
                      256 * KiB + 8 * C, false), 0);
  CHECK (matches_model (&s, model, 0, MiB, ctx));
  if (mode == QCOW2_DETECT_ZEROES_ON && version == 3) {
    CHECK_EQ (data_clusters (&s, ctx), n);
    CHECK_EQ (l2_entry (&s, 64) & OFFSET_MASK, host[0]);
    CHECK_EQ (l2_entry (&s, 72) & OFFSET_MASK, host[8]);
    CHECK_EQ (l2_entry (&s, 64) & ZERO_FLAG, 0);
    CHECK (l2_entry (&s, 65) & ZERO_FLAG);

    /* A trim, and a zero request, release what zero clusters kept. */
    n = data_clusters (&s, ctx);
    CHECK_EQ (do_trim (&s, 4 * C, 256 * KiB + 12 * C, false), 0);
    CHECK_EQ (do_zero (&s, 2 * C, 256 * KiB + 2 * C, false, false), 0);
    memset (model + 256 * KiB + 12 * C, 0, 4 * C);
    memset (model + 256 * KiB + 2 * C, 0, 2 * C);
    CHECK_EQ (data_clusters (&s, ctx), n - 6);
    CHECK (matches_model (&s, model, 0, MiB, ctx));
  }
  CHECK_EQ (s.log.errors, 0);
 out:
  session_close (&s);
  UNIT_NOTE_IF_FAILED (before, "%s", ctx);
  free (model);
  free (zeros);
}

/* ------------------------------------------------------------ packing */

/* The bytes the compressed entries of S's flushed image name (their
 * sector-rounded ranges) and the host clusters those ranges touch.
 */
static void
compressed_usage (struct session *s, uint64_t *bytes, uint64_t *clusters)
{
  const uint8_t *f = s->mio.data;
  const unsigned bits = get32 (f + 20);
  const uint64_t C = UINT64_C (1) << bits;
  const unsigned shift = 62 - (bits - 8);
  uint32_t l1_size = get32 (f + 36);
  uint64_t l1 = get64 (f + 40);
  uint8_t *touched = xcalloc (1, s->mio.size / C + 1);

  *bytes = *clusters = 0;
  for (uint32_t i = 0; i < l1_size; ++i) {
    uint64_t l2 = get64 (f + l1 + 8 * i) & OFFSET_MASK;
    for (uint64_t j = 0; l2 && j < C / 8; ++j) {
      uint64_t e = get64 (f + l2 + 8 * j);
      if (!(e & (UINT64_C (1) << 62)))
        continue;
      uint64_t off = e & ((UINT64_C (1) << shift) - 1);
      uint64_t sectors = ((e >> shift) & ((UINT64_C (1) << (bits - 8)) - 1))
        + 1;
      uint64_t start = off & ~UINT64_C (511), end = start + sectors * 512;
      *bytes += sectors * 512 - (off & 511);
      for (uint64_t c = start / C; c <= (end - 1) / C; ++c)
        touched[c] = 1;
    }
  }
  for (uint64_t c = 0; c <= s->mio.size / C; ++c)
    *clusters += touched[c];
  free (touched);
}

/* Data that does not compress, or compresses to between a twentieth
 * and a half of the cluster.
 */
static void
mixed_cluster (uint8_t *buf, uint64_t len, bool plain, uint64_t *state)
{
  uint64_t random_part = plain ? len : len / 20 + rng (state) % (len * 9 / 20);

  fill_pattern (buf, len, rng (state) % 1000);
  for (uint64_t i = 0; i < random_part; ++i)
    buf[i] = rng (state) >> 56;
}

/* One write per cluster, compressible and not in turn: every plain one
 * interrupts the packing.  The gaps it leaves are filled later.
 */
static void
test_packing_gaps (unsigned cluster_bits)
{
  const uint64_t C = UINT64_C (1) << cluster_bits;
  const uint64_t n = 96;
  const struct new_image spec = {
    3, cluster_bits, 4, QCOW2_COMPRESSION_ZSTD, n * C, (2 * n + 16) * C, 0,
  };
  struct qcow2_options opts = default_options;
  uint8_t *model = xcalloc (1, n * C);
  uint64_t state = 77 + cluster_bits, bytes, used;
  struct session s;
  char ctx[80];

  snprintf (ctx, sizeof ctx, "packing around plain clusters, %" PRIu64
            "-byte clusters", C);
  opts.compress = true;
  CHECK_EQ (session_open_new (&s, &spec, 0, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (model);
    return;
  }
  for (uint64_t k = 0; k < n; ++k) {
    mixed_cluster (model + k * C, C, k % 3 == 1, &state);
    CHECK_EQ (do_write (&s, model + k * C, C, k * C, false), 0);
  }
  CHECK (matches_model (&s, model, 0, n * C, ctx));
  CHECK_EQ (do_flush (&s), 0);
  check_file (s.mio.data, s.mio.size, true, ctx);
  compressed_usage (&s, &bytes, &used);
  CHECK (bytes > 0);
  /* The ranges overlap by up to a sector each; the last host cluster
   * may be partly used.
   */
  CHECK (used <= (bytes + C - 1) / C + 1);
  if (used > (bytes + C - 1) / C + 1)
    fprintf (stderr, "  %s: %" PRIu64 " bytes of compressed data touch %"
             PRIu64 " host clusters\n", ctx, bytes, used);
  session_close (&s);
  free (model);
}

/* ---------------------------------------------------------------- maps */

struct ranges {
  uint64_t next, data, zero;
  unsigned calls;
  bool bad;
};

static int
count_range (void *opaque, uint64_t offset, uint64_t length, bool zero)
{
  struct ranges *r = opaque;

  if (offset != r->next || length == 0)
    r->bad = true;
  r->next = offset + length;
  r->calls++;
  if (zero)
    r->zero += length;
  else
    r->data += length;
  return 0;
}

/* 256 TiB with 64 KiB clusters: 524,288 L1 entries, a few clusters
 * written far apart.
 */
static void
test_huge_sparse_map (void)
{
  const uint64_t C = 64 * KiB, vsize = UINT64_C (256) << 40;
  const struct new_image spec = {
    3, 16, 4, QCOW2_COMPRESSION_ZSTD, vsize, 8 * MiB, 0,
  };
  struct qcow2_options opts = default_options;
  uint8_t *buf = xmalloc (C);
  struct ranges r = { 0 };
  struct session s;

  CHECK_EQ (session_open_new (&s, &spec, 0, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (buf);
    return;
  }
  fill_pattern (buf, C, 5);
  for (uint64_t k = 0; k < 8; ++k)
    CHECK_EQ (do_write (&s, buf, C, k * (UINT64_C (31) << 40) + 7 * C,
                        false), 0);
  CHECK_EQ (do_flush (&s), 0);
  CHECK_EQ (do_extents (&s, 0, vsize, count_range, &r), 0);
  CHECK (!r.bad);
  CHECK_EQ (r.next, vsize);
  CHECK_EQ (r.data, 8 * C);
  CHECK_EQ (r.calls, 17);
  /* A range inside one unallocated L1 entry, and one across many. */
  r = (struct ranges) { .next = UINT64_C (100) << 40 };
  CHECK_EQ (do_extents (&s, r.next, UINT64_C (1) << 40, count_range, &r), 0);
  CHECK_EQ (r.calls, 1);
  CHECK_EQ (r.zero, UINT64_C (1) << 40);
  session_close (&s);
  free (buf);
}

int
main (void)
{
  for (unsigned mode = 0; mode < 3; ++mode) {
    test_detect_zeroes (mode, 3);
    test_detect_zeroes (mode, 2);
  }
  test_packing_gaps (12);
  test_packing_gaps (16);
  test_huge_sparse_map ();
  return unit_finish ();
}
