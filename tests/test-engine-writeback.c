/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: the order of the metadata writeback, what a crash
 * leaves, and reclaiming released clusters when the file is full.
 *
 * The storage records every write and flush, and each write is
 * classified by what its cluster holds (classify_log):
 * - a flush's writes come in the order the write path promises:
 *   refcount increments, flush, refcount table, flush, header if the
 *   table moved, flush, L2 tables, flush, L1, flush, decrements, flush;
 * - at any moment, nothing is written that depends on an unflushed write
 *   of what it depends on (an L2 table on data and refcounts, the L1
 *   table on L2 tables, ...);
 * - the storage as of every flush, plus any subset of the writes after
 *   it, is consistent: no cluster referenced beyond its refcount;
 * - a discard comes only after the flush that made its clusters' release
 *   durable, and no crash state refers to what it discarded (a discarded
 *   range reads as garbage);
 * - an overwrite in place changes no metadata: its flush is only a
 *   flush, and so is its FUA, unless its L2 table is not on disk yet;
 * - with writes, zeroes, trims, reads and flushes from several threads at
 *   once, every crash state is still consistent and the data is right;
 * - nothing is written before the first change, which clears the
 *   autoclear bits and flushes before it writes anything else;
 * - qcow2-create writes and flushes the tables before the header, and
 *   flushes the header before it returns;
 * - a host cluster released while a read that looked it up is in flight
 *   is not reused until that read is done.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "qcow2.h"
#include "meta/alloc-internal.h"
#include "meta/corrupt.h"
#include "lock-watch.h"
#include "session.h"
#include "unit.h"
#include "util.h"
#include "write-image.h"

static const char *const kind_names[] = {
  [WRITE_DATA] = "D", [WRITE_HEADER] = "H", [WRITE_REFCOUNT_TABLE] = "T",
  [WRITE_REFCOUNT_BLOCK] = "B", [WRITE_L1] = "L1", [WRITE_L2] = "L2",
  [WRITE_LUKS] = "K", [WRITE_SNAPSHOT_TABLE] = "S",
};

/* KIND[i] of a flush and of a discard. */
#define OP_FLUSH (-1)
#define OP_DISCARD (-2)

/* What each write of the log changed (KIND[i] for op i; OP_FLUSH,
 * OP_DISCARD).
 *
 * A cluster holds what the final storage says it holds, since the last
 * time its refcount on disk dropped to 0: before that it held data that
 * was released (metadata is never released, but for a refcount table
 * that moved, which is not written after it moved).
 */
static int *
classify_log (const struct mem_io *m)
{
  int *kind = xmalloc ((m->nops + 1) * sizeof *kind);
  uint8_t *state = mem_io_state_at (m, m->nops);
  struct image_report final, report;
  size_t nflush = 0, f;
  size_t *flush_at;
  uint8_t **free_at;            /* per flush: a bit per cluster, refcount 0 */
  uint64_t clusters;
  struct mem_replay replay;

  check_image (state, m->size, false, &final);
  free (state);
  clusters = final.host_clusters;
  flush_at = xmalloc ((m->nops + 1) * sizeof *flush_at);
  free_at = xmalloc ((m->nops + 1) * sizeof *free_at);
  mem_replay_init (&replay, m);
  for (size_t i = 0; i < m->nops; ++i) {
    if (!m->ops[i].flush)
      continue;
    check_image (mem_replay_to (&replay, i), m->size, false, &report);
    flush_at[nflush] = i;
    free_at[nflush] = xcalloc (1, (clusters + 7) / 8);
    for (uint64_t c = 0; c < clusters && c < report.host_clusters; ++c)
      if (report.refcount[c] == 0)
        free_at[nflush][c / 8] |= 1 << (c % 8);
    nflush++;
    image_report_free (&report);
  }
  mem_replay_free (&replay);

  for (size_t i = 0; i < m->nops; ++i) {
    uint64_t c = m->ops[i].offset / final.cluster_size;

    kind[i] = m->ops[i].discard ? OP_DISCARD : OP_FLUSH;
    if (m->ops[i].flush || m->ops[i].discard)
      continue;
    kind[i] = c < clusters && final.refs[c]
      ? classify_write (&final, m->ops[i].offset, m->ops[i].len) : WRITE_DATA;
    /* The last flush at which the count had dropped to 0. */
    for (f = nflush; f-- > 1; )
      if (c < clusters && (free_at[f][c / 8] & (1 << (c % 8))) &&
          !(free_at[f - 1][c / 8] & (1 << (c % 8))))
        break;
    if (f != (size_t) -1 && f > 0 && flush_at[f] > i)
      kind[i] = WRITE_DATA;
  }
  for (f = 0; f < nflush; ++f)
    free (free_at[f]);
  free (free_at);
  free (flush_at);
  image_report_free (&final);
  return kind;
}

/* Ops [FROM, TO) as a sequence like "B F L2 F L1 F", repeats collapsed. */
static void
sequence (const struct mem_io *m, const int *kind, size_t from, size_t to,
          char *out, size_t len)
{
  const char *last = NULL;

  out[0] = '\0';
  for (size_t i = from; i < to; ++i) {
    const char *name = kind[i] == OP_FLUSH ? "F"
      : kind[i] == OP_DISCARD ? "X" : kind_names[kind[i]];
    if (last && strcmp (name, last) == 0 && kind[i] >= 0)
      continue;
    snprintf (out + strlen (out), len - strlen (out), "%s%s",
              out[0] ? " " : "", name);
    last = name;
  }
}

/* No write of a kind before the kinds it depends on are flushed. */
static void
check_dependencies (const struct mem_io *m, const int *kind, const char *ctx)
{
  static const unsigned deps[] = {
    [WRITE_DATA] = 0,
    [WRITE_HEADER] = 1u << WRITE_REFCOUNT_TABLE,
    [WRITE_REFCOUNT_TABLE] = 1u << WRITE_REFCOUNT_BLOCK,
    [WRITE_REFCOUNT_BLOCK] = 1u << WRITE_L2 | 1u << WRITE_L1,
    [WRITE_L2] = 1u << WRITE_DATA | 1u << WRITE_REFCOUNT_BLOCK |
      1u << WRITE_REFCOUNT_TABLE | 1u << WRITE_HEADER,
    [WRITE_L1] = 1u << WRITE_L2 | 1u << WRITE_DATA |
      1u << WRITE_REFCOUNT_BLOCK | 1u << WRITE_REFCOUNT_TABLE |
      1u << WRITE_HEADER,
    [WRITE_LUKS] = 0, [WRITE_SNAPSHOT_TABLE] = 0,
  };
  unsigned unflushed = 0, bad = 0;

  for (size_t i = 0; i < m->nops; ++i) {
    if (kind[i] == OP_FLUSH)
      unflushed = 0;
    if (kind[i] < 0)
      continue;
    if ((deps[kind[i]] & unflushed) && bad++ == 0) {
      char seq[200];
      sequence (m, kind, i >= 8 ? i - 8 : 0, i + 1, seq, sizeof seq);
      fprintf (stderr, "  %s: op %zu (%s at 0x%" PRIx64 ") before a flush "
               "of what it depends on: ... %s\n", ctx, i,
               kind_names[kind[i]], m->ops[i].offset, seq);
    }
    unflushed |= 1u << kind[i];
  }
  CHECK_EQ (bad, 0);
}

/* Per 512-byte sector of a state: 1 if a discard left it garbage and
 * nothing was written there since.
 */
