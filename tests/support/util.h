/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: small helpers every C test uses: memory that
 * never fails, big-endian fields, a random generator, and the data
 * pattern that makes any misplaced byte show.
 */
#ifndef QCOW2ZSTD_TEST_UTIL_H
#define QCOW2ZSTD_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#define KiB (UINT64_C (1) << 10)
#define MiB (UINT64_C (1) << 20)

/* malloc and calloc that exit on failure (0 bytes allowed). */
void *xmalloc (size_t len);
void *xcalloc (size_t n, size_t size);
/* ARRAY, holding COUNT elements of ELEM bytes in room for *CAP, with
 * room for one more: doubled when full (FIRST elements at the start).
 * Exits on failure.
 */
void *xgrow (void *array, size_t count, size_t *cap, size_t elem,
             size_t first);

/* Big-endian fields of qcow2 structures. */
void put32 (uint8_t *p, uint32_t v);
void put64 (uint8_t *p, uint64_t v);
uint32_t get32 (const uint8_t *p);
uint64_t get64 (const uint8_t *p);

/* xorshift64*: STATE must not be 0. */
uint64_t rng (uint64_t *state);

/* LEN bytes of 16-byte text records naming SEED and the record number.
 * The data compresses like ordinary data, and any shifted, misplaced or
 * mixed-up byte compares unequal.
 */
void fill_pattern (uint8_t *buf, uint64_t len, uint32_t seed);

#endif /* QCOW2ZSTD_TEST_UTIL_H */
