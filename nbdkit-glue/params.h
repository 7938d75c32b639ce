/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd: what the filter and the plugin share: the parameters, the
 * debug flags, --dump-plugin, the statistics line, the extents adapter.
 */
#ifndef QCOW2ZSTD_PARAMS_H
#define QCOW2ZSTD_PARAMS_H

#include <stdbool.h>

#include "qcow2.h"

/* The parameters, settled by params_complete: what every open of an
 * image starts from.  The front ends keep them as a value from
 * start-up on and pass them down; nothing changes them afterwards.
 */
struct glue_options {
  /* The engine's options; writable, growable and room_file are set for
   * each open (registry.h), on a copy.
   */
  struct qcow2_options engine;
  bool create;                  /* qcow2-create=SIZE was given */
  struct qcow2_create_options create_options;
  /* 1: nbdkit -r was given; 0: not; -1: unknown (cmdline.h). */
  int readonly;
  /* The file the plugin under the filter was given (file=, resolved)
   * and the directory (the file's, or dir=): where relative backing file
   * names start.  NULL when not given.  The plugin form's file= passes
   * here too.
   */
  const char *image_file;
  const char *image_dir;
  bool log_stats;               /* -D qcow2zstd.stats=1 */
};

/* A qcow2-compression-level given on the command line fits TYPE (0),
 * or not (-1, after nbdkit_error).
 */
int params_check_level (const struct glue_options *options,
                        enum qcow2_compression type);

/* The local file that the plugin under the filter serves for
 * EXPORTNAME: the file named by file=, or with dir= the file of that
 * name in the directory.  NULL if neither was given (or out of memory).
 * The caller frees it.
 */
char *params_local_image (const struct glue_options *options,
                          const char *exportname);

/* Handle KEY=VALUE if it is one of ours: 0 done, -1 error, 1 not ours.
 * file= and dir= (the file plugin's, or the plugin form's own file=) are
 * noted, for resolving relative backing file names, and passed on.
 */
int params_config (const char *key, const char *value);
/* Settle the parameters into *OPTIONS: 0, or -1 after nbdkit_error
 * when they do not fit together.
 */
int params_complete (struct glue_options *options);
void params_dump_if_asked (void);
void params_unload (void);
/* The statistics line of IMG, for -D qcow2zstd.stats=1. */
void params_log_stats (struct qcow2_image *img, const char *name);
/* The engine's extent callback: adds to a struct nbdkit_extents. */
int params_add_extent (void *extents, uint64_t offset, uint64_t length,
                       bool zero);

#define PARAMS_HELP \
  "qcow2-threads=N                Threads (de)compressing each request (default: CPUs).\n" \
  "qcow2-request-size=SIZE        Largest read of the plugin (default 4M).\n" \
  "qcow2-l2-cache-size=SIZE       L2 table cache, all connections (default 32M).\n" \
  "qcow2-cluster-cache-size=SIZE  Decompressed cluster cache (default 64M).\n" \
  "qcow2-create=SIZE              Format the storage as a new image of SIZE.\n" \
  "qcow2-cluster-size=SIZE        Cluster size of a created image (default 64K).\n" \
  "qcow2-compression-type=zlib|zstd  Of a created image (default zstd).\n" \
  "qcow2-compress=BOOL            Store whole-cluster writes compressed.\n" \
  "qcow2-compression-level=N      zlib 1-9 (default 5), zstd 1-22 (default 3).\n" \
  "qcow2-discard=unmap|ignore     Discard freed clusters below (default unmap).\n" \
  "qcow2-detect-zeroes=off|on|unmap  Zero clusters for zeros written (default off).\n" \
  "qcow2-lazy-refcounts=BOOL      Refcounts written at close, dirty bit meanwhile.\n" \
  "qcow2-backing=PATH             The backing file (default: the image's own).\n" \
  "qcow2-backing-dir=DIR          Backing files may also be in DIR (repeatable).\n" \
  "qcow2-data-file=PATH           The external data file (default: the image's own).\n" \
  "qcow2-locking=on|auto|off      Lock the image as qemu does (default on).\n" \
  "qcow2-force-share=BOOL         With -r: read even an image in use (qemu -U).\n" \
  "qcow2-passphrase=SECRET        Of a LUKS image (- to prompt, +FILE, -FD).\n" \
  "qcow2-encrypt-format=luks      Encrypt a created image (with qcow2-passphrase).\n" \
  "qcow2-encrypt-iter-time=MS     PBKDF2 time of its key slot (default 2000).\n" \
  "qcow2-snapshot=NAME|ID         Serve this internal snapshot, read-only."

#endif /* QCOW2ZSTD_PARAMS_H */