static void
note_op (uint8_t *discarded, const struct mem_op *op)
{
  if (op->flush)
    return;
  for (uint64_t sec = op->offset / 512;
       sec < (op->offset + op->len + 511) / 512; ++sec)
    discarded[sec] = op->discard;
}

/* Does STATE (SIZE bytes) reference what DISCARDED says is garbage?  A
 * table's cluster must hold no garbage sector, a data cluster not only
 * garbage (packed compressed data may go back into part of a cluster
 * that was discarded, whose other sectors no reference reads).
 */
static bool
references_discarded (const uint8_t *state, uint64_t size,
                      const uint8_t *discarded, const char *what)
{
  struct image_report report;
  bool bad = false;

  check_image (state, size, false, &report);
  for (uint64_t c = 0; c < report.host_clusters && !bad; ++c) {
    uint64_t per = report.cluster_size / 512, marked = 0;

    if (report.refs[c] == 0)
      continue;
    for (uint64_t sec = c * per; sec < (c + 1) * per; ++sec)
      marked += discarded[sec];
    if (marked == per || (marked && report.role[c] != WRITE_DATA)) {
      fprintf (stderr, "  %s: host cluster %" PRIu64 " is referenced (%u) "
               "but %" PRIu64 " of its sectors were discarded\n", what, c,
               report.refs[c], marked);
      bad = true;
    }
  }
  image_report_free (&report);
  return bad;
}

/* The storage as of each flush, with every prefix and some random subsets
 * of the writes (and discards) after it, is consistent, and refers to no
 * cluster a discard made garbage.
 */
static void
check_crash_states (const struct mem_io *m, uint64_t seed, const char *ctx)
{
  const uint64_t sectors = m->size / 512;
  uint8_t *prefix_discarded = xcalloc (1, sectors);
  uint8_t *discarded = xmalloc (sectors);
  unsigned failures = 0;
  size_t applied = 0;
  struct mem_replay replay;

  mem_replay_init (&replay, m);
  for (size_t f = 0; f <= m->nops && failures < 3; ++f) {
    size_t next = f;
    if (f > 0 && !m->ops[f - 1].flush)
      continue;                         /* states start after a flush */
    while (next < m->nops && !m->ops[next].flush)
      next++;
    for (; applied < f; ++applied)
      note_op (prefix_discarded, &m->ops[applied]);
    for (unsigned trial = 0; trial < 4 && failures < 3; ++trial) {
      const uint8_t *state = mem_replay_to (&replay, f);
      char what[300];

      memcpy (discarded, prefix_discarded, sectors);
      /* trial 0: nothing after the flush; 1: all of it; else a subset.
       * A discard that reached the storage left garbage.
       */
      for (size_t i = f; i < next && trial > 0; ++i)
        if (trial == 1 || rng (&seed) % 2) {
          mem_replay_apply (&replay, &m->ops[i]);
          note_op (discarded, &m->ops[i]);
        }
      snprintf (what, sizeof what, "%s: crash after op %zu (trial %u)",
                ctx, f, trial);
      if (!check_file (state, m->size, false, what))
        failures++;
      else if (references_discarded (state, m->size, discarded, what)) {
        CHECK (!"a crash state refers to a discarded cluster");
        failures++;
      }
    }
  }
  mem_replay_free (&replay);
  free (discarded);
  free (prefix_discarded);
}

/* Each discard of the log comes right after a flush (or another discard
 * after it), and covers only clusters that the storage as of that flush
 * counts 0 times and that nothing there references: their release was
 * durable, and nothing was written to them since.  Returns the bytes
 * discarded.
 */
static uint64_t
check_discards (const struct mem_io *m, const char *ctx)
{
  uint64_t bytes = 0;
  unsigned bad = 0;
  struct mem_replay replay;

  mem_replay_init (&replay, m);
  for (size_t i = 0; i < m->nops; ++i) {
    const struct mem_op *op = &m->ops[i];
    struct image_report report;
    size_t j = i;

    if (!op->discard)
      continue;
    bytes += op->len;
    while (j > 0 && m->ops[j - 1].discard)
      j--;
    if (j == 0 || !m->ops[j - 1].flush) {
      if (bad++ == 0)
        fprintf (stderr, "  %s: discard (op %zu) not right after a flush\n",
                 ctx, i);
      continue;
    }
    /* J, where this run of discards begins, never goes back. */
    check_image (mem_replay_to (&replay, j), m->size, false, &report);
    for (uint64_t c = op->offset / report.cluster_size;
         c < (op->offset + op->len) / report.cluster_size &&
           c < report.host_clusters; ++c)
      if ((report.refcount[c] || report.refs[c]) && bad++ == 0)
        fprintf (stderr, "  %s: discard (op %zu) of host cluster %" PRIu64
                 ", whose refcount is %" PRIu64 " and references %u\n",
                 ctx, i, c, report.refcount[c], report.refs[c]);
    if (op->offset % report.cluster_size || op->len % report.cluster_size)
      if (bad++ == 0)
        fprintf (stderr, "  %s: discard (op %zu) not of whole clusters\n",
                 ctx, i);
    image_report_free (&report);
  }
  mem_replay_free (&replay);
  CHECK_EQ (bad, 0);
  return bytes;
}

/* ---------------------------------------------------------- the order */

/* Flush S and expect the flush's writes to come as EXPECTED (repeats
 * collapsed), and none of the log's before what it depends on.
 */
static void
expect_flush (struct session *s, const char *expected, const char *what)
{
  size_t start = s->mio.nops;
  int *kind;
  char seq[200];

  CHECK_EQ (do_flush (s), 0);
  kind = classify_log (&s->mio);
  sequence (&s->mio, kind, start, s->mio.nops, seq, sizeof seq);
  CHECK (strcmp (seq, expected) == 0);
  if (strcmp (seq, expected) != 0)
    fprintf (stderr, "  %s: the flush wrote %s, expected %s\n", what, seq,
             expected);
  check_dependencies (&s->mio, kind, what);
  free (kind);
}

/* A writeback with every step: new refcount blocks that need a bigger
 * table (which then moves, so the header changes), new L2 tables and L1
 * entries, and released clusters.
 */
static void
test_order_all_steps (void)
{
  /* 512-byte clusters, 64-bit refcounts: the one table cluster covers
   * 64 blocks of 64 clusters, 2 MiB.
   */
  const struct new_image spec = {
    3, 9, 6, QCOW2_COMPRESSION_ZLIB, 3 * MiB, 4 * MiB, 1,
  };
  struct qcow2_options opts = default_options;
  uint64_t len = 1900 * KiB;
  uint8_t *buf = xmalloc (len);
  struct session s;

  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_RECORD, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (buf);
    return;
  }
  fill_pattern (buf, len, 1);
  CHECK_EQ (do_write (&s, buf, len, 0, false), 0);
  CHECK_EQ (do_flush (&s), 0);

  /* A release, then data past what the table covers, in a new L2 table. */
  CHECK_EQ (do_zero (&s, 512, 0, false, false), 0);
  CHECK_EQ (do_write (&s, buf, 200 * KiB, 2560 * KiB, false), 0);
  expect_flush (&s, "B F T F H F L2 F L1 F B F", "every step");
  check_crash_states (&s.mio, 1, "every step");
  check_file (s.mio.data, s.mio.size, true, "every step");
  session_close (&s);
  free (buf);
}

