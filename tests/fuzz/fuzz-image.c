/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: open an arbitrary image held in memory and read and map
 * requests over it (its active disk, or its snapshot 1).  The first 32
 * bytes choose the requests and options; the rest is the image file.
 */
#include <config.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2.h"
#include "format/endian.h"
#include "mem-io.h"

static int
count_extent (void *opaque, uint64_t offset, uint64_t length, bool zero)
{
  uint64_t *covered = opaque;
  *covered += length;
  return 0;
}

#define MAX_READ (UINT32_C (1) << 22)

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  static uint8_t *buf;
  struct mem_io file;
  struct qcow2_options opts = { 0 };
  struct qcow2_image *img;
  struct qcow2_conn *conn;
  const uint8_t *params = data;

  if (size < 32)
    return 0;
  if (buf == NULL && (buf = malloc (MAX_READ)) == NULL)
    abort ();
  /* The engine must stay inside size() and off the pool's threads. */
  mem_io_init (&file, data + 32, size - 32, size - 32, MEM_IO_ABORT);
  mem_io_engine_call = true;

  opts.threads = params[0] % 3;
  opts.request_size = (uint64_t) 4096 << (params[1] % 6);
  opts.l2_cache_size = (params[2] & 1) ? (uint64_t) 1 << 20 : 0;
  opts.cluster_cache_size = (params[2] & 2) ? (uint64_t) 1 << 20 : 0;
  /* An encrypted image unlocks with "fuzz", as fuzz-luks's seeds do; bit
   * 0 of the fourth byte serves snapshot 1 instead of the active disk.
   */
  opts.passphrase = "fuzz";
  opts.snapshot = (params[3] & 1) ? "1" : NULL;

  if (qcow2_image_open (&file.io, NULL, &opts, &img) < 0)
    goto out;
  conn = qcow2_conn_new (img);
  if (conn == NULL)
    abort ();

  uint64_t vsize = qcow2_image_header (img)->virtual_size;
  for (unsigned i = 0; i < 4 && vsize > 0; ++i) {
    uint64_t off = be32 (params + 4 + 6 * i) % vsize;
    uint64_t len = (be32 (params + 6 + 6 * i) % MAX_READ) + 1;
    uint64_t covered = 0;
    if (len > vsize - off)
      len = vsize - off;
    qcow2_read (conn, &file.io, buf, len, off);
    qcow2_extents (conn, &file.io, off, len, count_extent, &covered);
    if (covered > len)
      abort ();
    qcow2_prefetch (conn, &file.io, off, len < 65536 ? len : 65536);
  }
  qcow2_conn_free (conn);
  qcow2_image_close (img);
 out:
  mem_io_free (&file);
  return 0;
}
