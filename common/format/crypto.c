/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: sector ciphers, hashes and PBKDF2 over GnuTLS and
 * nettle.
 *
 * GnuTLS serves AES-XTS (128 and 256) and AES-CBC: its x86 code takes the
 * per-sector calls of LUKS faster than OpenSSL 3's EVP layer and far
 * faster than nettle's generic XTS (bench/bench-crypto.sh).  nettle,
 * which GnuTLS is built on, serves every other combination through its
 * generic modes over the block cipher's nettle_cipher table, and does the
 * hashing and PBKDF2 (GnuTLS's PBKDF2 is nettle's, without ripemd160).
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <gnutls/gnutls.h>
#include <gnutls/crypto.h>
#include <nettle/cbc.h>
#include <nettle/ctr.h>
#include <nettle/hmac.h>
#include <nettle/md5.h>
#include <nettle/nettle-meta.h>
#include <nettle/pbkdf2.h>
#include <nettle/ripemd160.h>
#include <nettle/sha1.h>
#include <nettle/sha2.h>
#include <nettle/version.h>
#include <nettle/xts.h>

#include "format/crypto.h"
#include "format/errbuf.h"

/* ---------------------------------------------------------------- tables */

struct alg_info {
  const char *family;               /* as LUKS spells it */
  uint32_t key_bytes;               /* of one cipher key */
  const struct nettle_cipher *meta;
  gnutls_cipher_algorithm_t gnutls_cbc;   /* 0: not through GnuTLS */
  gnutls_cipher_algorithm_t gnutls_xts;
};

static const struct alg_info algs[] = {
  [QCOW2_CIPHER_AES_128] = { "aes", 16, &nettle_aes128,
                             GNUTLS_CIPHER_AES_128_CBC,
                             GNUTLS_CIPHER_AES_128_XTS },
  [QCOW2_CIPHER_AES_192] = { "aes", 24, &nettle_aes192,
                             GNUTLS_CIPHER_AES_192_CBC, 0 },
  [QCOW2_CIPHER_AES_256] = { "aes", 32, &nettle_aes256,
                             GNUTLS_CIPHER_AES_256_CBC,
                             GNUTLS_CIPHER_AES_256_XTS },
  [QCOW2_CIPHER_SERPENT_128] = { "serpent", 16, &nettle_serpent128, 0, 0 },
  [QCOW2_CIPHER_SERPENT_192] = { "serpent", 24, &nettle_serpent192, 0, 0 },
  [QCOW2_CIPHER_SERPENT_256] = { "serpent", 32, &nettle_serpent256, 0, 0 },
  [QCOW2_CIPHER_TWOFISH_128] = { "twofish", 16, &nettle_twofish128, 0, 0 },
  [QCOW2_CIPHER_TWOFISH_192] = { "twofish", 24, &nettle_twofish192, 0, 0 },
  [QCOW2_CIPHER_TWOFISH_256] = { "twofish", 32, &nettle_twofish256, 0, 0 },
  [QCOW2_CIPHER_CAST5_128] = { "cast5", 16, &nettle_cast128, 0, 0 },
};
#define NALGS (sizeof algs / sizeof algs[0])

static const char *const mode_names[] = {
  [QCOW2_MODE_ECB] = "ecb", [QCOW2_MODE_CBC] = "cbc",
  [QCOW2_MODE_XTS] = "xts", [QCOW2_MODE_CTR] = "ctr",
};

static const char *const ivgen_names[] = {
  [QCOW2_IVGEN_PLAIN] = "plain", [QCOW2_IVGEN_PLAIN64] = "plain64",
  [QCOW2_IVGEN_ESSIV] = "essiv",
};

/* PBKDF2 through nettle's function for the hash where it has one (its
 * HMAC then runs without indirect calls: this is the loop that costs
 * seconds at unlock), else the generic HMAC over the hash's table.
 */
typedef void pbkdf2_fn (size_t key_length, const uint8_t *key,
                        unsigned iterations, size_t salt_length,
                        const uint8_t *salt, size_t length, uint8_t *dst);

struct hash_info {
  const char *name;
  size_t digest_bytes;
  const struct nettle_hash *meta;
  pbkdf2_fn *pbkdf2;
};