/* The usual writebacks: a new cluster in a new table; a release. */
static void
test_order_usual (void)
{
  const struct new_image spec = {
    3, 12, 4, QCOW2_COMPRESSION_ZLIB, 4 * MiB, 8 * MiB, 0,
  };
  struct qcow2_options opts = default_options;
  uint8_t buf[4096];
  struct session s;

  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_RECORD, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  fill_pattern (buf, sizeof buf, 2);
  CHECK_EQ (do_write (&s, buf, sizeof buf, 3 * MiB, false), 0);
  expect_flush (&s, "B F L2 F L1 F", "a new cluster in a new L2 table");
  CHECK_EQ (do_trim (&s, sizeof buf, 3 * MiB, false), 0);
  expect_flush (&s, "F L2 F B F", "a released cluster");
  check_file (s.mio.data, s.mio.size, true, "usual");
  session_close (&s);
}

/* Released clusters are discarded after the flush that made their
 * release durable, and only then.
 */
static void
test_order_discard (void)
{
  const struct new_image spec = {
    3, 12, 4, QCOW2_COMPRESSION_ZLIB, 4 * MiB, 8 * MiB, 0,
  };
  struct qcow2_options opts = default_options;
  uint8_t *model = xcalloc (1, 4 * MiB);
  struct session s;

  opts.discard = QCOW2_DISCARD_UNMAP;
  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_RECORD | MEM_IO_DISCARD,
                              &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (model);
    return;
  }
  fill_pattern (model, 256 * KiB, 8);
  CHECK_EQ (do_write (&s, model, 256 * KiB, 0, false), 0);
  expect_flush (&s, "B F L2 F L1 F", "data to discard later");
  CHECK_EQ (do_trim (&s, 128 * KiB, 64 * KiB, false), 0);
  memset (model + 64 * KiB, 0, 128 * KiB);
  expect_flush (&s, "F L2 F B F X", "released clusters discarded");
  CHECK_EQ (check_discards (&s.mio, "trim"), 128 * KiB);
  /* Nothing reads the garbage the discard left. */
  CHECK (matches_model (&s, model, 0, 4 * MiB, "after the discard"));
  /* The discarded clusters are reused, by a write after the discard. */
  fill_pattern (model + MiB, 128 * KiB, 9);
  CHECK_EQ (do_write (&s, model + MiB, 128 * KiB, MiB, false), 0);
  CHECK_EQ (do_flush (&s), 0);
  CHECK (matches_model (&s, model, 0, 4 * MiB, "after the reuse"));
  check_crash_states (&s.mio, 4, "discard and reuse");
  check_file (s.mio.data, s.mio.size, true, "discard and reuse");
  CHECK (s.mio.size - s.mio.discarded_bytes >= 128 * KiB);
  session_close (&s);
  free (model);
}

/* qcow2-discard=ignore sends none; storage that refuses them is asked
 * once (-EOPNOTSUPP) or each time (another error), and the image is
 * right either way.
 */
static void
test_discard_modes (void)
{
  const struct new_image spec = {
    3, 12, 4, QCOW2_COMPRESSION_ZLIB, 2 * MiB, 4 * MiB, 0,
  };
  static const struct { enum qcow2_discard mode; int err; unsigned long
    discards; } cases[] = {
    { QCOW2_DISCARD_IGNORE, 0, 0 },
    { QCOW2_DISCARD_UNMAP, EOPNOTSUPP, 1 },
    { QCOW2_DISCARD_UNMAP, EIO, 3 },
    { QCOW2_DISCARD_UNMAP, 0, 3 },
  };
  uint8_t *model = xcalloc (1, 2 * MiB);

  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    struct qcow2_options opts = default_options;
    struct session s;
    char ctx[80];

    snprintf (ctx, sizeof ctx, "discard mode %d, storage error %d",
              cases[k].mode, cases[k].err);
    opts.discard = cases[k].mode;
    CHECK_EQ (session_open_new (&s, &spec, MEM_IO_RECORD | MEM_IO_DISCARD,
                                &opts), 0);
    if (s.conn == NULL) {
      session_close (&s);
      continue;
    }
    s.mio.discard_errno = cases[k].err;
    memset (model, 0, 2 * MiB);
    for (unsigned round = 0; round < 3; ++round) {
      fill_pattern (model, 64 * KiB, 10 + round);
      CHECK_EQ (do_write (&s, model, 64 * KiB, 0, false), 0);
      CHECK_EQ (do_flush (&s), 0);
      CHECK_EQ (do_zero (&s, 32 * KiB, 0, false, false), 0);
      memset (model, 0, 32 * KiB);
      CHECK_EQ (do_flush (&s), 0);
    }
    CHECK_EQ (atomic_load (&s.mio.discards), cases[k].discards);
    CHECK_EQ (s.log.errors, 0);
    CHECK (matches_model (&s, model, 0, 2 * MiB, ctx));
    check_discards (&s.mio, ctx);
    check_file (s.mio.data, s.mio.size, true, ctx);
    session_close (&s);
  }
  free (model);
}

/* Random work, plain and compressed: every flush's order and every crash
 * state, including the writebacks a write makes by itself when much has
 * piled up; with DISCARD, released clusters are discarded too.
 */
static void
test_random_log (bool compress, bool discard, uint64_t seed)
{
  const struct new_image spec = {
    3, 10, compress ? 2 : 4, QCOW2_COMPRESSION_ZSTD, 2 * MiB, 8 * MiB, 0,
  };
  const uint64_t C = 1024;
  struct qcow2_options opts = default_options;
  unsigned long before = atomic_load (&unit_failures);
  uint8_t *buf = xmalloc (16 * C);
  struct session s;
  int *kind;
  char ctx[100];

  snprintf (ctx, sizeof ctx, "random log, %scompressing,%s seed %" PRIu64,
            compress ? "" : "not ", discard ? " discarding," : "", seed);
  opts.compress = compress;
  opts.discard = discard ? QCOW2_DISCARD_UNMAP : QCOW2_DISCARD_IGNORE;
  CHECK_EQ (session_open_new (&s, &spec,
                              MEM_IO_RECORD | (discard ? MEM_IO_DISCARD : 0),
                              &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (buf);
    return;
  }
  for (unsigned i = 0; i < 120; ++i) {
    uint64_t off = rng (&seed) % (2 * MiB / C) * C +
      (rng (&seed) & 1 ? 100 : 0);
    uint64_t len = 1 + rng (&seed) % (16 * C - 100);

    if (off + len > 2 * MiB)
      len = 2 * MiB - off;
    switch (rng (&seed) % 6) {
    case 0: case 1: case 2:
      fill_pattern (buf, len, i % 5);
      CHECK_EQ (do_write (&s, buf, len, off, rng (&seed) % 8 == 0), 0);
      break;
    case 3:
      CHECK_EQ (do_zero (&s, len, off, false, false), 0);
      break;
    case 4:
      CHECK_EQ (do_trim (&s, len, off, false), 0);
      break;
    case 5:
      CHECK_EQ (do_flush (&s), 0);
      break;
    }
  }
  CHECK_EQ (do_flush (&s), 0);
  kind = classify_log (&s.mio);
  check_dependencies (&s.mio, kind, ctx);
  check_crash_states (&s.mio, seed, ctx);
  check_file (s.mio.data, s.mio.size, true, ctx);
  if (discard)
    CHECK (check_discards (&s.mio, ctx) > 0);
  free (kind);
  session_close (&s);
  free (buf);
  UNIT_NOTE_IF_FAILED (before, "%s", ctx);
}

/* ------------------------------------------------------- durability */

/* What was acknowledged with a flush or FUA is in the durable storage;
 * what was not may be missing, but the storage is consistent.
 */
static void
test_durability (void)
{
  const struct new_image spec = {
    3, 12, 4, QCOW2_COMPRESSION_ZLIB, MiB, 4 * MiB, 0,
  };
  struct qcow2_options opts = default_options;
  uint8_t *model = xcalloc (1, MiB);
  struct session s;
  uint8_t *durable;

  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_RECORD, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (model);
    return;
  }
  fill_pattern (model, 64 * KiB, 3);
  CHECK_EQ (do_write (&s, model, 64 * KiB, 0, false), 0);
  CHECK_EQ (do_flush (&s), 0);
  fill_pattern (model + 256 * KiB, 8 * KiB, 4);
  CHECK_EQ (do_write (&s, model + 256 * KiB, 8 * KiB, 256 * KiB, true), 0);
  CHECK_EQ (do_zero (&s, 4 * KiB, 0, false, true), 0);
  memset (model, 0, 4 * KiB);
  durable = xmalloc (s.mio.size);
  memcpy (durable, s.mio.durable, s.mio.size);
  CHECK (file_matches_model (durable, s.mio.size, model, MiB,
                             "after a flush and FUA requests"));

  /* Not acknowledged yet: the durable storage stays consistent and
   * keeps all that was.
   */
  fill_pattern (model + 512 * KiB, 8 * KiB, 5);
  CHECK_EQ (do_write (&s, model + 512 * KiB, 8 * KiB, 512 * KiB, false), 0);
  check_file (s.mio.durable, s.mio.size, false, "unacknowledged write");
  {
    struct session d;
    CHECK_EQ (session_open (&d, s.mio.durable, s.mio.size, &default_options),
              0);
    if (d.conn)
      CHECK (matches_model (&d, model, 0, 512 * KiB, "unacknowledged write"));
    session_close (&d);
  }
  CHECK_EQ (do_flush (&s), 0);
  CHECK (file_matches_model (s.mio.durable, s.mio.size, model, MiB,
                             "after the last flush"));
  free (durable);
  session_close (&s);
  free (model);
}

