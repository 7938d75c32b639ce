/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: refcounts.
 *
 * After each step and a flush, every refcount the engine stored must
 * equal the references the test counts itself from the L1 and L2 tables
 * (tests/support/write-image.c, no engine code), for every refcount
 * width qcow2 has and both versions, and the steps must have the effect
 * they promise: a new cluster counted once, an overwrite in place, a
 * released cluster free again, a compressed copy shared by as many guest
 * clusters as its width allows, a refcount table that moves when it
 * grows, and a full file that refuses the write and stays exact.
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

/* How many host clusters hold guest data, and the largest refcount. */
struct usage {
  uint64_t data, max_refcount;
};

/* Flush, check the image exactly, and say how it is used. */
static struct usage
flush_and_check (struct session *s, const char *ctx)
{
  struct image_report report;
  struct usage u = { 0, 0 };

  CHECK_EQ (do_flush (s), 0);
  if (!check_file (s->mio.data, s->mio.size, true, ctx))
    return u;
  check_image (s->mio.data, s->mio.size, true, &report);
  for (uint64_t c = 0; c < report.host_clusters; ++c) {
    if (report.role[c] == WRITE_DATA && report.refcount[c])
      u.data++;
    if (report.refcount[c] > u.max_refcount)
      u.max_refcount = report.refcount[c];
  }
  image_report_free (&report);
  return u;
}

static void
test_steps (unsigned version, unsigned order)
{
  const struct new_image spec = {
    version, 12, order, QCOW2_COMPRESSION_ZSTD, 2 * MiB, 8 * MiB, 0,
  };
  const uint64_t C = 4096;
  const uint64_t max = order == 6 ? UINT64_MAX
    : (UINT64_C (1) << (1u << order)) - 1;
  unsigned long before = atomic_load (&unit_failures);
  struct qcow2_options opts = default_options;
  uint8_t *buf = xmalloc (24 * C);
  struct session s;
  struct usage u;
  char ctx[100];

  snprintf (ctx, sizeof ctx, "v%u, refcount_order %u", version, order);
  CHECK_EQ (session_open_new (&s, &spec, 0, &opts), 0);
  if (s.conn == NULL)
    goto out;
  u = flush_and_check (&s, ctx);
  CHECK_EQ (u.data, 0);

  /* A new cluster, counted once; an overwrite in place takes no other. */
  fill_pattern (buf, C, 1);
  CHECK_EQ (do_write (&s, buf, C, 5 * C, false), 0);
  u = flush_and_check (&s, ctx);
  CHECK_EQ (u.data, 1);
  CHECK_EQ (u.max_refcount, 1);
  fill_pattern (buf, 100, 2);
  CHECK_EQ (do_write (&s, buf, 100, 5 * C + 7, false), 0);
  u = flush_and_check (&s, ctx);
  CHECK_EQ (u.data, 1);

  /* Zeroed whole, the cluster is released; zeroed in part, it stays. */
  CHECK_EQ (do_zero (&s, C, 5 * C, false, false), 0);
  u = flush_and_check (&s, ctx);
  CHECK_EQ (u.data, 0);
  fill_pattern (buf, 8 * C, 3);
  CHECK_EQ (do_write (&s, buf, 8 * C, 16 * C, false), 0);
  CHECK_EQ (do_zero (&s, 10, 16 * C + 5, false, false), 0);
  u = flush_and_check (&s, ctx);
  CHECK_EQ (u.data, 8);

  /* Trimmed: whole clusters released, the parts at either end kept. */
  CHECK_EQ (do_trim (&s, 3 * C + 200, 17 * C - 100, false), 0);
  u = flush_and_check (&s, ctx);
  CHECK_EQ (u.data, 5);
  session_close_image (&s);

  /* Compressed: 12 copies of one cluster share copies as far as the
   * refcount width lets them (each copy counted in its host clusters
   * at most MAX times), 12 distinct clusters each get their own.
   */
  opts.compress = true;
  opts.writable = true;
  CHECK_EQ (session_open_io (&s, &opts), 0);
  if (s.conn == NULL)
    goto out;
  for (int i = 0; i < 12; ++i)
    fill_pattern (buf + i * C, C, 4);
  CHECK_EQ (do_write (&s, buf, 12 * C, 64 * C, false), 0);
  for (int i = 0; i < 12; ++i)
    fill_pattern (buf + i * C, C, 100 + i);
  CHECK_EQ (do_write (&s, buf, 12 * C, 128 * C, false), 0);
  u = flush_and_check (&s, ctx);
  CHECK (u.max_refcount <= max);
  if (max >= 12)
    CHECK (u.max_refcount >= 12);         /* one copy for all twelve */

  /* Rewritten, the old compressed ranges are released. */
  for (int i = 0; i < 24; ++i)
    fill_pattern (buf + i * C, C, 200 + i);
  CHECK_EQ (do_write (&s, buf, 12 * C, 64 * C, false), 0);
  CHECK_EQ (do_write (&s, buf + 12 * C, 12 * C, 128 * C, false), 0);
  flush_and_check (&s, ctx);
  CHECK_EQ (do_trim (&s, 12 * C, 64 * C, false), 0);
  CHECK_EQ (do_zero (&s, 12 * C, 128 * C, false, false), 0);
  u = flush_and_check (&s, ctx);
  CHECK_EQ (u.data, 5);                   /* the plain ones from before */
  CHECK_EQ (s.log.errors, 0);
  session_close (&s);
 out:
  UNIT_NOTE_IF_FAILED (before, "%s", ctx);
  free (buf);
}