static const struct hash_info hashes[] = {
  [QCOW2_HASH_MD5] = { "md5", 16, &nettle_md5, NULL },
  [QCOW2_HASH_SHA1] = { "sha1", 20, &nettle_sha1, pbkdf2_hmac_sha1 },
  [QCOW2_HASH_SHA224] = { "sha224", 28, &nettle_sha224, NULL },
  [QCOW2_HASH_SHA256] = { "sha256", 32, &nettle_sha256, pbkdf2_hmac_sha256 },
  [QCOW2_HASH_SHA384] = { "sha384", 48, &nettle_sha384, pbkdf2_hmac_sha384 },
  [QCOW2_HASH_SHA512] = { "sha512", 64, &nettle_sha512, pbkdf2_hmac_sha512 },
  [QCOW2_HASH_RIPEMD160] = { "ripemd160", 20, &nettle_ripemd160, NULL },
};
#define NHASHES (sizeof hashes / sizeof hashes[0])

int
qcow2_hash_parse (const char *name, enum qcow2_hash *hash)
{
  for (size_t i = 0; i < NHASHES; ++i)
    if (strcmp (name, hashes[i].name) == 0) {
      *hash = i;
      return 0;
    }
  return -1;
}

const char *
qcow2_hash_name (enum qcow2_hash hash)
{
  return hashes[hash].name;
}

size_t
qcow2_hash_digest_bytes (enum qcow2_hash hash)
{
  return hashes[hash].digest_bytes;
}

/* The member of FAMILY whose key is KEY_BYTES long, or -1. */
static int
find_alg (const char *family, uint32_t key_bytes)
{
  for (size_t i = 0; i < NALGS; ++i)
    if (strcmp (algs[i].family, family) == 0 && algs[i].key_bytes == key_bytes)
      return i;
  return -1;
}

static bool
family_known (const char *family)
{
  for (size_t i = 0; i < NALGS; ++i)
    if (strcmp (algs[i].family, family) == 0)
      return true;
  return false;
}

