/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: the engine on LUKS-encrypted images in memory.
 *
 * Images made by qcow2_create with encryption, at several cluster sizes
 * and thread counts, against a model of the guest disk:
 * - random writes (partial sectors, partial clusters, runs), zeroes,
 *   trims and flushes read back as the model, also after the image is
 *   opened again (through the key cache, whose open must not unlock);
 * - after a flush the image passes the test's own check exactly (the
 *   LUKS area counted once, every refcount equal to its references);
 * - none of the model's data appears in the clear in the storage;
 * - two threads writing and reading halves of the disk through one
 *   connection at once, each half as its thread wrote it;
 * - two threads writing the halves of one sector: each half as its
 *   thread last wrote it, also with the first held between its read and
 *   its write of the sector;
 * - a wrong passphrase and none at all: -EPERM, a message that says so,
 *   and the storage not changed by the open.
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
#include "session.h"
#include "unit.h"
#include "util.h"
#include "write-image.h"

#define PASS "unit passphrase"

struct config {
  const char *name;
  uint32_t cluster_bits;
  uint64_t virtual_size;
  unsigned threads;
  unsigned ops;
};

static const struct config configs[] = {
  { "4 KiB clusters, no workers", 12, 3 * MiB - 512, 0, 300 },
  { "64 KiB clusters, 1 worker", 16, 6 * MiB, 1, 200 },
  { "512 B clusters, 3 workers", 9, MiB + 1536, 3, 300 },
};
#define NCONFIGS (sizeof configs / sizeof configs[0])

#define STORAGE (32 * MiB)

static struct qcow2_options
options (unsigned threads, struct qcow2_key_cache *cache, const char *pass)
{
  struct qcow2_options o = default_options;

  o.writable = true;
  o.threads = threads;
  o.request_size = 256 * KiB;       /* runs of several pool jobs */
  o.passphrase = pass;
  o.key_cache = cache;
  return o;
}

/* Make an encrypted image in S's (new) storage. */
static int
create (struct session *s, const struct config *cfg,
        const struct qcow2_options *opts)
{
  struct qcow2_create_options c = {
    .virtual_size = cfg->virtual_size, .cluster_bits = cfg->cluster_bits,
    .compression_type = QCOW2_COMPRESSION_ZSTD,
    .encrypt = true, .iter_time_ms = 10,
  };
  int r;

  memset (s, 0, sizeof *s);
  mem_io_init (&s->mio, NULL, 0, STORAGE, MEM_IO_WRITABLE);
  session_log_init (s);
  mem_io_engine_call = true;
  r = qcow2_create (&s->mio.io, &s->qlog, &c, opts, &s->img);
  if (r == 0 && (s->conn = qcow2_conn_new (s->img)) == NULL)
    r = -ENOMEM;
  mem_io_engine_call = false;
  return r;
}

/* Is any 64-byte piece of the model's nonzero data in STORAGE? */
static bool
plaintext_in (const uint8_t *storage, uint64_t size, const uint8_t *model,
              uint64_t vsize, uint64_t seed)
{
  unsigned looked = 0;

  for (unsigned tries = 0; tries < 4000 && looked < 32; ++tries) {
    uint64_t off = rng (&seed) % (vsize - 64);
    static const uint8_t zeros[64];
    if (memcmp (model + off, zeros, 64) == 0)
      continue;
    looked++;
    if (memmem (storage, size, model + off, 64))
      return true;
  }
  return looked == 0;
}

static void
test_config (const struct config *cfg, struct qcow2_key_cache *cache)
{
  struct qcow2_options opts = options (cfg->threads, cache, PASS);
  struct session s;
  uint64_t vsize = cfg->virtual_size;
  uint8_t *model = xcalloc (1, vsize), *before;
  unsigned long failures = atomic_load (&unit_failures);

  CHECK_EQ (create (&s, cfg, &opts), 0);
  if (s.conn == NULL) {
    fprintf (stderr, "  %s: %s\n", cfg->name, s.log.last);
    session_close (&s);
    free (model);
    return;
  }
  random_changes (&s, model, 0, vsize, UINT32_C (1) << cfg->cluster_bits,
                  cfg->cluster_bits * 77 + 1, cfg->ops, cfg->name);
  CHECK_EQ (do_flush (&s), 0);
  matches_model (&s, model, 0, vsize, cfg->name);
  check_file (s.mio.data, s.mio.size, true, cfg->name);
  CHECK (!plaintext_in (s.mio.data, s.mio.size, model, vsize, 5));

  /* Opened again, with the key from the cache. */
  session_close_image (&s);
  CHECK_EQ (session_open_io (&s, &opts), 0);
  if (s.conn)
    matches_model (&s, model, 0, vsize, "opened again");
  session_close_image (&s);

  /* A wrong passphrase and none: refused, the storage as it was. */
  before = xmalloc (s.mio.size);
  memcpy (before, s.mio.data, s.mio.size);
  opts = options (cfg->threads, NULL, "not the passphrase");
  CHECK_EQ (session_open_io (&s, &opts), -EPERM);
  CHECK (unit_says (s.log.last, "qcow2-passphrase: wrong passphrase"));
  session_close_image (&s);
  opts = options (cfg->threads, NULL, NULL);
  CHECK_EQ (session_open_io (&s, &opts), -EPERM);
  CHECK (unit_says (s.log.last, "give its passphrase"));
  session_close_image (&s);
  CHECK (memcmp (before, s.mio.data, s.mio.size) == 0);

  /* The right one, without the cache: unlocked again. */
  opts = options (cfg->threads, NULL, PASS);
  CHECK_EQ (session_open_io (&s, &opts), 0);
  if (s.conn)
    matches_model (&s, model, 0, vsize, "unlocked again");
  session_close (&s);
  free (before);
  free (model);
  UNIT_NOTE_IF_FAILED (failures, "%s", cfg->name);
}