/* ------------------------------------------------ writes in place */

/* The ops from START to the end of S's log, as a sequence. */
static void
ops_since (struct session *s, size_t start, char *seq, size_t len)
{
  int *kind = classify_log (&s->mio);

  sequence (&s->mio, kind, start, s->mio.nops, seq, len);
  free (kind);
}

/* An overwrite of a cluster the image alone owns, whose L2 table is on
 * disk, writes its data and nothing else: the next flush is only a
 * flush, and with FUA the request is its data and a flush.  Once a new
 * cluster is allocated in the same L2 table (not written back yet), a
 * FUA overwrite also writes the metadata back: what it wrote must be
 * reachable after a crash, and the table holding its entry may be new.
 */
static void
test_in_place (void)
{
  const struct new_image spec = {
    3, 12, 4, QCOW2_COMPRESSION_ZLIB, MiB, 4 * MiB, 0,
  };
  struct qcow2_options opts = default_options;
  uint8_t *model = xcalloc (1, MiB);
  struct session s;
  size_t start;
  char seq[200];

  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_RECORD, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (model);
    return;
  }
  fill_pattern (model, 8 * KiB, 8);
  CHECK_EQ (do_write (&s, model, 8 * KiB, 0, false), 0);
  CHECK_EQ (do_flush (&s), 0);

  fill_pattern (model + 100, 512, 9);
  start = s.mio.nops;
  CHECK_EQ (do_write (&s, model + 100, 512, 100, false), 0);
  ops_since (&s, start, seq, sizeof seq);
  CHECK (strcmp (seq, "D") == 0);
  expect_flush (&s, "F", "after an overwrite in place");

  fill_pattern (model + 4096 + 7, 1000, 10);
  start = s.mio.nops;
  CHECK_EQ (do_write (&s, model + 4096 + 7, 1000, 4096 + 7, true), 0);
  ops_since (&s, start, seq, sizeof seq);
  CHECK (strcmp (seq, "D F") == 0);
  if (strcmp (seq, "D F") != 0)
    fprintf (stderr, "  a FUA overwrite in place wrote %s, expected D F\n",
             seq);
  CHECK (file_matches_model (s.mio.durable, s.mio.size, model, MiB,
                             "after a FUA overwrite in place"));

  fill_pattern (model + 64 * KiB, 4096, 11);
  CHECK_EQ (do_write (&s, model + 64 * KiB, 4096, 64 * KiB, false), 0);
  fill_pattern (model + 200, 300, 12);
  start = s.mio.nops;
  CHECK_EQ (do_write (&s, model + 200, 300, 200, true), 0);
  ops_since (&s, start, seq, sizeof seq);
  CHECK (strcmp (seq, "D B F L2 F") == 0);
  if (strcmp (seq, "D B F L2 F") != 0)
    fprintf (stderr, "  a FUA overwrite beside a new cluster wrote %s, "
             "expected D B F L2 F\n", seq);
  CHECK (file_matches_model (s.mio.durable, s.mio.size, model, MiB,
                             "after a FUA overwrite beside a new cluster"));
  check_file (s.mio.data, s.mio.size, true, "writes in place");
  session_close (&s);
  free (model);
}

/* ------------------------------------------------------- concurrency */

#define WRITERS 3
#define WRITER_OPS 150
#define FLUSHES 12

/* Writers own the guest clusters k with k % 4 == their index; clusters
 * with k % 4 == 3 hold data written before the threads start, which a
 * reader keeps reading.  All of them share L2 tables and refcount
 * blocks, and a flusher writes the metadata back meanwhile.  With SPACE,
 * released clusters are discarded (a discarded range reads as garbage)
 * and whole clusters of zeros written become zero clusters that keep
 * their host cluster, which later writes fill in place.
 */
struct concurrent {
  struct session *s;
  uint8_t *model;
  uint64_t C, vsize;
  bool space;
  atomic_int writers_left;
  atomic_ulong wrong_reads;
};

struct concurrent_arg {
  struct concurrent *c;
  unsigned id;
};

static void *
writer_thread (void *arg)
{
  struct concurrent_arg *a = arg;
  struct concurrent *c = a->c;
  uint64_t seed = 1000 + a->id, clusters = c->vsize / c->C;
  uint8_t *buf = xmalloc (c->C);

  for (unsigned i = 0; i < WRITER_OPS; ++i) {
    uint64_t k = (rng (&seed) % (clusters / 4)) * 4 + a->id;
    uint64_t off = rng (&seed) % c->C, len = 1 + rng (&seed) % (c->C - off);
    bool fua = rng (&seed) % 8 == 0;

    if (rng (&seed) % 3 == 0) {
      off = 0;
      len = c->C;
    }
    switch (rng (&seed) % 6) {
    case 0:
      CHECK_EQ (do_zero (c->s, len, k * c->C + off, false, fua), 0);
      memset (c->model + k * c->C + off, 0, len);
      break;
    case 1:
      CHECK_EQ (do_trim (c->s, len, k * c->C + off, fua), 0);
      if (len == c->C)
        memset (c->model + k * c->C, 0, c->C);
      break;
    default:
      fill_pattern (buf, len, a->id * 10000 + i);
      if (c->space && rng (&seed) % 3 == 0)
        memset (buf, 0, len);
      CHECK_EQ (do_write (c->s, buf, len, k * c->C + off, fua), 0);
      memcpy (c->model + k * c->C + off, buf, len);
      break;
    }
  }
  atomic_fetch_sub (&c->writers_left, 1);
  free (buf);
  return NULL;
}

