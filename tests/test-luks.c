/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: LUKS headers, key slots and sector ciphers.
 *
 * qemu is the oracle.  For every cipher family, mode and IV generator that
 * qemu-img can create, an image made by qemu-img and written by qemu-io is
 * read here as bytes: its LUKS header must parse and unlock, its host
 * clusters must decrypt to what qemu-io wrote when the IVs come from HOST
 * offsets (and must not when they come from guest offsets), and a cluster
 * encrypted here and put in the file must read back through qemu-io.
 * Headers made by qcow2_luks_create must open in qemu-io.  Around that:
 * known answers for PBKDF2 and the hashes, the spec parser's refusals, and
 * a hostile header for every check of qcow2_luks_parse.
 */
#include <config.h>

#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/crypto.h"
#include "format/endian.h"
#include "format/header.h"
#include "format/luks.h"
#include "oracle.h"
#include "unit.h"
#include "util.h"

static void
unhex (const char *hex, uint8_t *out)
{
  for (size_t i = 0; hex[2 * i]; ++i)
    sscanf (hex + 2 * i, "%2hhx", &out[i]);
}

/* ---------------------------------------------------------------- known */

static void
test_pbkdf2_known_answers (void)
{
  /* Computed with Python's hashlib.pbkdf2_hmac (OpenSSL underneath). */
  static const struct {
    enum qcow2_hash hash;
    const char *pass, *salt;
    uint32_t iterations;
    const char *hex;
  } v[] = {
    { QCOW2_HASH_SHA256, "passwd", "salt", 1,
      "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc"
      "49ca9cccf179b645991664b39d77ef317c71b845b1e30bd509112041d3a19783" },
    { QCOW2_HASH_SHA1, "password", "salt", 2,
      "ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957" },
    { QCOW2_HASH_SHA512, "pass", "NaCl", 1000,
      "f931f545d74d5b7ad94b926a689a9b89" },
    { QCOW2_HASH_RIPEMD160, "pass", "NaCl", 10,
      "845964544a8de52e10004d654edd64d2a3f351d1" },
    { QCOW2_HASH_MD5, "", "salty", 3, "02d1fcf0153f451e0ad1265ab7f99763" },
  };
  char err[256];

  for (size_t i = 0; i < sizeof v / sizeof v[0]; ++i) {
    uint8_t want[64], got[64];
    size_t n = strlen (v[i].hex) / 2;
    unsigned long before = atomic_load (&unit_failures);
    unhex (v[i].hex, want);
    CHECK_EQ (qcow2_pbkdf2 (v[i].hash, (const uint8_t *) v[i].pass,
                            strlen (v[i].pass), (const uint8_t *) v[i].salt,
                            strlen (v[i].salt), v[i].iterations, got, n,
                            err, sizeof err), 0);
    CHECK (memcmp (got, want, n) == 0);
    UNIT_NOTE_IF_FAILED (before, "PBKDF2 vector %zu: %s", i, err);
  }
  uint8_t out[32];
  CHECK_EQ (qcow2_pbkdf2 (QCOW2_HASH_SHA256, (const uint8_t *) "p", 1,
                          (const uint8_t *) "s", 1, 0, out, sizeof out,
                          err, sizeof err), -1);
  CHECK (unit_says (err, "at least one iteration"));

  uint64_t rate = 0;
  CHECK_EQ (qcow2_pbkdf2_rate (QCOW2_HASH_SHA256, 8, 32, 64, 10, &rate,
                               err, sizeof err), 0);
  CHECK (rate > 1000);
}

static void
test_hashes (void)
{
  uint8_t want[32], got[64];
  char err[256];

  unhex ("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
         want);
  CHECK_EQ (qcow2_hash2 (QCOW2_HASH_SHA256, "a", 1, "bc", 2, got,
                         err, sizeof err), 0);
  CHECK (memcmp (got, want, 32) == 0);

  static const char *const names[] = {
    "md5", "sha1", "sha224", "sha256", "sha384", "sha512", "ripemd160",
  };
  static const size_t sizes[] = { 16, 20, 28, 32, 48, 64, 20 };
  for (size_t i = 0; i < 7; ++i) {
    enum qcow2_hash h;
    CHECK_EQ (qcow2_hash_parse (names[i], &h), 0);
    CHECK (strcmp (qcow2_hash_name (h), names[i]) == 0);
    CHECK_EQ (qcow2_hash_digest_bytes (h), sizes[i]);
  }
  enum qcow2_hash h;
  CHECK_EQ (qcow2_hash_parse ("whirlpool", &h), -1);
  CHECK_EQ (qcow2_hash_parse ("SHA256", &h), -1);
}

/* ---------------------------------------------------------------- specs */

