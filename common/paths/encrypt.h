/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the data of LUKS-encrypted images.
 *
 * An image with crypt_method 2 keeps a LUKS1 header in its own clusters,
 * where the full disk encryption header extension (0x0537be77) says.
 * Opening the image unlocks a key slot with the passphrase (or takes the
 * master key from the caller's key cache, qcow2.h), once per image: the
 * connections then each make their threads' sector ciphers from it
 * (paths/conn.c).  Every 512-byte sector of a data cluster is encrypted
 * with the host offset of the sector as its IV's source (qemu's
 * crypt_physical_offset); zero and unallocated clusters hold no data.
 *
 * Reads decrypt in place after the bytes arrive, writes encrypt into a
 * buffer of their own just before the data goes to the host: both on the
 * connection's pool, a job per piece of a run, with the workers' cipher
 * contexts, allocating nothing.  What changes one cluster of a write
 * (copy-on-write, part of a sector) and zeroes use the write's own cipher
 * (paths/scratch.h).
 *
 * Offers: qcow2_encrypt_open, qcow2_encrypt_close, qcow2_encrypt_start,
 * qcow2_encrypt_finish, qcow2_encrypt_here, qcow2_key_cache_put, and the
 * key cache of qcow2.h.
 * Locks: open and close none (nobody else sees the image); start and
 * finish none of their own but the pool's; qcow2_encrypt_here none (its
 * cipher is the calling thread's or the write's alone).
 * Needs: the connection (its pool), the LUKS header, the ciphers, host
 * I/O.
 */
#ifndef QCOW2_ENCRYPT_H
#define QCOW2_ENCRYPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/types.h"

/* Set up IMG's encryption from its header (FIRST: the first cluster as
 * read, FIRST_LEN bytes): refuse a crypto header extension without
 * crypt_method 2 and the reverse (qemu's rules), read and check the LUKS
 * area, unlock it with img->opts.passphrase or the key cache, and check
 * that the key makes a cipher.  Does nothing for an image that is not encrypted.  0,
 * -EPERM after saying that the passphrase is wrong or missing, or another
 * -errno after logging.
 */
int qcow2_encrypt_open (struct qcow2_image *img, struct qcow2_io *io,
                        const uint8_t *first, size_t first_len);

/* Wipe the key (the image keeps no cipher of its own: each thread and
 * each write has one).  Accepts an image that was never set up.
 */
void qcow2_encrypt_close (struct qcow2_image *img);

/* Encrypt (ENCRYPT true) or decrypt LEN bytes of BUF in place, the data
 * of host offset HOST (both multiples of 512), with SB as the batch: on
 * CONN's pool, or on this thread with CALLER's cipher when the work is
 * small or other reads keep the CPUs busy.  Returns at once; SB must be
 * finished with qcow2_encrypt_finish before BUF is used or SB reused.
 */
void qcow2_encrypt_start (struct qcow2_conn *conn, struct sector_batch *sb,
                          struct thread_state *caller, bool encrypt,
                          uint8_t *buf, uint64_t len, uint64_t host);

/* Wait for SB (if started), running its unclaimed jobs with CALLER's
 * cipher.  0, or -EIO after logging what failed.
 */
int qcow2_encrypt_finish (struct qcow2_conn *conn, struct sector_batch *sb,
                          struct thread_state *caller);

/* The same on this thread alone with CIPHER (a write's, or a thread's
 * own).  0, or -EIO after logging.
 */
int qcow2_encrypt_here (struct qcow2_image *img,
                        struct qcow2_sector_cipher *cipher, bool encrypt,
                        uint8_t *buf, uint64_t len, uint64_t host);

/* Remember MASTER_KEY (KEY_BYTES) for the LUKS area AREA (AREA_LEN bytes)
 * unlocked by PASSPHRASE, as a newly created image's.  CACHE NULL: does
 * nothing.
 */
void qcow2_key_cache_put (struct qcow2_key_cache *cache, const uint8_t *area,
                          size_t area_len, const char *passphrase,
                          const uint8_t *master_key, uint32_t key_bytes);

#endif /* QCOW2_ENCRYPT_H */
