/* Fuzz target: open an arbitrary image held in memory and read and map
 * requests over it.  The first 32 bytes choose the requests and options;
 * the rest is the image file.
 */
#include <config.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2.h"
#include "qcow2-endian.h"

struct memfile {
  const uint8_t *data;
  size_t size;
};

static int
mem_pread (void *opaque, void *buf, size_t count, uint64_t offset)
{
  struct memfile *f = opaque;

  /* The engine promises to stay inside size(). */
  if (offset > f->size || count > f->size - offset)
    abort ();
  memcpy (buf, f->data + offset, count);
  return 0;
}

static int64_t
mem_size (void *opaque)
{
  struct memfile *f = opaque;
  return f->size;
}

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
  struct memfile file;
  struct qcow2_io io = { .opaque = &file, .pread = mem_pread, .size = mem_size };
  struct qcow2_options opts = { 0 };
  struct qcow2_image *img;
  struct qcow2_conn *conn;
  const uint8_t *params = data;

  if (size < 32)
    return 0;
  if (buf == NULL && (buf = malloc (MAX_READ)) == NULL)
    abort ();
  file.data = data + 32;
  file.size = size - 32;

  opts.threads = params[0] % 3;
  opts.request_size = (uint64_t) 4096 << (params[1] % 6);
  opts.l2_cache_size = (params[2] & 1) ? (uint64_t) 1 << 20 : 0;
  opts.cluster_cache_size = (params[2] & 2) ? (uint64_t) 1 << 20 : 0;

  if (qcow2_image_open (&io, NULL, &opts, &img) < 0)
    return 0;
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
    qcow2_read (conn, &io, buf, len, off);
    qcow2_extents (conn, &io, off, len, count_extent, &covered);
    if (covered > len)
      abort ();
    qcow2_prefetch (conn, &io, off, len < 65536 ? len : 65536);
  }
  qcow2_conn_free (conn);
  qcow2_image_close (img);
  return 0;
}
