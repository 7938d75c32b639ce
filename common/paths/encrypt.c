/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the data of LUKS-encrypted images (see
 * paths/encrypt.h), and the key cache (qcow2.h).
 */

#include <config.h>

#include "qcow2.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "paths/encrypt.h"
#include "paths/conn.h"
#include "format/crypto.h"
#include "format/endian.h"
#include "format/header.h"
#include "meta/hostio.h"
#include "format/luks.h"
#include "base/pool.h"

#define SECTOR QCOW2_CRYPTO_SECTOR_SIZE

/* qemu's LUKS areas are about 2 MiB (eight slots of 4000 stripes of a
 * 64-byte key); anything much larger is not a LUKS area.
 */
#define MAX_AREA_BYTES (UINT64_C (32) << 20)

/* Bytes of one pool job: enough that the cipher's work outweighs waking
 * a thread many times over.
 */
#define JOB_BYTES (128 * 1024)

/* ------------------------------------------------------------ key cache */

#define KEY_CACHE_ENTRIES 16

struct key_entry {
  bool used;
  uint8_t digest[32];           /* sha256 (sha256 (area) || passphrase) */
  uint32_t key_bytes;
  uint8_t key[QCOW2_CRYPTO_MAX_KEY_BYTES];
};

struct qcow2_key_cache {
  pthread_mutex_t lock;
  unsigned next;                /* the entry replaced next when full */
  struct key_entry entries[KEY_CACHE_ENTRIES];
};

struct qcow2_key_cache *
qcow2_key_cache_new (void)
{
  struct qcow2_key_cache *cache = calloc (1, sizeof *cache);

  if (cache)
    pthread_mutex_init (&cache->lock, NULL);
  return cache;
}

void
qcow2_key_cache_free (struct qcow2_key_cache *cache)
{
  if (cache == NULL)
    return;
  qcow2_wipe (cache->entries, sizeof cache->entries);
  pthread_mutex_destroy (&cache->lock);
  free (cache);
}

/* The digest that names the pair (area, passphrase).  The area's own
 * digest comes first, fixed in length, so no two pairs run together.
 */
static void
cache_digest (const uint8_t *area, size_t area_len, const char *passphrase,
              uint8_t *digest)
{
  uint8_t area_digest[32];
  char err[64];

  qcow2_hash2 (QCOW2_HASH_SHA256, area, area_len, NULL, 0, area_digest,
               err, sizeof err);
  qcow2_hash2 (QCOW2_HASH_SHA256, area_digest, sizeof area_digest,
               passphrase, strlen (passphrase), digest, err, sizeof err);
}

static bool
cache_get (struct qcow2_key_cache *cache, const uint8_t *digest,
           uint8_t *key, uint32_t key_bytes)
{
  bool found = false;
  unsigned i;

  pthread_mutex_lock (&cache->lock);
  for (i = 0; i < KEY_CACHE_ENTRIES && !found; ++i) {
    struct key_entry *e = &cache->entries[i];
    if (e->used && e->key_bytes == key_bytes &&
        memcmp (e->digest, digest, sizeof e->digest) == 0) {
      memcpy (key, e->key, key_bytes);
      found = true;
    }
  }
  pthread_mutex_unlock (&cache->lock);
  return found;
}

static void
cache_put (struct qcow2_key_cache *cache, const uint8_t *digest,
           const uint8_t *key, uint32_t key_bytes)
{
  struct key_entry *e = NULL;
  unsigned i;

  pthread_mutex_lock (&cache->lock);
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
  pthread_mutex_unlock (&cache->lock);
}

void
qcow2_key_cache_put (struct qcow2_key_cache *cache, const uint8_t *area,
                     size_t area_len, const char *passphrase,
                     const uint8_t *master_key, uint32_t key_bytes)
{
  uint8_t digest[32];

  if (cache == NULL)
    return;
  cache_digest (area, area_len, passphrase, digest);
  cache_put (cache, digest, master_key, key_bytes);
}

/* ---------------------------------------------------------------- open */

struct crypto_ext {
  bool found;
  uint32_t len;
  uint64_t offset, length;
};

static int
find_crypto_ext (void *opaque, uint32_t type, const uint8_t *data,
                 uint32_t len)
{
  struct crypto_ext *ext = opaque;

  if (type != QCOW2_EXT_CRYPTO)
    return 0;
  ext->found = true;
  ext->len = len;
  if (len == 16) {
    ext->offset = be64 (data);
    ext->length = be64 (data + 8);
  }
  return 1;
}

