/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the bits of L1, L2 and refcount table entries
 * (qcow2.txt, "Cluster mapping" and "Host cluster management").
 */
#ifndef QCOW2_ENTRIES_H
#define QCOW2_ENTRIES_H

#include <stdint.h>

/* L1 and standard L2 entry bits. */
#define L1E_OFFSET_MASK    UINT64_C (0x00fffffffffffe00)
#define L1E_RESERVED_MASK  UINT64_C (0x7f000000000001ff)
#define L2E_OFFSET_MASK    UINT64_C (0x00fffffffffffe00)
#define L2E_RESERVED_MASK  UINT64_C (0x3f000000000001fe)
#define L2E_ZERO           (UINT64_C (1) << 0)
#define L2E_COMPRESSED     (UINT64_C (1) << 62)
#define L2E_COPIED         (UINT64_C (1) << 63)

/* Refcount table entries: bits 9..63 offset, 0..8 reserved. */
#define RTE_OFFSET_MASK    UINT64_C (0xfffffffffffffe00)
#define RTE_RESERVED_MASK  UINT64_C (0x00000000000001ff)

#endif /* QCOW2_ENTRIES_H */
