/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: a sequence of writes, zeroes, trims, flushes and reads over
 * an arbitrary image held in memory, opened for writing.  If the image's
 * refcounts covered its references before (no cluster is referenced more
 * often than its refcount says, so every referenced cluster has a
 * refcount of at least 1), they must still after the sequence and a
 * final flush.
 *
 * Released clusters are discarded (bit 1 of the second byte), whole
 * clusters of zeros written detected (the next bits).
 *
 * Input: 64 bytes of operations (8 of 8 bytes each), then the image.
 */
#include <config.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2.h"
#include "meta/image.h"
#include "format/entries.h"
#include "meta/map.h"
#include "meta/refcount.h"
#include "mem-io.h"
#include "format/endian.h"

#define OPS 8
#define OPS_BYTES (OPS * 8)
#define ROOM (256 * 1024)       /* free space after the image */

/* Does every host cluster have a refcount at least as large as the number
 * of references to it (header, L1, refcount table and blocks, L2 tables,
 * data clusters, every host cluster a compressed range touches)?
 */
struct refs {
  uint32_t *count;
  uint64_t nclusters;
  unsigned bits;
  bool ok;
};

static void
ref (struct refs *refs, uint64_t offset)
{
  if ((offset >> refs->bits) < refs->nclusters)
    refs->count[offset >> refs->bits]++;
  else
    refs->ok = false;
}

static int
ref_block (void *opaque, uint64_t offset)
{
  ref (opaque, offset);
  return 0;
}

static bool
refcounts_cover_references (struct qcow2_image *img, struct qcow2_io *io)
{
  const struct qcow2_header *h = &img->header;
  const uint32_t bits = h->cluster_bits;
  uint64_t nclusters = (img->file_size + h->cluster_size - 1) >> bits;
  struct refs r = {
    .count = calloc (nclusters + 1, sizeof *r.count),
    .nclusters = nclusters, .bits = bits, .ok = true,
  };
  uint32_t *refs = r.count;
  uint8_t *l2 = malloc (h->cluster_size);
  uint64_t i, j, c, refcount, rt_offset;
  uint32_t rt_clusters;
  bool ok;

  if (refs == NULL || l2 == NULL)
    abort ();
#define REF(off) ref (&r, (off))
  REF (0);
  qcow2_refcount_table_location (img, &rt_offset, &rt_clusters);
  for (c = 0; c < rt_clusters; ++c)
    REF (rt_offset + (c << bits));
  for (c = 0; c < ((uint64_t) h->l1_size * 8 + h->cluster_size - 1) >> bits; ++c)
    REF (h->l1_table_offset + (c << bits));
  qcow2_refcount_each_block (img, ref_block, &r);
  for (i = 0; r.ok && i < h->l1_size; ++i) {
    uint64_t l2_offset = qcow2_l1_entry (img, i) & L1E_OFFSET_MASK;
    if (l2_offset == 0)
      continue;
    REF (l2_offset);
    size_t n = (size_t) 1 << h->l2_bits;
    uint64_t entries[512];
    for (j = 0; r.ok && j < n; j += 512) {
      size_t got = n - j < 512 ? n - j : 512;
      if (qcow2_l2_entries (img, io, (i << h->l2_bits) + j, &got, entries,
                            NULL, l2) < 0) {
        r.ok = false;
        break;
      }
      for (size_t k = 0; r.ok && k < got; ++k) {
        struct cluster_map map;
        if (qcow2_classify (img, (i << h->l2_bits) + j + k, entries[k],
                            &map) < 0) {
          r.ok = false;
          break;
        }
        if (map.kind == CLUSTER_NORMAL ||
            (map.kind == CLUSTER_ZERO && map.host_offset))
          REF (map.host_offset);
        if (map.kind == CLUSTER_COMPRESSED) {
          uint64_t s = map.host_offset & ~UINT64_C (511);
          uint64_t e = map.host_offset + map.compressed_len - 1;
          for (c = s >> bits; c <= e >> bits; ++c)
            if (c < nclusters)
              refs[c]++;
        }
      }
    }
  }
#undef REF
  ok = r.ok;
  for (c = 0; ok && c < nclusters; ++c) {
    if (refs[c] == 0)
      continue;
    if (qcow2_refcount_get (img, io, c, &refcount) < 0 || refcount < refs[c])
      ok = false;
  }
  free (refs);
  free (l2);
  return ok;
}

static void
quiet (void *opaque, const char *msg)
{
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  static uint8_t buf[1 << 18];
  struct mem_io file;
  struct qcow2_io *io = &file.io;
  struct qcow2_log log = { .error = quiet };
  struct qcow2_options opts = {
    .writable = true, .request_size = 65536,
    .l2_cache_size = 1 << 20, .cluster_cache_size = 1 << 20,
  };
  struct qcow2_image *img;
  struct qcow2_conn *conn;
  bool was_consistent;

  if (size < OPS_BYTES + 72 || size > (4 << 20))
    return 0;
  /* The engine must stay inside size() and off the pool's threads. */
  mem_io_init (&file, data + OPS_BYTES, size - OPS_BYTES,
               size - OPS_BYTES + ROOM,
               MEM_IO_WRITABLE | MEM_IO_ABORT | MEM_IO_DISCARD);
  mem_io_engine_call = true;
  opts.threads = data[0] % 2;
  opts.compress = data[1] & 1;
  /* Discarded bytes read as garbage: reading them back would show. */
  opts.discard = data[1] & 2 ? QCOW2_DISCARD_UNMAP : QCOW2_DISCARD_IGNORE;
  opts.detect_zeroes = (data[1] >> 2) % 3;
  opts.passphrase = "fuzz";           /* for an encrypted image */

  if (qcow2_image_open (io, &log, &opts, &img) < 0)
    goto out;
  conn = qcow2_conn_new (img);
  if (conn == NULL)
    abort ();
  qcow2_rwlock_wrlock (&img->lock);
  was_consistent = refcounts_cover_references (img, io);
  qcow2_rwlock_unlock (&img->lock);

  uint64_t vsize = img->header.virtual_size;
  for (unsigned i = 0; i < OPS && vsize > 0; ++i) {
    const uint8_t *op = data + 8 * i;
    uint64_t off = be32 (op + 2) % vsize;
    uint64_t len = (be32 (op + 4) & 0x3ffff) + 1;
    if (len > vsize - off)
      len = vsize - off;
    if (len > sizeof buf)
      len = sizeof buf;
    memset (buf, op[1], len);
    switch (op[0] % 5) {
    case 0: qcow2_write (conn, io, buf, len, off, op[1] & 1); break;
    case 1: qcow2_zero (img, io, len, off, op[1] & 2, false); break;
    case 2: qcow2_trim (img, io, len, off, false); break;
    case 3: qcow2_flush (img, io); break;
    case 4: qcow2_read (conn, io, buf, len, off); break;
    }
  }
  qcow2_flush (img, io);
  if (was_consistent) {
    qcow2_rwlock_wrlock (&img->lock);
    if (!refcounts_cover_references (img, io)) {
      fprintf (stderr, "a cluster has fewer refcounts than references after writing\n");
      abort ();
    }
    qcow2_rwlock_unlock (&img->lock);
  }
  qcow2_conn_free (conn);
  qcow2_image_close (img);
 out:
  mem_io_free (&file);
  return 0;
}