int
qcow2_cipher_spec_parse (const char *cipher_name, const char *cipher_mode,
                         uint32_t key_bytes, struct qcow2_cipher_spec *spec,
                         char *errbuf, size_t errlen)
{
  char mode[64];
  char *ivgen, *ivhash;
  uint32_t cipher_key_bytes = key_bytes;
  int alg;
  size_t i;

  memset (spec, 0, sizeof *spec);
  spec->key_bytes = key_bytes;

  /* "<mode>-<ivgen>[:<hash>]", e.g. "cbc-essiv:sha256". */
  if (snprintf (mode, sizeof mode, "%s", cipher_mode) >= (int) sizeof mode ||
      (ivgen = strchr (mode, '-')) == NULL)
    return qcow2_fail (errbuf, errlen,
                       "LUKS cipher mode \"%s\" is not of the form "
                       "MODE-IVGEN (such as xts-plain64)", cipher_mode);
  *ivgen++ = '\0';
  ivhash = strchr (ivgen, ':');
  if (ivhash)
    *ivhash++ = '\0';

  for (i = 0; i < sizeof mode_names / sizeof mode_names[0]; ++i)
    if (strcmp (mode, mode_names[i]) == 0)
      break;
  if (i == sizeof mode_names / sizeof mode_names[0])
    return qcow2_fail (errbuf, errlen,
                       "LUKS cipher %s-%s: the block cipher mode \"%s\" is "
                       "not supported (xts, cbc, ecb and ctr are)",
                       cipher_name, cipher_mode, mode);
  spec->mode = i;

  for (i = 0; i < sizeof ivgen_names / sizeof ivgen_names[0]; ++i)
    if (strcmp (ivgen, ivgen_names[i]) == 0)
      break;
  if (i == sizeof ivgen_names / sizeof ivgen_names[0])
    return qcow2_fail (errbuf, errlen,
                       "LUKS cipher %s-%s: the IV generator \"%s\" is not "
                       "supported (plain, plain64 and essiv are)",
                       cipher_name, cipher_mode, ivgen);
  spec->ivgen = i;

  /* Like qemu, parse a hash after any IV generator, use it only for
   * ESSIV (dm-crypt accepts and ignores it for the others).
   */
  if (ivhash && qcow2_hash_parse (ivhash, &spec->ivgen_hash) == -1)
    return qcow2_fail (errbuf, errlen,
                       "LUKS cipher %s-%s: the IV generator's hash \"%s\" is "
                       "not supported (md5, sha1, sha224, sha256, sha384, "
                       "sha512 and ripemd160 are)",
                       cipher_name, cipher_mode, ivhash);
  if (spec->ivgen == QCOW2_IVGEN_ESSIV && !ivhash)
    return qcow2_fail (errbuf, errlen,
                       "LUKS cipher %s-%s: essiv needs a hash (such as "
                       "essiv:sha256)", cipher_name, cipher_mode);
  if (spec->ivgen != QCOW2_IVGEN_ESSIV)
    spec->ivgen_hash = 0;

  if (spec->mode == QCOW2_MODE_XTS) {
    if (key_bytes % 2 != 0)
      return qcow2_fail (errbuf, errlen,
                         "LUKS cipher %s-%s: an XTS key holds two cipher "
                         "keys, but the header's key size is odd (%" PRIu32
                         " bytes)", cipher_name, cipher_mode, key_bytes);
    cipher_key_bytes = key_bytes / 2;
  }

  alg = find_alg (cipher_name, cipher_key_bytes);
  if (alg == -1) {
    if (family_known (cipher_name))
      return qcow2_fail (errbuf, errlen,
                         "LUKS cipher %s-%" PRIu32 "-%s is not supported: %s "
                         "does not have %" PRIu32 "-bit keys",
                         cipher_name, cipher_key_bytes * 8, cipher_mode,
                         cipher_name, cipher_key_bytes * 8);
    return qcow2_fail (errbuf, errlen,
                       "LUKS cipher %s-%" PRIu32 "-%s is not supported (aes, "
                       "serpent and twofish with 128, 192 or 256-bit keys, "
                       "and cast5-128, are)",
                       cipher_name, cipher_key_bytes * 8, cipher_mode);
  }
  spec->alg = alg;

  if (spec->mode == QCOW2_MODE_XTS && algs[alg].meta->block_size != 16)
    return qcow2_fail (errbuf, errlen,
                       "LUKS cipher %s-%" PRIu32 "-%s is not supported: XTS "
                       "needs a cipher with 16-byte blocks, and %s has "
                       "%u-byte blocks",
                       cipher_name, cipher_key_bytes * 8, cipher_mode,
                       cipher_name, algs[alg].meta->block_size);

  if (spec->ivgen == QCOW2_IVGEN_ESSIV) {
    /* dm-crypt's rule, which qemu follows: the ESSIV cipher takes the
     * digest as its key, so its key size is the digest size.
     */
    size_t digest = qcow2_hash_digest_bytes (spec->ivgen_hash);
    int essiv = find_alg (cipher_name, digest);
    if (strcmp (cipher_name, "cast5") == 0)
      return qcow2_fail (errbuf, errlen,
                         "LUKS cipher %s-%" PRIu32 "-%s is not supported: "
                         "qemu does not use cast5 with essiv",
                         cipher_name, cipher_key_bytes * 8, cipher_mode);
    if (essiv == -1)
      return qcow2_fail (errbuf, errlen,
                         "LUKS cipher %s-%" PRIu32 "-%s is not supported: "
                         "essiv needs %s with a %zu-bit key (the size of a "
                         "%s digest), and there is none",
                         cipher_name, cipher_key_bytes * 8, cipher_mode,
                         cipher_name, digest * 8, ivhash);
    spec->essiv_alg = essiv;
  }
  return 0;
}

void
qcow2_cipher_spec_strings (const struct qcow2_cipher_spec *spec,
                           char *name, size_t name_len,
                           char *mode, size_t mode_len)
{
  snprintf (name, name_len, "%s", algs[spec->alg].family);
  if (spec->ivgen == QCOW2_IVGEN_ESSIV)
    snprintf (mode, mode_len, "%s-%s:%s", mode_names[spec->mode],
              ivgen_names[spec->ivgen], hashes[spec->ivgen_hash].name);
  else
    snprintf (mode, mode_len, "%s-%s", mode_names[spec->mode],
              ivgen_names[spec->ivgen]);
}

void
qcow2_cipher_spec_describe (const struct qcow2_cipher_spec *spec,
                            char *buf, size_t len)
{
  char name[32], mode[64];

  qcow2_cipher_spec_strings (spec, name, sizeof name, mode, sizeof mode);
  snprintf (buf, len, "%s-%" PRIu32 "-%s", name,
            algs[spec->alg].key_bytes * 8, mode);
}

