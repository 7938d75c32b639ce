/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: an image open in the engine. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"
#include "unit.h"
#include "util.h"

const struct qcow2_options default_options = {
  .threads = 3, .request_size = 4 * MiB,
  .l2_cache_size = 8 * MiB, .cluster_cache_size = 8 * MiB,
};

static void
log_error (void *opaque, const char *msg)
{
  struct log_capture *lc = opaque;
  size_t len = strlen (msg);

  pthread_mutex_lock (&lc->lock);
  lc->errors++;
  if (len == 0 || msg[len - 1] == '\n')
    lc->malformed++;
  snprintf (lc->last, sizeof lc->last, "%s", msg);
  pthread_mutex_unlock (&lc->lock);
}

static void
log_debug (void *opaque, const char *msg)
{
  (void) opaque;
  (void) msg;
}

void
session_log_init (struct session *s)
{
  pthread_mutex_init (&s->log.lock, NULL);
  s->log.errors = s->log.malformed = 0;
  s->log.last[0] = '\0';
  s->qlog = (struct qcow2_log) {
    .opaque = &s->log, .error = log_error, .debug = log_debug,
  };
}

int
session_open_io (struct session *s, const struct qcow2_options *opts)
{
  int r;

  s->img = NULL;
  s->conn = NULL;
  session_log_init (s);
  mem_io_engine_call = true;
  r = qcow2_image_open (&s->mio.io, &s->qlog, opts, &s->img);
  if (r == 0) {
    s->conn = qcow2_conn_new (s->img);
    if (s->conn == NULL)
      r = -ENOMEM;
  }
  mem_io_engine_call = false;
  return r;
}

int
session_open (struct session *s, const uint8_t *file, uint64_t size,
              const struct qcow2_options *opts)
{
  memset (s, 0, sizeof *s);
  mem_io_init (&s->mio, file, size, size, MEM_IO_BORROW);
  return session_open_io (s, opts);
}

void
session_close_image (struct session *s)
{
  mem_io_engine_call = true;
  qcow2_conn_free (s->conn);
  qcow2_image_close (s->img);
  mem_io_engine_call = false;
  CHECK_EQ (atomic_load (&s->mio.outside), 0);
  CHECK_EQ (atomic_load (&s->mio.wrong_thread), 0);
  CHECK_EQ (s->log.malformed, 0);
  pthread_mutex_destroy (&s->log.lock);
  s->conn = NULL;
  s->img = NULL;
}

void
session_close (struct session *s)
{
  session_close_image (s);
  mem_io_free (&s->mio);
}

int
do_read (struct session *s, void *buf, uint64_t count, uint64_t offset)
{
  int r;

  mem_io_engine_call = true;
  r = qcow2_read (s->conn, &s->mio.io, buf, count, offset);
  mem_io_engine_call = false;
  return r;
}

int
do_prefetch (struct session *s, uint64_t offset, uint64_t count)
{
  int r;

  mem_io_engine_call = true;
  r = qcow2_prefetch (s->conn, &s->mio.io, offset, count);
  mem_io_engine_call = false;
  return r;
}

bool
read_cluster (struct session *s, const struct image *img, uint64_t k,
              const char *ctx)
{
  const uint64_t C = img->cluster_size;
  uint64_t len = img->virtual_size - k * C < C ? img->virtual_size - k * C : C;

  return read_and_compare (s, img, k * C, len, ctx);
}

bool
logged (struct session *s, unsigned *seen)
{
  unsigned now;

  pthread_mutex_lock (&s->log.lock);
  now = s->log.errors;
  pthread_mutex_unlock (&s->log.lock);
  if (now > *seen) {
    *seen = now;
    return true;
  }
  return false;
}

