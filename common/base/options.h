/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: what the engine is asked to do with an image.
 *
 * The options an image is opened with (struct qcow2_options), given by
 * value to qcow2_image_open and copied: the engine never reads the
 * caller's copy again, and the caller may change or free it afterwards.
 */
#ifndef QCOW2_OPTIONS_H
#define QCOW2_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/filelock.h"

struct qcow2_key_cache;

/* What becomes of host clusters nothing refers to any more (qcow2-discard). */
enum qcow2_discard {
  QCOW2_DISCARD_IGNORE,           /* kept by the storage, reused later */
  QCOW2_DISCARD_UNMAP,            /* discarded in the storage (io.discard) */
};

/* Whole clusters of zeros in a write (qcow2-detect-zeroes, as qemu's
 * detect-zeroes).
 */
enum qcow2_detect_zeroes {
  QCOW2_DETECT_ZEROES_OFF,        /* written as data */
  QCOW2_DETECT_ZEROES_ON,         /* zero clusters that keep their host
                                     cluster */
  QCOW2_DETECT_ZEROES_UNMAP,      /* zero clusters; host cluster released */
};

struct qcow2_options {
  bool writable;                  /* open for writing */
  unsigned threads;               /* pool workers per connection; 0: none */
  unsigned compress_threads;      /* per image, at most one per CPU; 0: 1 */
  uint64_t request_size;          /* largest coalesced read underneath */
  uint64_t l2_cache_size;         /* bytes */
  uint64_t cluster_cache_size;    /* bytes */
  bool compress;                  /* store whole-cluster writes compressed */
  int compression_level;          /* the codec's level; 0: its default */
  const char *backing_path;       /* the backing file, overriding the header */
  /* The external data file, overriding the header's name (qemu's
   * data-file option); NULL: the header's.
   */
  const char *data_file_path;
  const char *image_dir;          /* where relative backing names start */
  /* The directories (absolute, symbolic links resolved, NULL-terminated)
   * that a backing file named in an image header may be in, at any
   * depth of the chain (backing.h); NULL: none, and only
   * backing_path is opened.
   */
  const char *const *backing_dirs;
  unsigned backing_depth;         /* 0; the engine counts the chain */
  bool growable;                  /* writes may extend the storage */
  /* The regular file the storage is, when its user can give it room
   * (truncate) but the engine cannot: named, with the command, in the
   * message of a full image.  NULL: no such file, and the message says
   * only that the image needs room.
   */
  const char *room_file;
  enum qcow2_discard discard;
  enum qcow2_detect_zeroes detect_zeroes;
  /* Lazy refcounts (qcow2-lazy-refcounts, qemu's lazy_refcounts): the
   * image's dirty bit is set before the first change and the refcounts
   * reach the disk only at a clean close (qcow2_finish), which clears it
   * again; a crash meanwhile is repaired from the tables at the next
   * open.  Version 3 images only.
   */
  bool lazy_refcounts;
  enum qcow2_lock_policy locking; /* for the backing files it opens */
  unsigned debug;                 /* QCOW2_DEBUG_* bits */
  /* The passphrase of a LUKS-encrypted image (NUL-terminated), or NULL. */
  const char *passphrase;
  /* Master keys unlocked before, shared by the images opened with it
   * (see qcow2_key_cache_new), or NULL: every open unlocks.
   */
  struct qcow2_key_cache *key_cache;
  /* Serve this internal snapshot instead of the active disk, read-only:
   * an ID or a name, or "snapshot.id=ID,snapshot.name=NAME" (qemu-img
   * convert -l's argument); NULL: the active disk.
   */
  const char *snapshot;
};

/* What qcow2_log.debug receives. */
#define QCOW2_DEBUG_IMAGE 1u      /* opening: header, extensions, backing */
#define QCOW2_DEBUG_MAP   2u      /* each request: its clusters by kind */
#define QCOW2_DEBUG_POOL  4u      /* each batch: who ran its jobs */

#endif /* QCOW2_OPTIONS_H */