static void
test_spec_parse (void)
{
  static const struct {
    const char *name, *mode;
    uint32_t key_bytes;
    const char *described;          /* NULL: refused */
    const char *message;            /* part of the refusal */
  } v[] = {
    { "aes", "xts-plain64", 64, "aes-256-xts-plain64", NULL },
    { "aes", "xts-plain64", 32, "aes-128-xts-plain64", NULL },
    { "aes", "xts-plain", 48, "aes-192-xts-plain", NULL },
    { "aes", "cbc-essiv:sha256", 16, "aes-128-cbc-essiv:sha256", NULL },
    { "aes", "ecb-plain64", 24, "aes-192-ecb-plain64", NULL },
    { "aes", "ctr-plain64", 32, "aes-256-ctr-plain64", NULL },
    /* qemu and dm-crypt ignore a hash after plain64. */
    { "aes", "xts-plain64:sha1", 64, "aes-256-xts-plain64", NULL },
    { "serpent", "xts-essiv:sha256", 48, "serpent-192-xts-essiv:sha256",
      NULL },
    { "twofish", "cbc-essiv:md5", 32, "twofish-256-cbc-essiv:md5", NULL },
    { "cast5", "cbc-plain64", 16, "cast5-128-cbc-plain64", NULL },
    { "camellia", "xts-plain64", 64, NULL, "camellia-256-xts-plain64" },
    { "sm4", "xts-plain64", 32, NULL, "sm4-128-xts-plain64" },
    { "serpent", "cbc-plain64", 20, NULL, "serpent does not have 160-bit" },
    { "cast5", "xts-plain64", 32, NULL, "XTS needs a cipher with 16-byte" },
    { "cast5", "cbc-essiv:md5", 16, NULL, "does not use cast5 with essiv" },
    { "aes", "cbc-essiv:sha1", 32, NULL, "160-bit key" },
    { "aes", "xts", 64, NULL, "not of the form" },
    { "aes", "gcm-plain64", 32, NULL, "block cipher mode \"gcm\"" },
    { "aes", "xts-benbi", 64, NULL, "IV generator \"benbi\"" },
    { "aes", "xts-plain64:whirlpool", 64, NULL, "hash \"whirlpool\"" },
    { "aes", "cbc-essiv", 32, NULL, "essiv needs a hash" },
    { "aes", "xts-plain64", 63, NULL, "odd" },
  };
  char err[256], described[80], name[33], mode[33];

  for (size_t i = 0; i < sizeof v / sizeof v[0]; ++i) {
    struct qcow2_cipher_spec spec, again;
    unsigned long before = atomic_load (&unit_failures);
    int r = qcow2_cipher_spec_parse (v[i].name, v[i].mode, v[i].key_bytes,
                                     &spec, err, sizeof err);
    if (v[i].described) {
      CHECK_EQ (r, 0);
      qcow2_cipher_spec_describe (&spec, described, sizeof described);
      CHECK (strcmp (described, v[i].described) == 0);
      CHECK_EQ (spec.key_bytes, v[i].key_bytes);
      qcow2_cipher_spec_strings (&spec, name, sizeof name, mode, sizeof mode);
      CHECK_EQ (qcow2_cipher_spec_parse (name, mode, spec.key_bytes, &again,
                                         err, sizeof err), 0);
      CHECK (memcmp (&spec, &again, sizeof spec) == 0);
    }
    else {
      CHECK_EQ (r, -1);
      CHECK (unit_says (err, v[i].message));
    }
    UNIT_NOTE_IF_FAILED (before, "%s %s %u", v[i].name, v[i].mode,
                         v[i].key_bytes);
  }

  /* dm-crypt's ESSIV quirk: the ESSIV cipher's key is the digest. */
  struct qcow2_cipher_spec spec;
  CHECK_EQ (qcow2_cipher_spec_parse ("aes", "cbc-essiv:sha256", 16, &spec,
                                     err, sizeof err), 0);
  CHECK_EQ (spec.essiv_alg, QCOW2_CIPHER_AES_256);
  CHECK_EQ (qcow2_cipher_spec_parse ("twofish", "xts-essiv:md5", 64, &spec,
                                     err, sizeof err), 0);
  CHECK_EQ (spec.essiv_alg, QCOW2_CIPHER_TWOFISH_128);
}

/* ---------------------------------------------------------------- ciphers */

