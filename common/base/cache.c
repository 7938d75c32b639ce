/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: sharded CLOCK cache of fixed-size slots. */

#include <config.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/cache.h"
#include "base/lockorder.h"

#define MAX_SHARDS 16
#define EMPTY UINT32_MAX

struct shard {
  struct qcow2_mutex lock;
  uint32_t nslots;            /* capacity */
  uint32_t used;              /* slots filled so far, all below nslots */
  uint32_t hand;              /* CLOCK hand */
  uint32_t table_mask;        /* hash table size - 1 */
  uint32_t *table;            /* open addressing: slot index or EMPTY */
  uint64_t *keys;             /* per slot */
  uint8_t *referenced;        /* per slot: the CLOCK bit */
  uint8_t *data;              /* nslots * slot_size */
  uint64_t hits, misses, evictions;
} __attribute__ ((aligned (64)));

struct qcow2_cache {
  size_t slot_size;
  unsigned nshards;
  struct shard shards[MAX_SHARDS];
};

static inline uint64_t
mix (uint64_t key)
{
  /* splitmix64's finaliser: keys are offsets with many low zero bits. */
  key ^= key >> 30;
  key *= UINT64_C (0xbf58476d1ce4e5b9);
  key ^= key >> 27;
  key *= UINT64_C (0x94d049bb133111eb);
  key ^= key >> 31;
  return key;
}

static inline struct shard *
shard_of (struct qcow2_cache *cache, uint64_t key, uint64_t *hash)
{
  *hash = mix (key);
  return &cache->shards[(*hash >> 56) % cache->nshards];
}

struct qcow2_cache *
qcow2_cache_new (size_t slot_size, uint64_t total_bytes)
{
  struct qcow2_cache *cache;
  uint64_t total_slots = slot_size ? total_bytes / slot_size : 0;
  unsigned i;

  cache = calloc (1, sizeof *cache);
  if (cache == NULL)
    return NULL;
  cache->slot_size = slot_size;
  if (total_slots > UINT32_MAX / 4)
    total_slots = UINT32_MAX / 4;
  cache->nshards = total_slots < MAX_SHARDS ? 1 : MAX_SHARDS;
  if (total_slots == 0)
    cache->nshards = 1;

  for (i = 0; i < cache->nshards; ++i) {
    struct shard *s = &cache->shards[i];
    uint32_t table_size = 2;

    qcow2_mutex_init (&s->lock, QCOW2_RANK_CACHE, "a cache shard");
    s->nslots = total_slots / cache->nshards;
    if (s->nslots == 0)
      continue;
    while (table_size < 2 * s->nslots)
      table_size <<= 1;
    s->table_mask = table_size - 1;
    s->table = malloc (table_size * sizeof *s->table);
    s->keys = calloc (s->nslots, sizeof *s->keys);
    s->referenced = calloc (s->nslots, 1);
    s->data = malloc ((size_t) s->nslots * slot_size);
    if (!s->table || !s->keys || !s->referenced || !s->data) {
      qcow2_cache_free (cache);
      return NULL;
    }
    memset (s->table, 0xff, table_size * sizeof *s->table);
  }
  return cache;
}

void
qcow2_cache_free (struct qcow2_cache *cache)
{
  unsigned i;

  if (cache == NULL)
    return;
  for (i = 0; i < cache->nshards; ++i) {
    struct shard *s = &cache->shards[i];
    qcow2_mutex_destroy (&s->lock);
    free (s->table);
    free (s->keys);
    free (s->referenced);
    free (s->data);
  }
  free (cache);
}

/* Position in the hash table of KEY, or of the empty place where it
 * would go.
 */
static uint32_t
find (const struct shard *s, uint64_t key, uint64_t hash)
{
  uint32_t pos = hash & s->table_mask;

  while (s->table[pos] != EMPTY && s->keys[s->table[pos]] != key)
    pos = (pos + 1) & s->table_mask;
  return pos;
}

/* Remove the entry at POS by shifting later members of its probe run
 * back, so that lookups never need tombstones.
 */
static void
remove_at (struct shard *s, uint32_t pos)
{
  uint32_t next = pos;

  for (;;) {
    uint32_t home;

    next = (next + 1) & s->table_mask;
    if (s->table[next] == EMPTY)
      break;
    home = mix (s->keys[s->table[next]]) & s->table_mask;
    /* Leave the entry where it is if its home lies cyclically in
     * (pos, next]: moving it before its home would hide it.
     */
    if (pos <= next ? (pos < home && home <= next)
                    : (pos < home || home <= next))
      continue;
    s->table[pos] = s->table[next];
    pos = next;
  }
  s->table[pos] = EMPTY;
}

