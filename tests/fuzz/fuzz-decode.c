/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: decoding one compressed cluster.  The first byte picks the
 * compression type and the cluster size; the rest is the compressed range.
 */
#include <config.h>

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "format/codec.h"

static struct qcow2_decoder *decoder;
static uint8_t *out;

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  char err[256];

  if (size < 1)
    return 0;
  if (decoder == NULL) {
    decoder = qcow2_decoder_new ();
    out = malloc (UINT32_C (1) << QCOW2_MAX_CLUSTER_BITS);
    if (decoder == NULL || out == NULL)
      abort ();
  }
  enum qcow2_compression type = data[0] & 1;
  unsigned cluster_bits = QCOW2_MIN_CLUSTER_BITS +
    (data[0] >> 1) % (QCOW2_MAX_CLUSTER_BITS - QCOW2_MIN_CLUSTER_BITS + 1);
  /* The decoder is reused across inputs, as the pool reuses it. */
  qcow2_decode_cluster (decoder, type, data + 1, size - 1,
                        out, (size_t) 1 << cluster_bits, err, sizeof err);
  return 0;
}
