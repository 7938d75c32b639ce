/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: a map from host offsets to in-memory metadata tables.
 *
 * Holds the L2 tables that writes changed but that are not on disk yet,
 * and the refcount blocks.  Open addressing, grows by doubling; used only
 * under the image's metadata lock, so it has no lock of its own.
 */
#ifndef QCOW2_TABLEMAP_H
#define QCOW2_TABLEMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct meta_table {
  uint64_t offset;            /* host offset of the table's cluster */
  bool dirty;                 /* differs from what is on disk */
  uint8_t data[];             /* one cluster, as on disk (big-endian) */
};

struct tablemap {
  struct meta_table **slots;  /* NULL = empty */
  size_t capacity;            /* power of two, or 0 */
  size_t count;
};

/* The table at OFFSET, or NULL. */
struct meta_table *tablemap_find (const struct tablemap *map, uint64_t offset);

/* Add TABLE (its offset must not be in the map yet).  Returns 0, or -1
 * if memory runs out.
 */
int tablemap_insert (struct tablemap *map, struct meta_table *table);

/* Remove the table at OFFSET from the map and return it (NULL if none). */
struct meta_table *tablemap_remove (struct tablemap *map, uint64_t offset);

/* Call FN on every table, in no particular order.  FN must not change the
 * map.  Stops at the first nonzero return and returns it.
 */
int tablemap_each (const struct tablemap *map,
                   int (*fn) (void *opaque, struct meta_table *table),
                   void *opaque);

/* Free every table and the map's memory. */
void tablemap_clear (struct tablemap *map);

#endif /* QCOW2_TABLEMAP_H */
