/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: decoding ahead of a sequential reader.
 *
 * A client reading a compressed disk in small pieces, one after the
 * other, would wait for each cluster's decoding in turn.  After such a
 * read the next clusters are decoded in the connection's pool into the
 * cluster cache while the client works, so that its next reads hit the
 * cache.
 *
 * Offers: qcow2_readahead, QCOW2_READAHEAD_BYTES.
 * Locks: takes the image lock (shared) itself to look up the entries, so
 * the caller holds none; the caller is a read registered for a grace
 * period, which covers the read underneath.  The decoding may finish
 * after that read has returned, and then puts nothing into the cache for
 * clusters released meanwhile (the image's free_generation).
 * Needs: the connection (its readahead chunk and pool), the chunks, the
 * map, the cluster cache.
 */
#ifndef QCOW2_READAHEAD_H
#define QCOW2_READAHEAD_H

#include <stdint.h>

#include "meta/image.h"

struct qcow2_conn;
struct request;

/* Guest bytes decoded ahead of a sequential reader; reads this long or
 * longer are not small.
 */
#define QCOW2_READAHEAD_BYTES (256 * 1024)

/* Start decoding the compressed clusters from guest cluster FIRST on
 * (QCOW2_READAHEAD_BYTES' worth) that are not cached yet, as many as one
 * read underneath fetches, without waiting for them.  REQ lends its
 * calling thread's decoder (to help finish the previous readahead) and
 * its L2 buffer.  Does nothing if another read of the connection is
 * already doing this; errors only mean no readahead.
 */
void qcow2_readahead (struct qcow2_conn *conn, struct request *req,
                      struct qcow2_io *io, uint64_t first);

#endif /* QCOW2_READAHEAD_H */
