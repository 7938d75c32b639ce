/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: runs of host bytes moved with one request.
 *
 * Reads and writes both gather what lies back to back on the host and in
 * memory into one request underneath, of at most the image's request
 * size.  A run holds the bytes gathered so far; adding bytes that do not
 * continue it (or would make it too long) first hands the run to its
 * mover, which reads or writes it (and decrypts or encrypts it, on an
 * encrypted image), and starts a new run with them.
 *
 * Offers: struct data_run, qcow2_run_add, qcow2_run_flush.
 * Locks: none; a run belongs to one request.
 * Needs: nothing.
 */
#ifndef QCOW2_RUN_H
#define QCOW2_RUN_H

#include <stdint.h>

struct data_run;

/* Moves RUN's bytes (RUN->len of them, never 0), with OPAQUE; 0, or
 * -errno after logging.
 */
typedef int (*qcow2_run_mover) (struct data_run *run, void *opaque);

struct data_run {
  uint8_t *buf;                 /* memory side of the first byte */
  uint64_t host;                /* host offset of the first byte */
  uint64_t len;                 /* 0: empty */
  uint64_t max;                 /* the longest run */
  qcow2_run_mover move;
  void *opaque;
};

/* An empty run of at most MAX bytes, moved by MOVE with OPAQUE. */
static inline struct data_run
qcow2_run_new (uint64_t max, qcow2_run_mover move, void *opaque)
{
  return (struct data_run) { .max = max, .move = move, .opaque = opaque };
}

/* Add LEN bytes at BUF for host offset HOST, moving what RUN held first
 * if they do not continue it.  0, or the mover's error.
 */
int qcow2_run_add (struct data_run *run, uint8_t *buf, uint64_t host,
                   uint64_t len);

/* Move what RUN holds, and empty it.  0, or the mover's error. */
int qcow2_run_flush (struct data_run *run);

#endif /* QCOW2_RUN_H */
