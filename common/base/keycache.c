/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the key cache (see base/keycache.h). */

#include <config.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/keycache.h"
#include "base/lockorder.h"
#include "format/crypto.h"

#define KEY_CACHE_ENTRIES 16

struct key_entry {
  bool used;
  uint8_t digest[32];           /* sha256 (sha256 (area) || passphrase) */
  uint32_t key_bytes;
  uint8_t key[QCOW2_CRYPTO_MAX_KEY_BYTES];
};

struct qcow2_key_cache {
  struct qcow2_mutex lock;
  unsigned next;                /* the entry replaced next when full */
  struct key_entry entries[KEY_CACHE_ENTRIES];
};

struct qcow2_key_cache *
qcow2_key_cache_new (void)
{
  struct qcow2_key_cache *cache = calloc (1, sizeof *cache);

  if (cache)
    qcow2_mutex_init (&cache->lock, QCOW2_RANK_LEAF, "a key cache");
  return cache;
}

void
qcow2_key_cache_free (struct qcow2_key_cache *cache)
{
  if (cache == NULL)
    return;
  qcow2_wipe (cache->entries, sizeof cache->entries);
  qcow2_mutex_destroy (&cache->lock);
  free (cache);
}

void
qcow2_key_cache_digest (const uint8_t *area, size_t area_len, const char *passphrase,
              uint8_t *digest)
{
  uint8_t area_digest[32];
  char err[64];

  qcow2_hash2 (QCOW2_HASH_SHA256, area, area_len, NULL, 0, area_digest,
               err, sizeof err);
  qcow2_hash2 (QCOW2_HASH_SHA256, area_digest, sizeof area_digest,
               passphrase, strlen (passphrase), digest, err, sizeof err);
}

bool
qcow2_key_cache_get (struct qcow2_key_cache *cache, const uint8_t *digest,
           uint8_t *key, uint32_t key_bytes)
{
  bool found = false;
  unsigned i;

  qcow2_mutex_lock (&cache->lock);
  for (i = 0; i < KEY_CACHE_ENTRIES && !found; ++i) {
    struct key_entry *e = &cache->entries[i];
    if (e->used && e->key_bytes == key_bytes &&
        memcmp (e->digest, digest, sizeof e->digest) == 0) {
      memcpy (key, e->key, key_bytes);
      found = true;
    }
  }
  qcow2_mutex_unlock (&cache->lock);
  return found;
}

void
qcow2_key_cache_put_digest (struct qcow2_key_cache *cache, const uint8_t *digest,
           const uint8_t *key, uint32_t key_bytes)
{
  struct key_entry *e = NULL;
  unsigned i;

  qcow2_mutex_lock (&cache->lock);
  for (i = 0; i < KEY_CACHE_ENTRIES && e == NULL; ++i)
    if (!cache->entries[i].used ||
        memcmp (cache->entries[i].digest, digest, 32) == 0)
      e = &cache->entries[i];
  if (e == NULL) {
    e = &cache->entries[cache->next];
    cache->next = (cache->next + 1) % KEY_CACHE_ENTRIES;
  }
  e->used = true;
  memcpy (e->digest, digest, sizeof e->digest);
  e->key_bytes = key_bytes;
  memcpy (e->key, key, key_bytes);
  qcow2_mutex_unlock (&cache->lock);
}

void
qcow2_key_cache_put (struct qcow2_key_cache *cache, const uint8_t *area,
                     size_t area_len, const char *passphrase,
                     const uint8_t *master_key, uint32_t key_bytes)
{
  uint8_t digest[32];

  if (cache == NULL)
    return;
  qcow2_key_cache_digest (area, area_len, passphrase, digest);
  qcow2_key_cache_put_digest (cache, digest, master_key, key_bytes);
}