bool
read_and_compare (struct session *s, const struct image *img,
                  uint64_t offset, uint64_t len, const char *ctx)
{
  uint8_t *got = xmalloc (len);
  uint8_t *want = xmalloc (len);
  bool ok = true;
  int r;

  memset (got, 0xcd, len);
  r = do_read (s, got, len, offset);
  CHECK_EQ (r, 0);
  if (r != 0) {
    fprintf (stderr, "  %s: read of %" PRIu64 " at %" PRIu64 " failed: %s\n",
             ctx, len, offset, s->log.last);
    ok = false;
  }
  else {
    expected_bytes (img, want, offset, len);
    if (memcmp (got, want, len) != 0) {
      uint64_t i = 0;
      while (got[i] == want[i])
        ++i;
      CHECK (!"guest bytes differ");
      fprintf (stderr, "  %s: read of %" PRIu64 " at %" PRIu64 ": first "
               "difference at guest offset %" PRIu64 " (cluster %" PRIu64
               ", kind %d): got 0x%02x, want 0x%02x\n", ctx, len, offset,
               offset + i, (offset + i) / img->cluster_size,
               img->kind[(offset + i) / img->cluster_size], got[i], want[i]);
      ok = false;
    }
  }
  free (got);
  free (want);
  return ok;
}

int
do_extents (struct session *s, uint64_t offset, uint64_t count,
            qcow2_extent_fn fn, void *opaque)
{
  int r;

  mem_io_engine_call = true;
  r = qcow2_extents (s->conn, &s->mio.io, offset, count, fn, opaque);
  mem_io_engine_call = false;
  return r;
}

int
check_extent (void *opaque, uint64_t offset, uint64_t length, bool zero)
{
  struct extent_check *ec = opaque;
  const uint64_t C = ec->img->cluster_size;

  ec->calls++;
  if (ec->stop_after && ec->calls > ec->stop_after) {
    /* Not allowed; answer like a callback that does not expect it. */
    if (!ec->bad)
      fprintf (stderr, "  extent callback called again after it returned "
               "an error (range at %" PRIu64 ", +%" PRIu64 ")\n",
               offset, length);
    ec->bad = true;
    return 0;
  }
  if (ec->stop_after && ec->calls == ec->stop_after)
    return -EINTR;
  if (offset != ec->next || length == 0) {
    if (!ec->bad)
      fprintf (stderr, "  extent at %" PRIu64 " (+%" PRIu64 "), expected "
               "one at %" PRIu64 "\n", offset, length, ec->next);
    ec->bad = true;
  }
  for (uint64_t k = offset / C; length && k <= (offset + length - 1) / C;
       ++k)
    if (reads_as_zero (ec->img, k) != zero) {
      if (!ec->bad)
        fprintf (stderr, "  extent at %" PRIu64 " (+%" PRIu64 ") says "
                 "zero=%d, but cluster %" PRIu64 " is of kind %d\n",
                 offset, length, zero, k, ec->img->kind[k]);
      ec->bad = true;
      break;
    }
  ec->next = offset + length;
  return 0;
}

/* ------------------------------------------------------------ writing */

int
session_open_new (struct session *s, const struct new_image *spec,
                  unsigned flags, const struct qcow2_options *opts)
{
  struct qcow2_options o = *opts;
  uint8_t *file = new_image (spec);

  memset (s, 0, sizeof *s);
  mem_io_init (&s->mio, file, spec->storage_size, spec->storage_size,
               flags | MEM_IO_WRITABLE);
  free (file);
  o.writable = true;
  return session_open_io (s, &o);
}

int
do_write (struct session *s, const void *buf, uint64_t count,
          uint64_t offset, bool fua)
{
  int r;

  mem_io_engine_call = true;
  r = qcow2_write (s->conn, &s->mio.io, buf, count, offset, fua);
  mem_io_engine_call = false;
  return r;
}

int
do_zero (struct session *s, uint64_t count, uint64_t offset, bool fast,
         bool fua)
{
  int r;

  mem_io_engine_call = true;
  r = qcow2_zero (s->img, &s->mio.io, count, offset, fast, fua);
  mem_io_engine_call = false;
  return r;
}

int
do_trim (struct session *s, uint64_t count, uint64_t offset, bool fua)
{
  int r;

  mem_io_engine_call = true;
  r = qcow2_trim (s->img, &s->mio.io, count, offset, fua);
  mem_io_engine_call = false;
  return r;
}

int
do_flush (struct session *s)
{
  int r;

  mem_io_engine_call = true;
  r = qcow2_flush (s->img, &s->mio.io);
  mem_io_engine_call = false;
  return r;
}

