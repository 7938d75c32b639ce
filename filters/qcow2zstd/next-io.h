/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-qcow2zstd-filter: the plugin under the filter, as the engine
 * and the glue see storage.
 *
 * Offers: next_io, next_serves_file.
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
 * discard, and the plugin's size.  Valid while NEXT is.
 */
struct qcow2_io next_io (nbdkit_next *next);

/* A locks_confirm_fn: whether NEXT (the opaque) serves the file open on
 * FD (locks.h).
 */
locks_confirm_fn next_serves_file;

#endif /* QCOW2ZSTD_NEXT_IO_H */