static void
test_sector_ciphers (void)
{
  static const struct {
    const char *name, *mode;
    uint32_t key_bytes;
  } v[] = {
    { "aes", "xts-plain64", 64 }, { "aes", "xts-plain", 32 },
    { "aes", "xts-essiv:sha256", 48 }, { "aes", "cbc-essiv:sha256", 32 },
    { "aes", "cbc-plain", 24 }, { "aes", "ctr-plain64", 16 },
    { "aes", "ecb-plain64", 32 }, { "serpent", "xts-plain64", 64 },
    { "twofish", "ctr-essiv:sha256", 24 }, { "cast5", "cbc-plain64", 16 },
    { "cast5", "ecb-plain", 16 },
  };
  uint8_t key[64], plain[4 * 512], buf[4 * 512], other[4 * 512];
  char err[256];

  for (size_t i = 0; i < sizeof key; ++i)
    key[i] = i * 37 + 11;
  for (size_t i = 0; i < sizeof plain; ++i)
    plain[i] = i * 7;

  for (size_t i = 0; i < sizeof v / sizeof v[0]; ++i) {
    struct qcow2_cipher_spec spec;
    struct qcow2_sector_cipher *c;
    unsigned long before = atomic_load (&unit_failures);
    bool ecb;

    CHECK_EQ (qcow2_cipher_spec_parse (v[i].name, v[i].mode, v[i].key_bytes,
                                       &spec, err, sizeof err), 0);
    c = qcow2_sector_cipher_new (&spec, key, err, sizeof err);
    CHECK (c != NULL);
    if (c == NULL)
      continue;
    ecb = spec.mode == QCOW2_MODE_ECB;

    memcpy (buf, plain, sizeof buf);
    CHECK_EQ (qcow2_sectors_encrypt (c, 1000, buf, sizeof buf,
                                     err, sizeof err), 0);
    CHECK (memcmp (buf, plain, sizeof buf) != 0);
    /* Sector by sector: encrypting the second sector alone as sector 1001
     * gives the same bytes as the second sector of the run.
     */
    memcpy (other, plain + 512, 512);
    CHECK_EQ (qcow2_sectors_encrypt (c, 1001, other, 512, err, sizeof err),
              0);
    CHECK (memcmp (other, buf + 512, 512) == 0);
    /* Equal plaintext sectors differ once encrypted, except under ECB. */
    memset (other, 0x5a, 1024);
    CHECK_EQ (qcow2_sectors_encrypt (c, 7, other, 1024, err, sizeof err), 0);
    CHECK ((memcmp (other, other + 512, 512) == 0) == ecb);
    CHECK_EQ (qcow2_sectors_decrypt (c, 1000, buf, sizeof buf,
                                     err, sizeof err), 0);
    CHECK (memcmp (buf, plain, sizeof buf) == 0);

    /* plain keeps only the low 32 bits of the sector number. */
    if (spec.ivgen != QCOW2_IVGEN_ESSIV && !ecb) {
      memcpy (buf, plain, 512);
      memcpy (other, plain, 512);
      CHECK_EQ (qcow2_sectors_encrypt (c, 5, buf, 512, err, sizeof err), 0);
      CHECK_EQ (qcow2_sectors_encrypt (c, 5 + (UINT64_C (1) << 32), other,
                                       512, err, sizeof err), 0);
      CHECK ((memcmp (buf, other, 512) == 0) ==
             (spec.ivgen == QCOW2_IVGEN_PLAIN));
    }

    CHECK_EQ (qcow2_sectors_encrypt (c, 0, buf, 511, err, sizeof err), -1);
    CHECK (unit_says (err, "whole 512-byte sectors"));
    qcow2_sector_cipher_free (c);
    UNIT_NOTE_IF_FAILED (before, "%s %s %u", v[i].name, v[i].mode,
                         v[i].key_bytes);
  }
  qcow2_sector_cipher_free (NULL);
}

/* ---------------------------------------------------------------- create */

static const char our_pass[] = "our passphrase";

/* An area from qcow2_luks_create with fast fixed iterations. */
static uint8_t *
make_area (const char *name, const char *mode, uint32_t key_bytes,
           enum qcow2_hash hash, const char *pass, size_t *len,
           uint8_t *mk)
{
  struct qcow2_luks_create_params p = {
    .spec_set = true, .hash_set = true, .hash = hash,
    .slot_iterations = 1000, .mk_iterations = 1000,
  };
  uint8_t *area = NULL;
  char err[256];

  CHECK_EQ (qcow2_cipher_spec_parse (name, mode, key_bytes, &p.spec,
                                     err, sizeof err), 0);
  if (qcow2_luks_create (&p, pass, strlen (pass), &area, len, mk,
                         err, sizeof err) != 0) {
    fprintf (stderr, "qcow2_luks_create: %s\n", err);
    exit (1);
  }
  return area;
}

