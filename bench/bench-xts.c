/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd benchmark: AES-XTS, AES-CBC and PBKDF2 speed of the crypto
 * libraries a LUKS-encrypted qcow2 could be served with (OpenSSL's
 * libcrypto, GnuTLS, nettle), single thread, on this machine.
 *
 * qcow2 LUKS encrypts every 512-byte sector with its own IV (plain64 of the
 * sector number), so the number that matters is "per-sector": one IV set
 * and one 512-byte call per sector, over a cluster.  "one-message" encrypts
 * the whole cluster under one IV: the raw cipher speed, which shows what
 * the per-sector calls cost.  Every library's output is compared with
 * OpenSSL's before anything is timed.
 *
 * Built and run by bench/bench-crypto.sh, not by make.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>
#include <gnutls/gnutls.h>
#include <gnutls/crypto.h>
#include <nettle/aes.h>
#include <nettle/cbc.h>
#include <nettle/xts.h>
#include <nettle/pbkdf2.h>
#include <nettle/version.h>

#define SECTOR 512

/* The thread's CPU time, not the wall clock: the machines are shared, and
 * time spent descheduled is not the library's.
 */
static double
now (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
die (const char *what)
{
  fprintf (stderr, "bench-xts: %s failed\n", what);
  exit (1);
}

static void
plain64 (uint8_t iv[16], uint64_t sector)
{
  memset (iv, 0, 16);
  for (int i = 0; i < 8; ++i)
    iv[i] = sector >> (8 * i);
}

/* One contender: encrypts or decrypts BUF (LEN bytes, a multiple of 512)
 * in place, sector by sector from FIRST_SECTOR, or as one message when
 * ONE_MESSAGE.
 */
struct lib {
  const char *name;
  void (*setup) (const uint8_t *key, size_t key_len, bool xts);
  void (*run) (bool encrypt, bool one_message, uint64_t first_sector,
               uint8_t *buf, size_t len);
  void (*teardown) (void);
};

/* ---------------------------------------------------------------- OpenSSL */
static EVP_CIPHER_CTX *ossl_enc, *ossl_dec;

static void
ossl_setup (const uint8_t *key, size_t key_len __attribute__ ((unused)),
            bool xts)
{
  const EVP_CIPHER *c = xts ? EVP_aes_256_xts () : EVP_aes_256_cbc ();
  ossl_enc = EVP_CIPHER_CTX_new ();
  ossl_dec = EVP_CIPHER_CTX_new ();
  if (!ossl_enc || !ossl_dec ||
      EVP_CipherInit_ex (ossl_enc, c, NULL, key, NULL, 1) != 1 ||
      EVP_CipherInit_ex (ossl_dec, c, NULL, key, NULL, 0) != 1)
    die ("OpenSSL init");
  EVP_CIPHER_CTX_set_padding (ossl_enc, 0);
  EVP_CIPHER_CTX_set_padding (ossl_dec, 0);
}

/* EVP_CipherUpdate, the documented streaming call, and EVP_Cipher, the
 * thinner one-shot call; both reset the IV with EVP_CipherInit_ex.
 */
static bool ossl_thin;

static void
ossl_run (bool encrypt, bool one_message, uint64_t first_sector,
          uint8_t *buf, size_t len)
{
  EVP_CIPHER_CTX *ctx = encrypt ? ossl_enc : ossl_dec;
  size_t step = one_message ? len : SECTOR;
  uint8_t iv[16];
  int out_len;

  for (size_t off = 0; off < len; off += step) {
    plain64 (iv, first_sector + off / SECTOR);
    if (EVP_CipherInit_ex (ctx, NULL, NULL, NULL, iv, -1) != 1)
      die ("OpenSSL IV");
    if (ossl_thin ? EVP_Cipher (ctx, buf + off, buf + off, step) <= 0
        : EVP_CipherUpdate (ctx, buf + off, &out_len, buf + off, step) != 1)
      die ("OpenSSL cipher");
  }
}

static void
ossl_teardown (void)
{
  EVP_CIPHER_CTX_free (ossl_enc);
  EVP_CIPHER_CTX_free (ossl_dec);
}

static void
ossl_thin_setup (const uint8_t *key, size_t key_len, bool xts)
{
  ossl_thin = true;
  ossl_setup (key, key_len, xts);
}

static void
ossl_thin_teardown (void)
{
  ossl_teardown ();
  ossl_thin = false;
}

/* ---------------------------------------------------------------- GnuTLS */
static gnutls_cipher_hd_t gtls;

static void
gtls_setup (const uint8_t *key, size_t key_len, bool xts)
{
  gnutls_datum_t k = { (unsigned char *) key, key_len };
  uint8_t iv0[16] = { 0 };
  gnutls_datum_t iv = { iv0, 16 };
  if (gnutls_cipher_init (&gtls, xts ? GNUTLS_CIPHER_AES_256_XTS
                                     : GNUTLS_CIPHER_AES_256_CBC,
                          &k, &iv) < 0)
    die ("GnuTLS init");
}

static void
gtls_run (bool encrypt, bool one_message, uint64_t first_sector,
          uint8_t *buf, size_t len)
{
  size_t step = one_message ? len : SECTOR;
  uint8_t iv[16];

  for (size_t off = 0; off < len; off += step) {
    plain64 (iv, first_sector + off / SECTOR);
    gnutls_cipher_set_iv (gtls, iv, 16);
    int r = encrypt
      ? gnutls_cipher_encrypt2 (gtls, buf + off, step, buf + off, step)
      : gnutls_cipher_decrypt2 (gtls, buf + off, step, buf + off, step);
    if (r < 0)
      die ("GnuTLS cipher");
  }
}

static void
gtls_teardown (void)
{
  gnutls_cipher_deinit (gtls);
}

/* ---------------------------------------------------------------- nettle */
static struct xts_aes256_key nettle_xts_enc, nettle_xts_dec;
static struct aes256_ctx nettle_aes_enc, nettle_aes_dec;
static bool nettle_is_xts;

static void
nettle_setup (const uint8_t *key, size_t key_len __attribute__ ((unused)),
              bool xts)
{
  nettle_is_xts = xts;
  if (xts) {
    xts_aes256_set_encrypt_key (&nettle_xts_enc, key);
    xts_aes256_set_decrypt_key (&nettle_xts_dec, key);
  }
  else {
    aes256_set_encrypt_key (&nettle_aes_enc, key);
    aes256_set_decrypt_key (&nettle_aes_dec, key);
  }
}

static void
nettle_run (bool encrypt, bool one_message, uint64_t first_sector,
            uint8_t *buf, size_t len)
{
  size_t step = one_message ? len : SECTOR;
  uint8_t iv[16];

  for (size_t off = 0; off < len; off += step) {
    plain64 (iv, first_sector + off / SECTOR);
    if (nettle_is_xts) {
      if (encrypt)
        xts_aes256_encrypt_message (&nettle_xts_enc, iv, step, buf + off,
                                    buf + off);
      else
        xts_aes256_decrypt_message (&nettle_xts_dec, iv, step, buf + off,
                                    buf + off);
    }
    else if (encrypt)
      cbc_encrypt (&nettle_aes_enc, (nettle_cipher_func *) aes256_encrypt,
                   16, iv, step, buf + off, buf + off);
    else
      cbc_decrypt (&nettle_aes_dec, (nettle_cipher_func *) aes256_decrypt,
                   16, iv, step, buf + off, buf + off);
  }
}

static void
nettle_teardown (void)
{
}

static const struct lib libs[] = {
  { "openssl", ossl_setup, ossl_run, ossl_teardown },
  { "openssl2", ossl_thin_setup, ossl_run, ossl_thin_teardown },
  { "gnutls", gtls_setup, gtls_run, gtls_teardown },
  { "nettle", nettle_setup, nettle_run, nettle_teardown },
};
#define NLIBS (sizeof libs / sizeof libs[0])

/* Each measurement runs for about SECONDS of CPU time; the libraries take
 * turns REPEATS times and each keeps its best, so that a burst of load on
 * the machine does not land on one library only.
 */
static double seconds = 1.0;
static int repeats = 3;

/* MB/s (10^6 bytes) of one run. */
static double
time_cipher (const struct lib *l, bool encrypt, bool one_message,
             uint8_t *buf, size_t len)
{
  uint64_t bytes = 0, sector = 12345;
  double start = now (), t;

  do {
    for (int i = 0; i < 16; ++i) {
      l->run (encrypt, one_message, sector, buf, len);
      sector += len / SECTOR;
      bytes += len;
    }
    t = now () - start;
  } while (t < seconds);
  return bytes / t / 1e6;
}

static void
check_same_output (bool xts, const uint8_t *key, size_t key_len,
                   const uint8_t *plain, size_t len)
{
  uint8_t *ref = malloc (len), *out = malloc (len);
  if (!ref || !out)
    die ("malloc");
  for (size_t i = 0; i < NLIBS; ++i) {
    uint8_t *dst = i == 0 ? ref : out;
    libs[i].setup (key, key_len, xts);
    memcpy (dst, plain, len);
    libs[i].run (true, false, 777, dst, len);
    if (i > 0 && memcmp (ref, out, len) != 0) {
      fprintf (stderr, "bench-xts: %s and %s disagree on the ciphertext\n",
               libs[0].name, libs[i].name);
      exit (1);
    }
    memcpy (out, dst, len);
    libs[i].run (false, false, 777, out, len);
    if (memcmp (out, plain, len) != 0) {
      fprintf (stderr, "bench-xts: %s does not decrypt its own output\n",
               libs[i].name);
      exit (1);
    }
    libs[i].teardown ();
  }
  free (ref);
  free (out);
}

/* ---------------------------------------------------------------- PBKDF2 */
static const char *const pbkdf2_names[] = { "openssl", "gnutls", "nettle" };
#define NPBKDF2 3

/* Iterations per second of one run. */
static double
pbkdf2_rate (int which, size_t out_len, unsigned iterations)
{
  static const char pass[] = "correct horse battery staple";
  uint8_t salt[32] = { 1, 2, 3 }, out[64];
  double start = now ();
  int ok = 1;

  switch (which) {
  case 0:
    ok = PKCS5_PBKDF2_HMAC (pass, strlen (pass), salt, sizeof salt,
                            iterations, EVP_sha256 (), out_len, out);
    break;
  case 1: {
    gnutls_datum_t k = { (unsigned char *) pass, strlen (pass) };
    gnutls_datum_t s = { salt, sizeof salt };
    ok = gnutls_pbkdf2 (GNUTLS_MAC_SHA256, &k, &s, iterations, out,
                        out_len) == 0;
    break;
  }
  case 2:
    pbkdf2_hmac_sha256 (strlen (pass), (const uint8_t *) pass,
                        iterations, sizeof salt, salt, out_len, out);
    break;
  }
  if (!ok)
    die ("PBKDF2");
  return iterations / (now () - start);
}

#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* One row of the table: a cipher operation over LEN bytes per call. */
struct row {
  const char *label;
  bool xts, encrypt, one_message;
  size_t len;
};

static const struct row rows[] = {
  { "xts-256 decrypt, 1 sector per call",       true,  false, false, 512 },
  { "xts-256 decrypt, 64 KiB of sectors",       true,  false, false, 65536 },
  { "xts-256 decrypt, 64 KiB under one IV",     true,  false, true,  65536 },
  { "xts-256 encrypt, 1 sector per call",       true,  true,  false, 512 },
  { "xts-256 encrypt, 64 KiB of sectors",       true,  true,  false, 65536 },
  { "xts-256 encrypt, 64 KiB under one IV",     true,  true,  true,  65536 },
  { "cbc-256 decrypt, 64 KiB of sectors",       false, false, false, 65536 },
  { "cbc-256 encrypt, 64 KiB of sectors",       false, true,  false, 65536 },
};
#define NROWS (sizeof rows / sizeof rows[0])

int
main (void)
{
  size_t cluster = 65536;
  uint8_t key[64];
  uint8_t *buf;
  double rate[NROWS][NLIBS] = { { 0 } };
  double pb[2][NPBKDF2] = { { 0 } };

  if (getenv ("BENCH_SECONDS"))
    seconds = atof (getenv ("BENCH_SECONDS"));
  if (getenv ("BENCH_REPEATS"))
    repeats = atoi (getenv ("BENCH_REPEATS"));
  if (gnutls_global_init () < 0)
    die ("gnutls_global_init");

  srand (42);
  for (size_t i = 0; i < sizeof key; ++i)
    key[i] = rand ();
  buf = malloc (cluster);
  if (!buf)
    die ("malloc");
  for (size_t i = 0; i < cluster; ++i)
    buf[i] = rand ();

  check_same_output (true, key, 64, buf, cluster);
  check_same_output (false, key, 32, buf, cluster);
  printf ("every library gives the same AES-256-XTS and AES-256-CBC "
          "ciphertext\n");
  printf ("versions: %s, GnuTLS %s, nettle %d.%d\n",
          OpenSSL_version (OPENSSL_VERSION), gnutls_check_version (NULL),
          nettle_version_major (), nettle_version_minor ());
  printf ("openssl: EVP_CipherUpdate per sector; openssl2: EVP_Cipher; "
          "both reset the IV\nwith EVP_CipherInit_ex.  gnutls: "
          "gnutls_cipher_set_iv + gnutls_cipher_encrypt2.\n");
  printf ("Single thread, 512-byte sectors with plain64 IVs.  MB/s "
          "(10^6 bytes) per CPU second,\nbest of %d runs of %.1f s, the "
          "libraries taking turns.\n\n", repeats, seconds);

  for (int r = 0; r < repeats; ++r)
    for (size_t i = 0; i < NLIBS; ++i)
      for (size_t k = 0; k < NROWS; ++k) {
        libs[i].setup (key, rows[k].xts ? 64 : 32, rows[k].xts);
        rate[k][i] = MAX (rate[k][i],
                          time_cipher (&libs[i], rows[k].encrypt,
                                       rows[k].one_message, buf,
                                       rows[k].len));
        libs[i].teardown ();
      }

  printf ("%-38s", "");
  for (size_t i = 0; i < NLIBS; ++i)
    printf (" %9s", libs[i].name);
  printf (" %14s\n", "gnutls/openssl");
  for (size_t k = 0; k < NROWS; ++k) {
    printf ("%-38s", rows[k].label);
    for (size_t i = 0; i < NLIBS; ++i)
      printf (" %9.0f", rate[k][i]);
    printf (" %14.2f\n", rate[k][2] / MAX (rate[k][0], rate[k][1]));
  }

  unsigned iters = 200000;
  for (int r = 0; r < repeats; ++r)
    for (int i = 0; i < NPBKDF2; ++i)
      for (int k = 0; k < 2; ++k)
        pb[k][i] = MAX (pb[k][i], pbkdf2_rate (i, k ? 64 : 32, iters));
  printf ("\nPBKDF2-HMAC-SHA256, iterations per CPU second (runs of %u)\n"
          "%-38s", iters, "");
  for (int i = 0; i < NPBKDF2; ++i)
    printf (" %9s", pbkdf2_names[i]);
  printf (" %14s\n", "gnutls/openssl");
  for (int k = 0; k < 2; ++k) {
    printf ("%-38s", k ? "64-byte output (an XTS-256 slot key)"
                       : "32-byte output");
    for (int i = 0; i < NPBKDF2; ++i)
      printf (" %9.0f", pb[k][i]);
    printf (" %14.2f\n", pb[k][1] / pb[k][0]);
  }

  free (buf);
  gnutls_global_deinit ();
  return 0;
}