bool
qcow2_cache_get (struct qcow2_cache *cache, uint64_t key,
                 size_t offset, void *dst, size_t len)
{
  uint64_t hash;
  struct shard *s = shard_of (cache, key, &hash);
  uint32_t pos, slot;

  if (s->nslots == 0)
    return false;
  qcow2_mutex_lock (&s->lock);
  pos = find (s, key, hash);
  slot = s->table[pos];
  if (slot == EMPTY) {
    s->misses++;
    qcow2_mutex_unlock (&s->lock);
    return false;
  }
  s->referenced[slot] = 1;
  s->hits++;
  if (len)
    memcpy (dst, s->data + (size_t) slot * cache->slot_size + offset, len);
  qcow2_mutex_unlock (&s->lock);
  return true;
}

static void put_locked (struct qcow2_cache *cache, struct shard *s,
                        uint64_t key, uint64_t hash, const void *src);

void
qcow2_cache_put (struct qcow2_cache *cache, uint64_t key, const void *src)
{
  uint64_t hash;
  struct shard *s = shard_of (cache, key, &hash);

  if (s->nslots == 0)
    return;
  qcow2_mutex_lock (&s->lock);
  put_locked (cache, s, key, hash, src);
  qcow2_mutex_unlock (&s->lock);
}

void
qcow2_cache_put_if (struct qcow2_cache *cache, uint64_t key, const void *src,
                    const _Atomic uint64_t *generation, uint64_t expected)
{
  uint64_t hash;
  struct shard *s = shard_of (cache, key, &hash);

  if (s->nslots == 0)
    return;
  qcow2_mutex_lock (&s->lock);
  if (atomic_load (generation) == expected)
    put_locked (cache, s, key, hash, src);
  qcow2_mutex_unlock (&s->lock);
}

static void
put_locked (struct qcow2_cache *cache, struct shard *s,
            uint64_t key, uint64_t hash, const void *src)
{
  uint32_t pos, slot;

  pos = find (s, key, hash);
  slot = s->table[pos];
  if (slot == EMPTY) {
    if (s->used < s->nslots)
      slot = s->used++;
    else {
      while (s->referenced[s->hand]) {
        s->referenced[s->hand] = 0;
        s->hand = (s->hand + 1) % s->nslots;
      }
      slot = s->hand;
      s->hand = (s->hand + 1) % s->nslots;
      remove_at (s, find (s, s->keys[slot], mix (s->keys[slot])));
      s->evictions++;
      pos = find (s, key, hash);
    }
    s->keys[slot] = key;
    s->table[pos] = slot;
  }
  s->referenced[slot] = 0;
  memcpy (s->data + (size_t) slot * cache->slot_size, src, cache->slot_size);
}

void
qcow2_cache_drop (struct qcow2_cache *cache, uint64_t key)
{
  uint64_t hash;
  struct shard *s = shard_of (cache, key, &hash);
  uint32_t pos, slot;

  if (s->nslots == 0)
    return;
  qcow2_mutex_lock (&s->lock);
  pos = find (s, key, hash);
  slot = s->table[pos];
  if (slot != EMPTY) {
    remove_at (s, pos);
    /* Move the last filled slot into the hole so slots stay dense. */
    s->used--;
    if (slot != s->used) {
      uint32_t last = s->used;
      uint32_t last_pos = find (s, s->keys[last], mix (s->keys[last]));
      memcpy (s->data + (size_t) slot * cache->slot_size,
              s->data + (size_t) last * cache->slot_size, cache->slot_size);
      s->keys[slot] = s->keys[last];
      s->referenced[slot] = s->referenced[last];
      s->table[last_pos] = slot;
    }
    if (s->hand >= s->used)
      s->hand = 0;
  }
  qcow2_mutex_unlock (&s->lock);
}

void
qcow2_cache_get_stats (struct qcow2_cache *cache,
                       struct qcow2_cache_stats *stats)
{
  unsigned i;

  memset (stats, 0, sizeof *stats);
  for (i = 0; i < cache->nshards; ++i) {
    struct shard *s = &cache->shards[i];
    qcow2_mutex_lock (&s->lock);
    stats->hits += s->hits;
    stats->misses += s->misses;
    stats->evictions += s->evictions;
    stats->slots += s->nslots;
    stats->used += s->used;
    qcow2_mutex_unlock (&s->lock);
  }
}
