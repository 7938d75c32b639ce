/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: big-endian loads and stores.  Every qcow2 integer on
 * disk is big-endian; memcpy keeps the accesses legal at any alignment.
 */
#ifndef QCOW2_ENDIAN_H
#define QCOW2_ENDIAN_H

#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define QCOW2_BSWAP32(v) (v)
#define QCOW2_BSWAP64(v) (v)
#else
#define QCOW2_BSWAP32(v) __builtin_bswap32 (v)
#define QCOW2_BSWAP64(v) __builtin_bswap64 (v)
#endif

static inline uint32_t
be32 (const void *p)
{
  uint32_t v;
  memcpy (&v, p, sizeof v);
  return QCOW2_BSWAP32 (v);
}

static inline uint64_t
be64 (const void *p)
{
  uint64_t v;
  memcpy (&v, p, sizeof v);
  return QCOW2_BSWAP64 (v);
}

static inline void
put_be32 (void *p, uint32_t v)
{
  v = QCOW2_BSWAP32 (v);
  memcpy (p, &v, sizeof v);
}

static inline void
put_be64 (void *p, uint64_t v)
{
  v = QCOW2_BSWAP64 (v);
  memcpy (p, &v, sizeof v);
}

#endif /* QCOW2_ENDIAN_H */
