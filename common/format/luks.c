/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: LUKS1 headers: parse, unlock, create.
 *
 * The on-disk format is cryptsetup's LUKS1 ("LUKS On-Disk Format
 * Specification" 1.2), as qemu's crypto/block-luks.c writes it inside
 * qcow2: big-endian, 592 bytes of header, then each key slot's
 * anti-forensic split master key, encrypted with a key derived from the
 * passphrase, at the slot's sector offset.
 */

#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/crypto.h"
#include "format/endian.h"
#include "format/errbuf.h"
#include "format/luks.h"

static const uint8_t luks_magic[6] = { 'L', 'U', 'K', 'S', 0xba, 0xbe };

/* Byte offsets in the header. */
enum {
  OFF_MAGIC = 0, OFF_VERSION = 6, OFF_CIPHER_NAME = 8, OFF_CIPHER_MODE = 40,
  OFF_HASH_SPEC = 72, OFF_PAYLOAD_OFFSET = 104, OFF_KEY_BYTES = 108,
  OFF_MK_DIGEST = 112, OFF_MK_SALT = 132, OFF_MK_ITERATIONS = 164,
  OFF_UUID = 168, OFF_SLOTS = 208,
  SLOT_BYTES = 48,
  SLOT_ACTIVE = 0, SLOT_ITERATIONS = 4, SLOT_SALT = 8, SLOT_KEY_OFFSET = 40,
  SLOT_STRIPES = 44,
  STRING_BYTES = 32, UUID_BYTES = 40,
};

#define SLOT_STATE_ACTIVE 0x00ac71f3u
#define SLOT_STATE_INACTIVE 0x0000deadu

#define SECTOR QCOW2_CRYPTO_SECTOR_SIZE

/* The header and the slot table take the first 4 KiB; each slot's
 * material is rounded up to 4 KiB as well (cryptsetup's layout, which
 * qemu copies and checks).
 */
#define HEADER_SECTORS 8u

#define MIN_ITERATIONS 1000u

static uint64_t
div_round_up (uint64_t n, uint64_t d)
{
  return (n + d - 1) / d;
}

/* Sectors of the material of a slot with STRIPES stripes of KEY_BYTES. */
static uint64_t
slot_sectors (uint32_t key_bytes, uint32_t stripes)
{
  uint64_t sectors = div_round_up ((uint64_t) key_bytes * stripes, SECTOR);
  return div_round_up (sectors, HEADER_SECTORS) * HEADER_SECTORS;
}

/* Copy a fixed-size field that must hold a NUL-terminated string. */
static int
get_string (const uint8_t *field, size_t field_len, char *out,
            const char *what, char *errbuf, size_t errlen)
{
  const uint8_t *nul = memchr (field, '\0', field_len);

  if (nul == NULL)
    return qcow2_fail (errbuf, errlen,
                       "LUKS header: %s is not terminated within its %zu "
                       "bytes", what, field_len);
  memcpy (out, field, nul - field + 1);
  return 0;
}

int
qcow2_luks_parse (const uint8_t *area, size_t area_len,
                  struct qcow2_luks_header *h, char *errbuf, size_t errlen)
{
  uint16_t version;

  memset (h, 0, sizeof *h);
  if (area_len < QCOW2_LUKS_HEADER_BYTES)
    return qcow2_fail (errbuf, errlen,
                       "LUKS header: the encryption header is %zu bytes, too "
                       "short for a LUKS header (%d bytes)",
                       area_len, QCOW2_LUKS_HEADER_BYTES);
  if (memcmp (area + OFF_MAGIC, luks_magic, sizeof luks_magic) != 0)
    return qcow2_fail (errbuf, errlen,
                       "LUKS header: magic: the encryption header does not "
                       "start with the LUKS magic");
  version = (uint16_t) area[OFF_VERSION] << 8 | area[OFF_VERSION + 1];
  if (version != 1)
    return qcow2_fail (errbuf, errlen,
                       "LUKS header: version: LUKS version %u is not "
                       "supported (only LUKS1, which qemu writes)", version);