static void
test_create_and_unlock (void)
{
  struct qcow2_luks_header h;
  uint8_t mk[64], got[64];
  size_t len;
  char err[256];
  int slot = -1;
  uint8_t *area = make_area ("aes", "xts-plain64", 64, QCOW2_HASH_SHA256,
                             our_pass, &len, mk);

  /* qemu's layout for a 64-byte key and 4000 stripes: 500 sectors of
   * material rounded to 504, eight slots after the first 4 KiB.
   */
  CHECK_EQ (len, (8 + 8 * 504) * 512);
  CHECK_EQ (qcow2_luks_parse (area, len, &h, err, sizeof err), 0);
  CHECK (strcmp (h.cipher_name, "aes") == 0);
  CHECK (strcmp (h.cipher_mode, "xts-plain64") == 0);
  CHECK (strcmp (h.hash_spec, "sha256") == 0);
  CHECK_EQ (h.payload_offset, 8 + 8 * 504);
  CHECK_EQ (h.key_bytes, 64);
  CHECK_EQ (h.active_slots, 1);
  CHECK (h.slots[0].active && !h.slots[1].active);
  for (int i = 0; i < QCOW2_LUKS_SLOTS; ++i) {
    CHECK_EQ (h.slots[i].key_offset, 8 + i * 504);
    CHECK_EQ (h.slots[i].stripes, 4000);
  }
  CHECK_EQ (h.slots[0].iterations, 1000);
  CHECK_EQ (h.mk_iterations, 1000);
  CHECK_EQ (strlen (h.uuid), 36);
  CHECK (h.uuid[14] == '4' && h.uuid[8] == '-' && h.uuid[23] == '-');

  CHECK_EQ (qcow2_luks_unlock (&h, area, len, our_pass, strlen (our_pass),
                               got, &slot, err, sizeof err), 0);
  CHECK_EQ (slot, 0);
  CHECK (memcmp (got, mk, 64) == 0);
  CHECK_EQ (qcow2_luks_unlock (&h, area, len, "our passphrasE",
                               strlen (our_pass), got, &slot,
                               err, sizeof err),
            QCOW2_LUKS_WRONG_PASSPHRASE);
  CHECK (unit_says (err, "wrong passphrase"));
  /* The length counts: a prefix is another passphrase. */
  CHECK_EQ (qcow2_luks_unlock (&h, area, len, our_pass, 3, got, NULL,
                               err, sizeof err),
            QCOW2_LUKS_WRONG_PASSPHRASE);

  /* A second active slot, a copy of slot 0 at slot 5's place (the
   * material's sectors are numbered from the slot's start).  With slot 0's
   * salt broken, slot 5 opens.
   */
  uint8_t *copy = malloc (len);
  memcpy (copy, area, len);
  memcpy (copy + 208 + 5 * 48, copy + 208, 40);
  memcpy (copy + (size_t) h.slots[5].key_offset * 512,
          copy + (size_t) h.slots[0].key_offset * 512, 256000);
  copy[208 + 8] ^= 1;
  struct qcow2_luks_header h2;
  CHECK_EQ (qcow2_luks_parse (copy, len, &h2, err, sizeof err), 0);
  CHECK_EQ (h2.active_slots, 2);
  CHECK_EQ (qcow2_luks_unlock (&h2, copy, len, our_pass, strlen (our_pass),
                               got, &slot, err, sizeof err), 0);
  CHECK_EQ (slot, 5);
  CHECK (memcmp (got, mk, 64) == 0);
  CHECK_EQ (qcow2_luks_unlock (&h2, copy, len, "x", 1, got, &slot,
                               err, sizeof err),
            QCOW2_LUKS_WRONG_PASSPHRASE);
  CHECK (unit_says (err, "2 active LUKS key slots"));

  /* No active slot at all: not a wrong passphrase. */
  put_be32 (copy + 208, 0xdead);
  put_be32 (copy + 208 + 5 * 48, 0xdead);
  CHECK_EQ (qcow2_luks_parse (copy, len, &h2, err, sizeof err), 0);
  CHECK_EQ (qcow2_luks_unlock (&h2, copy, len, our_pass, strlen (our_pass),
                               got, &slot, err, sizeof err), -1);
  CHECK (unit_says (err, "no active key slot"));
  free (copy);
  free (area);

  /* Tuned iterations (qemu's minimum is 1000), then unlock. */
  struct qcow2_luks_create_params p = { .iter_time_ms = 20 };
  CHECK_EQ (qcow2_luks_create (&p, "", 0, &area, &len, mk, err, sizeof err),
            0);
  CHECK_EQ (qcow2_luks_parse (area, len, &h, err, sizeof err), 0);
  CHECK (h.slots[0].iterations >= 1000 && h.mk_iterations >= 1000);
  CHECK_EQ (qcow2_luks_unlock (&h, area, len, "", 0, got, NULL,
                               err, sizeof err), 0);
  CHECK (memcmp (got, mk, 64) == 0);
  free (area);

  /* 24-byte keys outside XTS: 96000 bytes of material, qemu cannot. */
  p.spec_set = true;
  CHECK_EQ (qcow2_cipher_spec_parse ("aes", "cbc-plain64", 24, &p.spec,
                                     err, sizeof err), 0);
  area = NULL;
  CHECK_EQ (qcow2_luks_create (&p, "x", 1, &area, &len, mk, err, sizeof err),
            -1);
  CHECK (unit_says (err, "aes-192-cbc-plain64"));
  CHECK (area == NULL);
  qcow2_wipe (mk, sizeof mk);
}

/* ---------------------------------------------------------------- hostile */

