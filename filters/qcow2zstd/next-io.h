/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-qcow2zstd-filter: the plugin under the filter, as the engine
 * and the glue see storage.
 *
 * Offers: next_io, next_background_io, next_background_close,
 * next_serves_file.
 * Locks: none.  Needs: nbdkit-filter.h, base/io.h, locks.h.
 */
#ifndef QCOW2ZSTD_NEXT_IO_H
#define QCOW2ZSTD_NEXT_IO_H

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "base/io.h"
#include "locks.h"

/* The engine's struct qcow2_io over NEXT: reads and writes (in pieces
 * of at most 1 GiB, as nbdkit takes them), flush (a no-op over a plugin
 * that cannot, whose writes are as durable as it makes them), trim for
 * discard, extents for block status, and the plugin's size.  Valid
 * while NEXT is.
 */
struct qcow2_io next_io (nbdkit_next *next);

/* A second context into the plugin, for the engine's thread that
 * fetches ahead of a sequential reader (base/io.h): opened read-only by
 * the request that first needs it, so that a connection that never
 * reads sequentially opens nothing, and closed by next_background_close
 * once the engine's connection is freed.  A context of no connection
 * (nbdkit asserts that a plugin is opened once per connection): the
 * plugin must serve it beside the connection's at once (thread model
 * serialize_requests or parallel) and serve the same bytes without an
 * export name.
 */
struct next_background {
  nbdkit_backend *backend;
  const char *exportname;
  nbdkit_next *next;            /* once opened */
};

struct qcow2_background_io next_background_io (struct next_background *bg);
void next_background_close (struct next_background *bg);

/* A locks_confirm_fn: whether NEXT (the opaque) serves the file open on
 * FD (locks.h).
 */
locks_confirm_fn next_serves_file;

#endif /* QCOW2ZSTD_NEXT_IO_H */