  if (get_string (area + OFF_CIPHER_NAME, STRING_BYTES, h->cipher_name,
                  "cipher_name", errbuf, errlen) == -1 ||
      get_string (area + OFF_CIPHER_MODE, STRING_BYTES, h->cipher_mode,
                  "cipher_mode", errbuf, errlen) == -1 ||
      get_string (area + OFF_HASH_SPEC, STRING_BYTES, h->hash_spec,
                  "hash_spec", errbuf, errlen) == -1)
    return -1;
  /* Informational only: keep whatever it holds up to the field's end. */
  memcpy (h->uuid, area + OFF_UUID, UUID_BYTES);
  h->uuid[UUID_BYTES] = '\0';

  h->payload_offset = be32 (area + OFF_PAYLOAD_OFFSET);
  h->key_bytes = be32 (area + OFF_KEY_BYTES);
  memcpy (h->mk_digest, area + OFF_MK_DIGEST, QCOW2_LUKS_DIGEST_BYTES);
  memcpy (h->mk_salt, area + OFF_MK_SALT, QCOW2_LUKS_SALT_BYTES);
  h->mk_iterations = be32 (area + OFF_MK_ITERATIONS);

  if (h->key_bytes == 0 || h->key_bytes > QCOW2_CRYPTO_MAX_KEY_BYTES)
    return qcow2_fail (errbuf, errlen,
                       "LUKS header: key_bytes: a master key of %" PRIu32 " "
                       "bytes is not possible (1 to %d)",
                       h->key_bytes, QCOW2_CRYPTO_MAX_KEY_BYTES);
  if (qcow2_cipher_spec_parse (h->cipher_name, h->cipher_mode, h->key_bytes,
                               &h->spec, errbuf, errlen) == -1)
    return -1;
  if (qcow2_hash_parse (h->hash_spec, &h->hash) == -1)
    return qcow2_fail (errbuf, errlen,
                       "LUKS header: hash_spec: the hash \"%s\" is not "
                       "supported (md5, sha1, sha224, sha256, sha384, sha512 "
                       "and ripemd160 are)", h->hash_spec);
  if (h->mk_iterations == 0)
    return qcow2_fail (errbuf, errlen,
                       "LUKS header: master key iterations is 0 (PBKDF2 "
                       "needs at least 1)");

  for (int i = 0; i < QCOW2_LUKS_SLOTS; ++i) {
    const uint8_t *p = area + OFF_SLOTS + i * SLOT_BYTES;
    struct qcow2_luks_slot *s = &h->slots[i];
    uint32_t state = be32 (p + SLOT_ACTIVE);

    if (state != SLOT_STATE_ACTIVE && state != SLOT_STATE_INACTIVE)
      return qcow2_fail (errbuf, errlen,
                         "LUKS header: key slot %d: state 0x%08" PRIx32 " is "
                         "neither active (0x%08x) nor inactive (0x%08x)",
                         i, state, SLOT_STATE_ACTIVE, SLOT_STATE_INACTIVE);
    s->active = state == SLOT_STATE_ACTIVE;
    s->iterations = be32 (p + SLOT_ITERATIONS);
    memcpy (s->salt, p + SLOT_SALT, QCOW2_LUKS_SALT_BYTES);
    s->key_offset = be32 (p + SLOT_KEY_OFFSET);
    s->stripes = be32 (p + SLOT_STRIPES);
    h->active_slots += s->active;
  }