static double
elapsed_ms (const struct timespec *since)
{
  struct timespec now;

  clock_gettime (CLOCK_MONOTONIC, &now);
  return (now.tv_sec - since->tv_sec) * 1e3 +
    (now.tv_nsec - since->tv_nsec) / 1e6;
}

/* Where the LUKS area is, checked as qemu checks it (and inside the
 * file).  0, or -EINVAL after logging.
 */
static int
locate_area (struct qcow2_image *img, const uint8_t *first, size_t first_len,
             struct crypto_ext *ext)
{
  const struct qcow2_header *h = &img->header;
  char err[256];

  memset (ext, 0, sizeof *ext);
  if (qcow2_header_walk_extensions (first, first_len, h, find_crypto_ext,
                                    ext, err, sizeof err) == -1) {
    qcow2_error (img, "invalid or unsupported qcow2 image: %s", err);
    return -EINVAL;
  }
  if (ext->found && h->crypt_method != 2) {
    qcow2_error (img, "invalid or unsupported qcow2 image: header extension "
                 "0x%08x (full disk encryption header): only LUKS-encrypted "
                 "images (crypt_method 2) have one, and crypt_method is %u",
                 QCOW2_EXT_CRYPTO, h->crypt_method);
    return -EINVAL;
  }
  if (h->crypt_method != 2)
    return 0;
  if (!ext->found) {
    qcow2_error (img, "invalid or unsupported qcow2 image: crypt_method: "
                 "the image is LUKS-encrypted (2) but has no full disk "
                 "encryption header extension (0x%08x) to say where the "
                 "LUKS header is", QCOW2_EXT_CRYPTO);
    return -EINVAL;
  }
  if (ext->len != 16) {
    qcow2_error (img, "invalid or unsupported qcow2 image: header extension "
                 "0x%08x (full disk encryption header): length %u, expected "
                 "16", QCOW2_EXT_CRYPTO, ext->len);
    return -EINVAL;
  }
  if (ext->offset & (h->cluster_size - 1) || ext->offset == 0) {
    qcow2_error (img, "invalid or unsupported qcow2 image: full disk "
                 "encryption header: offset 0x%" PRIx64 " is %s",
                 ext->offset, ext->offset ? "not cluster aligned"
                 : "the qcow2 header's");
    return -EINVAL;
  }
  if (ext->length < QCOW2_LUKS_HEADER_BYTES || ext->length > MAX_AREA_BYTES) {
    qcow2_error (img, "invalid or unsupported qcow2 image: full disk "
                 "encryption header: length %" PRIu64 " is not that of a "
                 "LUKS header and its key slots (%u bytes to %" PRIu64 ")",
                 ext->length, QCOW2_LUKS_HEADER_BYTES, MAX_AREA_BYTES);
    return -EINVAL;
  }
  if (ext->offset > img->file_size ||
      ext->length > img->file_size - ext->offset) {
    qcow2_error (img, "invalid or unsupported qcow2 image: full disk "
                 "encryption header: 0x%" PRIx64 "+%" PRIu64 " lies outside "
                 "the file (%" PRIu64 " bytes)", ext->offset, ext->length,
                 img->file_size);
    return -EINVAL;
  }
  return 0;
}

/* qemu reads a passphrase file (secret,file=) whole, so a file written
 * by echo gives it a passphrase that ends with a newline; nbdkit's
 * +FILE and -FD drop that newline.  A passphrase that unlocks no slot is
 * therefore tried once more as qemu would have read it: one more round
 * of PBKDF2 per active slot, paid only when the first round failed.
 */
static int
unlock_with_newline (const struct qcow2_luks_header *lh, const uint8_t *area,
                     size_t area_len, const char *pass, uint8_t *master_key,
                     int *slot, char *err, size_t errlen)
{
  size_t len = strlen (pass);
  char *as_qemu_read = malloc (len + 1);
  int r;

  if (as_qemu_read == NULL)
    return QCOW2_LUKS_WRONG_PASSPHRASE;  /* the first answer stands */
  memcpy (as_qemu_read, pass, len);
  as_qemu_read[len] = '\n';
  r = qcow2_luks_unlock (lh, area, area_len, as_qemu_read, len + 1,
                         master_key, slot, err, errlen);
  qcow2_wipe (as_qemu_read, len + 1);
  free (as_qemu_read);
  return r;
}

/* The master key of AREA: from the key cache, else by unlocking a slot
 * with the passphrase (or with the passphrase and a newline).
 */
