/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: block status.  The engine's extents for every
 * range the read tests read, and the whole disk, must cover it from
 * where they were asked for, consecutively, with zero exactly where the
 * image reads as zeros; a callback's error stops the walk.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2.h"
#include "read-image.h"
#include "session.h"
#include "unit.h"
#include "util.h"

/* Ask for [OFFSET, OFFSET+LEN) as a client does: again from where the
 * last answer stopped, until all is covered.
 */
static bool
extents_cover (struct session *s, const struct image *img, uint64_t offset,
               uint64_t len)
{
  struct extent_check ec = { .img = img, .next = offset };
  uint64_t end = offset + len;
  unsigned rounds = 0;

  while (ec.next < end && !ec.bad && rounds++ < 100000) {
    uint64_t from = ec.next;
    unsigned calls = ec.calls;
    int r;

    mem_io_engine_call = true;
    r = qcow2_extents (s->conn, &s->mio.io, from, end - from,
                       check_extent, &ec);
    mem_io_engine_call = false;
    CHECK_EQ (r, 0);
    CHECK (ec.calls > calls);           /* at least one range */
    CHECK (ec.next > from);
    CHECK (ec.next <= end);
    if (r != 0 || ec.next <= from)
      return false;
  }
  CHECK (!ec.bad);
  CHECK_EQ (ec.next, end);
  return !ec.bad && ec.next == end;
}

static void
test_extents (const struct image *img)
{
  struct pairs ps = make_pairs (img);
  struct session s;
  unsigned failures = 0;

  CHECK_EQ (session_open (&s, img->file, img->file_size, &default_options),
            0);
  if (s.conn == NULL) {
    session_close (&s);
    return;
  }
  for (size_t i = 0; i < ps.n && failures < 5; ++i)
    if (!extents_cover (&s, img, ps.p[i].offset, ps.p[i].len)) {
      failures++;
      fprintf (stderr, "  (%s: extents of %" PRIu64 " at %" PRIu64 ")\n",
               img->spec->name, ps.p[i].len, ps.p[i].offset);
    }
  /* The whole disk at once: for the 64 KiB images 512 MiB, mostly an
   * unallocated stretch inside an L2 table.
   */
  CHECK (extents_cover (&s, img, 0, img->virtual_size));

  /* The callback's error stops the walk and is returned, and the
   * callback is not called again.
   */
  {
    struct extent_check ec = { .img = img, .next = 0, .stop_after = 1 };
    mem_io_engine_call = true;
    CHECK_EQ (qcow2_extents (s.conn, &s.mio.io, 0, img->virtual_size,
                             check_extent, &ec), -EINTR);
    mem_io_engine_call = false;
    /* "FN returns ... a negative errno to stop with that error": no
     * call after that one.
     */
    CHECK_EQ (ec.calls, 1);
  }
  {
    /* Failing on the second range, and on the last (only) one. */
    struct extent_check ec = { .img = img, .next = 0, .stop_after = 2 };
    mem_io_engine_call = true;
    CHECK_EQ (qcow2_extents (s.conn, &s.mio.io, 0, img->virtual_size,
                             check_extent, &ec), -EINTR);
    CHECK_EQ (ec.calls, 2);
    ec = (struct extent_check) { .img = img, .next = 0, .stop_after = 1 };
    CHECK_EQ (qcow2_extents (s.conn, &s.mio.io, 0, 1, check_extent, &ec),
              -EINTR);
    CHECK_EQ (ec.calls, 1);
    mem_io_engine_call = false;
  }
  /* Nothing asked, nothing reported. */
  {
    struct extent_check ec = { .img = img, .next = 0 };
    mem_io_engine_call = true;
    CHECK_EQ (qcow2_extents (s.conn, &s.mio.io, 5, 0, check_extent, &ec),
              0);
    mem_io_engine_call = false;
    CHECK_EQ (ec.calls, 0);
  }
  CHECK_EQ (s.log.errors, 0);
  session_close (&s);
  free (ps.p);
}

int
main (void)
{
  for (size_t i = 0; i < read_image_nspecs; ++i) {
    struct image *img = image_new (&read_image_specs[i]);
    unsigned long before = atomic_load (&unit_failures);

    test_extents (img);
    UNIT_NOTE_IF_FAILED (before, "image %s", read_image_specs[i].name);
    image_free (img);
  }
  return unit_finish ();
}
