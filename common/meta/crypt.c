/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the key of a LUKS-encrypted image (see
 * meta/crypt.h).
 */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meta/crypt.h"
#include "base/keycache.h"
#include "format/crypto.h"
#include "format/endian.h"
#include "format/header.h"
#include "format/luks.h"
#include "meta/hostio.h"
#include "meta/log.h"

/* A LUKS-encrypted image's key (img->crypt): set when the image opens,
 * read by whoever makes a sector cipher (the connections' threads and
 * the writes' buffers), wiped when it closes.
 */
struct qcow2_crypt {
  struct qcow2_cipher_spec spec;
  uint8_t master_key[QCOW2_CRYPTO_MAX_KEY_BYTES];
};

/* qemu's LUKS areas are about 2 MiB (eight slots of 4000 stripes of a
 * 64-byte key); anything much larger is not a LUKS area.
 */
#define MAX_AREA_BYTES (UINT64_C (32) << 20)

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
  if (ext->found && h->crypt_method != QCOW2_CRYPT_LUKS) {
    qcow2_error (img, "invalid or unsupported qcow2 image: header extension "
                 "0x%08x (full disk encryption header): only LUKS-encrypted "
                 "images (crypt_method 2) have one, and crypt_method is %u",
                 QCOW2_EXT_CRYPTO, h->crypt_method);
    return -EINVAL;
  }
  if (h->crypt_method != QCOW2_CRYPT_LUKS)
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
  struct qcow2_crypt *crypt = img->crypt;
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
  qcow2_key_cache_digest (area, area_len, pass, digest);
  if (img->opts.key_cache &&
      qcow2_key_cache_get (img->opts.key_cache, digest, crypt->master_key,
                           lh->key_bytes)) {
    qcow2_debug (img, "LUKS master key from the key cache");
    return 0;
  }
  clock_gettime (CLOCK_MONOTONIC, &start);
  r = qcow2_luks_unlock (lh, area, area_len, pass, strlen (pass),
                         crypt->master_key, &slot, err, sizeof err);
  if (r == QCOW2_LUKS_WRONG_PASSPHRASE) {
    char err2[256];
    r = unlock_with_newline (lh, area, area_len, pass, crypt->master_key,
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
    qcow2_key_cache_put_digest (img->opts.key_cache, digest,
                                crypt->master_key, lh->key_bytes);
  return 0;
}

int
qcow2_crypt_open (struct qcow2_image *img, struct qcow2_io *io,
                    const uint8_t *first, size_t first_len)
{
  struct crypto_ext ext;
  struct qcow2_luks_header lh;
  struct qcow2_sector_cipher *trial;
  uint8_t *area = NULL;
  char err[256], described[80];
  int r;

  r = locate_area (img, first, first_len, &ext);
  if (r < 0 || !qcow2_image_encrypted (img))
    return r;

  img->crypt = calloc (1, sizeof *img->crypt);
  area = malloc (ext.length);
  if (img->crypt == NULL) {
    free (area);
    qcow2_error (img, "out of memory for the image's key");
    return -ENOMEM;
  }
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

  img->crypt->spec = lh.spec;
  img->luks_area_offset = ext.offset;
  img->luks_area_length = ext.length;
  /* Each thread and each write makes its own cipher from the key later
   * (and counts on it working): try once here, where a failure can say
   * what is wrong.
   */
  trial = qcow2_sector_cipher_new (&lh.spec, img->crypt->master_key,
                                   err, sizeof err);
  if (trial == NULL) {
    qcow2_error (img, "the image's LUKS master key cannot be used: %s", err);
    r = -EINVAL;
    goto out;
  }
  qcow2_sector_cipher_free (trial);
  r = 0;

 out:
  if (r < 0)
    qcow2_crypt_close (img);
  free (area);
  return r;
}

void
qcow2_crypt_close (struct qcow2_image *img)
{
  if (img->crypt == NULL)
    return;
  qcow2_wipe (img->crypt, sizeof *img->crypt);
  free (img->crypt);
  img->crypt = NULL;
}

struct qcow2_sector_cipher *
qcow2_crypt_cipher_new (struct qcow2_image *img)
{
  char err[256];

  return qcow2_sector_cipher_new (&img->crypt->spec, img->crypt->master_key,
                                  err, sizeof err);
}
