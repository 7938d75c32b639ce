/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the connection.
 *
 * A struct qcow2_conn is what one NBD connection brings to an image: a
 * pool of workers that decode its reads, the read requests' buffers and
 * the compression batches (kept on free lists, so that a stream of
 * requests allocates nothing), the readahead of a sequential reader,
 * and the bytes of the image file fetched ahead of it
 * (paths/fetchahead.h).
 * Its fields are this module's alone: the paths borrow a request, a
 * batch or the readahead chunk and give it back, and hand work to the
 * pool through the calls below.
 *
 * Offers: qcow2_conn_new and qcow2_conn_free (declared in qcow2.h), and
 * the calls below.
 * Locks: the connection's lock guards its free lists, the readahead lock
 * (only ever tried) its readahead chunk; both are taken and released
 * inside each call.  Callers may hold the image lock (base/lockorder.h has
 * the order).
 * Needs: the pool, the codec (a decoder per thread), the ciphers (a
 * sector cipher per thread of an encrypted image), host I/O for
 * messages.
 */
#ifndef QCOW2_CONN_H
#define QCOW2_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/image.h"
#include "paths/chunk.h"
#include "paths/encrypt.h"

struct qcow2_conn;
struct compress_ctx;
struct qcow2_decoder;

/* What each thread that decodes keeps: a connection's pool workers, and
 * each read request for its calling thread (paths/conn.c).
 */
struct thread_state {
  struct qcow2_decoder *dec;
  struct qcow2_sector_cipher *cipher;   /* encrypted images only */
  uint8_t *scratch;             /* one cluster */
  char err[256];
};

/* The state of one read in progress.  A connection keeps the ones it
 * made on a free list, so concurrent reads of one connection each get
 * their own without allocating on every request (made by paths/conn.c,
 * used by paths/read.c).
 */
struct request {
  struct request *next_free;
  struct chunk chunk[2];
  unsigned cur;
  struct thread_state caller;
  uint8_t *l2buf;

  /* Encrypted images: the run being decrypted on the pool while the
   * next one is read, and for writes, request_size bytes to encrypt the
   * client's data into (made on first use).
   */
  struct sector_batch crypt;
  uint8_t *crypt_buf;
};


/* The image the connection was made for. */
struct qcow2_image *qcow2_conn_image (struct qcow2_conn *conn);

/* Bytes in each staging buffer of IMG's connections: request_size, and
 * at least the largest compressed range one descriptor can name.
 */
size_t qcow2_staging_size (const struct qcow2_image *img);

/* A request for one read (its chunks and staging buffers, a decoder for
 * the calling thread, an L2 buffer), or NULL after logging.  Give it
 * back with qcow2_conn_request_put.
 */
struct request *qcow2_conn_request_get (struct qcow2_conn *conn);
void qcow2_conn_request_put (struct qcow2_conn *conn, struct request *req);

/* Give REQ its buffer for encrypting a write's data (request_size bytes,
 * kept with the request): 0, or -ENOMEM after logging.
 */
int qcow2_conn_request_crypt_buf (struct qcow2_conn *conn,
                                  struct request *req);

/* A compression batch with room for CLUSTERS clusters and count 0, or
 * NULL after logging.  Give it back with qcow2_conn_batch_put.
 */
struct compress_ctx *qcow2_conn_batch_get (struct qcow2_conn *conn,
                                           size_t clusters);
void qcow2_conn_batch_put (struct qcow2_conn *conn, struct compress_ctx *ctx);

/* The connection's pool: how many workers it has (0: the calling thread
 * does all the work), handing a batch to them, and waiting for it while
 * running its unclaimed jobs with CALLER_STATE (NULL: only wait).
 */
unsigned qcow2_conn_workers (const struct qcow2_conn *conn);
void qcow2_conn_submit (struct qcow2_conn *conn, struct qcow2_batch *batch);
void qcow2_conn_wait (struct qcow2_conn *conn, struct qcow2_batch *batch,
                      struct thread_state *caller_state);

/* Does a read of [OFFSET, END) begin where the connection's previous read
 * ended?  It becomes the previous read.
 */
bool qcow2_conn_continues (struct qcow2_conn *conn, uint64_t offset,
                           uint64_t end);

/* The connection's readahead chunk, for the caller alone until
 * qcow2_conn_readahead_release; NULL if another thread has it (the
 * caller then does without) or memory ran out.  The chunk may still be
 * in the pool's hands from the last readahead (in_flight).
 */
struct chunk *qcow2_conn_readahead_claim (struct qcow2_conn *conn);
void qcow2_conn_readahead_release (struct qcow2_conn *conn);

/* Read LEN bytes of the image file (not an external data file) at host
 * offset HOST for a read of the connection, from the bytes fetched ahead
 * of it when it reads sequentially (paths/fetchahead.h).  0, or -errno
 * after logging.
 */
int qcow2_conn_pread (struct qcow2_conn *conn, struct qcow2_io *io,
                      void *buf, uint64_t len, uint64_t host);

#endif /* QCOW2_CONN_H */
