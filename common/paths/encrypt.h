/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the data of LUKS-encrypted images.
 *
 * Every 512-byte sector of a data cluster is encrypted with the host
 * offset of the sector as its IV's source (qemu's crypt_physical_offset);
 * zero and unallocated clusters hold no data.  Reads decrypt in place
 * after the bytes arrive, writes encrypt into a buffer of their own just
 * before the data goes to the host: both on the connection's pool, a job
 * per piece of a run, with the workers' ciphers (made from the image's
 * key, meta/crypt.h), allocating nothing.  What changes one cluster of a
 * write (copy-on-write, part of a sector) and zeroes use the write's own
 * cipher (paths/scratch.h).
 *
 * Offers: qcow2_encrypt_start, qcow2_encrypt_finish, qcow2_encrypt_here.
 * Locks: start and finish none of their own but the pool's;
 * qcow2_encrypt_here none (its cipher is the calling thread's or the
 * write's alone).
 * Needs: the connection (its pool), the ciphers, host I/O.
 */
#ifndef QCOW2_ENCRYPT_H
#define QCOW2_ENCRYPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"
#include "meta/image.h"

struct qcow2_conn;
struct qcow2_sector_cipher;
struct thread_state;

/* Host sectors of an encrypted image to encrypt or decrypt in place on a
 * connection's pool, a job per JOB_BYTES.
 */
struct sector_batch {
  struct qcow2_batch batch;
  struct qcow2_image *img;
  uint8_t *buf;
  uint64_t len;
  uint64_t host_offset;         /* of BUF's first byte: the IVs' source */
  uint64_t job_bytes;
  bool encrypt;
  bool in_flight;
  _Atomic int failed;
  char errmsg[400];
};

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

#endif /* QCOW2_ENCRYPT_H */