/* ---------------------------------------------------------------- ciphers */

struct qcow2_sector_cipher {
  struct qcow2_cipher_spec spec;
  gnutls_cipher_hd_t gtls;          /* set: the GnuTLS path */
  const struct nettle_cipher *meta; /* the nettle path */
  size_t iv_len;                    /* 0 for ECB, else the block size */
  void *enc, *dec, *tweak;          /* nettle key schedules */
  const struct nettle_cipher *essiv_meta;
  void *essiv;                      /* ESSIV's encryption schedule */
  size_t storage_len;
  /* The schedules follow, each 16-byte aligned. */
  _Alignas (16) uint8_t storage[];
};

static size_t
round16 (size_t n)
{
  return (n + 15) & ~(size_t) 15;
}

struct qcow2_sector_cipher *
qcow2_sector_cipher_new (const struct qcow2_cipher_spec *spec,
                         const uint8_t *key, char *errbuf, size_t errlen)
{
  const struct alg_info *a = &algs[spec->alg];
  const struct nettle_cipher *meta = a->meta;
  gnutls_cipher_algorithm_t gnutls_alg = 0;
  struct qcow2_sector_cipher *c;
  size_t ctx = round16 (meta->context_size), storage = 0, off = 0;
  char name[80];
  int r;

  if (spec->mode == QCOW2_MODE_XTS)
    gnutls_alg = a->gnutls_xts;
  else if (spec->mode == QCOW2_MODE_CBC)
    gnutls_alg = a->gnutls_cbc;

  if (!gnutls_alg)
    storage = ctx * (spec->mode == QCOW2_MODE_XTS ? 3 : 2);
  if (spec->ivgen == QCOW2_IVGEN_ESSIV)
    storage += round16 (algs[spec->essiv_alg].meta->context_size);

  c = aligned_alloc (16, round16 (sizeof *c + storage));
  if (c == NULL) {
    qcow2_fail (errbuf, errlen, "out of memory for a cipher context");
    return NULL;
  }
  memset (c, 0, sizeof *c + storage);
  c->spec = *spec;
  c->storage_len = storage;
  c->iv_len = spec->mode == QCOW2_MODE_ECB ? 0 : meta->block_size;

  if (gnutls_alg) {
    gnutls_datum_t k = { (unsigned char *) key, spec->key_bytes };
    uint8_t iv0[16] = { 0 };
    gnutls_datum_t iv = { iv0, c->iv_len };
    r = gnutls_cipher_init (&c->gtls, gnutls_alg, &k, &iv);
    if (r < 0) {
      qcow2_cipher_spec_describe (spec, name, sizeof name);
      qcow2_fail (errbuf, errlen,
                  "GnuTLS refused the %s key: %s", name, gnutls_strerror (r));
      c->gtls = NULL;
      qcow2_sector_cipher_free (c);
      return NULL;
    }
  }
  else {
    /* XTS: the first half keys the data, the second the tweak. */
    c->meta = meta;
    c->enc = c->storage + off, off += ctx;
    c->dec = c->storage + off, off += ctx;
    meta->set_encrypt_key (c->enc, key);
    meta->set_decrypt_key (c->dec, key);
    if (spec->mode == QCOW2_MODE_XTS) {
      c->tweak = c->storage + off, off += ctx;
      meta->set_encrypt_key (c->tweak, key + a->key_bytes);
    }
  }

  if (spec->ivgen == QCOW2_IVGEN_ESSIV) {
    uint8_t salt[QCOW2_CRYPTO_MAX_DIGEST_BYTES];
    qcow2_hash2 (spec->ivgen_hash, key, spec->key_bytes, NULL, 0, salt,
                 errbuf, errlen);
    c->essiv_meta = algs[spec->essiv_alg].meta;
    c->essiv = c->storage + off;
    c->essiv_meta->set_encrypt_key (c->essiv, salt);
    qcow2_wipe (salt, sizeof salt);
  }
  return c;
}

void
qcow2_sector_cipher_free (struct qcow2_sector_cipher *c)
{
  if (c == NULL)
    return;
  if (c->gtls)
    gnutls_cipher_deinit (c->gtls);
  qcow2_wipe (c->storage, c->storage_len);
  free (c);
}

