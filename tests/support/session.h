/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: an image open in the engine, with its connection,
 * storage (struct mem_io) and a log that records the engine's errors.
 */
#ifndef QCOW2ZSTD_TEST_SESSION_H
#define QCOW2ZSTD_TEST_SESSION_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "qcow2.h"
#include "mem-io.h"
#include "read-image.h"
#include "write-image.h"

struct log_capture {
  pthread_mutex_t lock;
  unsigned errors;
  unsigned malformed;           /* empty, or ending in a newline */
  char last[600];
};

struct session {
  struct mem_io mio;
  struct log_capture log;
  struct qcow2_log qlog;
  struct qcow2_image *img;
  struct qcow2_conn *conn;
};

/* Threads 3, requests of 4 MiB, 8 MiB caches. */
extern const struct qcow2_options default_options;

/* The log of S, counting errors: to give to qcow2_image_open. */
void session_log_init (struct session *s);

/* Open the image in FILE (SIZE bytes, read in place as read-only
 * storage: FILE must stay as it is until session_close) with OPTS and
 * make a connection.  Returns the open's result.
 */
int session_open (struct session *s, const uint8_t *file, uint64_t size,
                  const struct qcow2_options *opts);

/* Open what S->mio holds (set up by the caller) with OPTS. */
int session_open_io (struct session *s, const struct qcow2_options *opts);

/* Close the image and connection (either may be NULL: after a failed
 * open too), check the contract the storage watched and the shape of
 * every message logged, and free the storage.  session_close_image keeps
 * the storage, for opening it again with session_open_io.
 */
void session_close (struct session *s);
void session_close_image (struct session *s);

/* The engine's calls, made as the engine's caller. */
int do_read (struct session *s, void *buf, uint64_t count, uint64_t offset);
int do_prefetch (struct session *s, uint64_t offset, uint64_t count);
int do_extents (struct session *s, uint64_t offset, uint64_t count,
                qcow2_extent_fn fn, void *opaque);

/* Did the engine log (at least) one more error since *SEEN?  Moves *SEEN
 * on, so that the next call checks the next failure.
 */
bool logged (struct session *s, unsigned *seen);

/* Read [OFFSET, OFFSET+LEN) and compare with IMG.  Returns true if it
 * matched; on a mismatch says where.
 */
bool read_and_compare (struct session *s, const struct image *img,
                       uint64_t offset, uint64_t len, const char *ctx);
/* Read guest cluster K (the part inside the disk) and compare. */
bool read_cluster (struct session *s, const struct image *img, uint64_t k,
                   const char *ctx);

/* An extent callback that checks the ranges against IMG: consecutive
 * from NEXT, zero exactly where the image reads as zeros.  With
 * STOP_AFTER set, fails with -EINTR on that call and marks any later
 * call bad.
 */
struct extent_check {
  const struct image *img;
  uint64_t next;                /* where the next range must start */
  unsigned calls;
  unsigned stop_after;          /* fail with -EINTR on this call (1-based) */
  bool bad;
};
int check_extent (void *opaque, uint64_t offset, uint64_t length, bool zero);

/* ------------------------------------------------------------ writing */

/* Open a new image laid out by SPEC, on writable storage with the
 * MEM_IO_* FLAGS (MEM_IO_WRITABLE is added), with OPTS made writable.
 */
int session_open_new (struct session *s, const struct new_image *spec,
                      unsigned flags, const struct qcow2_options *opts);

int do_write (struct session *s, const void *buf, uint64_t count,
              uint64_t offset, bool fua);
int do_zero (struct session *s, uint64_t count, uint64_t offset, bool fast,
             bool fua);
int do_trim (struct session *s, uint64_t count, uint64_t offset, bool fua);
int do_flush (struct session *s);

/* NOPS random writes (random data, a FUA now and then), zeroes, trims,
 * flushes and reads inside [LO, HI) of S's disk, with CLUSTER_SIZE its
 * cluster size and MODEL the whole guest disk, which follows the changes
 * (a trim zeroes the whole clusters it covers).  Every read is compared
 * with the model; every call must succeed.  SEED picks the sequence.
 */
void random_changes (struct session *s, uint8_t *model, uint64_t lo,
                     uint64_t hi, uint32_t cluster_size, uint64_t seed,
                     unsigned nops, const char *ctx);

/* Check the image FILE (SIZE bytes) with check_image, counting a failed
 * check and saying why under CTX.
 */
bool check_file (const uint8_t *file, uint64_t size, bool exact,
                 const char *ctx);

/* Do the guest bytes of [OFFSET, OFFSET+LEN) read through S equal
 * MODEL's (the whole guest disk)?  Counts a failed check.
 */
bool matches_model (struct session *s, const uint8_t *model,
                    uint64_t offset, uint64_t len, const char *ctx);

/* Open FILE (SIZE bytes) read-only on its own and compare the whole guest
 * disk with MODEL (VIRTUAL_SIZE bytes).
 */
bool file_matches_model (const uint8_t *file, uint64_t size,
                         const uint8_t *model, uint64_t virtual_size,
                         const char *ctx);

#endif /* QCOW2ZSTD_TEST_SESSION_H */