static void
test_hostile_headers (void)
{
  uint8_t mk[64];
  size_t len;
  uint8_t *good = make_area ("aes", "cbc-essiv:sha256", 32,
                             QCOW2_HASH_SHA1, our_pass, &len, mk);
  uint8_t *a = malloc (len);
  struct qcow2_luks_header h;
  char err[256];

  /* Each case breaks one field of a valid header. */
#define HOSTILE(what, edit, area_len, message)                           \
  do {                                                                  \
    unsigned long before_ = atomic_load (&unit_failures);               \
    memcpy (a, good, len);                                              \
    edit;                                                               \
    CHECK_EQ (qcow2_luks_parse (a, (area_len), &h, err, sizeof err), -1); \
    CHECK (unit_says (err, message));                                    \
    UNIT_NOTE_IF_FAILED (before_, "%s", what);                          \
  } while (0)

  CHECK_EQ (qcow2_luks_parse (good, len, &h, err, sizeof err), 0);
  uint32_t payload = h.payload_offset;

  HOSTILE ("short", (void) 0, 591, "too short for a LUKS header");
  HOSTILE ("magic", a[3] = 'X', len, "magic");
  HOSTILE ("version", a[7] = 2, len, "LUKS version 2");
  HOSTILE ("cipher_name", memset (a + 8, 'a', 32), len,
           "cipher_name is not terminated");
  HOSTILE ("cipher_mode", memset (a + 40, 'b', 32), len,
           "cipher_mode is not terminated");
  HOSTILE ("hash_spec", strcpy ((char *) a + 72, "whirlpool"), len,
           "hash \"whirlpool\"");
  HOSTILE ("cipher", strcpy ((char *) a + 8, "camellia"), len,
           "camellia-256-cbc-essiv:sha256");
  HOSTILE ("key_bytes 0", put_be32 (a + 108, 0), len, "key_bytes");
  HOSTILE ("key_bytes 65", put_be32 (a + 108, 65), len, "key_bytes");
  HOSTILE ("key_bytes 48", put_be32 (a + 108, 48), len,
           "aes does not have 384-bit keys");
  HOSTILE ("mk_iterations", put_be32 (a + 164, 0), len,
           "master key iterations is 0");
  HOSTILE ("slot state", put_be32 (a + 208 + 3 * 48, 0x12345678), len,
           "key slot 3: state 0x12345678");
  HOSTILE ("stripes", put_be32 (a + 208 + 2 * 48 + 44, 0), len,
           "key slot 2: stripes is 0");
  HOSTILE ("over header", put_be32 (a + 208 + 40, 1), len,
           "key slot 0: its key material (sector 1) overlaps the LUKS");
  HOSTILE ("over payload", put_be32 (a + 208 + 7 * 48 + 40, payload - 1),
           len, "key slot 7: its key material");
  HOSTILE ("payload", put_be32 (a + 104, payload - 8), len,
           "overlaps the payload");
  HOSTILE ("overlap", put_be32 (a + 208 + 48 + 40, 8 + 100), len,
           "key slots 0 and 1");
  HOSTILE ("huge stripes",
           (put_be32 (a + 208 + 4 * 48 + 44, UINT32_MAX),
            put_be32 (a + 104, UINT32_MAX)), len, "key slots");
  HOSTILE ("iterations", put_be32 (a + 208 + 4, 0), len,
           "key slot 0: iterations is 0");
  HOSTILE ("past the area", (void) 0, 8 * 512 + 1000,
           "key slot 0: its key material (4000 stripes of 32 bytes at "
           "sector 8) runs past the end");
#undef HOSTILE

  /* An inactive slot's state, iterations and material do not count. */
  memcpy (a, good, len);
  put_be32 (a + 208 + 6 * 48 + 4, 0);
  CHECK_EQ (qcow2_luks_parse (a, len, &h, err, sizeof err), 0);
  /* The area may end right after the active slot's material. */
  CHECK_EQ (qcow2_luks_parse (a, (8 + 256) * 512, &h, err, sizeof err), 0);
  free (a);
  free (good);
}

static void
test_crypt_method_refusal (void)
{
  char msg[1024];

  qcow2_crypt_method_refusal (1, msg, sizeof msg);
  CHECK (unit_says (msg, "crypt_method"));
  CHECK (unit_says (msg, "legacy AES"));
  CHECK (unit_says (msg, "qemu-img convert"));
  CHECK (unit_says (msg, "encrypt.format=luks"));
  qcow2_crypt_method_refusal (7, msg, sizeof msg);
  CHECK (unit_says (msg, "unknown encryption method 7"));
}

/* ---------------------------------------------------------------- qemu */

static const char qemu_pass[] = "qemu-pass-1";

/* Images qemu-img makes, one per cipher family, mode and IV generator
 * path (GnuTLS or nettle) and hash.
 */
static const struct qemu_case {
  const char *alg, *mode, *ivgen, *ivhash, *hash;
  const char *described;
} qemu_cases[] = {
  { "aes-256", "xts", "plain64", NULL, "sha256", "aes-256-xts-plain64" },
  { "aes-128", "xts", "plain64", NULL, "sha1", "aes-128-xts-plain64" },
  { "aes-192", "xts", "plain", NULL, "sha512", "aes-192-xts-plain" },
  { "aes-256", "cbc", "essiv", "sha256", "sha256",
    "aes-256-cbc-essiv:sha256" },
  { "aes-128", "cbc", "plain64", NULL, "ripemd160", "aes-128-cbc-plain64" },
  { "aes-256", "ctr", "plain64", NULL, "sha384", "aes-256-ctr-plain64" },
  { "aes-128", "ecb", "plain64", NULL, "md5", "aes-128-ecb-plain64" },
  { "serpent-256", "xts", "plain64", NULL, "sha256",
    "serpent-256-xts-plain64" },
  { "serpent-192", "xts", "essiv", "sha256", "sha224",
    "serpent-192-xts-essiv:sha256" },
  { "twofish-128", "cbc", "essiv", "sha256", "sha256",
    "twofish-128-cbc-essiv:sha256" },
  { "cast5-128", "cbc", "plain64", NULL, "sha256", "cast5-128-cbc-plain64" },
};
#define NQEMU (sizeof qemu_cases / sizeof qemu_cases[0])