  /* qemu's checks, on every slot whether active or not. */
  for (int i = 0; i < QCOW2_LUKS_SLOTS; ++i) {
    const struct qcow2_luks_slot *s = &h->slots[i];
    uint64_t start = s->key_offset;
    uint64_t len = slot_sectors (h->key_bytes, s->stripes);

    if (s->stripes == 0)
      return qcow2_fail (errbuf, errlen,
                         "LUKS header: key slot %d: stripes is 0", i);
    if (start * SECTOR < QCOW2_LUKS_HEADER_BYTES)
      return qcow2_fail (errbuf, errlen,
                         "LUKS header: key slot %d: its key material (sector "
                         "%" PRIu64 ") overlaps the LUKS header", i, start);
    if (start + len > h->payload_offset)
      return qcow2_fail (errbuf, errlen,
                         "LUKS header: key slot %d: its key material "
                         "(sectors %" PRIu64 " to %" PRIu64 ") overlaps the "
                         "payload, which starts at sector %" PRIu32,
                         i, start, start + len - 1, h->payload_offset);
    for (int j = i + 1; j < QCOW2_LUKS_SLOTS; ++j) {
      uint64_t start2 = h->slots[j].key_offset;
      uint64_t len2 = slot_sectors (h->key_bytes, h->slots[j].stripes);
      if (start < start2 + len2 && start2 < start + len)
        return qcow2_fail (errbuf, errlen,
                           "LUKS header: key slots %d and %d: their key "
                           "material overlaps", i, j);
    }
    if (!s->active)
      continue;
    if (s->iterations == 0)
      return qcow2_fail (errbuf, errlen,
                         "LUKS header: key slot %d: iterations is 0 (PBKDF2 "
                         "needs at least 1)", i);
    /* The material is decrypted in whole sectors. */
    if (start * SECTOR +
        div_round_up ((uint64_t) h->key_bytes * s->stripes, SECTOR) * SECTOR
        > area_len)
      return qcow2_fail (errbuf, errlen,
                         "LUKS header: key slot %d: its key material (%"
                         PRIu32 " stripes of %" PRIu32 " bytes at sector %"
                         PRIu64 ") runs past the end of the encryption "
                         "header (%zu bytes)",
                         i, s->stripes, h->key_bytes, start, area_len);
  }
  return 0;
}

/* ---------------------------------------------------------------- AF */

/* The AF splitter's diffusion: hash BLOCK in digest-sized pieces, each
 * prefixed by its big-endian index, the last piece truncated.
 */
static int
af_diffuse (enum qcow2_hash hash, uint8_t *block, size_t len,
            char *errbuf, size_t errlen)
{
  size_t digest = qcow2_hash_digest_bytes (hash);
  uint8_t out[QCOW2_CRYPTO_MAX_DIGEST_BYTES];

  for (size_t i = 0, off = 0; off < len; ++i, off += digest) {
    size_t piece = len - off < digest ? len - off : digest;
    uint8_t index[4];
    put_be32 (index, i);
    if (qcow2_hash2 (hash, index, sizeof index, block + off, piece, out,
                     errbuf, errlen) == -1)
      return -1;
    memcpy (block + off, out, piece);
  }
  qcow2_wipe (out, sizeof out);
  return 0;
}

static void
xor_into (uint8_t *dst, const uint8_t *src, size_t len)
{
  for (size_t i = 0; i < len; ++i)
    dst[i] ^= src[i];
}

/* Merge STRIPES stripes of LEN bytes at SPLIT into OUT. */
static int
af_merge (enum qcow2_hash hash, const uint8_t *split, size_t len,
          uint32_t stripes, uint8_t *out, char *errbuf, size_t errlen)
{
  memset (out, 0, len);
  for (uint32_t i = 0; i + 1 < stripes; ++i) {
    xor_into (out, split + (size_t) i * len, len);
    if (af_diffuse (hash, out, len, errbuf, errlen) == -1)
      return -1;
  }
  xor_into (out, split + (size_t) (stripes - 1) * len, len);
  return 0;
}

/* Split IN (LEN bytes) into STRIPES stripes at SPLIT: all but the last
 * random, the last chosen so that af_merge gives IN back.
 */
static int
af_split (enum qcow2_hash hash, const uint8_t *in, size_t len,
          uint32_t stripes, uint8_t *split, char *errbuf, size_t errlen)
{
  uint8_t block[QCOW2_CRYPTO_MAX_KEY_BYTES] = { 0 };
  uint8_t *last = split + (size_t) (stripes - 1) * len;

  if (qcow2_random_bytes (split, (size_t) (stripes - 1) * len,
                          errbuf, errlen) == -1)
    return -1;
  for (uint32_t i = 0; i + 1 < stripes; ++i) {
    xor_into (block, split + (size_t) i * len, len);
    if (af_diffuse (hash, block, len, errbuf, errlen) == -1)
      return -1;
  }
  memcpy (last, in, len);
  xor_into (last, block, len);
  qcow2_wipe (block, sizeof block);
  return 0;
}

/* ---------------------------------------------------------------- unlock */

/* Try one active slot.  Returns 1 with the key in MASTER_KEY if PASS opens
 * it, 0 if not, -1 on error.
 */
