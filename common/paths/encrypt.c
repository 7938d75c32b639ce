/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the data of LUKS-encrypted images (see
 * paths/encrypt.h).
 */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "paths/encrypt.h"
#include "base/pool.h"
#include "format/crypto.h"
#include "meta/log.h"
#include "paths/conn.h"

#define SECTOR QCOW2_CRYPTO_SECTOR_SIZE

/* Bytes of one pool job: enough that the cipher's work outweighs waking
 * a thread many times over.
 */
#define JOB_BYTES (128 * 1024)

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
       atomic_load_explicit (&img->counters.active_reads, memory_order_relaxed) >
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
