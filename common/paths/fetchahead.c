/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: host bytes fetched ahead of a sequential reader (see
 * paths/fetchahead.h).
 */

#include <config.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "paths/fetchahead.h"
#include "meta/hostio.h"
#include "base/lockorder.h"

/* A reader counts as sequential when its last reads all began within
 * one buffer's span.
 */
#define RECENT_READS 4

struct fetch_ahead {
  struct qcow2_mutex lock;
  /* Under LOCK: where the connection's last RECENT_READS reads began
   * (a ring; SEEN is below RECENT_READS until it is full); the bytes
   * held ([start, end) of the image file, when HELD), and whether a
   * thread is fetching into BUF (which nobody reads meanwhile).
   */
  uint64_t recent[RECENT_READS];
  unsigned seen;
  uint64_t start, end;
  bool held, fetching;
  uint8_t *buf;                 /* size bytes, made at the first fetch */
  uint64_t size;
};

struct fetch_ahead *
qcow2_fetchahead_new (struct qcow2_image *img)
{
  struct fetch_ahead *fa;

  if (img->opts.writable || img->data_file)
    return NULL;
  fa = calloc (1, sizeof *fa);
  if (fa == NULL)
    return NULL;
  fa->size = img->opts.request_size;
  qcow2_mutex_init (&fa->lock, QCOW2_RANK_LEAF, "a connection's fetch ahead");
  return fa;
}

void
qcow2_fetchahead_free (struct fetch_ahead *fa)
{
  if (fa == NULL)
    return;
  qcow2_mutex_destroy (&fa->lock);
  free (fa->buf);
  free (fa);
}

/* Fetch from HOST on (as much of the file as there is, up to fa->size)
 * into fa->buf, which the caller alone owns while fa->fetching, and copy
 * the first LEN bytes into BUF.
 */
static int
fetch (struct fetch_ahead *fa, struct qcow2_image *img, struct qcow2_io *io,
       void *buf, uint64_t len, uint64_t host)
{
  uint64_t file_size = atomic_load (&img->file_size);
  uint64_t want = fa->size;
  int r;

  if (host < file_size && want > file_size - host)
    want = file_size - host;
  if (want < len)
    want = len;
  r = qcow2_pread_clamped (img, io, fa->buf, want, host);
  qcow2_mutex_lock (&fa->lock);
  fa->fetching = false;
  if (r == 0) {
    fa->start = host;
    fa->end = host + want;
    fa->held = true;
    memcpy (buf, fa->buf, len);
  }
  qcow2_mutex_unlock (&fa->lock);
  return r;
}

/* Note a read beginning at HOST: is the reader sequential?  A client
 * with many requests in flight reads on in a shuffled order (nbdkit runs
 * a connection's requests on several threads), so the reads need not
 * continue each other, only lie together.  A reader that jumps about
 * has its last few reads in one span only by chance, hardly ever.
 */
static bool
recent_read (struct fetch_ahead *fa, uint64_t host)
{
  uint64_t lo = host, hi = host;
  unsigned i;

  fa->recent[fa->seen++ % RECENT_READS] = host;
  if (fa->seen < RECENT_READS)
    return false;
  if (fa->seen >= 2 * RECENT_READS)
    fa->seen -= RECENT_READS;
  for (i = 0; i < RECENT_READS; ++i) {
    if (fa->recent[i] < lo)
      lo = fa->recent[i];
    if (fa->recent[i] > hi)
      hi = fa->recent[i];
  }
  return hi - lo <= fa->size;
}

int
qcow2_fetchahead_pread (struct fetch_ahead *fa, struct qcow2_image *img,
                        struct qcow2_io *io, void *buf, uint64_t len,
                        uint64_t host)
{
  bool sequential;

  /* A read as long as the buffer gains nothing from it. */
  if (fa == NULL || len >= fa->size / 2)
    return qcow2_pread_clamped (img, io, buf, len, host);
  qcow2_mutex_lock (&fa->lock);
  sequential = recent_read (fa, host);
  if (fa->held && host >= fa->start && host + len <= fa->end) {
    memcpy (buf, fa->buf + (host - fa->start), len);
    qcow2_mutex_unlock (&fa->lock);
    atomic_fetch_add_explicit (&img->counters.reads_fetched_ahead, 1,
                               memory_order_relaxed);
    return 0;
  }
  if (!sequential || fa->fetching) {
    qcow2_mutex_unlock (&fa->lock);
    return qcow2_pread_clamped (img, io, buf, len, host);
  }
  if (fa->buf == NULL) {
    fa->buf = malloc (fa->size);
    if (fa->buf == NULL) {
      qcow2_mutex_unlock (&fa->lock);
      return qcow2_pread_clamped (img, io, buf, len, host);
    }
  }
  fa->held = false;
  fa->fetching = true;
  qcow2_mutex_unlock (&fa->lock);
  return fetch (fa, img, io, buf, len, host);
}