static int
try_slot (const struct qcow2_luks_header *h, const struct qcow2_luks_slot *s,
          const uint8_t *area, const char *pass, size_t pass_len,
          uint8_t *master_key, char *errbuf, size_t errlen)
{
  size_t split_len = (size_t) h->key_bytes * s->stripes;
  size_t padded = div_round_up (split_len, SECTOR) * SECTOR;
  uint8_t slot_key[QCOW2_CRYPTO_MAX_KEY_BYTES];
  uint8_t candidate[QCOW2_CRYPTO_MAX_KEY_BYTES];
  uint8_t digest[QCOW2_LUKS_DIGEST_BYTES];
  struct qcow2_sector_cipher *cipher = NULL;
  uint8_t *split;
  int ret = -1;

  split = malloc (padded);
  if (split == NULL)
    return qcow2_fail (errbuf, errlen,
                       "out of memory for %zu bytes of LUKS key material",
                       padded);
  memcpy (split, area + (size_t) s->key_offset * SECTOR, padded);

  if (qcow2_pbkdf2 (h->hash, (const uint8_t *) pass, pass_len, s->salt,
                    sizeof s->salt, s->iterations, slot_key, h->key_bytes,
                    errbuf, errlen) == -1)
    goto out;
  /* The material is encrypted like payload, its first sector numbered 0. */
  cipher = qcow2_sector_cipher_new (&h->spec, slot_key, errbuf, errlen);
  if (cipher == NULL ||
      qcow2_sectors_decrypt (cipher, 0, split, padded, errbuf, errlen) == -1 ||
      af_merge (h->hash, split, h->key_bytes, s->stripes, candidate,
                errbuf, errlen) == -1 ||
      qcow2_pbkdf2 (h->hash, candidate, h->key_bytes, h->mk_salt,
                    sizeof h->mk_salt, h->mk_iterations, digest,
                    sizeof digest, errbuf, errlen) == -1)
    goto out;

  /* A mismatch says "wrong passphrase" and nothing about where. */
  uint8_t diff = 0;
  for (size_t i = 0; i < sizeof digest; ++i)
    diff |= digest[i] ^ h->mk_digest[i];
  ret = diff == 0;
  if (ret == 1)
    memcpy (master_key, candidate, h->key_bytes);

 out:
  qcow2_sector_cipher_free (cipher);
  qcow2_wipe (split, padded);
  free (split);
  qcow2_wipe (slot_key, sizeof slot_key);
  qcow2_wipe (candidate, sizeof candidate);
  return ret;
}

int
qcow2_luks_unlock (const struct qcow2_luks_header *h,
                   const uint8_t *area, size_t area_len,
                   const char *pass, size_t pass_len,
                   uint8_t *master_key, int *slot,
                   char *errbuf, size_t errlen)
{
  if (h->active_slots == 0)
    return qcow2_fail (errbuf, errlen,
                       "the LUKS header has no active key slot: no "
                       "passphrase can unlock this image");

  for (int i = 0; i < QCOW2_LUKS_SLOTS; ++i) {
    if (!h->slots[i].active)
      continue;
    int r = try_slot (h, &h->slots[i], area, pass, pass_len, master_key,
                      errbuf, errlen);
    if (r == -1)
      return -1;
    if (r == 1) {
      if (slot)
        *slot = i;
      return 0;
    }
  }
  qcow2_fail (errbuf, errlen,
              "wrong passphrase: it unlocks none of the image's %u active "
              "LUKS key slot%s",
              h->active_slots, h->active_slots == 1 ? "" : "s");
  return QCOW2_LUKS_WRONG_PASSPHRASE;
}

/* ---------------------------------------------------------------- create */

/* qemu's tuning: iterations for TIME_MS of CPU at the measured rate,
 * divided by DIVISOR, at least 1000.
 */
static int
tuned_iterations (enum qcow2_hash hash, size_t pass_len, size_t out_len,
                  uint32_t time_ms, uint32_t divisor, uint32_t *iterations,
                  char *errbuf, size_t errlen)
{
  uint64_t per_second, n;
  uint32_t measure_ms = time_ms < 250 ? time_ms : 250;

  if (qcow2_pbkdf2_rate (hash, pass_len, QCOW2_LUKS_SALT_BYTES, out_len,
                         measure_ms, &per_second, errbuf, errlen) == -1)
    return -1;
  n = per_second * time_ms / 1000 / divisor;
  if (n > UINT32_MAX)
    return qcow2_fail (errbuf, errlen,
                       "PBKDF2 iterations for %" PRIu32 " ms (%" PRIu64 ") "
                       "do not fit the LUKS header's 32 bits: choose a "
                       "shorter time", time_ms, n);
  *iterations = n < MIN_ITERATIONS ? MIN_ITERATIONS : n;
  return 0;
}

