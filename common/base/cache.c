/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: sharded CLOCK cache of fixed-size slots, with a
 * frequency sketch per shard for admission (base/cache.h).
 */

#include <config.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/cache.h"
#include "base/lockorder.h"

#define MAX_SHARDS 16
#define EMPTY UINT32_MAX

/* The frequency sketch: SKETCH_ROWS rows of counters, each key counted in
 * one counter per row (a count-min sketch), so a key's estimate is its
 * smallest counter.  Counters stop at 15: only "more often than the
 * victim" is asked, and small counters halve quickly.  Every
 * SKETCH_PERIOD accesses per slot all counters halve, so that what was
 * hot long ago loses its claim.
 */
#define SKETCH_ROWS 4
#define SKETCH_MAX 15
#define SKETCH_PERIOD 10

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
  uint8_t *sketch;            /* SKETCH_ROWS rows of sketch_mask + 1;
                                 * NULL: the cache does not admit */
  uint32_t sketch_mask;
  uint64_t accesses;          /* counted since the last halving */
  uint64_t hits, misses, evictions, refused;
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

static struct qcow2_cache *
cache_new (size_t slot_size, uint64_t total_bytes, bool admitting)
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
    /* Four to eight counters per row for each slot: over one period
     * (SKETCH_PERIOD accesses per slot) the other keys then add about
     * two to a counter, and the least of four rows less.
     */
    if (admitting) {
      s->sketch_mask = 2 * table_size - 1;
      s->sketch = calloc ((size_t) SKETCH_ROWS * 2 * table_size, 1);
    }
    if (!s->table || !s->keys || !s->referenced || !s->data ||
        (admitting && !s->sketch)) {
      qcow2_cache_free (cache);
      return NULL;
    }
    memset (s->table, 0xff, table_size * sizeof *s->table);
  }
  return cache;
}

struct qcow2_cache *
qcow2_cache_new (size_t slot_size, uint64_t total_bytes)
{
  return cache_new (slot_size, total_bytes, false);
}

struct qcow2_cache *
qcow2_cache_new_admitting (size_t slot_size, uint64_t total_bytes)
{
  return cache_new (slot_size, total_bytes, true);
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
    free (s->sketch);
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

/* The counter of row ROW for the key of HASH. */
static inline uint8_t *
sketch_counter (const struct shard *s, uint64_t hash, unsigned row)
{
  uint64_t h = mix (hash + (row + 1) * UINT64_C (0x9e3779b97f4a7c15));

  return &s->sketch[(size_t) row * (s->sketch_mask + 1) +
                    (h & s->sketch_mask)];
}

static unsigned
sketch_estimate (const struct shard *s, uint64_t hash)
{
  unsigned row, least = SKETCH_MAX;

  for (row = 0; row < SKETCH_ROWS; ++row) {
    unsigned c = *sketch_counter (s, hash, row);
    if (c < least)
      least = c;
  }
  return least;
}

static void
sketch_count (struct shard *s, uint64_t hash)
{
  unsigned row;

  for (row = 0; row < SKETCH_ROWS; ++row) {
    uint8_t *c = sketch_counter (s, hash, row);
    if (*c < SKETCH_MAX)
      ++*c;
  }
  if (++s->accesses >= (uint64_t) SKETCH_PERIOD * s->nslots) {
    size_t i, n = (size_t) SKETCH_ROWS * (s->sketch_mask + 1);

    for (i = 0; i < n; ++i)
      s->sketch[i] >>= 1;
    s->accesses = 0;
  }
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
  if (len && s->sketch)
    sketch_count (s, hash);
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

static bool put_locked (struct qcow2_cache *cache, struct shard *s,
                        uint64_t key, uint64_t hash, const void *src,
                        bool admit_by_frequency);

void
qcow2_cache_put (struct qcow2_cache *cache, uint64_t key, const void *src)
{
  uint64_t hash;
  struct shard *s = shard_of (cache, key, &hash);

  if (s->nslots == 0)
    return;
  qcow2_mutex_lock (&s->lock);
  put_locked (cache, s, key, hash, src, false);
  qcow2_mutex_unlock (&s->lock);
}

bool
qcow2_cache_offer (struct qcow2_cache *cache, uint64_t key, const void *src)
{
  uint64_t hash;
  struct shard *s = shard_of (cache, key, &hash);
  bool stored;

  if (s->nslots == 0)
    return false;
  qcow2_mutex_lock (&s->lock);
  stored = put_locked (cache, s, key, hash, src, true);
  qcow2_mutex_unlock (&s->lock);
  return stored;
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
    put_locked (cache, s, key, hash, src, false);
  qcow2_mutex_unlock (&s->lock);
}

/* Store KEY, evicting CLOCK's choice if the shard is full; with
 * ADMIT_BY_FREQUENCY and a sketch, only if KEY beats that choice in it.  A
 * refused key leaves the hand on the victim, which the next offer then
 * faces again: the coldest key found so far stays the one to beat.
 */
static bool
put_locked (struct qcow2_cache *cache, struct shard *s,
            uint64_t key, uint64_t hash, const void *src,
            bool admit_by_frequency)
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
      if (admit_by_frequency && s->sketch &&
          sketch_estimate (s, hash) <=
          sketch_estimate (s, mix (s->keys[slot]))) {
        s->refused++;
        return false;
      }
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
  return true;
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
    stats->refused += s->refused;
    stats->slots += s->nslots;
    stats->used += s->used;
    qcow2_mutex_unlock (&s->lock);
  }
}
