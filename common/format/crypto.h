/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the ciphers, hashes and key derivation that LUKS
 * images need, over GnuTLS and nettle.
 *
 * A struct qcow2_cipher_spec says how a LUKS volume encrypts its sectors:
 * the block cipher and its key size, the chaining mode and the IV
 * generator, with the names the LUKS header spells ("aes" and
 * "xts-plain64", key 64 bytes).  qcow2_cipher_spec_parse() accepts what
 * qemu can create (aes, serpent and twofish of 128, 192 and 256 bits and
 * cast5 of 128 bits; xts, cbc, ecb and ctr; the plain, plain64 and essiv
 * IV generators) and refuses the rest naming the cipher.
 *
 * A struct qcow2_sector_cipher holds one key ready to use.  Create one per
 * thread that encrypts or decrypts and keep it: qcow2_sectors_encrypt()
 * and qcow2_sectors_decrypt() then allocate nothing.  One context is not
 * thread safe; different contexts are, also with the same key.  AES-XTS
 * with 128- and 256-bit keys and AES-CBC go through GnuTLS (AES-NI); the
 * other combinations, the hashes and PBKDF2 through nettle.
 *
 * Every function here does no I/O and never calls nbdkit.  Errors are
 * -1 with a sentence in ERRBUF (ERRLEN bytes), as in format/header.h.
 */
#ifndef QCOW2_CRYPTO_H
#define QCOW2_CRYPTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Every sector is encrypted on its own, with an IV from its number. */
#define QCOW2_CRYPTO_SECTOR_SIZE 512

/* The longest key of any spec: AES-256 in XTS mode uses two keys. */
#define QCOW2_CRYPTO_MAX_KEY_BYTES 64

/* The longest digest of any hash (sha512). */
#define QCOW2_CRYPTO_MAX_DIGEST_BYTES 64

enum qcow2_cipher_alg {
  QCOW2_CIPHER_AES_128, QCOW2_CIPHER_AES_192, QCOW2_CIPHER_AES_256,
  QCOW2_CIPHER_SERPENT_128, QCOW2_CIPHER_SERPENT_192,
  QCOW2_CIPHER_SERPENT_256,
  QCOW2_CIPHER_TWOFISH_128, QCOW2_CIPHER_TWOFISH_192,
  QCOW2_CIPHER_TWOFISH_256,
  QCOW2_CIPHER_CAST5_128,
};

enum qcow2_cipher_mode {
  QCOW2_MODE_ECB, QCOW2_MODE_CBC, QCOW2_MODE_XTS, QCOW2_MODE_CTR,
};

enum qcow2_ivgen {
  QCOW2_IVGEN_PLAIN,                /* low 32 bits of the sector, LE */
  QCOW2_IVGEN_PLAIN64,              /* the sector number, 64-bit LE */
  QCOW2_IVGEN_ESSIV,                /* plain64 encrypted under H(key) */
};

/* The hashes LUKS names for PBKDF2, the AF splitter and ESSIV. */
enum qcow2_hash {
  QCOW2_HASH_MD5, QCOW2_HASH_SHA1, QCOW2_HASH_SHA224, QCOW2_HASH_SHA256,
  QCOW2_HASH_SHA384, QCOW2_HASH_SHA512, QCOW2_HASH_RIPEMD160,
};

struct qcow2_cipher_spec {
  enum qcow2_cipher_alg alg;
  enum qcow2_cipher_mode mode;
  enum qcow2_ivgen ivgen;
  enum qcow2_hash ivgen_hash;       /* ESSIV only */
  enum qcow2_cipher_alg essiv_alg;  /* ESSIV only: key size = digest size */
  uint32_t key_bytes;               /* the whole key, both halves for XTS */
};

/* Fill SPEC from the LUKS header's cipher name ("aes"), cipher mode
 * ("xts-plain64", "cbc-essiv:sha256") and key size in bytes, the way qemu
 * reads them: an XTS key is two cipher keys; a hash after plain or
 * plain64 is ignored; ESSIV uses the cipher of the same family whose key
 * size is the hash's digest size.  Returns 0, or -1 with a sentence
 * naming the cipher and why it cannot be used.  The strings must be NUL
 * terminated.
 */
int qcow2_cipher_spec_parse (const char *cipher_name, const char *cipher_mode,
                             uint32_t key_bytes,
                             struct qcow2_cipher_spec *spec,
                             char *errbuf, size_t errlen);

