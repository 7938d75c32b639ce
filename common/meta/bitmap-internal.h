/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the persistent bitmaps' state, for meta/bitmap.c and
 * meta/bitmap-store.c only (everyone else: meta/bitmap.h).
 */
#ifndef QCOW2_BITMAP_INTERNAL_H
#define QCOW2_BITMAP_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/lockorder.h"
#include "meta/image.h"

/* Directory entries (qcow2.txt "Bitmap directory"). */
#define ENTRY_FIXED_BYTES 24
#define FLAG_IN_USE       (UINT32_C (1) << 0)
#define FLAG_AUTO         (UINT32_C (1) << 1)
#define FLAGS_KNOWN       (FLAG_IN_USE | FLAG_AUTO)
#define TYPE_DIRTY_TRACKING 1

/* Bitmap table entries. */
#define TABLE_RESERVED    UINT64_C (0xff000000000001fe)
#define TABLE_OFFSET      UINT64_C (0x00fffffffffffe00)
#define TABLE_ALL_ONES    UINT64_C (1)

/* qemu's limits (block/qcow2-bitmap.c, block/qcow2.h): what it refuses
 * to open, and so what cannot be kept.
 */
#define MAX_BITMAPS            65535
#define MAX_DIRECTORY_BYTES    (UINT64_C (1024) * MAX_BITMAPS)
#define MAX_NAME_BYTES         1023
#define MIN_GRANULARITY_BITS   9
#define MAX_GRANULARITY_BITS   31
#define MAX_TABLE_ENTRIES      UINT32_C (0x8000000)
#define MAX_BITMAP_BYTES       (UINT64_C (512) << 20)

struct bitmap {
  char *name;                 /* NUL-terminated copy, for messages */
  uint64_t entry_pos;         /* of its directory entry, in the directory */
  uint32_t flags;
  unsigned granularity_bits;
  uint64_t table_offset;
  uint32_t table_size;        /* entries */
  uint64_t *table;            /* host order */
  /* Tracked bitmaps only (enabled and consistent when opened). */
  bool tracked;
  uint8_t *bits;              /* table_size clusters */
  uint64_t nbits;             /* bits that cover the disk */
  uint8_t *changed;           /* per data cluster: set since last stored */
};

struct qcow2_bitmaps {
  /* One store at a time, taken with no other lock held. */
  struct qcow2_mutex store_lock;
  /* The tracked bitmaps' bits and changed flags: a leaf. */
  struct qcow2_mutex bits_lock;
  bool kept;                  /* kept valid: autoclear bit 0 stays */
  uint64_t dir_offset, dir_size;
  uint32_t count;
  struct bitmap *bitmaps;
  unsigned ntracked;
  /* The tracked bitmaps are in_use on disk: the first change ran since
   * the image opened or was last closed clean.  Written under the image
   * lock by the first change, read and cleared by the store.
   */
  atomic_bool in_use_on_disk;
};

static inline uint64_t
clusters_for (const struct qcow2_image *img, uint64_t bytes)
{
  return (bytes + img->header.cluster_size - 1) >> img->header.cluster_bits;
}

/* Write the 4-byte flags of BM's directory entry (FLAGS), in place. */
int qcow2_bitmap_write_flags (struct qcow2_image *img, struct qcow2_io *io,
                              const struct bitmap *bm, uint32_t flags);

#endif /* QCOW2_BITMAP_INTERNAL_H */
