/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: master keys unlocked before.
 *
 * A key cache (qcow2_key_cache_new, qcow2.h) remembers the master keys
 * of the LUKS areas unlocked with it, by a digest of the area and of the
 * passphrase, so that opening the same image again does not pay
 * PBKDF2's seconds again.  The digest hashes the area first, to a fixed
 * length, so that no two pairs run together.  Thread safe.
 *
 * Offers: qcow2_key_cache_new and _free (qcow2.h), the digest, get and
 * put.
 * Locks: the cache's own, a leaf, inside each call.
 * Needs: the hashes (format/crypto.h).
 */
#ifndef QCOW2_KEYCACHE_H
#define QCOW2_KEYCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct qcow2_key_cache;

struct qcow2_key_cache *qcow2_key_cache_new (void);
void qcow2_key_cache_free (struct qcow2_key_cache *cache);

/* The 32-byte digest that names the pair (AREA, PASSPHRASE). */
void qcow2_key_cache_digest (const uint8_t *area, size_t area_len,
                             const char *passphrase, uint8_t *digest);

/* The key of KEY_BYTES for DIGEST into KEY, if the cache has it. */
bool qcow2_key_cache_get (struct qcow2_key_cache *cache,
                          const uint8_t *digest, uint8_t *key,
                          uint32_t key_bytes);

/* Remember KEY for DIGEST (replacing the oldest entry when full). */
void qcow2_key_cache_put_digest (struct qcow2_key_cache *cache,
                                 const uint8_t *digest, const uint8_t *key,
                                 uint32_t key_bytes);

/* Remember MASTER_KEY (KEY_BYTES) for the LUKS area AREA (AREA_LEN bytes)
 * unlocked by PASSPHRASE, as a newly created image's.  CACHE NULL: does
 * nothing.
 */
void qcow2_key_cache_put (struct qcow2_key_cache *cache, const uint8_t *area,
                          size_t area_len, const char *passphrase,
                          const uint8_t *master_key, uint32_t key_bytes);

#endif /* QCOW2_KEYCACHE_H */
