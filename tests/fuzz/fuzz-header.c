/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: header parsing, feature checks and the extension walk over
 * arbitrary bytes taken as the first cluster of an image.
 */
#include <config.h>

#include <stddef.h>
#include <stdint.h>

#include "format/header.h"

static int
count_extension (void *opaque, uint32_t type, const uint8_t *data,
                 uint32_t len)
{
  uint64_t *sum = opaque;
  /* Touch every byte so a bad bound shows up under ASan. */
  for (uint32_t i = 0; i < len; ++i)
    *sum += data[i];
  return 0;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  struct qcow2_header h;
  char err[256];
  uint64_t sum = 0;

  /* Claim a few file sizes around the buffer's own. */
  uint64_t file_sizes[] = { size, size + 4096, UINT64_C (1) << 40 };
  for (size_t i = 0; i < sizeof file_sizes / sizeof file_sizes[0]; ++i) {
    if (qcow2_header_parse (data, size, file_sizes[i], &h, err, sizeof err) == 0) {
      qcow2_header_check_features (&h, err, sizeof err);
      qcow2_header_walk_extensions (data, size, &h, count_extension, &sum,
                                    err, sizeof err);
    }
  }
  return 0;
}
