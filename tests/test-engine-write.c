/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: writes, zeroes and trims.
 *
 * Random sequences of writes (partial clusters, whole runs, zeros,
 * repeated data), zeroes (fast or not), trims, flushes and FUA requests
 * on new images of several shapes (some detecting zeros written, some on
 * storage that discards released clusters: discarded bytes read as
 * garbage), against a model of the guest disk:
 * - every read, before and after flushes, returns what the model holds;
 * - after every flush the image passes the test's own check exactly
 *   (every refcount equals the references counted from the tables), and
 *   what is durable (the storage as of the last flush) reads as the model;
 * - at any moment what is durable is consistent (leaks at worst);
 * - a FUA request is durable when it returns.
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

struct config {
  const char *name;
  struct new_image image;
  bool compress;
  unsigned ops;
  enum qcow2_detect_zeroes detect_zeroes;
  bool discard;                 /* qcow2-discard=unmap, storage discards */
};

static const struct config configs[] = {
  { "v3, 512 B clusters",
    { 3, 9, 4, QCOW2_COMPRESSION_ZLIB, MiB - 1536, 4 * MiB, 0 },
    false, 400, QCOW2_DETECT_ZEROES_OFF, false },
  { "v3, 4 KiB clusters, refcount_bits 1",
    { 3, 12, 0, QCOW2_COMPRESSION_ZSTD, 4 * MiB, 12 * MiB, 0 },
    false, 300, QCOW2_DETECT_ZEROES_OFF, false },
  { "v2, 64 KiB clusters",
    { 2, 16, 4, QCOW2_COMPRESSION_ZLIB, 8 * MiB - 512, 24 * MiB, 0 },
    false, 150, QCOW2_DETECT_ZEROES_OFF, false },
  { "v3, 64 KiB clusters, zstd, compressing",
    { 3, 16, 4, QCOW2_COMPRESSION_ZSTD, 8 * MiB, 24 * MiB, 0 },
    true, 150, QCOW2_DETECT_ZEROES_OFF, false },
  { "v3, 4 KiB clusters, zlib, compressing, refcount_bits 64",
    { 3, 12, 6, QCOW2_COMPRESSION_ZLIB, 2 * MiB - 4096, 8 * MiB, 0 },
    true, 300, QCOW2_DETECT_ZEROES_OFF, false },
  { "v3, 1 KiB clusters, zstd, compressing, refcount_bits 2",
    { 3, 10, 1, QCOW2_COMPRESSION_ZSTD, MiB, 4 * MiB, 0 },
    true, 300, QCOW2_DETECT_ZEROES_OFF, false },
  { "v3, 4 KiB clusters, detect-zeroes on, discarding",
    { 3, 12, 4, QCOW2_COMPRESSION_ZSTD, 2 * MiB - 1024, 8 * MiB, 0 },
    false, 300, QCOW2_DETECT_ZEROES_ON, true },
  { "v3, 2 KiB clusters, detect-zeroes unmap, discarding, compressing",
    { 3, 11, 4, QCOW2_COMPRESSION_ZLIB, MiB, 4 * MiB, 0 },
    true, 300, QCOW2_DETECT_ZEROES_UNMAP, true },
  { "v2, 4 KiB clusters, detect-zeroes on",
    { 2, 12, 4, QCOW2_COMPRESSION_ZLIB, 2 * MiB, 8 * MiB, 0 },
    false, 200, QCOW2_DETECT_ZEROES_ON, false },
};
#define NCONFIGS (sizeof configs / sizeof configs[0])

struct run {
  const struct config *cfg;
  struct session s;
  uint64_t C, vsize;
  uint8_t *model;
  uint8_t *buf;
  uint64_t state;
  char ctx[200];
};

/* Data for a write: the pattern, a repeat of the previous write's data
 * (clusters the dedup can share), zeros, or bytes that do not compress.
 */
static void
make_data (struct run *r, uint8_t *buf, uint64_t len, unsigned seed)
{
  switch (rng (&r->state) % 8) {
  case 0:
    memset (buf, 0, len);
    break;
  case 1:
    for (uint64_t i = 0; i < len; ++i)
      buf[i] = rng (&r->state) >> 56;
    break;
  case 2:
    fill_pattern (buf, len, 7);           /* the same every time */
    break;
  default:
    fill_pattern (buf, len, seed);
    break;
  }
}

/* A range: unaligned and short, or whole clusters (the compressed path),
 * sometimes up to the end of the disk.
 */