static void *
reader_thread (void *arg)
{
  struct concurrent *c = arg;
  uint64_t seed = 77, clusters = c->vsize / c->C;
  uint8_t *buf = xmalloc (2 * c->C);

  while (atomic_load (&c->writers_left) > 0) {
    uint64_t k = (rng (&seed) % (clusters / 4)) * 4 + 3;
    uint64_t off = rng (&seed) % c->C, len = 1 + rng (&seed) % (c->C - off);

    CHECK_EQ (do_read (c->s, buf, len, k * c->C + off), 0);
    if (memcmp (buf, c->model + k * c->C + off, len) != 0)
      atomic_fetch_add (&c->wrong_reads, 1);
  }
  free (buf);
  return NULL;
}

static void *
flusher_thread (void *arg)
{
  struct concurrent *c = arg;

  for (unsigned i = 0; i < FLUSHES && atomic_load (&c->writers_left) > 0;
       ++i) {
    usleep (3000);
    CHECK_EQ (do_flush (c->s), 0);
  }
  return NULL;
}

static void
test_concurrent (bool compress, bool space)
{
  /* 1 KiB clusters: 128 to an L2 table, 16 tables. */
  const struct new_image spec = {
    3, 10, 4, QCOW2_COMPRESSION_ZSTD, 2 * MiB, 6 * MiB, 0,
  };
  struct qcow2_options opts = default_options;
  unsigned long before = atomic_load (&unit_failures);
  struct concurrent c = { .C = 1024, .vsize = 2 * MiB, .space = space };
  struct concurrent_arg args[WRITERS];
  pthread_t writers[WRITERS], reader, flusher;
  struct session s;
  char ctx[80];

  snprintf (ctx, sizeof ctx, "concurrent, %scompressing%s",
            compress ? "" : "not ", space ? ", discards, written zeros" : "");
  opts.compress = compress;
  if (space) {
    opts.discard = QCOW2_DISCARD_UNMAP;
    opts.detect_zeroes = QCOW2_DETECT_ZEROES_ON;
  }
  CHECK_EQ (session_open_new (&s, &spec,
                              MEM_IO_RECORD | (space ? MEM_IO_DISCARD : 0),
                              &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  c.s = &s;
  c.model = xcalloc (1, c.vsize);
  for (uint64_t k = 3; k < c.vsize / c.C; k += 4)
    fill_pattern (c.model + k * c.C, c.C, k);
  for (uint64_t k = 0; k < c.vsize / c.C; k += 4)
    CHECK_EQ (do_write (&s, c.model + k * c.C, 4 * c.C, k * c.C, false), 0);
  atomic_store (&c.writers_left, WRITERS);
  for (unsigned i = 0; i < WRITERS; ++i) {
    args[i] = (struct concurrent_arg) { &c, i };
    pthread_create (&writers[i], NULL, writer_thread, &args[i]);
  }
  pthread_create (&reader, NULL, reader_thread, &c);
  pthread_create (&flusher, NULL, flusher_thread, &c);
  for (unsigned i = 0; i < WRITERS; ++i)
    pthread_join (writers[i], NULL);
  pthread_join (reader, NULL);
  pthread_join (flusher, NULL);

  CHECK_EQ (atomic_load (&c.wrong_reads), 0);
  CHECK (matches_model (&s, c.model, 0, c.vsize, ctx));
  CHECK_EQ (do_flush (&s), 0);
  check_file (s.mio.data, s.mio.size, true, ctx);
  CHECK (file_matches_model (s.mio.durable, s.mio.size, c.model, c.vsize,
                             ctx));
  check_crash_states (&s.mio, compress ? 5 : 6, ctx);
  if (space)
    CHECK (atomic_load (&s.mio.discards) > 0);
  CHECK_EQ (s.log.errors, 0);
  session_close (&s);
  free (c.model);
  UNIT_NOTE_IF_FAILED (before, "%s", ctx);
}

/* ---------------------------------------------------------- reclaim */

/* Flushes the storage saw during the call that ended at op END and began
 * at op START: a write that reclaimed room wrote the metadata back.
 */
static unsigned
flushes_between (const struct mem_io *m, size_t start, size_t end)
{
  unsigned n = 0;

  for (size_t i = start; i < end; ++i)
    n += m->ops[i].flush;
  return n;
}

/* A file with room for the header, table, block, L1 table, one L2 table
 * and 40 data clusters of 4 KiB, and no more.
 */
#define FULL_FILE_CLUSTER 4096
static const struct new_image full_file = {
  3, 12, 4, QCOW2_COMPRESSION_ZLIB, MiB, 45 * FULL_FILE_CLUSTER, 0,
};

/* A full file whose zeroed clusters wait for a writeback: a write that
 * needs room writes the metadata back to reuse them, goes on from the
 * cluster where it stopped (the range begins with clusters written in
 * place), and succeeds; with nothing left to reclaim, -ENOSPC.
 */
static void
test_reclaim_plain (void)
{
  const uint64_t C = FULL_FILE_CLUSTER;
  const struct new_image spec = full_file;
  struct qcow2_options opts = default_options;
  uint8_t *model = xcalloc (1, MiB);
  struct session s;
  size_t start;
  int *kind;

  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_RECORD, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (model);
    return;
  }
  fill_pattern (model, 40 * C, 6);
  CHECK_EQ (do_write (&s, model, 40 * C, 0, false), 0);
  CHECK_EQ (do_flush (&s), 0);
  CHECK_EQ (do_write (&s, model, C, 200 * C, false), -ENOSPC);
  CHECK (strstr (s.log.last, "no room in the image file") != NULL);

  CHECK_EQ (do_zero (&s, 10 * C, 0, false, false), 0);
  memset (model, 0, 10 * C);
  fill_pattern (model + 35 * C, 15 * C, 7);
  start = s.mio.nops;
  CHECK_EQ (do_write (&s, model + 35 * C, 15 * C, 35 * C, false), 0);
  CHECK (flushes_between (&s.mio, start, s.mio.nops) > 0);
  CHECK (matches_model (&s, model, 0, MiB, "after the reclaim"));
  CHECK_EQ (do_flush (&s), 0);
  check_file (s.mio.data, s.mio.size, true, "after the reclaim");
  kind = classify_log (&s.mio);
  check_dependencies (&s.mio, kind, "reclaim");
  check_crash_states (&s.mio, 2, "reclaim");
  free (kind);

  /* Full again, nothing released: no room. */
  CHECK_EQ (do_write (&s, model, C, 250 * C, false), -ENOSPC);
  CHECK (matches_model (&s, model, 0, MiB, "after ENOSPC"));
  CHECK_EQ (do_flush (&s), 0);
  check_file (s.mio.data, s.mio.size, true, "after ENOSPC");
  session_close (&s);
  free (model);
}

/* Compressed rewrites of a disk in a file with room for about two
 * copies of it: each rewrite releases the last one, and the batches
 * reclaim it as they go.
 */
static void
test_reclaim_compressed (void)
{
  const uint64_t C = 4096;
  const struct new_image spec = {
    3, 12, 4, QCOW2_COMPRESSION_ZSTD, 256 * C, 40 * C, 0,
  };
  struct qcow2_options opts = default_options;
  uint8_t *model = xcalloc (1, 256 * C);
  struct session s;
  unsigned reclaims = 0;

  opts.compress = true;
  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_RECORD, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (model);
    return;
  }
  for (unsigned round = 0; round < 6; ++round) {
    size_t start = s.mio.nops;
    char ctx[60];

    for (uint64_t k = 0; k < 256; ++k)
      fill_pattern (model + k * C, C, round * 1000 + k);
    CHECK_EQ (do_write (&s, model, 256 * C, 0, false), 0);
    reclaims += flushes_between (&s.mio, start, s.mio.nops) > 0;
    snprintf (ctx, sizeof ctx, "compressed rewrite %u", round);
    CHECK (matches_model (&s, model, 0, 256 * C, ctx));
  }
  CHECK (reclaims > 0);
  CHECK_EQ (do_flush (&s), 0);
  check_file (s.mio.data, s.mio.size, true, "compressed rewrites");
  {
    int *kind = classify_log (&s.mio);
    check_dependencies (&s.mio, kind, "compressed rewrites");
    free (kind);
  }
  CHECK_EQ (s.log.errors, 0);
  session_close (&s);
  free (model);
}

