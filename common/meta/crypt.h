/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the key of a LUKS-encrypted image.
 *
 * An image with crypt_method 2 keeps a LUKS1 header in its own clusters,
 * where the full disk encryption header extension (0x0537be77) says.
 * Opening the image unlocks a key slot with the passphrase (or takes the
 * master key from the caller's key cache, base/keycache.h), once per
 * image, and records where the LUKS area lies (img->luks_area_*).  The
 * key (img->crypt) is this module's; the paths make their sector ciphers
 * from it, one per thread and per write (qcow2_crypt_cipher_new), and
 * encrypt and decrypt on the connections' pools (paths/encrypt.h).
 *
 * Offers: qcow2_crypt_open, qcow2_crypt_close, qcow2_crypt_cipher_new.
 * Locks: none: open and close run while nobody else sees the image, and
 * the key does not change in between.
 * Needs: the LUKS header and the ciphers, the key cache, host I/O.
 */
#ifndef QCOW2_CRYPT_H
#define QCOW2_CRYPT_H

#include <stddef.h>
#include <stdint.h>

#include "meta/image.h"

struct qcow2_sector_cipher;

/* Set up IMG's encryption from its header (FIRST: the first cluster as
 * read, FIRST_LEN bytes): refuse a crypto header extension without
 * crypt_method 2 and the reverse (qemu's rules), read and check the LUKS
 * area, unlock it with img->opts.passphrase or the key cache, and check
 * that the key makes a cipher.  Does nothing for an image that is not
 * encrypted.  0, -EPERM after saying that the passphrase is wrong or
 * missing, or another -errno after logging.
 */
int qcow2_crypt_open (struct qcow2_image *img, struct qcow2_io *io,
                      const uint8_t *first, size_t first_len);

/* Wipe the key.  Accepts an image that was never set up. */
void qcow2_crypt_close (struct qcow2_image *img);

/* A sector cipher with the image's key, for one thread or one write
 * (the open checked that the key makes one: NULL means no memory).
 */
struct qcow2_sector_cipher *qcow2_crypt_cipher_new (struct qcow2_image *img);

#endif /* QCOW2_CRYPT_H */