/* The IV of one sector, as qemu's plain, plain64 and essiv generators
 * make it: the sector number little-endian, zero padded.
 */
static void
sector_iv (const struct qcow2_sector_cipher *c, uint64_t sector,
           uint8_t iv[16])
{
  uint8_t le[16] = { 0 };
  size_t n = c->spec.ivgen == QCOW2_IVGEN_PLAIN ? 4 : 8;

  for (size_t i = 0; i < 8; ++i)
    le[i] = sector >> (8 * i);
  memset (iv, 0, 16);
  if (c->spec.ivgen == QCOW2_IVGEN_ESSIV) {
    c->essiv_meta->encrypt (c->essiv, c->essiv_meta->block_size, le, le);
    n = c->essiv_meta->block_size;
  }
  memcpy (iv, le, n < c->iv_len ? n : c->iv_len);
}

static int
crypt_sectors (struct qcow2_sector_cipher *c, bool encrypt,
               uint64_t first_sector, uint8_t *buf, size_t len,
               char *errbuf, size_t errlen)
{
  const struct nettle_cipher *meta = c->meta;
  uint8_t iv[16];

  if (len % QCOW2_CRYPTO_SECTOR_SIZE != 0)
    return qcow2_fail (errbuf, errlen,
                       "encrypted data must come in whole 512-byte sectors, "
                       "not %zu bytes", len);

  for (size_t off = 0; off < len; off += QCOW2_CRYPTO_SECTOR_SIZE) {
    uint8_t *p = buf + off;
    const size_t n = QCOW2_CRYPTO_SECTOR_SIZE;

    if (c->iv_len)
      sector_iv (c, first_sector + off / n, iv);

    if (c->gtls) {
      int r;
      gnutls_cipher_set_iv (c->gtls, iv, c->iv_len);
      r = encrypt ? gnutls_cipher_encrypt2 (c->gtls, p, n, p, n)
                  : gnutls_cipher_decrypt2 (c->gtls, p, n, p, n);
      if (r < 0)
        return qcow2_fail (errbuf, errlen,
                           "GnuTLS failed to %s a sector: %s",
                           encrypt ? "encrypt" : "decrypt",
                           gnutls_strerror (r));
      continue;
    }

    switch (c->spec.mode) {
    case QCOW2_MODE_ECB:
      if (encrypt)
        meta->encrypt (c->enc, n, p, p);
      else
        meta->decrypt (c->dec, n, p, p);
      break;
    case QCOW2_MODE_CBC:
      if (encrypt)
        cbc_encrypt (c->enc, meta->encrypt, meta->block_size, iv, n, p, p);
      else
        cbc_decrypt (c->dec, meta->decrypt, meta->block_size, iv, n, p, p);
      break;
    case QCOW2_MODE_CTR:
      ctr_crypt (c->enc, meta->encrypt, meta->block_size, iv, n, p, p);
      break;
    case QCOW2_MODE_XTS:
      if (encrypt)
        xts_encrypt_message (c->enc, c->tweak, meta->encrypt, iv, n, p, p);
      else
        xts_decrypt_message (c->dec, c->tweak, meta->decrypt, meta->encrypt,
                             iv, n, p, p);
      break;
    }
  }
  return 0;
}

int
qcow2_sectors_encrypt (struct qcow2_sector_cipher *c, uint64_t first_sector,
                       uint8_t *buf, size_t len, char *errbuf, size_t errlen)
{
  return crypt_sectors (c, true, first_sector, buf, len, errbuf, errlen);
}

int
qcow2_sectors_decrypt (struct qcow2_sector_cipher *c, uint64_t first_sector,
                       uint8_t *buf, size_t len, char *errbuf, size_t errlen)
{
  return crypt_sectors (c, false, first_sector, buf, len, errbuf, errlen);
}

/* ---------------------------------------------------------------- hashes */

/* Room for the state of any hash in the table. */
union hash_ctx {
  struct md5_ctx md5;
  struct sha1_ctx sha1;
  struct sha256_ctx sha256;
  struct sha512_ctx sha512;
  struct ripemd160_ctx ripemd160;
};

