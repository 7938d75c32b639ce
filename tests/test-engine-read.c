/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: reading the images of tests/support/read-image.c
 * through the engine, under every combination of threads, request size
 * and cache sizes, from several threads at once, and through the cluster
 * cache after a prefetch.
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
#include "read-image.h"
#include "session.h"
#include "unit.h"
#include "util.h"

struct options_case {
  struct qcow2_options opts;
  bool tiny_caches;             /* l2 2 slots, clusters 3 slots */
};

#define OPTIONS(t, r, l2, cc)                                           \
  { .threads = (t), .request_size = (r),                                \
    .l2_cache_size = (l2), .cluster_cache_size = (cc) }

static const struct options_case option_cases[] = {
  { OPTIONS (0, 4 * KiB, 0, 0), false },
  { OPTIONS (0, 4 * MiB, 0, 0), false },
  { OPTIONS (3, 4 * KiB, 0, 0), false },
  { OPTIONS (3, 4 * MiB, 0, 0), false },
  { OPTIONS (0, 4 * KiB, 8 * MiB, 8 * MiB), false },
  { OPTIONS (0, 4 * MiB, 8 * MiB, 8 * MiB), false },
  { OPTIONS (3, 4 * KiB, 8 * MiB, 8 * MiB), false },
  { OPTIONS (3, 4 * MiB, 8 * MiB, 8 * MiB), false },
  { OPTIONS (3, 64 * KiB, 0, 0), true },
};
#define NOPTIONS (sizeof option_cases / sizeof option_cases[0])

static struct qcow2_options
options_for (const struct options_case *oc, const struct image *img)
{
  struct qcow2_options o = oc->opts;

  if (oc->tiny_caches) {
    o.l2_cache_size = 2 * img->cluster_size;
    o.cluster_cache_size = 3 * img->cluster_size;
  }
  return o;
}

/* Every pair, under every option combination. */
static void
test_reads (const struct image *img)
{
  struct pairs ps = make_pairs (img);
  const bool huge = img->cluster_size >= 2 * MiB;

  for (size_t o = 0; o < NOPTIONS; ++o) {
    struct qcow2_options opts = options_for (&option_cases[o], img);
    struct session s;
    unsigned mismatches = 0;
    char ctx[200];

    /* The 2 MiB image: one combination with and one without threads. */
    if (huge && o != 1 && o != 7)
      continue;
    snprintf (ctx, sizeof ctx, "%s, threads %u, request %" PRIu64
              ", l2 cache %" PRIu64 ", cluster cache %" PRIu64,
              img->spec->name, opts.threads, opts.request_size,
              opts.l2_cache_size, opts.cluster_cache_size);
    CHECK_EQ (session_open (&s, img->file, img->file_size, &opts), 0);
    if (s.conn == NULL) {
      fprintf (stderr, "  %s: open failed: %s\n", ctx, s.log.last);
      session_close (&s);
      continue;
    }
    /* Opening reads the first cluster and the L1 table in one go each;
     * after that no read underneath may exceed request_size, except to
     * fetch one cluster or one compressed range (at most 2 clusters).
     */
    atomic_store (&s.mio.largest, 0);
    for (size_t i = 0; i < ps.n && mismatches < 5; ++i)
      if (!read_and_compare (&s, img, ps.p[i].offset, ps.p[i].len, ctx))
        mismatches++;
    CHECK_EQ (s.log.errors, 0);
    {
      uint64_t limit = opts.request_size > 2 * img->cluster_size
        ? opts.request_size : 2 * img->cluster_size;
      CHECK (atomic_load (&s.mio.largest) <= limit);
      /* And coalescing happens: some read underneath is bigger than a
       * cluster when the limit allows it.
       */
      if (opts.request_size >= 4 * img->cluster_size)
        CHECK (atomic_load (&s.mio.largest) > img->cluster_size);
    }
    session_close (&s);
  }
  free (ps.p);
}

