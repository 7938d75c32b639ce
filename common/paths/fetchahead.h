/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: host bytes fetched ahead of a sequential reader.
 *
 * Storage far away (a web server under nbdkit's curl plugin) costs a
 * round trip and the overhead of one request for every read, whatever
 * its size: a client that reads the disk in pieces of 256 KiB pays them
 * for every piece (a request underneath holds no more than one client
 * request's clusters, paths/run.h).  So when a connection's last few
 * reads of the image file all began within the span of the request size
 * (in any order: a client's requests in flight arrive shuffled), a read
 * not in memory fetches the request size from where it begins in one
 * read and keeps it; the reads that follow inside those bytes are copied
 * from memory.
 *
 * Two such spans per connection.  Where the front end gave the
 * connection storage it may read from a thread of its own
 * (qcow2_conn_fetch_in_background), the read that passes the middle of
 * the newest span has that thread fetch the next stretch into the other
 * span, while the reads decode what they have; a read that reaches into
 * a stretch still on its way waits for it rather than asking again.
 * Without that thread the read that reaches past the held bytes fetches
 * the next stretch itself.  A reader that jumps about has its last few
 * reads in one span only by chance, hardly ever, and pays nothing but a
 * compare: no buffer, no thread, no handle opened.
 *
 * Only for an image opened read-only (a writable image's bytes may
 * change under the copy), and never for an external data file.
 * Memory: two buffers of the request size (qcow2-request-size) per
 * connection, each made at its first use.
 *
 * Offers: qcow2_fetchahead_new, qcow2_fetchahead_background,
 * qcow2_fetchahead_free, qcow2_fetchahead_pread.
 * Locks: a mutex of its own per connection, a leaf, never held across a
 * read of the storage or a call to the front end; readers wait on its
 * condition for a stretch being fetched.
 * Needs: host I/O.
 */
#ifndef QCOW2_FETCHAHEAD_H
#define QCOW2_FETCHAHEAD_H

#include <stdint.h>

#include "meta/image.h"

struct fetch_ahead;

/* The state of one connection to IMG, or NULL where nothing is fetched
 * ahead (a writable image, memory short): qcow2_fetchahead_pread then
 * reads straight from the storage.
 */
struct fetch_ahead *qcow2_fetchahead_new (struct qcow2_image *img);

/* Fetch from IO on a thread of FA's own (see above); FA may be NULL.
 * Before the first read.
 */
void qcow2_fetchahead_background (struct fetch_ahead *fa,
                                  const struct qcow2_background_io *io);

/* Stops the thread (after the read it is making), frees the buffers.
 * No read may be in progress.
 */
void qcow2_fetchahead_free (struct fetch_ahead *fa);

/* Read LEN bytes of the image file at host offset HOST into BUF, as
 * qcow2_pread_clamped does, through FA (which may be NULL).  0, or
 * -errno after logging.
 */
int qcow2_fetchahead_pread (struct fetch_ahead *fa, struct qcow2_image *img,
                            struct qcow2_io *io, void *buf, uint64_t len,
                            uint64_t host);

#endif /* QCOW2_FETCHAHEAD_H */