static void
pick_range (struct run *r, uint64_t *offset, uint64_t *len)
{
  uint64_t v = rng (&r->state);

  if (v % 3 == 0) {
    uint64_t clusters = r->vsize / r->C;
    uint64_t first = rng (&r->state) % (clusters ? clusters : 1);
    *offset = first * r->C;
    *len = (1 + rng (&r->state) % 6) * r->C;
  }
  else {
    *offset = rng (&r->state) % r->vsize;
    *len = 1 + rng (&r->state) % (3 * r->C);
  }
  if (v % 17 == 0)
    *len = r->vsize - *offset;
  if (*len > r->vsize - *offset)
    *len = r->vsize - *offset;
  if (*len > 8 * r->C)
    *len = 8 * r->C;
}

/* A trim makes whole clusters (the disk's last one when the range reaches
 * the end) read as zeros and leaves parts alone.
 */
static void
model_trim (struct run *r, uint64_t offset, uint64_t len)
{
  uint64_t end = offset + len;

  for (uint64_t k = offset / r->C; k * r->C < end; ++k) {
    uint64_t cstart = k * r->C, cend = cstart + r->C;
    if (cend > r->vsize)
      cend = r->vsize;
    if (offset <= cstart && end >= cend)
      memset (r->model + cstart, 0, cend - cstart);
  }
}

/* What is durable must read as the model. */
static void
check_durable (struct run *r, const char *what)
{
  char ctx[400];

  snprintf (ctx, sizeof ctx, "%s: durable after %s", r->ctx, what);
  check_file (r->s.mio.durable, r->s.mio.size, false, ctx);
  file_matches_model (r->s.mio.durable, r->s.mio.size, r->model, r->vsize,
                      ctx);
}

/* What a FUA request wrote must be durable: its range (for a trim, the
 * whole clusters it made read as zeros) reads from the durable storage
 * as the model says, and that storage is consistent.  Earlier requests
 * without FUA need not be durable yet.
 */
static void
check_durable_request (struct run *r, const char *what, uint64_t offset,
                       uint64_t len, bool trim)
{
  struct qcow2_options opts = default_options;
  uint64_t end = offset + len;
  struct session d;
  char ctx[400];

  snprintf (ctx, sizeof ctx, "%s: durable after %s", r->ctx, what);
  check_file (r->s.mio.durable, r->s.mio.size, false, ctx);
  opts.writable = false;
  CHECK_EQ (session_open (&d, r->s.mio.durable, r->s.mio.size, &opts), 0);
  if (d.conn && !trim)
    matches_model (&d, r->model, offset, len, ctx);
  for (uint64_t k = offset / r->C; d.conn && trim && k * r->C < end; ++k) {
    uint64_t cstart = k * r->C, cend = cstart + r->C;
    if (cend > r->vsize)
      cend = r->vsize;
    if (offset <= cstart && end >= cend)
      matches_model (&d, r->model, cstart, cend - cstart, ctx);
  }
  session_close (&d);
}

static void
one_op (struct run *r, unsigned i)
{
  uint64_t offset, len, v = rng (&r->state) % 20;
  bool fua = rng (&r->state) % 16 == 0, trim = false;
  char what[100];
  int ret;

  pick_range (r, &offset, &len);
  if (v < 9) {
    make_data (r, r->buf, len, i);
    ret = do_write (&r->s, r->buf, len, offset, fua);
    CHECK_EQ (ret, 0);
    if (ret == 0)
      memcpy (r->model + offset, r->buf, len);
    snprintf (what, sizeof what, "op %u, write of %" PRIu64 " at %" PRIu64,
              i, len, offset);
  }
  else if (v < 12) {
    bool fast = rng (&r->state) & 1;
    ret = do_zero (&r->s, len, offset, fast, fua);
    CHECK (ret == 0 || (fast && ret == -ENOTSUP));
    if (ret == 0)
      memset (r->model + offset, 0, len);
    snprintf (what, sizeof what, "op %u, %szero of %" PRIu64 " at %" PRIu64,
              i, fast ? "fast " : "", len, offset);
  }
  else if (v < 14) {
    ret = do_trim (&r->s, len, offset, fua);
    trim = true;
    CHECK_EQ (ret, 0);
    if (ret == 0)
      model_trim (r, offset, len);
    snprintf (what, sizeof what, "op %u, trim of %" PRIu64 " at %" PRIu64,
              i, len, offset);
  }
  else if (v < 16) {
    CHECK_EQ (do_flush (&r->s), 0);
    snprintf (what, sizeof what, "op %u, flush", i);
    /* Everything was written back: the image is exact, all durable. */
    check_file (r->s.mio.data, r->s.mio.size, true, what);
    CHECK (memcmp (r->s.mio.durable, r->s.mio.data, r->s.mio.size) == 0);
    if (rng (&r->state) % 4 == 0)
      check_durable (r, what);
    return;
  }
  else {
    matches_model (&r->s, r->model, offset, len, r->ctx);
    return;
  }
  if (fua && ret == 0)
    check_durable_request (r, what, offset, len, trim);
  else if (i % 25 == 0)
    check_file (r->s.mio.durable, r->s.mio.size, false, what);
}