/* What qemu-io writes into each image: guest offset, length, pattern.
 * The first write allocates the first data cluster, at a host offset
 * below the guest offset 3 MiB; the second lands above guest offset 0.
 */
static const struct { uint64_t guest; uint32_t len; uint8_t pattern; }
  writes[] = {
  { 3 * MiB, 64 * KiB, 0xa1 },
  { 0, 64 * KiB, 0xa2 },
  { 3 * MiB + 512 * KiB + 512, 1024, 0xa3 },
};

static char *
image_path (size_t i)
{
  char *path;
  if (asprintf (&path, "%s/luks-%zu.qcow2", scratch_dir (), i) < 0)
    exit (1);
  return path;
}

static int
qemu_io (const char *path, const char *pass, const char *commands)
{
  return run_command ("qemu-io --object secret,id=s0,data=%s --image-opts "
                   "driver=qcow2,file.filename=%s,encrypt.key-secret=s0 "
                   "%s >/dev/null 2>&1", pass, path, commands);
}

/* Make every image, two qemu-img processes at a time, through
 * tests/qemu-img-luks.sh: qemu-img's PBKDF2 benchmark fails about one
 * run in three with "Unable to get accurate CPU usage", and that script
 * runs it again then (it says why that is safe).
 */
static void
make_qemu_images (void)
{
  FILE *fp;
  char script[4200];

  snprintf (script, sizeof script, "%s/make.sh", scratch_dir ());
  fp = fopen (script, "w");
  if (fp == NULL) {
    perror (script);
    exit (1);
  }
  fprintf (fp,
           "set -e\n"
           "mk () {\n"
           "  bash '%s/tests/qemu-img-luks.sh' create -q -f qcow2 \\\n"
           "    --object secret,id=s0,data=%s \\\n"
           "    -o encrypt.format=luks,encrypt.key-secret=s0,"
           "encrypt.iter-time=10,$2 \"$1\" 4M\n"
           "  qemu-io --object secret,id=s0,data=%s --image-opts \\\n"
           "    driver=qcow2,file.filename=\"$1\",encrypt.key-secret=s0 \\\n",
           top_srcdir (), qemu_pass, qemu_pass);
  for (size_t w = 0; w < sizeof writes / sizeof writes[0]; ++w)
    fprintf (fp, "    -c 'write -P 0x%02x %" PRIu64 " %" PRIu32 "' \\\n",
             writes[w].pattern, writes[w].guest, writes[w].len);
  fprintf (fp, "    >/dev/null\n}\n");
  for (size_t i = 0; i < NQEMU; ++i) {
    const struct qemu_case *q = &qemu_cases[i];
    char *path = image_path (i);
    fprintf (fp,
             "mk %s encrypt.cipher-alg=%s,encrypt.cipher-mode=%s,"
             "encrypt.ivgen-alg=%s%s%s,encrypt.hash-alg=%s & p%zu=$!\n",
             path, q->alg, q->mode, q->ivgen,
             q->ivhash ? ",encrypt.ivgen-hash-alg=" : "",
             q->ivhash ? q->ivhash : "", q->hash, i);
    /* "wait PID" returns that job's status (a bare wait returns 0). */
    if (i % 2 == 1)
      fprintf (fp, "wait $p%zu\nwait $p%zu\n", i - 1, i);
    else if (i + 1 == NQEMU)
      fprintf (fp, "wait $p%zu\n", i);
    free (path);
  }
  fclose (fp);
  if (run_command ("bash -e %s", script) != 0) {
    fprintf (stderr, "making the LUKS images with qemu-img failed\n");
    exit (1);
  }
}

struct crypto_ext {
  uint64_t offset, length;
  bool found;
};

static int
find_crypto_ext (void *opaque, uint32_t type, const uint8_t *data,
                 uint32_t len)
{
  struct crypto_ext *ext = opaque;
  if (type == QCOW2_EXT_CRYPTO && len >= 16) {
    ext->offset = be64 (data);
    ext->length = be64 (data + 8);
    ext->found = true;
  }
  return 0;
}

/* The image's header and its LUKS area, from the file's bytes. */
static bool
open_luks_image (const uint8_t *img, size_t len, struct qcow2_header *qh,
                 struct crypto_ext *ext)
{
  char err[256];

  memset (ext, 0, sizeof *ext);
  if (qcow2_header_parse (img, len, len, qh, err, sizeof err) != 0 ||
      qcow2_header_walk_extensions (img, len, qh, find_crypto_ext, ext,
                                    err, sizeof err) != 0) {
    fprintf (stderr, "qcow2 header: %s\n", err);
    return false;
  }
  return qh->crypt_method == 2 && ext->found &&
    ext->offset % qh->cluster_size == 0 &&
    ext->offset + ext->length <= len;
}