/* ------------------------------------------------------------ threads */

struct half {
  struct session *s;
  uint8_t *model;
  uint64_t lo, hi;
  uint64_t seed;
};

static void *
half_main (void *arg)
{
  struct half *h = arg;

  random_changes (h->s, h->model, h->lo, h->hi, 4096, h->seed, 200,
                  "two threads");
  return NULL;
}

static void
test_two_threads (struct qcow2_key_cache *cache)
{
  const struct config cfg = { "two threads", 12, 4 * MiB, 1, 0 };
  struct qcow2_options opts = options (1, cache, PASS);
  struct session s;
  uint8_t *model = xcalloc (1, cfg.virtual_size);
  struct half h[2];
  pthread_t t[2];

  CHECK_EQ (create (&s, &cfg, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (model);
    return;
  }
  for (int i = 0; i < 2; ++i) {
    /* Halves that share an L2 table and meet inside a cluster. */
    h[i] = (struct half) { &s, model, i ? 2 * MiB + 1000 : 0,
                           i ? cfg.virtual_size : 2 * MiB + 1000, 100 + i };
    pthread_create (&t[i], NULL, half_main, &h[i]);
  }
  for (int i = 0; i < 2; ++i)
    pthread_join (t[i], NULL);
  CHECK_EQ (do_flush (&s), 0);
  matches_model (&s, model, 0, cfg.virtual_size, "two threads");
  check_file (s.mio.data, s.mio.size, true, "two threads");
  session_close (&s);
  free (model);
}

/* Two threads write the two halves of one 512-byte sector of an
 * allocated cluster, over and over: each write reads, decrypts and
 * encrypts again the whole sector.  Unless those writes are kept apart,
 * one puts back the other's old half.  After each round the sector must
 * hold each thread's last write; a lost update shows only when it hits
 * a round's last writes, hence many short rounds.
 */
#define SECTOR_ROUNDS 300
#define SECTOR_WRITES 8

struct sector_half {
  struct session *s;
  uint64_t offset;
  unsigned who, round;
};

static int
half_value (unsigned who, unsigned round, unsigned k)
{
  return (int) (who * 128 + (round * SECTOR_WRITES + k) % 127 + 1);
}

static void *
sector_half_main (void *arg)
{
  const struct sector_half *h = arg;
  uint8_t buf[256];

  for (unsigned k = 0; k < SECTOR_WRITES; ++k) {
    memset (buf, half_value (h->who, h->round, k), sizeof buf);
    CHECK_EQ (do_write (h->s, buf, sizeof buf, h->offset, false), 0);
  }
  return NULL;
}

static void
test_one_sector (struct qcow2_key_cache *cache)
{
  const struct config cfg = { "one sector", 16, 4 * MiB, 1, 0 };
  struct qcow2_options opts = options (2, cache, PASS);
  const uint64_t sector = MiB + 3 * 512;
  uint8_t *cluster = xcalloc (1, 65536), got[512], want[512];
  struct sector_half h[2];
  struct session s;
  pthread_t t[2];
  unsigned lost = 0;

  CHECK_EQ (create (&s, &cfg, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (cluster);
    return;
  }
  memset (cluster, 0x5a, 65536);
  CHECK_EQ (do_write (&s, cluster, 65536, MiB, false), 0);
  CHECK_EQ (do_flush (&s), 0);
  for (unsigned round = 0; round < SECTOR_ROUNDS; ++round) {
    for (unsigned i = 0; i < 2; ++i) {
      h[i] = (struct sector_half) { &s, sector + i * 256, i, round };
      pthread_create (&t[i], NULL, sector_half_main, &h[i]);
    }
    for (unsigned i = 0; i < 2; ++i)
      pthread_join (t[i], NULL);
    CHECK_EQ (do_read (&s, got, sizeof got, sector), 0);
    for (unsigned i = 0; i < 2; ++i)
      memset (want + i * 256, half_value (i, round, SECTOR_WRITES - 1), 256);
    if (memcmp (got, want, sizeof got) != 0) {
      if (lost++ == 0)
        fprintf (stderr, "one sector, round %u: the halves hold 0x%02x and "
                 "0x%02x, not each thread's last write 0x%02x and 0x%02x\n",
                 round, got[0], got[256], want[0], want[256]);
    }
  }
  CHECK_EQ (lost, 0);
  CHECK_EQ (do_flush (&s), 0);
  check_file (s.mio.data, s.mio.size, true, "one sector");
  session_close (&s);
  free (cluster);
}

/* The same race made certain: the first writer is held in the storage
 * write of its merged sector, after it read the sector, until the second
 * writer's write of the other half is done or HOLD_SECONDS pass.  With
 * the cluster claimed (paths/commit.h) the second waits for the first,
 * which goes on by the timeout; without, the first puts back the second
 * half as it read it.
 */
#define HOLD_SECONDS 2

struct held_writer {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  bool armed, holding, other_done;
  struct session *s;
  uint64_t offset;
};

static void
hold_writer (struct mem_io *m, uint64_t offset, size_t count, void *arg)
{
  struct held_writer *h = arg;
  struct timespec until;

  (void) m;
  (void) offset;
  pthread_mutex_lock (&h->lock);
  if (h->armed && count == 512) {
    h->armed = false;
    h->holding = true;
    pthread_cond_broadcast (&h->changed);
    clock_gettime (CLOCK_REALTIME, &until);
    until.tv_sec += HOLD_SECONDS;
    while (!h->other_done &&
           pthread_cond_timedwait (&h->changed, &h->lock, &until) == 0)
      ;
  }
  pthread_mutex_unlock (&h->lock);
}

static void *
held_writer_main (void *arg)
{
  struct held_writer *h = arg;
  uint8_t buf[256];

  memset (buf, 0x11, sizeof buf);
  CHECK_EQ (do_write (h->s, buf, sizeof buf, h->offset, false), 0);
  return NULL;
}

static void
test_held_sector (struct qcow2_key_cache *cache)
{
  const struct config cfg = { "held sector", 16, 4 * MiB, 2, 0 };
  struct qcow2_options opts = options (2, cache, PASS);
  struct held_writer h = {
    .lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER,
    .offset = MiB + 5 * 512,
  };
  uint8_t *cluster = xcalloc (1, 65536), got[512], half[256];
  struct session s;
  pthread_t first;

  CHECK_EQ (create (&s, &cfg, &opts), 0);
  if (s.conn == NULL) {
    session_close (&s);
    free (cluster);
    return;
  }
  memset (cluster, 0x5a, 65536);
  CHECK_EQ (do_write (&s, cluster, 65536, MiB, false), 0);
  CHECK_EQ (do_flush (&s), 0);

  h.s = &s;
  h.armed = true;
  s.mio.pwrite_hook = hold_writer;
  s.mio.pwrite_hook_arg = &h;
  CHECK_EQ (pthread_create (&first, NULL, held_writer_main, &h), 0);
  pthread_mutex_lock (&h.lock);
  while (!h.holding)
    pthread_cond_wait (&h.changed, &h.lock);
  pthread_mutex_unlock (&h.lock);
  memset (half, 0x22, sizeof half);
  CHECK_EQ (do_write (&s, half, sizeof half, h.offset + 256, false), 0);
  pthread_mutex_lock (&h.lock);
  h.other_done = true;
  pthread_cond_broadcast (&h.changed);
  pthread_mutex_unlock (&h.lock);
  pthread_join (first, NULL);
  s.mio.pwrite_hook = NULL;

  CHECK_EQ (do_read (&s, got, sizeof got, h.offset), 0);
  if (got[0] != 0x11 || got[256] != 0x22) {
    CHECK (!"a write into one sector lost the other's half");
    fprintf (stderr, "held sector: the halves hold 0x%02x and 0x%02x, not "
             "0x11 and 0x22: the held writer wrote back the second half as "
             "it read it\n", got[0], got[256]);
  }
  CHECK_EQ (do_flush (&s), 0);
  check_file (s.mio.data, s.mio.size, true, "held sector");
  session_close (&s);
  free (cluster);
}

int
main (void)
{
  struct qcow2_key_cache *cache = qcow2_key_cache_new ();

  CHECK (cache != NULL);
  for (size_t i = 0; i < NCONFIGS; ++i)
    test_config (&configs[i], cache);
  test_two_threads (cache);
  test_one_sector (cache);
  test_held_sector (cache);
  qcow2_key_cache_free (cache);
  return unit_finish ();
}