static int
get_master_key (struct qcow2_image *img, const struct qcow2_luks_header *lh,
                const uint8_t *area, size_t area_len, const char *described)
{
  const char *pass = img->opts.passphrase;
  uint8_t digest[32];
  struct timespec start;
  char err[256];
  int slot = -1, r;

  if (pass == NULL) {
    if (img->opts.backing_depth > 0)
      qcow2_error (img, "the backing file is LUKS-encrypted (%s): encrypted "
                   "backing files are not supported", described);
    else
      qcow2_error (img, "the image is LUKS-encrypted (%s): give its "
                   "passphrase with qcow2-passphrase=SECRET", described);
    return -EPERM;
  }
  cache_digest (area, area_len, pass, digest);
  if (img->opts.key_cache &&
      cache_get (img->opts.key_cache, digest, img->crypt.master_key,
                 lh->key_bytes)) {
    qcow2_debug (img, "LUKS master key from the key cache");
    return 0;
  }
  clock_gettime (CLOCK_MONOTONIC, &start);
  r = qcow2_luks_unlock (lh, area, area_len, pass, strlen (pass),
                         img->crypt.master_key, &slot, err, sizeof err);
  if (r == QCOW2_LUKS_WRONG_PASSPHRASE) {
    char err2[256];
    r = unlock_with_newline (lh, area, area_len, pass, img->crypt.master_key,
                             &slot, err2, sizeof err2);
    if (r == QCOW2_LUKS_WRONG_PASSPHRASE) {
      qcow2_error (img, "qcow2-passphrase: %s, nor with a newline added "
                   "(qemu's secret,file= keeps the final newline of a "
                   "passphrase file, as echo writes it; nbdkit's +FILE "
                   "drops it)", err);
      return -EPERM;
    }
    if (r == 0)
      qcow2_warning (img, "qcow2-passphrase: unlocked with a newline added: "
                     "the image's passphrase ends with one, as qemu reads "
                     "a passphrase file written by echo (nbdkit's +FILE "
                     "drops the newline).  To give it exactly: "
                     "qcow2-passphrase=$'SECRET\\n' in bash; to stop "
                     "depending on this, give the image a passphrase from "
                     "a file written by printf '%%s' or echo -n (qemu-img "
                     "amend)");
    else
      snprintf (err, sizeof err, "%s", err2);
  }
  if (r < 0) {
    qcow2_error (img, "invalid or unsupported qcow2 image: %s", err);
    return -EINVAL;
  }
  qcow2_debug (img, "LUKS key slot %d unlocked in %.0f ms", slot,
               elapsed_ms (&start));
  if (img->opts.key_cache)
    cache_put (img->opts.key_cache, digest, img->crypt.master_key,
               lh->key_bytes);
  return 0;
}

int
qcow2_encrypt_open (struct qcow2_image *img, struct qcow2_io *io,
                    const uint8_t *first, size_t first_len)
{
  struct crypto_ext ext;
  struct qcow2_luks_header lh;
  struct qcow2_sector_cipher *trial;
  uint8_t *area = NULL;
  char err[256], described[80];
  int r;

  r = locate_area (img, first, first_len, &ext);
  if (r < 0 || img->header.crypt_method != 2)
    return r;

  area = malloc (ext.length);
  if (area == NULL) {
    qcow2_error (img, "out of memory for the LUKS header");
    return -ENOMEM;
  }
  r = qcow2_pread_clamped (img, io, area, ext.length, ext.offset);
  if (r < 0)
    goto out;
  if (qcow2_luks_parse (area, ext.length, &lh, err, sizeof err) == -1) {
    qcow2_error (img, "invalid or unsupported qcow2 image: full disk "
                 "encryption header at 0x%" PRIx64 ": %s", ext.offset, err);
    r = -EINVAL;
    goto out;
  }
  qcow2_cipher_spec_describe (&lh.spec, described, sizeof described);
  qcow2_debug (img, "LUKS header at 0x%" PRIx64 ", %" PRIu64 " bytes: %s, "
               "hash %s, %u active key slot(s), uuid %s", ext.offset,
               ext.length, described, lh.hash_spec, lh.active_slots, lh.uuid);
  r = get_master_key (img, &lh, area, ext.length, described);
  if (r < 0)
    goto out;

  img->crypt.spec = lh.spec;
  img->crypt.area_offset = ext.offset;
  img->crypt.area_length = ext.length;
  /* Each thread and each write makes its own cipher from the key later
   * (and counts on it working): try once here, where a failure can say
   * what is wrong.
   */
  trial = qcow2_sector_cipher_new (&lh.spec, img->crypt.master_key,
                                   err, sizeof err);
  if (trial == NULL) {
    qcow2_error (img, "the image's LUKS master key cannot be used: %s", err);
    r = -EINVAL;
    goto out;
  }
  qcow2_sector_cipher_free (trial);
  img->crypt.enabled = true;
  r = 0;

 out:
  if (r < 0)
    qcow2_wipe (img->crypt.master_key, sizeof img->crypt.master_key);
  free (area);
  return r;
}