bool
check_file (const uint8_t *file, uint64_t size, bool exact, const char *ctx)
{
  struct image_report report;
  bool ok = check_image (file, size, exact, &report);

  CHECK (ok);
  if (!ok)
    fprintf (stderr, "  %s: the image is not %s: %s (%" PRIu64 " leaked, %"
             PRIu64 " short, %" PRIu64 " COPIED wrong, %" PRIu64 " broken)\n",
             ctx, exact ? "exact" : "consistent", report.first_problem,
             report.leaked, report.short_counted, report.copied_wrong,
             report.broken);
  image_report_free (&report);
  return ok;
}

bool
matches_model (struct session *s, const uint8_t *model, uint64_t offset,
               uint64_t len, const char *ctx)
{
  uint8_t *got = xmalloc (len);
  bool ok;
  int r;

  memset (got, 0xcd, len);
  r = do_read (s, got, len, offset);
  CHECK_EQ (r, 0);
  ok = r == 0 && memcmp (got, model + offset, len) == 0;
  if (r == 0 && !ok) {
    uint64_t i = 0;
    while (got[i] == model[offset + i])
      ++i;
    CHECK (!"guest bytes differ from the model");
    fprintf (stderr, "  %s: read of %" PRIu64 " at %" PRIu64 ": first "
             "difference at guest offset %" PRIu64 ": got 0x%02x, want "
             "0x%02x\n", ctx, len, offset, offset + i, got[i],
             model[offset + i]);
  }
  else if (r != 0)
    fprintf (stderr, "  %s: read failed: %s\n", ctx, s->log.last);
  free (got);
  return ok;
}

bool
file_matches_model (const uint8_t *file, uint64_t size, const uint8_t *model,
                    uint64_t virtual_size, const char *ctx)
{
  struct qcow2_options opts = default_options;
  struct session s;
  bool ok = false;

  opts.writable = false;
  CHECK_EQ (session_open (&s, file, size, &opts), 0);
  if (s.conn)
    ok = matches_model (&s, model, 0, virtual_size, ctx);
  else
    fprintf (stderr, "  %s: cannot open: %s\n", ctx, s.log.last);
  session_close (&s);
  return ok;
}

/* ------------------------------------------------------ random changes */

/* A random range of the disk [OFF, OFF+LEN), LO <= OFF < HI. */
static void
random_range (uint64_t *seed, uint64_t lo, uint64_t hi, uint64_t max_len,
              uint64_t *off, uint64_t *len)
{
  *off = lo + rng (seed) % (hi - lo);
  /* Sector-aligned half of the time: the pool's runs; else anything. */
  if (rng (seed) & 1)
    *off &= ~UINT64_C (511);
  if (*off < lo)
    *off = lo;
  *len = 1 + rng (seed) % max_len;
  if (*len > hi - *off)
    *len = hi - *off;
}

void
random_changes (struct session *s, uint8_t *model, uint64_t lo, uint64_t hi,
                uint32_t cluster_size, uint64_t seed, unsigned nops,
                const char *ctx)
{
  uint8_t *buf = xmalloc (512 * KiB);

  for (unsigned i = 0; i < nops; ++i) {
    uint64_t off, len, k = rng (&seed) % 10;
    random_range (&seed, lo, hi, k < 2 ? 512 * KiB : 3 * cluster_size + 700,
                  &off, &len);
    if (k < 6) {
      for (uint64_t j = 0; j < len; j += 8) {
        uint64_t v = rng (&seed);
        memcpy (buf + j, &v, len - j < 8 ? len - j : 8);
      }
      CHECK_EQ (do_write (s, buf, len, off, k == 5), 0);
      memcpy (model + off, buf, len);
    }
    else if (k == 6) {
      CHECK_EQ (do_zero (s, len, off, false, false), 0);
      memset (model + off, 0, len);
    }
    else if (k == 7) {
      /* Whole clusters inside the range read as zeros afterwards. */
      uint64_t first = (off + cluster_size - 1) / cluster_size * cluster_size;
      uint64_t last = (off + len) / cluster_size * cluster_size;
      CHECK_EQ (do_trim (s, len, off, false), 0);
      /* A partial last cluster is whole once the range reaches the end. */
      if (off + len == qcow2_image_header (s->img)->virtual_size)
        last = off + len;
      if (last > first)
        memset (model + first, 0, last - first);
    }
    else if (k == 8)
      CHECK_EQ (do_flush (s), 0);
    else
      matches_model (s, model, off, len, ctx);
  }
  free (buf);
}