static void
write_at (const char *path, uint64_t offset, const void *buf, size_t len)
{
  int fd = open (path, O_WRONLY);
  if (fd == -1 || pwrite (fd, buf, len, offset) != (ssize_t) len ||
      close (fd) != 0) {
    perror (path);
    exit (1);
  }
}

static void
check_qemu_image (size_t i)
{
  const struct qemu_case *q = &qemu_cases[i];
  char *path = image_path (i);
  size_t len;
  uint8_t *img = read_whole_file (path, &len);
  struct qcow2_header qh;
  struct crypto_ext ext;
  struct qcow2_luks_header h;
  struct qcow2_sector_cipher *c = NULL;
  uint8_t mk[64];
  char err[256], described[80];
  int slot = -1;
  uint8_t *cluster = NULL, *expect = NULL;
  unsigned long before = atomic_load (&unit_failures);

  CHECK (open_luks_image (img, len, &qh, &ext));
  if (!ext.found)
    goto out;
  const uint8_t *area = img + ext.offset;

  CHECK_EQ (qcow2_luks_parse (area, ext.length, &h, err, sizeof err), 0);
  qcow2_cipher_spec_describe (&h.spec, described, sizeof described);
  CHECK (strcmp (described, q->described) == 0);
  CHECK (strcmp (h.hash_spec, q->hash) == 0);
  /* Our layout is qemu's: the extension's length is our area's. */
  {
    struct qcow2_luks_create_params p = {
      .spec_set = true, .spec = h.spec, .hash_set = true, .hash = h.hash,
      .slot_iterations = 1000, .mk_iterations = 1000,
    };
    uint8_t *ours = NULL, ours_mk[64];
    size_t ours_len = 0;
    if (h.key_bytes * 4000 % 512 == 0) {
      CHECK_EQ (qcow2_luks_create (&p, "x", 1, &ours, &ours_len, ours_mk,
                                   err, sizeof err), 0);
      UNIT_NOTE_IF_FAILED (before, "%s", err);
      CHECK_EQ (ours_len, ext.length);
      if (ours)
        CHECK_EQ (be32 (ours + 104), h.payload_offset);
      free (ours);
    }
  }

  CHECK_EQ (qcow2_luks_unlock (&h, area, ext.length, "qemu-pass-2",
                               strlen (qemu_pass), mk, &slot,
                               err, sizeof err),
            QCOW2_LUKS_WRONG_PASSPHRASE);
  CHECK_EQ (qcow2_luks_unlock (&h, area, ext.length, qemu_pass,
                               strlen (qemu_pass), mk, &slot,
                               err, sizeof err), 0);
  CHECK_EQ (slot, 0);
  c = qcow2_sector_cipher_new (&h.spec, mk, err, sizeof err);
  CHECK (c != NULL);
  if (c == NULL)
    goto out;

  cluster = malloc (qh.cluster_size);
  expect = malloc (qh.cluster_size);
  for (size_t w = 0; w < sizeof writes / sizeof writes[0]; ++w) {
    uint64_t guest_cluster = writes[w].guest & -(uint64_t) qh.cluster_size;
    uint64_t host = guest_to_host (img, len, &qh, qh.l1_table_offset,
                                        qh.l1_size, writes[w].guest);
    CHECK (host != 0 && host != guest_cluster);
    if (host == 0 || host + qh.cluster_size > len)
      continue;
    memset (expect, 0, qh.cluster_size);
    memset (expect + (writes[w].guest - guest_cluster), writes[w].pattern,
            writes[w].len);

    /* The IV comes from the host offset... */
    memcpy (cluster, img + host, qh.cluster_size);
    CHECK_EQ (qcow2_sectors_decrypt (c, host / 512, cluster, qh.cluster_size,
                                     err, sizeof err), 0);
    CHECK (memcmp (cluster, expect, qh.cluster_size) == 0);
    /* ...not the guest offset (ECB has no IV to tell them apart). */
    memcpy (cluster, img + host, qh.cluster_size);
    CHECK_EQ (qcow2_sectors_decrypt (c, guest_cluster / 512, cluster,
                                     qh.cluster_size, err, sizeof err), 0);
    CHECK ((memcmp (cluster, expect, qh.cluster_size) == 0) ==
           (h.spec.mode == QCOW2_MODE_ECB));
  }

  /* The other way: encrypt here, read through qemu. */
  uint64_t host0 = guest_to_host (img, len, &qh, qh.l1_table_offset,
                                       qh.l1_size, 0);
  if (host0) {
    memset (cluster, 0xb7, qh.cluster_size);
    CHECK_EQ (qcow2_sectors_encrypt (c, host0 / 512, cluster, qh.cluster_size,
                                     err, sizeof err), 0);
    write_at (path, host0, cluster, qh.cluster_size);
    CHECK_EQ (qemu_io (path, qemu_pass, "-c 'read -P 0xb7 0 64k'"), 0);
  }

 out:
  qcow2_sector_cipher_free (c);
  qcow2_wipe (mk, sizeof mk);
  free (cluster);
  free (expect);
  free (img);
  free (path);
}