/* The inverse, for creating headers: "aes" into NAME and "xts-plain64" or
 * "cbc-essiv:sha256" into MODE (each at least 32 bytes).
 */
void qcow2_cipher_spec_strings (const struct qcow2_cipher_spec *spec,
                                char *name, size_t name_len,
                                char *mode, size_t mode_len);

/* "aes-256-xts-plain64", as qemu-img prints it, for messages. */
void qcow2_cipher_spec_describe (const struct qcow2_cipher_spec *spec,
                                 char *buf, size_t len);

/* Hash names as LUKS spells them ("sha256").  Parse returns 0, or -1 if
 * NAME is not one of them.
 */
int qcow2_hash_parse (const char *name, enum qcow2_hash *hash);
const char *qcow2_hash_name (enum qcow2_hash hash);
size_t qcow2_hash_digest_bytes (enum qcow2_hash hash);

/* Sector cipher contexts.  KEY holds SPEC->key_bytes bytes; the context
 * keeps what it derives from it, not the pointer.  Returns NULL with a
 * message if the library refuses the key (GnuTLS refuses an XTS key whose
 * two halves are equal) or memory runs out.
 */
struct qcow2_sector_cipher;
struct qcow2_sector_cipher *
qcow2_sector_cipher_new (const struct qcow2_cipher_spec *spec,
                         const uint8_t *key, char *errbuf, size_t errlen);
/* Wipes the key schedule.  Accepts NULL. */
void qcow2_sector_cipher_free (struct qcow2_sector_cipher *c);

/* Encrypt or decrypt BUF (LEN bytes, a multiple of 512) in place: its
 * first 512 bytes are sector FIRST_SECTOR, the next FIRST_SECTOR + 1, and
 * so on.  For a qcow2 data cluster the sector number is the HOST offset of
 * the bytes divided by 512 (qemu's crypt_physical_offset).  Returns 0, or
 * -1 with a message (LEN not a multiple of 512, or the library failed);
 * BUF is then undefined.
 */
int qcow2_sectors_encrypt (struct qcow2_sector_cipher *c,
                           uint64_t first_sector, uint8_t *buf, size_t len,
                           char *errbuf, size_t errlen);
int qcow2_sectors_decrypt (struct qcow2_sector_cipher *c,
                           uint64_t first_sector, uint8_t *buf, size_t len,
                           char *errbuf, size_t errlen);

/* Digest of the concatenation of A (A_LEN bytes) and B (B_LEN bytes)
 * into OUT (qcow2_hash_digest_bytes (HASH) bytes).  Returns 0 (the error
 * arguments are for a library that could fail).
 */
int qcow2_hash2 (enum qcow2_hash hash, const void *a, size_t a_len,
                 const void *b, size_t b_len, uint8_t *out,
                 char *errbuf, size_t errlen);

/* PBKDF2 with HMAC-HASH: OUT_LEN bytes from PASS and SALT after
 * ITERATIONS rounds (at least 1).  Returns 0 or -1.
 */
int qcow2_pbkdf2 (enum qcow2_hash hash, const uint8_t *pass, size_t pass_len,
                  const uint8_t *salt, size_t salt_len, uint32_t iterations,
                  uint8_t *out, size_t out_len, char *errbuf, size_t errlen);

/* How many PBKDF2 iterations of this shape (hash, password and salt
 * lengths, output length) this thread runs per second of its CPU time,
 * measured over about MEASURE_MS milliseconds (at least 10).  This is how
 * qemu tunes iter-time.  Returns 0 with *PER_SECOND set, or -1.
 */
int qcow2_pbkdf2_rate (enum qcow2_hash hash, size_t pass_len,
                       size_t salt_len, size_t out_len, uint32_t measure_ms,
                       uint64_t *per_second, char *errbuf, size_t errlen);

/* LEN bytes from the kernel's random number generator (getrandom),
 * blocking until it is seeded.  Returns 0 or -1.
 */
int qcow2_random_bytes (void *buf, size_t len, char *errbuf, size_t errlen);

/* Overwrite LEN bytes of secret at P so the compiler cannot drop it. */
void qcow2_wipe (void *p, size_t len);

/* "gnutls=3.7.9 nettle=3.8", for the debug output. */
void qcow2_crypto_versions (char *buf, size_t len);

#endif /* QCOW2_CRYPTO_H */