/* A writer waiting for room stops the discards of the clusters the
 * writeback is about to make reusable (meta/release.c): ten clusters
 * trimmed apart from each other in a full file (ten runs to discard),
 * and while the flush's writeback discards the first, a write that needs
 * room comes in and waits for it.  The writeback discards no more: the
 * write gets the clusters after one discard, not ten.
 */
struct room_waiter {
  struct session *s;
  uint8_t *data;
  uint64_t C;
  bool started;
  pthread_t thread;
  int result;
};

static void *
room_waiter_thread (void *arg)
{
  struct room_waiter *w = arg;

  w->result = do_write (w->s, w->data, 10 * w->C, 40 * w->C, false);
  return NULL;
}

static void
start_room_waiter (struct mem_io *m, uint64_t offset, size_t count,
                   void *arg)
{
  struct room_waiter *w = arg;
  struct timespec pause = { 0, 1000000 };

  (void) m;
  (void) offset;
  (void) count;
  if (w->started)
    return;
  w->started = true;
  CHECK_EQ (pthread_create (&w->thread, NULL, room_waiter_thread, w), 0);
  /* Until the writer waits for room (at most 10 s). */
  for (unsigned i = 0; i < 10000 &&
         atomic_load (&w->s->img->alloc->room_wanted) == 0; ++i)
    nanosleep (&pause, NULL);
  CHECK_EQ (atomic_load (&w->s->img->alloc->room_wanted), 1);
}

static void
test_discards_yield_to_room (void)
{
  const uint64_t C = FULL_FILE_CLUSTER;
  const struct new_image spec = full_file;
  struct qcow2_options opts = default_options;
  uint8_t *model = xcalloc (1, MiB);
  struct room_waiter w = { .C = C };
  struct session s;

  opts.discard = QCOW2_DISCARD_UNMAP;
  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_DISCARD, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (model);
    return;
  }
  fill_pattern (model, 40 * C, 13);
  CHECK_EQ (do_write (&s, model, 40 * C, 0, false), 0);
  CHECK_EQ (do_flush (&s), 0);
  for (uint64_t k = 0; k < 10; ++k) {
    CHECK_EQ (do_trim (&s, C, 2 * k * C, false), 0);
    memset (model + 2 * k * C, 0, C);
  }
  fill_pattern (model + 40 * C, 10 * C, 14);
  w.s = &s;
  w.data = model + 40 * C;
  s.mio.discard_hook = start_room_waiter;
  s.mio.discard_hook_arg = &w;
  atomic_store (&s.mio.discards, 0);
  CHECK_EQ (do_flush (&s), 0);
  CHECK (w.started);
  if (w.started)
    pthread_join (w.thread, NULL);
  s.mio.discard_hook = NULL;
  CHECK_EQ (w.result, 0);
  CHECK_EQ (atomic_load (&s.mio.discards), 1);
  CHECK (matches_model (&s, model, 0, MiB, "after the write that waited"));
  CHECK_EQ (do_flush (&s), 0);
  check_file (s.mio.data, s.mio.size, true, "after the write that waited");
  session_close (&s);
  free (model);
}

/* ------------------------------------------------------- grace period */

/* A reader held inside its pread of a data cluster (the lookup done, the
 * bytes not yet copied) while another thread zeroes that cluster and
 * then writes into a full file, which reuses the released host clusters.
 * The release must wait for the reader (base/inflight.h): the reader
 * gets the data it looked up, never what the reuse wrote there.  The
 * hook lets the reader go when the writer is done or after HOLD_SECONDS,
 * whichever comes first: with the grace period kept the writer waits for
 * the reader, so the reader always goes on by the timeout.
 */
#define HOLD_SECONDS 2

struct held_reader {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  bool armed, holding, writer_done;
  uint64_t C;
  struct session *s;
  uint8_t *got;
};

static void
hold_reader (struct mem_io *m, uint64_t offset, size_t count, void *arg)
{
  struct held_reader *h = arg;
  struct timespec until;

  (void) m;
  (void) offset;
  pthread_mutex_lock (&h->lock);
  if (h->armed && count == h->C) {
    h->armed = false;
    h->holding = true;
    pthread_cond_broadcast (&h->changed);
    clock_gettime (CLOCK_REALTIME, &until);
    until.tv_sec += HOLD_SECONDS;
    while (!h->writer_done &&
           pthread_cond_timedwait (&h->changed, &h->lock, &until) == 0)
      ;
  }
  pthread_mutex_unlock (&h->lock);
}

static void *
held_reader_thread (void *arg)
{
  struct held_reader *h = arg;

  CHECK_EQ (do_read (h->s, h->got, h->C, 5 * h->C), 0);
  return NULL;
}

static void
test_grace_period (void)
{
  const uint64_t C = FULL_FILE_CLUSTER;
  const struct new_image spec = full_file;
  struct qcow2_options opts = default_options;
  uint8_t *model = xcalloc (1, MiB), *before = xmalloc (C);
  struct held_reader h = { .C = C };
  struct session s;
  pthread_t reader;

  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_RECORD, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (model);
    free (before);
    return;
  }
  fill_pattern (model, 40 * C, 11);
  memcpy (before, model + 5 * C, C);
  CHECK_EQ (do_write (&s, model, 40 * C, 0, false), 0);
  CHECK_EQ (do_flush (&s), 0);

  pthread_mutex_init (&h.lock, NULL);
  pthread_cond_init (&h.changed, NULL);
  h.s = &s;
  h.got = xmalloc (C);
  h.armed = true;
  s.mio.pread_hook = hold_reader;
  s.mio.pread_hook_arg = &h;
  CHECK_EQ (pthread_create (&reader, NULL, held_reader_thread, &h), 0);
  pthread_mutex_lock (&h.lock);
  while (!h.holding)
    pthread_cond_wait (&h.changed, &h.lock);
  pthread_mutex_unlock (&h.lock);

  /* Guest clusters 0-9 released, 40-49 written: the file is full, so
   * they take the released host clusters, guest cluster 5's among them.
   */
  CHECK_EQ (do_zero (&s, 10 * C, 0, false, false), 0);
  memset (model, 0, 10 * C);
  fill_pattern (model + 40 * C, 10 * C, 12);
  CHECK_EQ (do_write (&s, model + 40 * C, 10 * C, 40 * C, false), 0);
  pthread_mutex_lock (&h.lock);
  h.writer_done = true;
  pthread_cond_broadcast (&h.changed);
  pthread_mutex_unlock (&h.lock);
  pthread_join (reader, NULL);
  s.mio.pread_hook = NULL;

  if (memcmp (h.got, before, C) != 0) {
    CHECK (!"the held reader got the bytes of a reused host cluster");
    fprintf (stderr, "  grace period: a read that looked up guest cluster 5 "
             "before it was zeroed got other data: its host cluster was "
             "reused while the read was in flight\n");
  }
  CHECK (matches_model (&s, model, 0, MiB, "after the reuse"));
  CHECK_EQ (do_flush (&s), 0);
  check_file (s.mio.data, s.mio.size, true, "after the reuse");
  session_close (&s);
  pthread_cond_destroy (&h.changed);
  pthread_mutex_destroy (&h.lock);
  free (h.got);
  free (model);
  free (before);
}

