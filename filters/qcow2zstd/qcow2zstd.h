/* nbdkit-qcow2zstd-filter: what the filter's files share. */
#ifndef QCOW2ZSTD_FILTER_H
#define QCOW2ZSTD_FILTER_H

#include <stdbool.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "qcow2.h"

/* -D qcow2zstd.image=1: engine messages while opening the image.
 * -D qcow2zstd.stats=1: a statistics line when an image is closed.
 */
extern int qcow2zstd_debug_image;
extern int qcow2zstd_debug_stats;

/* params.c: the parameters, settled by params_complete. */
extern struct qcow2_options filter_options;
extern bool create_requested;
extern struct qcow2_create_options create_options;

/* Handle KEY=VALUE if it is one of ours: 0 done, -1 error, 1 not ours. */
int params_config (const char *key, const char *value);
int params_complete (void);
void params_dump_if_asked (void);

#define PARAMS_HELP \
  "qcow2-threads=N                Threads (de)compressing each request (default: CPUs).\n" \
  "qcow2-request-size=SIZE        Largest read of the plugin (default 4M).\n" \
  "qcow2-l2-cache-size=SIZE       L2 table cache, all connections (default 32M).\n" \
  "qcow2-cluster-cache-size=SIZE  Decompressed cluster cache (default 64M).\n" \
  "qcow2-create=SIZE              Format the plugin as a new image of SIZE.\n" \
  "qcow2-cluster-size=SIZE        Cluster size of a created image (default 64K).\n" \
  "qcow2-compression-type=zlib|zstd  Of a created image (default zstd).\n" \
  "qcow2-compress=BOOL            Store whole-cluster writes compressed.\n" \
  "qcow2-compression-level=N      zlib 1-9 (default 6), zstd 1-22 (default 3).\n" \
  "qcow2-backing=PATH             The backing file (default: the image's own)."

/* images.c: one engine image per export, shared by its connections. */
struct shared_image;

/* Open (or join) the image of EXPORTNAME through NEXT.  WRITABLE: the
 * connection may write.  NULL after nbdkit_error on failure.
 */
struct shared_image *images_acquire (nbdkit_next *next,
                                     const char *exportname, bool writable);
/* Leave it; the last one out flushes through NEXT (if not NULL) and
 * closes the image.
 */
void images_release (struct shared_image *shared, nbdkit_next *next);
struct qcow2_image *images_engine (struct shared_image *shared);

/* The engine's view of a next backend. */
int next_pread (void *opaque, void *buf, size_t count, uint64_t offset);
int next_pwrite (void *opaque, const void *buf, size_t count, uint64_t offset);
int next_flush (void *opaque);
int64_t next_size (void *opaque);
#define IO_FOR(next) \
  { .opaque = (next), .pread = next_pread, .pwrite = next_pwrite, \
    .flush = next_flush, .size = next_size }

#endif /* QCOW2ZSTD_FILTER_H */