/* A header made here, in place of qemu's in image I: qemu must open it
 * with our passphrase, refuse the old one, and what it writes must
 * decrypt with our master key.
 */
static void
check_our_header_in_qemu (size_t i)
{
  char *path = image_path (i);
  size_t len;
  uint8_t *img = read_whole_file (path, &len);
  struct qcow2_header qh;
  struct crypto_ext ext;
  struct qcow2_luks_header qemu_h;
  uint8_t mk[64];
  char err[256];

  CHECK (open_luks_image (img, len, &qh, &ext));
  if (!ext.found ||
      qcow2_luks_parse (img + ext.offset, ext.length, &qemu_h,
                        err, sizeof err) != 0) {
    CHECK (!"the qemu image parses");
    goto out;
  }
  struct qcow2_luks_create_params p = {
    .spec_set = true, .spec = qemu_h.spec, .hash_set = true,
    .hash = qemu_h.hash, .iter_time_ms = 10,
  };
  uint8_t *area = NULL;
  size_t area_len = 0;
  CHECK_EQ (qcow2_luks_create (&p, our_pass, strlen (our_pass), &area,
                               &area_len, mk, err, sizeof err), 0);
  CHECK_EQ (area_len, ext.length);
  if (area == NULL || area_len != ext.length)
    goto out;
  write_at (path, ext.offset, area, area_len);
  free (area);

  char quoted[64];
  snprintf (quoted, sizeof quoted, "'%s'", our_pass);
  CHECK_EQ (qemu_io (path, qemu_pass, "-c 'read 0 512'"), 1);
  CHECK_EQ (qemu_io (path, quoted,
                     "-c 'write -P 0xc4 2M 64k' -c 'read -P 0xc4 2M 64k'"),
            0);

  free (img);
  img = read_whole_file (path, &len);
  uint64_t host = guest_to_host (img, len, &qh, qh.l1_table_offset,
                                      qh.l1_size, 2 * MiB);
  CHECK (host != 0);
  if (host && host + qh.cluster_size <= len) {
    struct qcow2_sector_cipher *c =
      qcow2_sector_cipher_new (&qemu_h.spec, mk, err, sizeof err);
    uint8_t *buf = malloc (qh.cluster_size);
    memcpy (buf, img + host, qh.cluster_size);
    CHECK (c != NULL);
    if (c) {
      CHECK_EQ (qcow2_sectors_decrypt (c, host / 512, buf, qh.cluster_size,
                                       err, sizeof err), 0);
      bool all = true;
      for (size_t k = 0; k < qh.cluster_size; ++k)
        all &= buf[k] == 0xc4;
      CHECK (all);
    }
    qcow2_sector_cipher_free (c);
    free (buf);
  }
 out:
  qcow2_wipe (mk, sizeof mk);
  free (img);
  free (path);
}

static void
test_legacy_aes_image (void)
{
  char path[4200], msg[1024], err[256];
  size_t len;
  struct qcow2_header qh;

  snprintf (path, sizeof path, "%s/aes.qcow2", scratch_dir ());
  if (run_command ("qemu-img create -q -f qcow2 --object secret,id=s0,data=x "
                "-o encrypt.format=aes,encrypt.key-secret=s0 %s 1M "
                ">/dev/null 2>&1", path) != 0) {
    fprintf (stderr, "qemu-img cannot make legacy AES images here: "
             "skipping that check\n");
    return;
  }
  uint8_t *img = read_whole_file (path, &len);
  CHECK_EQ (qcow2_header_parse (img, len, len, &qh, err, sizeof err), 0);
  CHECK_EQ (qh.crypt_method, 1);
  qcow2_crypt_method_refusal (qh.crypt_method, msg, sizeof msg);
  CHECK (unit_says (msg, "legacy AES"));
  free (img);
}

int
main (void)
{
  test_pbkdf2_known_answers ();
  test_hashes ();
  test_spec_parse ();
  test_sector_ciphers ();
  test_create_and_unlock ();
  test_hostile_headers ();
  test_crypt_method_refusal ();

  if (!have_command ("qemu-img") || !have_command ("qemu-io"))
    UNIT_SKIP ("qemu-img or qemu-io not found: the checks against qemu "
               "did not run");
  scratch_dir_make ();
  make_qemu_images ();
  for (size_t i = 0; i < NQEMU; ++i) {
    unsigned long before = atomic_load (&unit_failures);
    check_qemu_image (i);
    UNIT_NOTE_IF_FAILED (before, "qemu image %s", qemu_cases[i].described);
  }
  /* GnuTLS XTS, GnuTLS CBC with ESSIV, nettle XTS, an 8-byte block. */
  static const size_t ours[] = { 0, 3, 7, 10 };
  for (size_t k = 0; k < sizeof ours / sizeof ours[0]; ++k) {
    unsigned long before = atomic_load (&unit_failures);
    check_our_header_in_qemu (ours[k]);
    UNIT_NOTE_IF_FAILED (before, "our header for %s",
                         qemu_cases[ours[k]].described);
  }
  test_legacy_aes_image ();
  return unit_finish ();
}