/* ---------------------------------------------------- the first change */

/* The writes the storage saw, all flushes aside. */
static size_t
writes_logged (const struct mem_io *m)
{
  return m->nops - flushes_between (m, 0, m->nops);
}

/* Nothing on disk changes until the first change (meta/first-change.h):
 * an image with autoclear bits (bit 0 without a bitmaps extension, which
 * is cleared as an unknown bit is), open for writing, read,
 * zeroed and trimmed where it reads as zeros already (in an L2 table that
 * is on disk, which is loaded for the change), flushed and closed, is
 * byte for byte as it was.  The first write that changes something
 * clears the bits and flushes before it writes anything else.  When the
 * bits cannot be cleared the write fails having written nothing, and the
 * next write clears them.
 */
static void
test_first_change (void)
{
  const uint64_t C = 4096;
  const struct new_image spec = {
    3, 12, 4, QCOW2_COMPRESSION_ZLIB, MiB, 4 * MiB, 0,
  };
  /* Persistent bitmaps (bit 0), and a bit no one knows. */
  const uint64_t autoclear = 1 | UINT64_C (1) << 40;
  struct qcow2_options opts = default_options;
  uint8_t buf[4096], back[4096], zero[8] = { 0 };
  struct session s;
  unsigned seen = 0;
  size_t start;

  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_RECORD, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  fill_pattern (buf, C, 8);
  CHECK_EQ (do_write (&s, buf, C, 0, false), 0);
  CHECK_EQ (do_flush (&s), 0);
  session_close_image (&s);
  put64 (s.mio.data + 88, autoclear);
  mem_io_log_reset (&s.mio);

  opts.writable = true;
  CHECK_EQ (session_open_io (&s, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  CHECK_EQ (do_read (&s, buf, C, 0), 0);
  CHECK_EQ (do_zero (&s, 2 * C, C, false, false), 0);
  CHECK_EQ (do_trim (&s, 2 * C, 3 * C, false), 0);
  CHECK_EQ (do_zero (&s, C, 512 * KiB, true, false), 0);
  CHECK_EQ (do_flush (&s), 0);
  session_close_image (&s);
  CHECK_EQ (writes_logged (&s.mio), 0);
  CHECK (memcmp (s.mio.data, s.mio.initial, s.mio.size) == 0);

  /* The bits cannot be cleared: nothing is written. */
  CHECK_EQ (session_open_io (&s, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  s.mio.write_fail_errno = EIO;
  s.mio.write_fail_from = 88;
  s.mio.write_fail_to = 96;
  CHECK_EQ (do_write (&s, buf, C, 8 * C, false), -EIO);
  CHECK (logged (&s, &seen));
  CHECK_EQ (writes_logged (&s.mio), 0);
  CHECK_EQ (get64 (s.mio.data + 88), autoclear);

  /* The next write clears them first, durably. */
  s.mio.write_fail_errno = 0;
  start = s.mio.nops;
  CHECK_EQ (do_write (&s, buf, C, 8 * C, false), 0);
  CHECK (s.mio.nops >= start + 3);
  if (s.mio.nops >= start + 3) {
    const struct mem_op *op = &s.mio.ops[start];
    CHECK (!op[0].flush);
    CHECK_EQ (op[0].offset, 88);
    CHECK_EQ (op[0].len, 8);
    CHECK (memcmp (op[0].data, zero, 8) == 0);
    CHECK (op[1].flush);
  }
  CHECK_EQ (get64 (s.mio.durable + 88), 0);
  CHECK_EQ (qcow2_image_header (s.img)->autoclear_features, 0);
  CHECK_EQ (do_flush (&s), 0);
  CHECK_EQ (do_read (&s, back, C, 8 * C), 0);
  CHECK (memcmp (back, buf, C) == 0);
  check_file (s.mio.data, s.mio.size, true, "after the first change");
  session_close (&s);
}

/* No storage call is made with the image lock held exclusively, which
 * would stop every reader and writer of the image for a device round
 * trip (tests/support/lock-watch.h):
 * - the first change (qcow2-lazy-refcounts: the dirty bit and its flush)
 *   is made before a writer takes the lock exclusively;
 * - an allocating commit that needs the lock exclusively from the start
 *   (a compressed write here) reads an L2 table that is not in memory
 *   with the lock shared first: an L2 cache of one table, two tables
 *   written in turn, a flush after each write so that the other table is
 *   let go from memory;
 * - the released clusters of trims are discarded with no lock held.
 */
static void
test_no_io_exclusive (void)
{
  const uint64_t C = 4096, table_span = C * (C / 8);
  const struct new_image spec = {
    3, 12, 4, QCOW2_COMPRESSION_ZLIB, 4 * table_span, 4 * MiB, 0,
  };
  struct qcow2_options opts = default_options;
  struct lock_watch w;
  uint8_t buf[4096];
  struct session s;

  opts.writable = true;
  opts.compress = true;
  opts.lazy_refcounts = true;
  opts.discard = QCOW2_DISCARD_UNMAP;
  opts.l2_cache_size = C;
  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_DISCARD, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  lock_watch_install (&w, &s.mio.io, &s.img->lock.l);
  /* The first change, then both tables made, on disk, and out of memory
   * but for one.
   */
  fill_pattern (buf, C, 1);
  CHECK_EQ (do_write (&s, buf, C, 0, false), 0);
  CHECK (get64 (s.mio.data + 72) & QCOW2_INCOMPAT_DIRTY);
  CHECK_EQ (do_write (&s, buf, C, table_span, false), 0);
  CHECK_EQ (do_flush (&s), 0);
  for (unsigned k = 0; k < 8; ++k) {
    fill_pattern (buf, C, 10 + k);
    CHECK_EQ (do_write (&s, buf, C, (k % 2) * table_span + (k / 2 + 1) * C,
                        false), 0);
    CHECK_EQ (do_flush (&s), 0);
  }
  /* Every packed host cluster freed, and discarded. */
  for (unsigned k = 0; k < 2; ++k) {
    CHECK_EQ (do_trim (&s, 5 * C, k * table_span, false), 0);
    CHECK_EQ (do_flush (&s), 0);
  }
  CHECK_EQ (do_flush (&s), 0);
  CHECK (atomic_load (&w.calls[WATCH_PREAD]) >= 8);
  CHECK (atomic_load (&w.calls[WATCH_PWRITE]) > 0);
  CHECK (atomic_load (&w.calls[WATCH_FLUSH]) > 0);
  CHECK (atomic_load (&w.calls[WATCH_DISCARD]) > 0);
  if (lock_watch_exclusive (&w))
    lock_watch_report (&w, "test_no_io_exclusive");
  CHECK_EQ (lock_watch_exclusive (&w), 0);
  lock_watch_remove (&w);
  /* A clean close: the refcounts written, the dirty bit cleared. */
  mem_io_engine_call = true;
  CHECK_EQ (qcow2_finish (s.img, &s.mio.io), 0);
  mem_io_engine_call = false;
  CHECK_EQ (get64 (s.mio.data + 72) & QCOW2_INCOMPAT_DIRTY, 0);
  check_file (s.mio.data, s.mio.size, true, "after the compressed writes");
  session_close (&s);
}

/* The releases of a trim read the refcount blocks they change, when not
 * in memory yet, before the writeback takes the image lock exclusively
 * to apply them: clusters past the first block's 8 MiB, written in one
 * session and trimmed in the next.
 */
static void
test_no_io_exclusive_release (void)
{
  const uint64_t C = 4096, len = 10 * MiB;
  const struct new_image spec = {
    3, 12, 4, QCOW2_COMPRESSION_ZLIB, 16 * MiB, 16 * MiB, 0,
  };
  struct qcow2_options opts = default_options;
  struct lock_watch w;
  uint8_t *buf = xmalloc (len);
  struct session s;

  opts.writable = true;
  opts.discard = QCOW2_DISCARD_UNMAP;
  CHECK_EQ (session_open_new (&s, &spec, MEM_IO_DISCARD, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (buf);
    return;
  }
  fill_pattern (buf, len, 5);
  CHECK_EQ (do_write (&s, buf, len, 0, false), 0);
  CHECK_EQ (do_flush (&s), 0);
  session_close_image (&s);
  CHECK_EQ (session_open_io (&s, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (buf);
    return;
  }
  lock_watch_install (&w, &s.mio.io, &s.img->lock.l);
  CHECK_EQ (do_trim (&s, 256 * C, len - 256 * C, false), 0);
  CHECK_EQ (do_flush (&s), 0);
  CHECK_EQ (do_flush (&s), 0);
  CHECK (atomic_load (&w.calls[WATCH_PREAD]) > 0);
  CHECK (atomic_load (&w.calls[WATCH_DISCARD]) > 0);
  if (lock_watch_exclusive (&w))
    lock_watch_report (&w, "test_no_io_exclusive_release");
  CHECK_EQ (lock_watch_exclusive (&w), 0);
  lock_watch_remove (&w);
  check_file (s.mio.data, s.mio.size, true, "after the trim");
  session_close (&s);
  free (buf);
}

/* A header write of the dirty bit (qcow2-lazy-refcounts' first change)
 * and the corrupt bit of another request's write, which checks no lock
 * (meta/corrupt.h), may go out together.  When the mark's bytes land
 * first, the dirty bit's bytes (made before the mark) would clear the
 * corrupt bit on disk: the engine sets it again, and the write fails.
 */
struct mark_during {
  struct session *s;
  bool marked;
};

static void
mark_during_header_write (struct mem_io *m, uint64_t offset, size_t count,
                          void *arg)
{
  struct mark_during *h = arg;

  /* The incompatible features: bytes 72 to 79 of the header. */
  if (h->marked || offset > 72 || offset + count < 80)
    return;
  h->marked = true;
  (void) qcow2_mark_corrupt (h->s->img, &m->io, "a write of this test "
                             "found metadata where it would land");
}

static void
test_corrupt_bit_kept (void)
{
  const struct new_image spec = {
    3, 16, 4, QCOW2_COMPRESSION_ZLIB, 4 * MiB, 4 * MiB, 0,
  };
  struct qcow2_options opts = default_options;
  struct mark_during h = { 0 };
  uint8_t buf[4096];
  struct session s;
  unsigned seen = 0;

  opts.writable = true;
  opts.lazy_refcounts = true;
  CHECK_EQ (session_open_new (&s, &spec, 0, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  h.s = &s;
  s.mio.pwrite_hook = mark_during_header_write;
  s.mio.pwrite_hook_arg = &h;
  fill_pattern (buf, sizeof buf, 3);
  CHECK_EQ (do_write (&s, buf, sizeof buf, 0, false), -EIO);
  CHECK (h.marked);
  CHECK (logged (&s, &seen));
  CHECK (get64 (s.mio.data + 72) & QCOW2_INCOMPAT_CORRUPT);
  CHECK (get64 (s.mio.data + 72) & QCOW2_INCOMPAT_DIRTY);
  /* ... and stays set: nothing is written any more. */
  CHECK_EQ (do_write (&s, buf, sizeof buf, 0, false), -EIO);
  CHECK (get64 (s.mio.data + 72) & QCOW2_INCOMPAT_CORRUPT);
  s.mio.pwrite_hook = NULL;
  session_close (&s);
}

/* qcow2-create's order, read from the log: every write of the new
 * image's tables reaches the storage, and then a flush, before the one
 * write of the header that gives them meaning, and that write is flushed
 * before qcow2_create returns.  A crash before the header's write leaves
 * storage whose first cluster is zeros (qcow2-create takes it again);
 * after it, a whole image.  (test-power-loss checks the same through
 * crash states of both forms; this is the engine's own log.)
 */
static void
test_create_order (void)
{
  for (int encrypt = 0; encrypt <= 1; ++encrypt) {
    struct qcow2_create_options c = {
      .virtual_size = 24 * MiB, .cluster_bits = 12,
      .compression_type = QCOW2_COMPRESSION_ZSTD,
      .encrypt = encrypt, .iter_time_ms = 10,
    };
    struct qcow2_options opts = default_options;
    size_t header = SIZE_MAX, tables = 0, last_table = 0, i;
    bool flushed_before = false, flushed_after = false;
    struct session s;
    int r;

    opts.writable = true;
    opts.passphrase = encrypt ? "create order" : NULL;
    memset (&s, 0, sizeof s);
    mem_io_init (&s.mio, NULL, 0, 32 * MiB, MEM_IO_WRITABLE | MEM_IO_RECORD);
    session_log_init (&s);
    mem_io_engine_call = true;
    r = qcow2_create (&s.mio.io, &s.qlog, &c, &opts, &s.img);
    mem_io_engine_call = false;
    CHECK_EQ (r, 0);
    for (i = 0; i < s.mio.nops; ++i) {
      const struct mem_op *op = &s.mio.ops[i];
      if (op->flush || op->discard)
        continue;
      if (op->offset == 0) {
        CHECK (header == SIZE_MAX);       /* the header is written once */
        header = i;
      }
      else {
        CHECK (header == SIZE_MAX);       /* nothing after the header */
        tables++;
        last_table = i;
      }
    }
    CHECK (header != SIZE_MAX);
    CHECK (tables > 0);
    for (i = last_table + 1; i < header && header != SIZE_MAX; ++i)
      flushed_before |= s.mio.ops[i].flush;
    for (i = header + 1; i < s.mio.nops && header != SIZE_MAX; ++i)
      flushed_after |= s.mio.ops[i].flush;
    CHECK (flushed_before);
    CHECK (flushed_after);
    if (!flushed_before || !flushed_after || header == SIZE_MAX)
      fprintf (stderr, "  (qcow2-create%s: %zu table writes, the last op "
               "%zu, the header op %zu of %zu)\n",
               encrypt ? ", encrypted" : "", tables, last_table, header,
               s.mio.nops);
    /* What it made opens, and is a qcow2 image to the checker. */
    check_file (s.mio.data, s.mio.size, true, "qcow2-create");
    session_close (&s);
  }
}

int
main (void)
{
  test_create_order ();
  test_order_all_steps ();
  test_order_usual ();
  test_order_discard ();
  test_discard_modes ();
  for (uint64_t seed = 1; seed <= unit_rounds (3); ++seed) {
    test_random_log (false, seed % 3 == 2, seed * 104729);
    test_random_log (true, seed % 3 != 2, seed * 1299709);
  }
  test_durability ();
  test_in_place ();
  test_concurrent (false, false);
  test_concurrent (true, false);
  test_concurrent (false, true);
  test_concurrent (true, true);
  test_first_change ();
  test_corrupt_bit_kept ();
  test_no_io_exclusive ();
  test_no_io_exclusive_release ();
  test_reclaim_plain ();
  test_reclaim_compressed ();
  test_discards_yield_to_room ();
  test_grace_period ();
  return unit_finish ();
}