/* A refcount table that fills up moves to a bigger place: the header
 * names it, and the old clusters are free again.
 */
static void
test_table_growth (unsigned order)
{
  /* 512-byte clusters: one table cluster of 64 entries covers 64 blocks
   * of 4096 >> (order - 3) clusters each.
   */
  const uint64_t C = 512;
  const uint64_t covered = 64 * (C * 8 >> order) * C;
  const struct new_image spec = {
    3, 9, order, QCOW2_COMPRESSION_ZLIB, covered + covered / 2,
    2 * covered, 1,
  };
  unsigned long before = atomic_load (&unit_failures);
  struct qcow2_options opts = default_options;
  struct image_report report;
  uint64_t len = covered + covered / 4;
  uint8_t *buf = xmalloc (len);
  struct session s;

  CHECK_EQ (session_open_new (&s, &spec, 0, &opts), 0);
  if (s.conn == NULL)
    goto out;
  fill_pattern (buf, len, 9);
  CHECK_EQ (do_write (&s, buf, len, 0, false), 0);
  flush_and_check (&s, "table growth");
  check_image (s.mio.data, s.mio.size, true, &report);
  CHECK (report.refcount_table_offset != C);
  CHECK (report.refcount_table_clusters >= 2);
  CHECK_EQ (report.refcount[1], 0);       /* where the table was */
  image_report_free (&report);
  CHECK (matches_model (&s, buf, 0, len, "table growth"));
  session_close_image (&s);
  CHECK_EQ (session_open_io (&s, &opts), 0);
  if (s.conn)
    CHECK (matches_model (&s, buf, 0, len, "table growth, opened again"));
  session_close (&s);
 out:
  UNIT_NOTE_IF_FAILED (before, "table growth, refcount_order %u", order);
  free (buf);
}

/* A full file: the write that finds no room fails with -ENOSPC and says
 * how much is missing; what was written before stays, exactly counted.
 */
static void
test_full (void)
{
  const uint64_t C = 4096;
  const struct new_image spec = {
    3, 12, 4, QCOW2_COMPRESSION_ZLIB, MiB, 64 * C, 0,
  };
  struct qcow2_options opts = default_options;
  uint8_t *buf = xmalloc (MiB);
  struct session s;
  int r = 0;
  uint64_t k;

  CHECK_EQ (session_open_new (&s, &spec, 0, &opts), 0);
  if (s.conn == NULL)
    goto out;
  fill_pattern (buf, MiB, 11);
  for (k = 0; k < MiB / C && (r = do_write (&s, buf + k * C, C, k * C,
                                            false)) == 0; ++k)
    ;
  CHECK_EQ (r, -ENOSPC);
  CHECK (k > 50 && k < 64);
  CHECK (strstr (s.log.last, "no room in the image file") != NULL);
  flush_and_check (&s, "full file");
  CHECK (matches_model (&s, buf, 0, k * C, "full file"));
  session_close (&s);
 out:
  free (buf);
}

int
main (void)
{
  for (unsigned order = 0; order <= 6; ++order)
    test_steps (3, order);
  test_steps (2, 4);
  test_table_growth (6);
  test_table_growth (5);
  test_full ();
  return unit_finish ();
}
