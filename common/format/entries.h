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

/* Compressed cluster descriptors (the L2 entries with L2E_COMPRESSED):
 * with clusters of 2^BITS bytes, the low 62 - (BITS - 8) bits are the
 * host byte offset of the data, and the BITS - 8 bits above them the
 * number of 512-byte sectors it runs into after the first one.
 */
static inline unsigned
qcow2_csize_shift (unsigned cluster_bits)
{
  return 62 - (cluster_bits - 8);
}

/* The largest host offset a descriptor can name. */
static inline uint64_t
qcow2_compressed_offset_mask (unsigned cluster_bits)
{
  return (UINT64_C (1) << qcow2_csize_shift (cluster_bits)) - 1;
}

static inline uint64_t
qcow2_compressed_offset (uint64_t entry, unsigned cluster_bits)
{
  return entry & qcow2_compressed_offset_mask (cluster_bits);
}

/* Sectors the data touches, counted from the one it begins in. */
static inline uint64_t
qcow2_compressed_sectors (uint64_t entry, unsigned cluster_bits)
{
  uint64_t mask = (UINT64_C (1) << (cluster_bits - 8)) - 1;

  return ((entry >> qcow2_csize_shift (cluster_bits)) & mask) + 1;
}

/* The descriptor of LEN bytes of compressed data at HOST. */
static inline uint64_t
qcow2_compressed_entry (uint64_t host, uint64_t len, unsigned cluster_bits)
{
  return L2E_COMPRESSED | host |
    ((((host + len - 1) >> 9) - (host >> 9)) << qcow2_csize_shift (cluster_bits));
}

#endif /* QCOW2_ENTRIES_H */