void
qcow2_encrypt_close (struct qcow2_image *img)
{
  qcow2_wipe (img->crypt.master_key, sizeof img->crypt.master_key);
  img->crypt.enabled = false;
}

/* --------------------------------------------------------------- sectors */

static int
crypt_sectors (struct qcow2_sector_cipher *cipher, bool encrypt,
               uint8_t *buf, uint64_t len, uint64_t host,
               char *err, size_t errlen)
{
  return encrypt
    ? qcow2_sectors_encrypt (cipher, host / SECTOR, buf, len, err, errlen)
    : qcow2_sectors_decrypt (cipher, host / SECTOR, buf, len, err, errlen);
}

static void
run_job (void *arg, size_t index, void *state)
{
  struct sector_batch *sb = arg;
  struct thread_state *ts = state;
  uint64_t off = (uint64_t) index * sb->job_bytes;
  uint64_t len = sb->len - off < sb->job_bytes ? sb->len - off : sb->job_bytes;
  int expected = 0;

  if (crypt_sectors (ts->cipher, sb->encrypt, sb->buf + off, len,
                     sb->host_offset + off, ts->err, sizeof ts->err) < 0 &&
      atomic_compare_exchange_strong (&sb->failed, &expected, 1))
    snprintf (sb->errmsg, sizeof sb->errmsg, "%s host offset 0x%" PRIx64
              "+%" PRIu64 ": %s", sb->encrypt ? "encrypting" : "decrypting",
              sb->host_offset + off, len, ts->err);
}

void
qcow2_encrypt_start (struct qcow2_conn *conn, struct sector_batch *sb,
                     struct thread_state *caller, bool encrypt,
                     uint8_t *buf, uint64_t len, uint64_t host)
{
  struct qcow2_image *img = qcow2_conn_image (conn);

  sb->img = img;
  sb->buf = buf;
  sb->len = len;
  sb->host_offset = host;
  sb->encrypt = encrypt;
  sb->job_bytes = JOB_BYTES;
  atomic_store (&sb->failed, 0);
  sb->batch.run = run_job;
  sb->batch.arg = sb;
  sb->batch.count = (len + JOB_BYTES - 1) / JOB_BYTES;
  sb->in_flight = true;
  /* One job, or as many reads as threads already: waking a worker only
   * costs.
   */
  if (sb->batch.count <= 1 || qcow2_conn_workers (conn) == 0 ||
      (!encrypt &&
       atomic_load_explicit (&img->active_reads, memory_order_relaxed) >
       qcow2_conn_workers (conn)))
    qcow2_pool_run_here (&sb->batch, caller);
  else
    qcow2_conn_submit (conn, &sb->batch);
}

int
qcow2_encrypt_finish (struct qcow2_conn *conn, struct sector_batch *sb,
                      struct thread_state *caller)
{
  if (!sb->in_flight)
    return 0;
  qcow2_conn_wait (conn, &sb->batch, caller);
  sb->in_flight = false;
  qcow2_debug_if (sb->img, QCOW2_DEBUG_POOL,
                  "pool: %s %" PRIu64 " bytes at host offset 0x%" PRIx64
                  " in %zu jobs, %zu run by the calling thread",
                  sb->encrypt ? "encrypted" : "decrypted", sb->len,
                  sb->host_offset, sb->batch.count, sb->batch.run_by_waiter);
  if (atomic_load (&sb->failed)) {
    qcow2_error (sb->img, "%s", sb->errmsg);
    return -EIO;
  }
  return 0;
}

int
qcow2_encrypt_here (struct qcow2_image *img,
                    struct qcow2_sector_cipher *cipher, bool encrypt,
                    uint8_t *buf, uint64_t len, uint64_t host)
{
  char err[256];

  if (crypt_sectors (cipher, encrypt, buf, len, host, err, sizeof err) < 0) {
    qcow2_error (img, "%s host offset 0x%" PRIx64 "+%" PRIu64 ": %s",
                 encrypt ? "encrypting" : "decrypting", host, len, err);
    return -EIO;
  }
  return 0;
}
