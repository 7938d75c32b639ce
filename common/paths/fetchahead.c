/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: host bytes fetched ahead of a sequential reader (see
 * paths/fetchahead.h).
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "paths/fetchahead.h"
#include "meta/hostio.h"
#include "meta/log.h"
#include "base/lockorder.h"

/* A reader counts as sequential when its last reads all began within
 * one span's size.
 */
#define RECENT_READS 4

enum span_state {
  SPAN_EMPTY,
  SPAN_FETCHING,                /* on its way into buf, which nobody reads */
  SPAN_HELD,
};

struct span {
  enum span_state state;
  uint64_t start, end;          /* of the image file, unless SPAN_EMPTY */
  uint8_t *buf;                 /* fa->size bytes, made at first use */
};

enum background {
  BACKGROUND_NONE,              /* no storage for it: reads fetch */
  BACKGROUND_IDLE,              /* not needed yet */
  BACKGROUND_STARTING,          /* a reader opens the storage, starts it */
  BACKGROUND_RUNNING,
  BACKGROUND_FAILED,            /* could not start, or a fetch failed */
};

struct fetch_ahead {
  struct qcow2_image *img;
  uint64_t size;
  struct qcow2_background_io bg;        /* set before the first read */

  struct qcow2_mutex lock;
  /* Broadcast when a span stops being SPAN_FETCHING, and when the
   * thread has a fetch to make or must quit: the readers and the thread
   * wait on it for different things, and there are few of them.
   */
  pthread_cond_t changed;

  /* Under LOCK: where the connection's last RECENT_READS reads began (a
   * ring; SEEN is below RECENT_READS until it is full); the spans; the
   * span the latest read was served from (which a fetch never takes
   * over: readers are in it); the thread's state and its next fetch.
   */
  uint64_t recent[RECENT_READS];
  unsigned seen;
  struct span spans[2];
  struct span *last_served;
  enum background background;
  struct span *job;
  bool quit;
  bool thread_started;
  pthread_t thread;
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
  fa->img = img;
  fa->size = img->opts.request_size;
  qcow2_mutex_init (&fa->lock, QCOW2_RANK_LEAF, "a connection's fetch ahead");
  pthread_cond_init (&fa->changed, NULL);
  return fa;
}

void
qcow2_fetchahead_background (struct fetch_ahead *fa,
                             const struct qcow2_background_io *io)
{
  if (fa == NULL || io == NULL || io->pread == NULL)
    return;
  fa->bg = *io;
  fa->background = BACKGROUND_IDLE;
}

void
qcow2_fetchahead_free (struct fetch_ahead *fa)
{
  bool started;

  if (fa == NULL)
    return;
  qcow2_mutex_lock (&fa->lock);
  started = fa->thread_started;
  fa->quit = true;
  pthread_cond_broadcast (&fa->changed);
  qcow2_mutex_unlock (&fa->lock);
  if (started)
    pthread_join (fa->thread, NULL);
  pthread_cond_destroy (&fa->changed);
  qcow2_mutex_destroy (&fa->lock);
  free (fa->spans[0].buf);
  free (fa->spans[1].buf);
  free (fa);
}

/* Where a stretch fetched from START ends: the span's size, or as much
 * of the file as there is, but at least LEN bytes (the read that
 * fetches it wants them all, even past the end of the file, which reads
 * as zeros).
 */
static uint64_t
stretch_end (struct fetch_ahead *fa, uint64_t start, uint64_t len)
{
  uint64_t file_size = atomic_load (&fa->img->file_size);
  uint64_t want = fa->size;

  if (start >= file_size)
    want = 0;
  else if (want > file_size - start)
    want = file_size - start;
  return start + (want < len ? len : want);
}

static bool
span_buffer (struct fetch_ahead *fa, struct span *s)
{
  if (s->buf == NULL)
    s->buf = malloc (fa->size);
  return s->buf != NULL;
}

