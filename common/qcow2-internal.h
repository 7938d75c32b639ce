/* qcow2zstd engine: state shared by the engine's own files. */
#ifndef QCOW2_INTERNAL_H
#define QCOW2_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "qcow2.h"
#include "qcow2-cache.h"
#include <inttypes.h>

/* L1 and standard L2 entry bits. */
#define L1E_OFFSET_MASK    UINT64_C (0x00fffffffffffe00)
#define L1E_RESERVED_MASK  UINT64_C (0x7f000000000001ff)
#define L2E_OFFSET_MASK    UINT64_C (0x00fffffffffffe00)
#define L2E_RESERVED_MASK  UINT64_C (0x3f000000000001fe)
#define L2E_ZERO           (UINT64_C (1) << 0)
#define L2E_COMPRESSED     (UINT64_C (1) << 62)
#define L2E_COPIED         (UINT64_C (1) << 63)

struct qcow2_image {
  struct qcow2_header header;
  struct qcow2_log log;
  struct qcow2_options opts;
  uint64_t file_size;
  uint64_t *l1;                       /* host order, l1_size entries */
  struct qcow2_cache *l2_cache;       /* raw big-endian L2 tables */
  struct qcow2_cache *cluster_cache;  /* decompressed clusters */

  /* Compressed descriptors: bits below csize_shift are the host byte
   * offset, the csize_bits above them the extra sector count.
   */
  unsigned csize_shift;
  uint64_t csize_mask;
  uint64_t coffset_mask;

  _Atomic uint64_t clusters_decompressed;
  _Atomic uint64_t bytes_read_underneath;
  _Atomic uint64_t reads_underneath;
};

enum cluster_kind {
  CLUSTER_UNALLOCATED,
  CLUSTER_ZERO,
  CLUSTER_NORMAL,
  CLUSTER_COMPRESSED,
};

/* Where one guest cluster's data lives. */
struct cluster_map {
  enum cluster_kind kind;
  uint64_t host_offset;       /* normal: cluster start; compressed: byte */
  uint64_t compressed_len;    /* compressed: bytes in the range */
  uint64_t l2_entry;          /* the raw entry (cache key) */
};

/* Decode a standard L2 ENTRY for guest cluster GUEST_CLUSTER into *MAP,
 * validating it.  Returns 0, or -EIO after logging what is wrong.
 */
int qcow2_classify (struct qcow2_image *img, uint64_t guest_cluster,
                    uint64_t entry, struct cluster_map *map);

/* Fetch the L2 entries (host order) for guest clusters
 * [FIRST, FIRST + *N) into ENTRIES; *N is cut so the range stays inside
 * one L2 table.  L2BUF is cluster_size bytes of scratch.  Returns 0 or a
 * negative errno after logging.
 */
int qcow2_l2_entries (struct qcow2_image *img, struct qcow2_io *io,
                      uint64_t first, size_t *n, uint64_t *entries,
                      uint8_t *l2buf);

/* Read [OFFSET, OFFSET+LEN) of the image underneath into BUF; bytes past
 * the end of the file read as zeros, as qemu reads them.
 */
int qcow2_pread_clamped (struct qcow2_image *img, struct qcow2_io *io,
                         void *buf, uint64_t len, uint64_t offset);

void qcow2_error (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
void qcow2_debug (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

#endif /* QCOW2_INTERNAL_H */
