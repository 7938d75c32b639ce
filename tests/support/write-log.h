/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: reading a recorded storage log (a mem_io made
 * with MEM_IO_RECORD) for what each write changed and whether the order
 * of the writes, flushes and discards keeps every crash state
 * consistent.  The checks report through unit.h (CHECK), naming CTX.
 */
#ifndef QCOW2ZSTD_TEST_WRITE_LOG_H
#define QCOW2ZSTD_TEST_WRITE_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "mem-io.h"

/* KIND[i] of a flush and of a discard (writes have write-image.h's
 * WRITE_* kinds).
 */
#define OP_FLUSH (-1)
#define OP_DISCARD (-2)

/* What each op of M's log changed: an array of M->nops kinds (the
 * caller frees it).  A write's kind is what its cluster holds in the
 * final storage, unless the cluster was released after the write (its
 * refcount on disk dropped to 0 at a later flush): then it wrote data.
 */
int *classify_log (const struct mem_io *m);

/* Ops [FROM, TO) of KIND in OUT (LEN bytes) as a sequence like
 * "B F L2 F L1 F" (X a discard), repeated writes of a kind collapsed.
 */
void log_sequence (const struct mem_io *m, const int *kind, size_t from,
                   size_t to, char *out, size_t len);

/* No write of a kind before the kinds it depends on are flushed (an L2
 * table after its data and refcounts, the L1 table after its L2
 * tables, ...).
 */
void check_dependencies (const struct mem_io *m, const int *kind,
                         const char *ctx);

/* The storage as of each flush, with nothing, all and some random
 * subsets (from SEED) of the writes and discards after it, passes the
 * checker and refers to no cluster a discard made garbage (a discarded
 * range reads as garbage after a crash).
 */
void check_crash_states (const struct mem_io *m, uint64_t seed,
                         const char *ctx);

/* Each discard comes right after a flush (or another discard after it),
 * of whole clusters that the storage as of that flush counts 0 times and
 * that nothing there references.  Returns the bytes discarded.
 */
uint64_t check_discards (const struct mem_io *m, const char *ctx);

/* The flushes among ops [START, END): a write that reclaimed room wrote
 * the metadata back and flushed.
 */
unsigned flushes_between (const struct mem_io *m, size_t start, size_t end);

#endif /* QCOW2ZSTD_TEST_WRITE_LOG_H */