/* A random version 4 UUID in its 36-character text form. */
static int
random_uuid (char *out, char *errbuf, size_t errlen)
{
  uint8_t u[16];

  if (qcow2_random_bytes (u, sizeof u, errbuf, errlen) == -1)
    return -1;
  u[6] = (u[6] & 0x0f) | 0x40;
  u[8] = (u[8] & 0x3f) | 0x80;
  snprintf (out, 37,
            "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
            "%02x%02x%02x%02x%02x%02x",
            u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9],
            u[10], u[11], u[12], u[13], u[14], u[15]);
  return 0;
}

int
qcow2_luks_create (const struct qcow2_luks_create_params *params,
                   const char *pass, size_t pass_len,
                   uint8_t **area_ret, size_t *area_len_ret,
                   uint8_t *master_key, char *errbuf, size_t errlen)
{
  struct qcow2_cipher_spec spec;
  enum qcow2_hash hash = params->hash_set ? params->hash : QCOW2_HASH_SHA256;
  uint32_t iter_time = params->iter_time_ms ? params->iter_time_ms
                                            : QCOW2_LUKS_DEFAULT_ITER_TIME_MS;
  uint32_t stripes = params->stripes ? params->stripes : QCOW2_LUKS_STRIPES;
  uint32_t mk_iterations = params->mk_iterations;
  uint32_t slot_iterations = params->slot_iterations;
  uint8_t mk[QCOW2_CRYPTO_MAX_KEY_BYTES];
  uint8_t slot_key[QCOW2_CRYPTO_MAX_KEY_BYTES];
  char name[33], mode[33], uuid[37], described[80];
  struct qcow2_sector_cipher *cipher = NULL;
  uint8_t *area = NULL, *slot0;
  uint64_t sectors, payload, split_len;
  size_t area_len;
  int ret = -1;

  if (params->spec_set)
    spec = params->spec;
  else if (qcow2_cipher_spec_parse ("aes", "xts-plain64", 64, &spec,
                                    errbuf, errlen) == -1)
    return -1;
  qcow2_cipher_spec_describe (&spec, described, sizeof described);

  split_len = (uint64_t) spec.key_bytes * stripes;
  if (split_len % SECTOR != 0)
    return qcow2_fail (errbuf, errlen,
                       "LUKS cipher %s: its key material (%" PRIu32 " "
                       "stripes of %" PRIu32 " bytes) is not a whole number "
                       "of 512-byte sectors, and qemu cannot open such "
                       "images: choose another key size",
                       described, stripes, spec.key_bytes);
  sectors = slot_sectors (spec.key_bytes, stripes);
  payload = HEADER_SECTORS + sectors * QCOW2_LUKS_SLOTS;
  if (payload > UINT32_MAX || payload * SECTOR > SIZE_MAX)
    return qcow2_fail (errbuf, errlen,
                       "LUKS header: %" PRIu32 " stripes do not fit in a "
                       "LUKS header", stripes);
  area_len = payload * SECTOR;

  qcow2_cipher_spec_strings (&spec, name, sizeof name, mode, sizeof mode);
  area = calloc (1, area_len);
  if (area == NULL)
    return qcow2_fail (errbuf, errlen,
                       "out of memory for a LUKS header of %zu bytes",
                       area_len);

  if (qcow2_random_bytes (mk, spec.key_bytes, errbuf, errlen) == -1 ||
      random_uuid (uuid, errbuf, errlen) == -1)
    goto out;

  memcpy (area + OFF_MAGIC, luks_magic, sizeof luks_magic);
  area[OFF_VERSION + 1] = 1;
  strcpy ((char *) area + OFF_CIPHER_NAME, name);
  strcpy ((char *) area + OFF_CIPHER_MODE, mode);
  strcpy ((char *) area + OFF_HASH_SPEC, qcow2_hash_name (hash));
  put_be32 (area + OFF_PAYLOAD_OFFSET, payload);
  put_be32 (area + OFF_KEY_BYTES, spec.key_bytes);
  memcpy (area + OFF_UUID, uuid, 36);

  /* The master key digest, which tells a right passphrase from a wrong
   * one.
   */
  if (qcow2_random_bytes (area + OFF_MK_SALT, QCOW2_LUKS_SALT_BYTES,
                          errbuf, errlen) == -1)
    goto out;
  if (mk_iterations == 0 &&
      tuned_iterations (hash, spec.key_bytes, QCOW2_LUKS_DIGEST_BYTES,
                        iter_time, 8, &mk_iterations, errbuf, errlen) == -1)
    goto out;
  put_be32 (area + OFF_MK_ITERATIONS, mk_iterations);
  if (qcow2_pbkdf2 (hash, mk, spec.key_bytes, area + OFF_MK_SALT,
                    QCOW2_LUKS_SALT_BYTES, mk_iterations,
                    area + OFF_MK_DIGEST, QCOW2_LUKS_DIGEST_BYTES,
                    errbuf, errlen) == -1)
    goto out;

  /* Every slot gets its place; only slot 0 holds a key. */
  for (int i = 0; i < QCOW2_LUKS_SLOTS; ++i) {
    uint8_t *p = area + OFF_SLOTS + i * SLOT_BYTES;
    put_be32 (p + SLOT_ACTIVE,
              i == 0 ? SLOT_STATE_ACTIVE : SLOT_STATE_INACTIVE);
    put_be32 (p + SLOT_KEY_OFFSET, HEADER_SECTORS + i * sectors);
    put_be32 (p + SLOT_STRIPES, stripes);
  }
  slot0 = area + OFF_SLOTS;
  if (qcow2_random_bytes (slot0 + SLOT_SALT, QCOW2_LUKS_SALT_BYTES,
                          errbuf, errlen) == -1)
    goto out;
  if (slot_iterations == 0 &&
      tuned_iterations (hash, pass_len, spec.key_bytes, iter_time, 1,
                        &slot_iterations, errbuf, errlen) == -1)
    goto out;
  put_be32 (slot0 + SLOT_ITERATIONS, slot_iterations);

  /* The split master key, encrypted under the passphrase's key. */
  uint8_t *material = area + (size_t) HEADER_SECTORS * SECTOR;
  if (qcow2_pbkdf2 (hash, (const uint8_t *) pass, pass_len, slot0 + SLOT_SALT,
                    QCOW2_LUKS_SALT_BYTES, slot_iterations, slot_key,
                    spec.key_bytes, errbuf, errlen) == -1 ||
      af_split (hash, mk, spec.key_bytes, stripes, material,
                errbuf, errlen) == -1 ||
      (cipher = qcow2_sector_cipher_new (&spec, slot_key, errbuf,
                                         errlen)) == NULL ||
      qcow2_sectors_encrypt (cipher, 0, material, split_len,
                             errbuf, errlen) == -1)
    goto out;

  memcpy (master_key, mk, spec.key_bytes);
  *area_ret = area;
  *area_len_ret = area_len;
  area = NULL;
  ret = 0;

 out:
  qcow2_sector_cipher_free (cipher);
  qcow2_wipe (mk, sizeof mk);
  qcow2_wipe (slot_key, sizeof slot_key);
  if (area)
    qcow2_wipe (area, area_len);
  free (area);
  return ret;
}

void
qcow2_crypt_method_refusal (uint32_t crypt_method, char *buf, size_t len)
{
  if (crypt_method == 1)
    snprintf (buf, len,
              "crypt_method: the image is encrypted with qcow2's legacy AES "
              "method (crypt_method 1: AES-128-CBC keyed directly by the "
              "passphrase, IVs from guest offsets), which qemu too refuses "
              "outside qemu-img because of its design flaws.  Convert it to a "
              "LUKS-encrypted image: qemu-img convert --object "
              "secret,id=sec0,data=PASSPHRASE --image-opts "
              "driver=qcow2,file.filename=OLD.qcow2,encrypt.key-secret=sec0 "
              "-O qcow2 -o encrypt.format=luks,encrypt.key-secret=sec0 "
              "NEW.qcow2");
  else
    snprintf (buf, len,
              "crypt_method: unknown encryption method %" PRIu32 " (qcow2 "
              "defines 0 for none, 1 for legacy AES and 2 for LUKS)",
              crypt_method);
}