static void
test_random (const struct config *cfg, uint64_t seed)
{
  struct qcow2_options opts = default_options;
  unsigned long before = atomic_load (&unit_failures);
  struct run r = { .cfg = cfg, .state = seed };

  opts.compress = cfg->compress;
  opts.detect_zeroes = cfg->detect_zeroes;
  opts.discard = cfg->discard ? QCOW2_DISCARD_UNMAP : QCOW2_DISCARD_IGNORE;
  opts.threads = seed & 1 ? 2 : 0;
  opts.request_size = seed & 2 ? 64 * KiB : 4 * MiB;
  r.C = UINT64_C (1) << cfg->image.cluster_bits;
  r.vsize = cfg->image.virtual_size;
  r.model = xcalloc (1, r.vsize);
  r.buf = xmalloc (8 * r.C);
  snprintf (r.ctx, sizeof r.ctx, "%s, seed %" PRIu64, cfg->name, seed);

  CHECK_EQ (session_open_new (&r.s, &cfg->image,
                              MEM_IO_RECORD |
                              (cfg->discard ? MEM_IO_DISCARD : 0), &opts), 0);
  if (r.s.conn == NULL) {
    fprintf (stderr, "  %s: open failed: %s\n", r.ctx, r.s.log.last);
    session_close (&r.s);
    goto out;
  }
  for (unsigned i = 0; i < cfg->ops; ++i)
    one_op (&r, i);

  /* All of it, flushed, exact, and again after opening anew. */
  matches_model (&r.s, r.model, 0, r.vsize, r.ctx);
  CHECK_EQ (do_flush (&r.s), 0);
  check_file (r.s.mio.data, r.s.mio.size, true, r.ctx);
  CHECK_EQ (r.s.log.errors, 0);
  session_close_image (&r.s);
  CHECK_EQ (session_open_io (&r.s, &opts), 0);
  if (r.s.conn)
    matches_model (&r.s, r.model, 0, r.vsize, "after opening again");
  session_close (&r.s);
 out:
  UNIT_NOTE_IF_FAILED (before, "%s", r.ctx);
  free (r.model);
  free (r.buf);
}

/* Requests past the disk, and writes to a read-only image, change
 * nothing and say why.
 */
static void
test_refusals (void)
{
  const struct config *cfg = &configs[0];
  struct qcow2_options opts = default_options;
  struct session s;
  uint8_t byte = 1;
  uint64_t vsize = cfg->image.virtual_size;

  CHECK_EQ (session_open_new (&s, &cfg->image, 0, &opts), 0);
  if (s.conn) {
    CHECK_EQ (do_write (&s, &byte, 1, vsize, false), -EINVAL);
    CHECK_EQ (do_write (&s, &byte, 2, vsize - 1, false), -EINVAL);
    CHECK_EQ (do_zero (&s, 2, vsize - 1, false, false), -EINVAL);
    CHECK_EQ (do_trim (&s, 1, UINT64_MAX, false), -EINVAL);
    CHECK_EQ (s.log.errors, 4);
    CHECK (strstr (s.log.last, "beyond the virtual size") != NULL);
    CHECK_EQ (do_write (&s, &byte, 0, vsize, false), 0);
    CHECK_EQ (atomic_load (&s.mio.pwrites), 0);
  }
  session_close_image (&s);

  /* Opened read-only: refused without touching the storage. */
  opts.writable = false;
  CHECK_EQ (session_open_io (&s, &opts), 0);
  if (s.conn) {
    CHECK_EQ (do_write (&s, &byte, 1, 0, false), -EROFS);
    CHECK_EQ (do_zero (&s, 1, 0, false, false), -EROFS);
    CHECK_EQ (do_trim (&s, 1, 0, false), -EROFS);
    CHECK_EQ (do_flush (&s), 0);
    CHECK (strstr (s.log.last, "read-only") != NULL);
    CHECK_EQ (atomic_load (&s.mio.pwrites), 0);
    CHECK_EQ (atomic_load (&s.mio.flushes), 0);
  }
  session_close (&s);
}

