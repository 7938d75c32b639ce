/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-qcow2zstd-filter: what the filter's files share. */
#ifndef QCOW2ZSTD_FILTER_H
#define QCOW2ZSTD_FILTER_H

#include <stdbool.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "qcow2.h"
#include "params.h"
#include "glue.h"

/* images.c: one engine image per export, shared by its connections. */
struct shared_image;

/* Open (or join) the image of EXPORTNAME through NEXT.  WRITABLE: the
 * connection may write.  NULL after nbdkit_error on failure.
 */
struct shared_image *images_acquire (nbdkit_next *next,
                                     const char *exportname, bool writable);
/* Leave it; the last one out closes the image.  It does not flush: by
 * then every connection that could write has flushed in its .finalize.
 * IO: the leaving connection's, if it can write, else NULL; the last one
 * out with IO finishes the image first (qcow2_finish: the persistent
 * bitmaps left consistent).
 */
void images_release (struct shared_image *shared, struct qcow2_io *io);
struct qcow2_image *images_engine (struct shared_image *shared);
void images_cleanup (void);
void images_unload (void);

/* The engine's view of a next backend. */
int next_pread (void *opaque, void *buf, size_t count, uint64_t offset);
int next_pwrite (void *opaque, const void *buf, size_t count, uint64_t offset);
int next_flush (void *opaque);
int64_t next_size (void *opaque);
int next_discard (void *opaque, uint64_t count, uint64_t offset);
#define IO_FOR(next) \
  { .opaque = (next), .pread = next_pread, .pwrite = next_pwrite, \
    .flush = next_flush, .size = next_size, .discard = next_discard }

#endif /* QCOW2ZSTD_FILTER_H */