/* Whether the spans hold, or are fetching, all of [HOST, HOST+LEN):
 * *FIRST from HOST on, and where the read runs past its end (a cluster
 * across the point where one fetch ended and the next began), *SECOND
 * the rest, else NULL.
 */
static bool
spans_with (struct fetch_ahead *fa, uint64_t host, uint64_t len,
            struct span **first, struct span **second)
{
  unsigned i;

  for (i = 0; i < 2; ++i) {
    struct span *s = &fa->spans[i], *other = &fa->spans[!i];
    if (s->state == SPAN_EMPTY || host < s->start || host >= s->end)
      continue;
    *first = s;
    *second = NULL;
    if (host + len <= s->end)
      return true;
    *second = other;
    return other->state != SPAN_EMPTY && other->start == s->end &&
      host + len <= other->end;
  }
  return false;
}

/* A span a read may fetch into: an empty one, or one held that readers
 * have left.  NULL when the other is being fetched and readers are in
 * this one.
 */
static struct span *
span_to_fill (struct fetch_ahead *fa)
{
  unsigned i;

  for (i = 0; i < 2; ++i)
    if (fa->spans[i].state == SPAN_EMPTY)
      return &fa->spans[i];
  for (i = 0; i < 2; ++i)
    if (fa->spans[i].state == SPAN_HELD && &fa->spans[i] != fa->last_served)
      return &fa->spans[i];
  return NULL;
}

/* A read ending at READ_END has just been served from S.  Once readers
 * pass the middle of S (the readers behind them, in a shuffled order,
 * are done with the other span by then), the thread fetches the
 * stretch after S into the other span.  True when the caller must start
 * the thread first (start_background), after dropping the lock.
 */
static bool
queue_next (struct fetch_ahead *fa, struct span *s, uint64_t read_end)
{
  struct span *other = &fa->spans[s == &fa->spans[0]];
  uint64_t file_size = atomic_load (&fa->img->file_size);

  if ((fa->background != BACKGROUND_IDLE &&
       fa->background != BACKGROUND_RUNNING) ||
      s->end >= file_size ||
      read_end - s->start <= (s->end - s->start) / 2 ||
      other->state == SPAN_FETCHING ||
      (other->state == SPAN_HELD && other->start == s->end) ||
      !span_buffer (fa, other))
    return false;
  other->state = SPAN_FETCHING;
  other->start = s->end;
  other->end = stretch_end (fa, s->end, 0);
  fa->job = other;
  if (fa->background == BACKGROUND_RUNNING) {
    pthread_cond_broadcast (&fa->changed);
    return false;
  }
  fa->background = BACKGROUND_STARTING;
  return true;
}

/* The thread: makes each fetch it is given, until told to quit. */
static void *
fetch_in_background (void *opaque)
{
  struct fetch_ahead *fa = opaque;
  struct qcow2_io io = { .opaque = fa->bg.opaque, .pread = fa->bg.pread };
  struct span *s;
  int r;

  qcow2_mutex_lock (&fa->lock);
  for (;;) {
    while (!fa->quit && fa->job == NULL)
      qcow2_cond_wait (&fa->changed, &fa->lock);
    if (fa->quit)
      break;
    s = fa->job;
    fa->job = NULL;
    /* Counted before the flag is looked at, as the stop sets the flag
     * before it looks at the count: one of the two sees the other.
     */
    atomic_fetch_add (&fa->img->background_reads, 1);
    if (atomic_load (&fa->img->background_stopped)) {
      atomic_fetch_sub (&fa->img->background_reads, 1);
      s->state = SPAN_EMPTY;
      fa->background = BACKGROUND_FAILED;
      pthread_cond_broadcast (&fa->changed);
      continue;
    }
    qcow2_mutex_unlock (&fa->lock);
    r = qcow2_pread_clamped (fa->img, &io, s->buf, s->end - s->start,
                             s->start);
    qcow2_mutex_lock (&fa->lock);
    if (r == 0) {
      s->state = SPAN_HELD;
      atomic_fetch_add_explicit (&fa->img->counters.fetches_in_background, 1,
                                 memory_order_relaxed);
    }
    else {
      /* The readers fetch for themselves from now on, through the
       * connection's own storage, and get its error if it is real.
       */
      s->state = SPAN_EMPTY;
      fa->background = BACKGROUND_FAILED;
    }
    pthread_cond_broadcast (&fa->changed);
    atomic_fetch_sub (&fa->img->background_reads, 1);
  }
  qcow2_mutex_unlock (&fa->lock);
  return NULL;
}

