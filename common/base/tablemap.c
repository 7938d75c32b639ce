/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: offset -> metadata table map. */

#include <config.h>

#include <stdlib.h>

#include "base/tablemap.h"

static size_t
home (uint64_t offset, size_t capacity)
{
  /* Offsets are cluster aligned: mix the high bits down. */
  uint64_t h = offset * UINT64_C (0x9e3779b97f4a7c15);
  return (h >> 32) & (capacity - 1);
}

static size_t
position (const struct tablemap *map, uint64_t offset)
{
  size_t pos = home (offset, map->capacity);

  while (map->slots[pos] && map->slots[pos]->offset != offset)
    pos = (pos + 1) & (map->capacity - 1);
  return pos;
}

struct meta_table *
tablemap_find (const struct tablemap *map, uint64_t offset)
{
  if (map->count == 0)
    return NULL;
  return map->slots[position (map, offset)];
}

static int
grow (struct tablemap *map)
{
  size_t new_capacity = map->capacity ? map->capacity * 2 : 16;
  struct meta_table **old = map->slots;
  size_t old_capacity = map->capacity, i;

  map->slots = calloc (new_capacity, sizeof *map->slots);
  if (map->slots == NULL) {
    map->slots = old;
    return -1;
  }
  map->capacity = new_capacity;
  for (i = 0; i < old_capacity; ++i)
    if (old[i])
      map->slots[position (map, old[i]->offset)] = old[i];
  free (old);
  return 0;
}

int
tablemap_insert (struct tablemap *map, struct meta_table *table)
{
  /* Keep the load at most 1/2 so probe runs stay short. */
  if ((map->count + 1) * 2 > map->capacity && grow (map) == -1)
    return -1;
  map->slots[position (map, table->offset)] = table;
  map->count++;
  return 0;
}

struct meta_table *
tablemap_remove (struct tablemap *map, uint64_t offset)
{
  size_t pos, next;
  struct meta_table *table;

  if (map->count == 0)
    return NULL;
  pos = position (map, offset);
  table = map->slots[pos];
  if (table == NULL)
    return NULL;
  map->slots[pos] = NULL;
  map->count--;
  /* Re-place the rest of the probe run so no lookup stops early. */
  next = (pos + 1) & (map->capacity - 1);
  while (map->slots[next]) {
    struct meta_table *moved = map->slots[next];
    map->slots[next] = NULL;
    map->slots[position (map, moved->offset)] = moved;
    next = (next + 1) & (map->capacity - 1);
  }
  return table;
}

int
tablemap_each (const struct tablemap *map,
               int (*fn) (void *opaque, struct meta_table *table),
               void *opaque)
{
  size_t i;
  int r;

  for (i = 0; i < map->capacity; ++i)
    if (map->slots[i] && (r = fn (opaque, map->slots[i])) != 0)
      return r;
  return 0;
}

void
tablemap_clear (struct tablemap *map)
{
  size_t i;

  for (i = 0; i < map->capacity; ++i)
    free (map->slots[i]);
  free (map->slots);
  map->slots = NULL;
  map->capacity = map->count = 0;
}
