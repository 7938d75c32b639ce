/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: whether a buffer holds only zero bytes.
 *
 * Offers: qcow2_all_zero.
 * Locks: none.
 * Needs: nothing.
 */
#ifndef QCOW2_ZEROS_H
#define QCOW2_ZEROS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Are the LEN bytes at P all zero (true for none)?  Each byte compared
 * with the one before it, in one memcmp, which libc does a word at a
 * time.
 */
static inline bool
qcow2_all_zero (const uint8_t *p, size_t len)
{
  return len == 0 || (p[0] == 0 && memcmp (p, p + 1, len - 1) == 0);
}

#endif /* QCOW2_ZEROS_H */