/* Called by the reader that queue_next told to, without the lock: the
 * front end's open must run on a thread that called into the engine.
 */
static void
start_background (struct fetch_ahead *fa)
{
  pthread_t thread;
  int r = fa->bg.open ? fa->bg.open (fa->bg.opaque) : 0;

  if (r == 0)
    r = -pthread_create (&thread, NULL, fetch_in_background, fa);
  qcow2_mutex_lock (&fa->lock);
  if (r == 0) {
    fa->thread = thread;
    fa->thread_started = true;
    /* Unless its first fetch has failed already. */
    if (fa->background == BACKGROUND_STARTING)
      fa->background = BACKGROUND_RUNNING;
  }
  else {
    fa->background = BACKGROUND_FAILED;
    fa->job->state = SPAN_EMPTY;
    fa->job = NULL;
  }
  pthread_cond_broadcast (&fa->changed);
  qcow2_mutex_unlock (&fa->lock);
  if (r < 0)
    qcow2_debug (fa->img, "the bytes ahead of a sequential reader are "
                 "fetched by its reads, not in the background: %s",
                 strerror (-r));
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
  struct span *s, *rest;
  bool sequential, held, start = false;
  int r;

  /* A read as long as a span gains nothing from it. */
  if (fa == NULL || len >= fa->size / 2)
    return qcow2_pread_clamped (img, io, buf, len, host);
  qcow2_mutex_lock (&fa->lock);
  sequential = recent_read (fa, host);
  while ((held = spans_with (fa, host, len, &s, &rest)) &&
         (s->state == SPAN_FETCHING ||
          (rest && rest->state == SPAN_FETCHING)))
    qcow2_cond_wait (&fa->changed, &fa->lock);
  if (held) {
    uint64_t in_s = (rest ? s->end : host + len) - host;
    memcpy (buf, s->buf + (host - s->start), in_s);
    if (rest) {
      memcpy ((uint8_t *) buf + in_s, rest->buf, len - in_s);
      s = rest;
    }
    fa->last_served = s;
    start = queue_next (fa, s, host + len);
    qcow2_mutex_unlock (&fa->lock);
    atomic_fetch_add_explicit (&img->counters.reads_fetched_ahead, 1,
                               memory_order_relaxed);
    if (start)
      start_background (fa);
    return 0;
  }
  if (!sequential || (s = span_to_fill (fa)) == NULL ||
      !span_buffer (fa, s)) {
    qcow2_mutex_unlock (&fa->lock);
    return qcow2_pread_clamped (img, io, buf, len, host);
  }
  s->state = SPAN_FETCHING;
  s->start = host;
  s->end = stretch_end (fa, host, len);
  qcow2_mutex_unlock (&fa->lock);

  r = qcow2_pread_clamped (img, io, s->buf, s->end - s->start, host);
  qcow2_mutex_lock (&fa->lock);
  s->state = r == 0 ? SPAN_HELD : SPAN_EMPTY;
  pthread_cond_broadcast (&fa->changed);
  if (r == 0) {
    memcpy (buf, s->buf, len);
    fa->last_served = s;
    start = queue_next (fa, s, host + len);
  }
  qcow2_mutex_unlock (&fa->lock);
  if (start)
    start_background (fa);
  return r;
}