int
qcow2_hash2 (enum qcow2_hash hash, const void *a, size_t a_len,
             const void *b, size_t b_len, uint8_t *out,
             char *errbuf, size_t errlen)
{
  const struct nettle_hash *meta = hashes[hash].meta;
  union hash_ctx ctx;

  meta->init (&ctx);
  meta->update (&ctx, a_len, a);
  meta->update (&ctx, b_len, b);
  meta->digest (&ctx, meta->digest_size, out);
  qcow2_wipe (&ctx, sizeof ctx);
  return 0;
}

struct generic_hmac {
  const struct nettle_hash *meta;
  union hash_ctx outer, inner, state;
};

static void
generic_hmac_update (void *ctx, size_t len, const uint8_t *data)
{
  struct generic_hmac *g = ctx;
  hmac_update (&g->state, g->meta, len, data);
}

static void
generic_hmac_digest (void *ctx, size_t len, uint8_t *out)
{
  struct generic_hmac *g = ctx;
  hmac_digest (&g->outer, &g->inner, &g->state, g->meta, len, out);
}

int
qcow2_pbkdf2 (enum qcow2_hash hash, const uint8_t *pass, size_t pass_len,
              const uint8_t *salt, size_t salt_len, uint32_t iterations,
              uint8_t *out, size_t out_len, char *errbuf, size_t errlen)
{
  const struct hash_info *hi = &hashes[hash];

  if (iterations == 0)
    return qcow2_fail (errbuf, errlen, "PBKDF2 needs at least one iteration");
  if (out_len == 0)
    return 0;
  if (hi->pbkdf2)
    hi->pbkdf2 (pass_len, pass, iterations, salt_len, salt, out_len, out);
  else {
    struct generic_hmac g = { .meta = hi->meta };
    hmac_set_key (&g.outer, &g.inner, &g.state, hi->meta, pass_len, pass);
    pbkdf2 (&g, generic_hmac_update, generic_hmac_digest,
            hi->meta->digest_size, iterations, salt_len, salt, out_len, out);
    qcow2_wipe (&g, sizeof g);
  }
  return 0;
}

static uint64_t
thread_cpu_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int
qcow2_pbkdf2_rate (enum qcow2_hash hash, size_t pass_len, size_t salt_len,
                   size_t out_len, uint32_t measure_ms, uint64_t *per_second,
                   char *errbuf, size_t errlen)
{
  uint8_t *scratch;
  uint64_t iterations = 1000, target_ns, elapsed;

  if (measure_ms < 10)
    measure_ms = 10;
  target_ns = (uint64_t) measure_ms * 1000000;
  /* The content does not change the cost, only the lengths do. */
  scratch = calloc (1, pass_len + salt_len + out_len + 1);
  if (scratch == NULL)
    return qcow2_fail (errbuf, errlen, "out of memory measuring PBKDF2");

  for (;;) {
    uint64_t start = thread_cpu_ns ();
    if (qcow2_pbkdf2 (hash, scratch, pass_len, scratch + pass_len, salt_len,
                      iterations, scratch + pass_len + salt_len, out_len,
                      errbuf, errlen) == -1) {
      free (scratch);
      return -1;
    }
    elapsed = thread_cpu_ns () - start;
    if (elapsed >= target_ns || iterations >= UINT32_MAX)
      break;
    /* Aim a little past the target so the next run is the last. */
    if (elapsed < target_ns / 10)
      iterations *= 10;
    else
      iterations = iterations * target_ns / elapsed * 11 / 10 + 1;
    if (iterations > UINT32_MAX)
      iterations = UINT32_MAX;
  }
  free (scratch);
  *per_second = iterations * UINT64_C (1000000000) / (elapsed ? elapsed : 1);
  return 0;
}

/* ---------------------------------------------------------------- misc */

int
qcow2_random_bytes (void *buf, size_t len, char *errbuf, size_t errlen)
{
  uint8_t *p = buf;

  while (len > 0) {
    ssize_t r = getrandom (p, len, 0);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return qcow2_fail (errbuf, errlen, "getrandom: %s", strerror (errno));
    }
    p += r;
    len -= r;
  }
  return 0;
}

void
qcow2_wipe (void *p, size_t len)
{
  explicit_bzero (p, len);
}

void
qcow2_crypto_versions (char *buf, size_t len)
{
  snprintf (buf, len, "gnutls=%s nettle=%d.%d", gnutls_check_version (NULL),
            nettle_version_major (), nettle_version_minor ());
}
