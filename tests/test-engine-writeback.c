/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: the order of the metadata writeback and what a
 * crash leaves (test-engine-writers: what writers wait for).
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
 * - qcow2-create writes and flushes the tables before the header, and
 *   flushes the header before it returns.
 * The log is read with tests/support/write-log.h.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qcow2.h"
#include "session.h"
#include "unit.h"
#include "util.h"
#include "write-image.h"
#include "write-log.h"

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
  log_sequence (&s->mio, kind, start, s->mio.nops, seq, sizeof seq);
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

  log_sequence (&s->mio, kind, start, s->mio.nops, seq, len);
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
  return unit_finish ();
}
