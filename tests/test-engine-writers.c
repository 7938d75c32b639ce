/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: what writers wait for, and what they must not
 * hold while they wait (test-engine-writeback: the writeback's order).
 *
 * - in a full file, a write that needs room writes the metadata back to
 *   reuse the clusters released meanwhile, and a writeback that
 *   discards them stops discarding once a writer waits;
 * - a host cluster released while a read that looked it up is in flight
 *   is not reused until that read is done;
 * - nothing is written before the first change, which clears the
 *   autoclear bits and flushes before it writes anything else, and a
 *   corrupt bit set meanwhile is kept;
 * - no storage call is made with the image lock held exclusively: L2
 *   tables and refcount blocks not in memory are read with it shared,
 *   and released clusters are discarded with no lock held.
 * The storage's log is read with tests/support/write-log.h.
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

#include "qcow2.h"
#include "meta/alloc-internal.h"
#include "meta/corrupt.h"
#include "lock-watch.h"
#include "session.h"
#include "unit.h"
#include "util.h"
#include "write-image.h"
#include "write-log.h"

/* ---------------------------------------------------------- reclaim */

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

int
main (void)
{
  test_reclaim_plain ();
  test_reclaim_compressed ();
  test_discards_yield_to_room ();
  test_grace_period ();
  test_first_change ();
  test_corrupt_bit_kept ();
  test_no_io_exclusive ();
  test_no_io_exclusive_release ();
  return unit_finish ();
}