/* What the header says, and the trivial reads. */
static void
test_basics (const struct image *img)
{
  struct session s;
  const struct qcow2_header *h;
  uint8_t byte;
  unsigned errors;

  CHECK_EQ (session_open (&s, img->file, img->file_size, &default_options),
            0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  h = qcow2_image_header (s.img);
  CHECK_EQ (h->version, img->spec->version);
  CHECK_EQ (h->cluster_bits, img->spec->cluster_bits);
  CHECK_EQ (h->virtual_size, img->virtual_size);
  CHECK_EQ (h->compression_type, img->spec->compression);
  CHECK_EQ (h->l1_size, img->l1_size);
  CHECK_EQ (h->file_size, img->file_size);

  /* Nothing to read; past the end; an overflowing range. */
  CHECK_EQ (do_read (&s, &byte, 0, 0), 0);
  CHECK_EQ (do_read (&s, &byte, 0, img->virtual_size), 0);
  errors = s.log.errors;
  CHECK_EQ (do_read (&s, &byte, 1, img->virtual_size), -EINVAL);
  CHECK_EQ (s.log.errors, errors + 1);
  {
    uint8_t two[2];
    CHECK_EQ (do_read (&s, two, 2, img->virtual_size - 1), -EINVAL);
    CHECK_EQ (do_read (&s, two, 2, UINT64_MAX), -EINVAL);
    CHECK_EQ (do_prefetch (&s, UINT64_MAX - 1, 2), -EINVAL);
  }
  CHECK_EQ (s.log.errors, errors + 4);
  CHECK (read_and_compare (&s, img, img->virtual_size - 1, 1, "last byte"));
  session_close (&s);
}

static void
stats (struct session *s, struct qcow2_stats *st)
{
  qcow2_image_get_stats (s->img, st);
}

static void
test_prefetch (const struct image *img, unsigned threads)
{
  const uint64_t C = img->cluster_size;
  const struct range *pr = &img->spec->populated[0];
  struct qcow2_options opts = default_options;
  struct qcow2_stats s0, s1, s2, s3;
  struct session s;
  uint64_t ncompressed = 0, unique = 0, k, pair;
  uint64_t range_len = (pr->end - pr->first) * C;

  if (range_len > img->virtual_size - pr->first * C)
    range_len = img->virtual_size - pr->first * C;

  opts.threads = threads;
  /* Room for every compressed cluster of the range in its shard: 64 MiB
   * is at least 64 slots per shard; 2 MiB clusters get one shard of 15.
   */
  opts.cluster_cache_size = C >= MiB ? 15 * C : 64 * MiB;
  for (k = pr->first; k < pr->end; ++k)
    if (img->kind[k] == COMPRESSED) {
      bool seen = false;
      ncompressed++;
      for (uint64_t j = pr->first; j < k; ++j)
        seen |= img->entry[j] == img->entry[k];
      unique += !seen;
    }
  k = find_cluster (img, pr->first, COMPRESSED, -1);
  pair = find_cluster (img, pr->first, COMPRESSED, COMPRESSED);
  CHECK (ncompressed > 0 && k < pr->end && pair < pr->end);
  if (ncompressed == 0 || k >= pr->end || pair >= pr->end)
    return;

  CHECK_EQ (session_open (&s, img->file, img->file_size, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  stats (&s, &s0);
  CHECK_EQ (s0.clusters_decompressed, 0);
  CHECK_EQ (do_prefetch (&s, pr->first * C, range_len), 0);
  stats (&s, &s1);
  /* Shared clusters may be decoded once or twice, depending on timing. */
  CHECK (s1.clusters_decompressed >= unique);
  CHECK (s1.clusters_decompressed <= ncompressed);
  CHECK (s1.bytes_read_underneath > s0.bytes_read_underneath);
  CHECK (s1.reads_underneath > s0.reads_underneath);

  /* A partial read of a prefetched cluster is served from the cache. */
  CHECK (read_and_compare (&s, img, k * C + 100, 50, "after prefetch"));
  stats (&s, &s2);
  CHECK_EQ (s2.cluster_cache_hits, s1.cluster_cache_hits + 1);
  CHECK_EQ (s2.clusters_decompressed, s1.clusters_decompressed);
  /* Two partial clusters in one read: two hits. */
  CHECK (read_and_compare (&s, img, pair * C + C - 10, 20, "pair"));
  stats (&s, &s3);
  CHECK_EQ (s3.cluster_cache_hits, s2.cluster_cache_hits + 2);
  CHECK_EQ (s3.clusters_decompressed, s1.clusters_decompressed);

  /* Prefetching again decodes nothing. */
  CHECK_EQ (do_prefetch (&s, pr->first * C, range_len), 0);
  stats (&s, &s2);
  CHECK_EQ (s2.clusters_decompressed, s1.clusters_decompressed);
  CHECK_EQ (s2.cluster_cache_hits, s3.cluster_cache_hits + ncompressed);

  /* The L2 cache: the second lookup of a table is a hit. */
  CHECK (s2.l2_cache_misses > 0);
  CHECK (s2.l2_cache_hits > 0);
  CHECK_EQ (s.log.errors, 0);
  session_close (&s);

  /* Without a cluster cache every partial read decodes; nothing hits. */
  opts.cluster_cache_size = 0;
  opts.l2_cache_size = 0;
  CHECK_EQ (session_open (&s, img->file, img->file_size, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  CHECK_EQ (do_prefetch (&s, pr->first * C, range_len), 0);
  stats (&s, &s1);
  CHECK (read_and_compare (&s, img, k * C + 100, 50, "no cache"));
  CHECK (read_and_compare (&s, img, k * C + 200, 50, "no cache"));
  stats (&s, &s2);
  CHECK_EQ (s2.clusters_decompressed, s1.clusters_decompressed + 2);
  CHECK_EQ (s2.cluster_cache_hits, 0);
  CHECK_EQ (s2.l2_cache_hits, 0);
  session_close (&s);
}

/* ------------------------------------------------------ concurrency */

struct reader_thread {
  struct session *s;
  struct qcow2_conn *conn;
  const struct image *img;
  uint64_t seed;
  unsigned reads;
};

static void *
reader_thread_main (void *arg)
{
  struct reader_thread *rt = arg;
  const struct image *img = rt->img;
  const uint64_t C = img->cluster_size;
  uint8_t *got = xmalloc (6 * C), *want = xmalloc (6 * C);

  mem_io_engine_call = true;
  for (unsigned i = 0; i < rt->reads; ++i) {
    const struct range *pr = &img->spec->populated[i & 1];
    uint64_t span, offset;

    if (pr->end == pr->first)
      pr = &img->spec->populated[0];
    span = (pr->end - pr->first) * C;
    offset = pr->first * C + rng (&rt->seed) % span;
    if (offset >= img->virtual_size)
      offset = img->virtual_size - 1;
    uint64_t len = 1 + rng (&rt->seed) % (5 * C);
    int r;

    if (len > img->virtual_size - offset)
      len = img->virtual_size - offset;
    r = qcow2_read (rt->conn, &rt->s->mio.io, got, len, offset);
    CHECK_EQ (r, 0);
    expected_bytes (img, want, offset, len);
    if (r != 0 || memcmp (got, want, len) != 0) {
      CHECK (!"concurrent read returned wrong bytes");
      fprintf (stderr, "  (%s: %" PRIu64 " bytes at %" PRIu64 ")\n",
               img->spec->name, len, offset);
      break;
    }
    if (i % 16 == 0)
      qcow2_prefetch (rt->conn, &rt->s->mio.io, offset, len);
  }
  mem_io_engine_call = false;
  free (got);
  free (want);
  return NULL;
}

/* Several threads read through one connection at once (the contract allows
 * it), and a second connection shares the image with the first; small caches
 * keep them evicting each other's entries.
 */
static void
test_concurrency (const struct image *img)
{
  enum { NTHREADS = 4 };
  struct qcow2_options opts = default_options;
  struct reader_thread rt[NTHREADS];
  pthread_t threads[NTHREADS];
  struct qcow2_conn *second;
  struct session s;
  int started = 0;

  opts.cluster_cache_size = 5 * img->cluster_size;
  opts.l2_cache_size = 2 * img->cluster_size;
  CHECK_EQ (session_open (&s, img->file, img->file_size, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  second = qcow2_conn_new (s.img);
  CHECK (second != NULL);
  for (int t = 0; t < NTHREADS; ++t) {
    rt[t] = (struct reader_thread) {
      .s = &s, .conn = t % 2 && second ? second : s.conn, .img = img,
      .seed = UINT64_C (0xabcdef) * (t + 1),
      .reads = img->cluster_size >= 2 * MiB ? 10 : 300,
    };
    if (pthread_create (&threads[t], NULL, reader_thread_main, &rt[t]) != 0)
      break;
    started++;
  }
  CHECK_EQ (started, NTHREADS);
  for (int t = 0; t < started; ++t)
    pthread_join (threads[t], NULL);
  CHECK_EQ (s.log.errors, 0);
  qcow2_conn_free (second);
  session_close (&s);
}

/* The image builder must have made what the tests rely on. */
static void
check_builder (const struct image *img)
{
  const uint64_t C = img->cluster_size;
  unsigned counts[5] = { 0 };
  uint64_t last_end = 0, last_k = UINT64_MAX;
  bool shared_host_cluster = false;

  for (uint64_t k = 0; k < img->nclusters; ++k)
    counts[img->kind[k]]++;
  CHECK (counts[NORMAL] > 0);
  CHECK (counts[COMPRESSED] > 1);
  CHECK (counts[UNALLOC] > 0);
  if (img->spec->version == 3) {
    CHECK (counts[ZERO] > 0);
    CHECK (counts[ZERO_ALLOC] > 0);
  }
  /* The last stream's sector range runs past the end of the file, and
   * two streams start in one host cluster.
   */
  for (uint64_t k = 0; k < img->nclusters; ++k)
    if (img->kind[k] == COMPRESSED) {
      uint64_t off = img->entry[k] & ((UINT64_C (1) << (62 - (img->spec->cluster_bits - 8))) - 1);
      if (off + img->csize[k] > last_end) {
        last_end = off + img->csize[k];
        last_k = k;
      }
      for (uint64_t j = 0; j < k; ++j)
        if (img->kind[j] == COMPRESSED && img->entry[j] != img->entry[k] &&
            ((img->entry[j] & ((UINT64_C (1) << (62 - (img->spec->cluster_bits - 8))) - 1)) / C) == off / C)
          shared_host_cluster = true;
    }
  CHECK (last_k != UINT64_MAX);
  if (last_k != UINT64_MAX) {
    uint64_t off = last_end - img->csize[last_k];
    uint64_t range = ((off & 511) + img->csize[last_k] + 511) / 512 * 512
      - (off & 511);
    CHECK_EQ (last_end, img->file_size);
    CHECK (off + range > img->file_size);
  }
  if (C <= 64 * KiB)
    CHECK (shared_host_cluster);
}

/* Write a 16 MiB disk of clusters half random, half zeros (compressed
 * to about half a cluster each) into a new zstd image, and open it again
 * read-only with requests of 1 MiB and THREADS, as S.  Fills DATA.
 * False, after closing S, where the session could not be made.
 */
static bool
open_fetch_image (struct session *s, uint8_t *data, uint64_t len,
                  unsigned threads)
{
  const uint64_t C = 64 * KiB;
  const struct new_image spec = {
    3, 16, 4, QCOW2_COMPRESSION_ZSTD, 32 * MiB, 32 * MiB, 0,
  };
  struct qcow2_options opts = default_options;

  opts.writable = true;
  opts.compress = true;
  CHECK_EQ (session_open_new (s, &spec, 0, &opts), 0);
  if (s->conn == NULL) {
    session_close (s);
    return false;
  }
  for (uint64_t k = 0, state = 21; k < len / 8; ++k) {
    uint64_t v = rng (&state);
    memcpy (data + 8 * k, &v, 8);
  }
  for (uint64_t k = 0; k < len / C; ++k)
    memset (data + k * C + C / 2, 0, C / 2);
  CHECK_EQ (do_write (s, data, len, 0, false), 0);
  CHECK_EQ (do_flush (s), 0);
  session_close_image (s);
  opts.writable = false;
  opts.compress = false;
  opts.request_size = 1 * MiB;
  opts.threads = threads;
  CHECK_EQ (session_open_io (s, &opts), 0);
  if (s->conn == NULL) {
    session_close (s);
    return false;
  }
  return true;
}

/* 256 reads of one cluster at random: each the storage's own read. */
static void
read_at_random (struct session *s, const uint8_t *data, uint64_t len)
{
  const uint64_t C = 64 * KiB;
  uint8_t *back = xmalloc (C);

  for (unsigned k = 0; k < 256; ++k) {
    uint64_t off = ((k * 2654435761u) % (len / C)) * C;
    CHECK_EQ (do_read (s, back, C, off), 0);
    CHECK (memcmp (back, data + off, C) == 0);
  }
  free (back);
}

/* The bytes ahead of a sequential reader, fetched by the reads. */
static void
test_fetch_ahead (void)
{
  const uint64_t len = 16 * MiB, piece = 64 * KiB;
  uint8_t *data = xmalloc (len), *back = xmalloc (len);
  unsigned long reads;
  struct session s;

  if (!open_fetch_image (&s, data, len, default_options.threads))
    goto out;

  /* 256 reads of one cluster in order: about 8 MiB of compressed data,
   * fetched 1 MiB at a time.
   */
  atomic_store (&s.mio.preads, 0);
  for (uint64_t off = 0; off < len; off += piece)
    CHECK_EQ (do_read (&s, back + off, piece, off), 0);
  CHECK (memcmp (back, data, len) == 0);
  reads = atomic_load (&s.mio.preads);
  CHECK (reads < len / piece / 8);
  CHECK (atomic_load (&s.mio.largest) >= 1 * MiB);

  /* Random single clusters: each read on its own, none ahead. */
  atomic_store (&s.mio.largest, 0);
  atomic_store (&s.mio.preads, 0);
  read_at_random (&s, data, len);
  CHECK (atomic_load (&s.mio.largest) < 1 * MiB);
  session_close (&s);
 out:
  free (data);
  free (back);
}

/* What the engine's background thread reads (base/io.h: struct
 * qcow2_background_io): the session's storage, watched.
 */
struct background_watch {
  struct mem_io *mio;
  pthread_t caller;             /* the test's thread, which calls the engine */
  atomic_uint opens, opens_elsewhere, preads, preads_on_caller;
  int fail_errno;               /* every read fails with it, if set */
  /* The gate (read_in_order): the thread's first read says it has begun
   * (GATE_REACHED) and waits, for at most a minute, until the test lets
   * it go (GATE_OPEN); the test, which knows a fetch is coming once the
   * storage was opened, waits for it to begin, makes two more reads of
   * the disk meanwhile (OVERLAPPED), and lets it go.
   */
  bool gate;
  atomic_bool gate_reached, gate_open, gate_timed_out;
  bool overlapped;
};

static int
background_open (void *opaque)
{
  struct background_watch *w = opaque;

  atomic_fetch_add (&w->opens, 1);
  if (!pthread_equal (pthread_self (), w->caller))
    atomic_fetch_add (&w->opens_elsewhere, 1);
  return 0;
}

static int
background_pread (void *opaque, void *buf, size_t count, uint64_t offset)
{
  struct background_watch *w = opaque;

  atomic_fetch_add (&w->preads, 1);
  if (pthread_equal (pthread_self (), w->caller))
    atomic_fetch_add (&w->preads_on_caller, 1);
  if (w->fail_errno)
    return -w->fail_errno;
  if (w->gate && !atomic_exchange (&w->gate_reached, true)) {
    unsigned ms;
    for (ms = 0; ms < 60000 && !atomic_load (&w->gate_open); ++ms)
      nanosleep (&(struct timespec) { .tv_nsec = 1000000 }, NULL);
    atomic_store (&w->gate_timed_out, !atomic_load (&w->gate_open));
  }
  if (offset > w->mio->size || count > w->mio->size - offset)
    return -EIO;
  pthread_mutex_lock (&w->mio->lock);
  memcpy (buf, w->mio->data + offset, count);
  pthread_mutex_unlock (&w->mio->lock);
  return 0;
}

/* Read the whole disk in order, one cluster at a time, with the bytes
 * ahead fetched through W.  With W's gate: the read that opened W has
 * queued the first fetch, on the middle of the stretch it read from;
 * once the thread has begun it, two more reads (of the same stretch)
 * are made while it is held.  A fetch made by the reads themselves
 * would never begin while the test waits between reads.
 */
static void
read_in_order (struct session *s, struct background_watch *w,
               const uint8_t *data, uint64_t len)
{
  const uint64_t piece = 64 * KiB;
  uint8_t *back = xmalloc (len);
  bool gated = false;

  for (uint64_t off = 0; off < len; off += piece) {
    CHECK_EQ (do_read (s, back + off, piece, off), 0);
    if (w->gate && !gated && atomic_load (&w->opens) > 0) {
      unsigned ms, k;

      gated = true;
      for (ms = 0; ms < 60000 && !atomic_load (&w->gate_reached); ++ms)
        nanosleep (&(struct timespec) { .tv_nsec = 1000000 }, NULL);
      if (atomic_load (&w->gate_reached)) {
        for (k = 0; k < 2 && off + piece < len; ++k) {
          off += piece;
          CHECK_EQ (do_read (s, back + off, piece, off), 0);
        }
        w->overlapped = k == 2;
      }
      atomic_store (&w->gate_open, true);
    }
  }
  CHECK (memcmp (back, data, len) == 0);
  free (back);
}

/* The bytes ahead of a sequential reader, fetched by a thread of the
 * engine's while the reads go on; random readers start nothing.  One
 * thread, so no readahead: each read of the test reads its one cluster
 * and no more, and the two reads made while the fetch is held lie in
 * the stretch held (the fetch is queued on the middle of a stretch of
 * some 32 compressed clusters).  With readahead, a read could reach into
 * the stretch on its way and wait for it.
 */
static void
test_fetch_in_background (void)
{
  const uint64_t len = 16 * MiB;
  uint8_t *data = xmalloc (len);
  struct background_watch w = { .caller = pthread_self (), .gate = true };
  struct qcow2_background_io bg = {
    .opaque = &w, .open = background_open, .pread = background_pread,
  };
  struct qcow2_stats stats;
  unsigned long own_reads;
  struct session s;

  if (!open_fetch_image (&s, data, len, 1))
    goto out;
  w.mio = &s.mio;
  qcow2_conn_fetch_in_background (s.conn, &bg);

  /* Random readers: nothing opened, nothing read in the background. */
  read_at_random (&s, data, len);
  CHECK_EQ (atomic_load (&w.opens), 0);
  CHECK_EQ (atomic_load (&w.preads), 0);

  /* In order: the reads fetch the first stretch, the thread the rest
   * (about 8 MiB compressed, in fetches of 1 MiB), each while the reads
   * decode the stretch before it.
   */
  atomic_store (&s.mio.preads, 0);
  read_in_order (&s, &w, data, len);
  own_reads = atomic_load (&s.mio.preads);
  CHECK_EQ (atomic_load (&w.opens), 1);
  CHECK_EQ (atomic_load (&w.opens_elsewhere), 0);
  CHECK (atomic_load (&w.preads) >= 5);
  CHECK_EQ (atomic_load (&w.preads_on_caller), 0);
  CHECK (w.overlapped);
  CHECK (!atomic_load (&w.gate_timed_out));
  CHECK (own_reads <= 6);
  qcow2_image_get_stats (s.img, &stats);
  CHECK_EQ (stats.fetches_in_background, atomic_load (&w.preads));
  printf ("fetched in the background: %u reads of the thread's, %lu of "
          "the reads' own\n", atomic_load (&w.preads), own_reads);
  session_close (&s);

  /* A thread whose reads fail: its first failure stops it, and the
   * reads fetch for themselves.
   */
  memset (&w, 0, sizeof w);
  w.caller = pthread_self ();
  w.fail_errno = EIO;
  if (!open_fetch_image (&s, data, len, 1))
    goto out;
  w.mio = &s.mio;
  qcow2_conn_fetch_in_background (s.conn, &bg);
  read_in_order (&s, &w, data, len);
  CHECK_EQ (atomic_load (&w.preads), 1);
  session_close (&s);
 out:
  free (data);
}

/* The image's cluster cache admits by frequency: 4 KiB read from each of
 * 20 compressed clusters in turn, four times, through a cache of 15: the
 * first 15 stay and hit in every later round, the other 5 are refused.
 * A cache that stored every miss would hit nothing (each cluster evicted
 * just before its turn).
 */
static void
test_cache_admission (void)
{
  const uint64_t len = 16 * MiB, C = 64 * KiB, piece = 4 * KiB;
  enum { CLUSTERS = 20, ROUNDS = 4, SLOTS = 15 };
  uint8_t *data = xmalloc (len), back[4 * KiB];
  struct qcow2_options opts = default_options;
  struct qcow2_stats stats;
  struct session s;

  if (!open_fetch_image (&s, data, len, 1))
    goto out;
  session_close_image (&s);
  opts.cluster_cache_size = SLOTS * C;
  opts.threads = 1;
  CHECK_EQ (session_open_io (&s, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    goto out;
  }
  /* Offsets that never continue the read before: no readahead. */
  for (int round = 0; round < ROUNDS; ++round)
    for (uint64_t k = 0; k < CLUSTERS; ++k) {
      uint64_t off = k * C + 1024;

      CHECK_EQ (do_read (&s, back, piece, off), 0);
      CHECK (memcmp (back, data + off, piece) == 0);
    }
  qcow2_image_get_stats (s.img, &stats);
  CHECK (stats.cluster_cache_hits >= (ROUNDS - 1) * SLOTS);
  CHECK (stats.cluster_cache_refused >= (ROUNDS - 1) * (CLUSTERS - SLOTS));
  printf ("cluster cache admission: %" PRIu64 " hits, %" PRIu64
          " not admitted\n", stats.cluster_cache_hits,
          stats.cluster_cache_refused);
  session_close (&s);
 out:
  free (data);
}

int
main (void)
{
  /* Quick: every third image. */
  size_t step = unit_rounds (3) == 1 ? 3 : 1;

  for (size_t i = 0; i < read_image_nspecs; i += step) {
    struct image *img = image_new (&read_image_specs[i]);
    unsigned long before = atomic_load (&unit_failures);

    check_builder (img);
    test_basics (img);
    test_reads (img);
    test_prefetch (img, 0);
    test_prefetch (img, 3);
    test_concurrency (img);
    UNIT_NOTE_IF_FAILED (before, "image %s", read_image_specs[i].name);
    image_free (img);
  }
  test_fetch_ahead ();
  test_fetch_in_background ();
  test_cache_admission ();
  return unit_finish ();
}