/* Is L1 entry K's table, in the image FILE, one run of consecutive host
 * clusters (what the map then keeps beside the L1 entry, meta/map.h)?
 */
static bool
table_is_run (const uint8_t *file, uint64_t C, uint64_t k)
{
  const uint64_t offset_mask = UINT64_C (0x00fffffffffffe00);
  uint64_t l1 = get64 (file + 40);
  uint64_t table = get64 (file + l1 + 8 * k) & offset_mask;
  uint64_t first = get64 (file + table), i;

  for (i = 1; i < C / 8; ++i)
    if (get64 (file + table + 8 * i) != first + i * C)
      return false;
  return table != 0 && (first & offset_mask);
}

/* L2 tables in one run (meta/map.h): a disk written whole, table by table,
 * maps each table's clusters to consecutive host clusters.  With an L2
 * cache of one table, reading the tables in turn reads each table from
 * the storage once, and then never again.  A table changed after it was
 * known (a cluster trimmed; its host cluster keeps the old bytes) is
 * looked up as changed, once the cache has let it go too.
 */
static void
test_table_runs (void)
{
  const uint64_t C = 4096, span = C * (C / 8), tables = 4;
  const struct new_image spec = {
    3, 12, 3, QCOW2_COMPRESSION_ZLIB, tables * span, 12 * MiB, 0,
  };
  struct qcow2_options opts = default_options;
  uint8_t *buf = xmalloc (span), *want = xmalloc (span), zero[4096] = { 0 };
  unsigned long before;
  struct session s;

  opts.writable = true;
  opts.discard = QCOW2_DISCARD_IGNORE;
  opts.l2_cache_size = C;
  CHECK_EQ (session_open_new (&s, &spec, 0, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (buf);
    free (want);
    return;
  }
  for (uint64_t k = 0; k < tables; ++k) {
    fill_pattern (buf, span, 40 + k);
    CHECK_EQ (do_write (&s, buf, span, k * span, false), 0);
  }
  CHECK_EQ (do_flush (&s), 0);
  session_close_image (&s);
  /* 8-bit refcounts: one block counts the whole file, so no block lies
   * among the data.
   */
  for (uint64_t k = 0; k < tables; ++k)
    CHECK (table_is_run (s.mio.data, C, k));

  CHECK_EQ (session_open_io (&s, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (buf);
    free (want);
    return;
  }
  /* Twice around: the first reads every table, the second none (the
   * cache holds one table).
   */
  for (unsigned round = 0; round < 2; ++round) {
    before = atomic_load (&s.mio.preads);
    for (uint64_t k = 0; k < tables; ++k) {
      CHECK_EQ (do_read (&s, buf, C, k * span + 3 * C), 0);
      fill_pattern (want, span, 40 + k);
      CHECK (memcmp (buf, want + 3 * C, C) == 0);
    }
    CHECK_EQ (atomic_load (&s.mio.preads) - before,
              round == 0 ? 2 * tables : tables);
  }

  /* Table 2 changed: its cluster 5 trimmed, written back, and the cache
   * made to hold another table.
   */
  CHECK_EQ (do_trim (&s, C, 2 * span + 5 * C, false), 0);
  CHECK_EQ (do_flush (&s), 0);
  CHECK_EQ (do_read (&s, buf, C, 0), 0);
  CHECK_EQ (do_read (&s, buf, C, 2 * span + 5 * C), 0);
  CHECK (memcmp (buf, zero, C) == 0);
  CHECK_EQ (do_read (&s, buf, C, 2 * span + 6 * C), 0);
  fill_pattern (want, span, 42);
  CHECK (memcmp (buf, want + 6 * C, C) == 0);
  CHECK_EQ (s.log.errors, 0);
  session_close_image (&s);
  check_file (s.mio.data, s.mio.size, true, "table runs");
  session_close (&s);
  free (buf);
  free (want);
}

int
main (void)
{
  test_refusals ();
  test_table_runs ();
  for (size_t i = 0; i < NCONFIGS; ++i)
    for (uint64_t seed = 1; seed <= unit_rounds (4); ++seed)
      test_random (&configs[i], seed * 7919 + i);
  return unit_finish ();
}
