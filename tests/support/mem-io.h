/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: the engine's storage in memory.
 *
 * One struct qcow2_io over a memory buffer for every C test and fuzz
 * target.  It checks the engine's side of the contract in base/io.h:
 * every read and write inside size(), reads and writes only from a thread
 * that called into the engine (never a pool worker), and no pwrite or
 * flush on read-only storage (they are NULL there, as the contract
 * says).  It counts what the engine does, can be told to fail, and can
 * record every write, flush and discard in order: the log of a flush can
 * then be checked against the order the write path promises, and the
 * storage rebuilt as it was at any point (what a crash would leave).  A
 * discarded range reads as garbage from then on.
 */
#ifndef QCOW2ZSTD_TEST_MEM_IO_H
#define QCOW2ZSTD_TEST_MEM_IO_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/io.h"

/* Set by a test around its calls into the engine, on the calling thread:
 * the engine may use the storage only from such a thread.
 */
extern _Thread_local bool mem_io_engine_call;

enum {
  MEM_IO_WRITABLE = 1,          /* pwrite and flush, else NULL */
  MEM_IO_RECORD = 2,            /* keep the log of writes and flushes */
  MEM_IO_ABORT = 4,             /* abort () on a broken contract (fuzzers) */
  MEM_IO_ANY_THREAD = 8,        /* do not check the calling thread */
  MEM_IO_DISCARD = 16,          /* discard (with MEM_IO_WRITABLE), else NULL */
  /* Read-only storage that reads the caller's DATA in place, which must
   * outlive it unchanged: a check that opens a copy of a large image
   * after every request spent most of its time (under the sanitizers)
   * copying it.
   */
  MEM_IO_BORROW = 32,
};

/* One write, flush or discard, in the order the engine made them. */
struct mem_op {
  bool flush;
  bool discard;                 /* LEN bytes at OFFSET became garbage */
  uint64_t offset;
  size_t len;
  uint8_t *data;                /* a copy of what was written */
};

/* What a discarded byte at OFFSET reads as: garbage, never zeros, so
 * that a read of discarded bytes cannot pass for a hole.
 */
uint8_t mem_io_garbage (uint64_t offset);

struct mem_io {
  struct qcow2_io io;
  unsigned flags;
  uint8_t *data;                /* the storage (the io's own copy) */
  uint64_t size;

  /* Failures to inject: size () fails with size_errno; reads touching
   * [fail_from, fail_to) with fail_errno; writes touching
   * [write_fail_from, write_fail_to) with write_fail_errno.
   */
  int size_errno;
  int fail_errno;
  uint64_t fail_from, fail_to;
  int write_fail_errno;
  uint64_t write_fail_from, write_fail_to;

  /* A discard fails with this, if set (-EOPNOTSUPP: cannot discard). */
  int discard_errno;

  /* Called at the start of every pread, from the reading thread, before
   * the bytes are copied: a test holds a reader there to let another
   * thread change the storage under it.
   */
  void (*pread_hook) (struct mem_io *m, uint64_t offset, size_t count,
                      void *arg);
  void *pread_hook_arg;
  /* The same at the start of every pwrite, before the bytes land: a
   * writer held there has made its buffer from what it read earlier.
   */
  void (*pwrite_hook) (struct mem_io *m, uint64_t offset, size_t count,
                       void *arg);
  void *pwrite_hook_arg;
  /* The same at the start of every discard. */
  void (*discard_hook) (struct mem_io *m, uint64_t offset, size_t count,
                        void *arg);
  void *discard_hook_arg;

  /* What the engine did. */
  atomic_ulong preads, pwrites, flushes, discards;
  atomic_ulong discarded_bytes;
  atomic_ulong largest;         /* largest pread so far */
  atomic_ulong outside;         /* I/O beyond the storage: contract broken */
  atomic_ulong wrong_thread;    /* I/O from a thread not in the engine */

  /* MEM_IO_RECORD: the storage before the first write, the log, and
   * the storage as of the last flush (what is durable).
   */
  pthread_mutex_t lock;
  uint8_t *initial;
  struct mem_op *ops;
  size_t nops, ops_cap;
  uint8_t *durable;
  size_t durable_ops;           /* ops already applied to DURABLE */
};

/* Storage of SIZE bytes holding a copy of LEN bytes of DATA (LEN <=
 * SIZE; the rest zeros; DATA may be NULL for all zeros).  FLAGS: the
 * MEM_IO_* above.
 */
void mem_io_init (struct mem_io *m, const uint8_t *data, size_t len,
                  uint64_t size, unsigned flags);
void mem_io_free (struct mem_io *m);

/* Forget the log so far (the storage becomes the new initial state). */
void mem_io_log_reset (struct mem_io *m);

/* A new buffer of m->size bytes: the initial storage with the first
 * NOPS logged writes (and discards) applied.  Free it with free ().
 */
uint8_t *mem_io_state_at (const struct mem_io *m, size_t nops);

/* The storage rebuilt from the log one op at a time.  A check that
 * visits many points of a long log in order moves one replay forward
 * instead of rebuilding each point from the initial storage: the cost
 * of the log once, not once per point (under ThreadSanitizer, rebuilding
 * per flush took most of test-engine-writeback's minutes).
 */
struct mem_replay {
  const struct mem_io *m;
  uint8_t *state;               /* m->size bytes, the first AT ops applied */
  size_t at;
  /* Ops applied out of order by mem_replay_apply, with what they
   * overwrote, until mem_replay_undo.
   */
  struct mem_undo { uint64_t offset; size_t len; uint8_t *saved; } *undo;
  size_t nundo, undo_cap;
};

void mem_replay_init (struct mem_replay *r, const struct mem_io *m);
/* The state with the first NOPS ops applied; NOPS never goes back.  Ops
 * applied by mem_replay_apply are taken back first.
 */
const uint8_t *mem_replay_to (struct mem_replay *r, size_t nops);
/* Apply logged op OP (a write or a discard; a flush changes nothing) to
 * the state, out of order: a crash state that has some of the writes
 * after a flush, built in place instead of in a copy of the storage.
 */
void mem_replay_apply (struct mem_replay *r, const struct mem_op *op);
/* Take back every op mem_replay_apply applied, the last first. */
void mem_replay_undo (struct mem_replay *r);
void mem_replay_free (struct mem_replay *r);

/* How many contract violations the engine made (outside, wrong thread). */
unsigned long mem_io_violations (struct mem_io *m);

#endif /* QCOW2ZSTD_TEST_MEM_IO_H */
