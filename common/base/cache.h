/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: a bounded cache of fixed-size slots keyed by u64.
 *
 * Used for L2 tables (key: host offset of the table) and for decompressed
 * clusters (key: the compressed cluster's L2 descriptor).  All memory is
 * reserved at creation; get, put and offer never allocate.  The cache is
 * split into shards, each with its own lock, so that lookups from many
 * threads do not queue on one mutex.  Eviction is CLOCK (second chance)
 * per shard.  A cache of size 0 holds nothing: get always misses, put
 * and offer do nothing.
 *
 * Admission (only in a cache made by qcow2_cache_new_admitting).  A put
 * always stores.  An offer stores a new key into a full shard only if the
 * key was asked for more often lately than the key CLOCK would evict for
 * it, as counted by a frequency sketch per shard (four rows of counters
 * that stop at 15, halved every ten accesses per slot, so that "lately"
 * means the last few times the cache's size).  Readers who miss offer
 * what they decoded: a working set a little larger than the cache then
 * keeps most of it cached instead of cycling it out (CLOCK alone hits
 * nothing on a loop one slot larger than the cache), and a scan of cold
 * keys does not push out the hot ones.
 */
#ifndef QCOW2_CACHE_H
#define QCOW2_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct qcow2_cache;

struct qcow2_cache_stats {
  uint64_t hits;
  uint64_t misses;
  uint64_t evictions;
  uint64_t refused;           /* offers not admitted */
  uint64_t slots;             /* capacity in slots */
  uint64_t used;              /* slots holding data */
};

/* A cache of at most TOTAL_BYTES of slots of SLOT_SIZE bytes each
 * (rounded down to whole slots).  Returns NULL if memory runs out.
 */
struct qcow2_cache *qcow2_cache_new (size_t slot_size, uint64_t total_bytes);

/* The same, with a frequency sketch for offers (see Admission above).  In
 * a cache made by qcow2_cache_new, gets count nothing and an offer stores
 * as a put does.
 */
struct qcow2_cache *qcow2_cache_new_admitting (size_t slot_size,
                                               uint64_t total_bytes);
void qcow2_cache_free (struct qcow2_cache *cache);

/* If KEY is cached, copy LEN bytes from OFFSET inside its slot to DST
 * and return true.  OFFSET + LEN must not exceed the slot size.  In an
 * admitting cache, a get with LEN > 0 counts as an access of KEY, hit or
 * miss; a get with LEN 0 only asks whether KEY is cached.
 */
bool qcow2_cache_get (struct qcow2_cache *cache, uint64_t key,
                      size_t offset, void *dst, size_t len);

/* Store a whole slot (SLOT_SIZE bytes from SRC) under KEY, replacing
 * what KEY held and evicting another key if the shard is full.
 */
void qcow2_cache_put (struct qcow2_cache *cache, uint64_t key,
                      const void *src);

/* Like qcow2_cache_put, but a key not cached yet goes into a full shard
 * only if it was accessed more often lately than the key it would evict
 * (see Admission above).  Returns whether KEY is now cached.
 */
bool qcow2_cache_offer (struct qcow2_cache *cache, uint64_t key,
                        const void *src);

/* Like qcow2_cache_put, but only if *GENERATION still equals EXPECTED,
 * checked under the shard's lock.  A writer that bumps the generation
 * and then drops a key cannot be overtaken: the drop waits for the lock.
 */
void qcow2_cache_put_if (struct qcow2_cache *cache, uint64_t key,
                         const void *src, const _Atomic uint64_t *generation,
                         uint64_t expected);

/* Forget KEY if it is cached. */
void qcow2_cache_drop (struct qcow2_cache *cache, uint64_t key);

void qcow2_cache_get_stats (struct qcow2_cache *cache,
                            struct qcow2_cache_stats *stats);

#endif /* QCOW2_CACHE_H */
