/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: changing the guest clusters of one range.
 *
 * A write, zero or trim walks its range cluster by cluster: data goes in
 * place into a normal cluster the image alone owns (COPIED, and with
 * snapshots a refcount of 1), else into a newly allocated cluster filled
 * with the old content around the new bytes; what a cluster held before
 * is released (one reference less) after the next writeback.  Data bound
 * for contiguous host bytes is written in runs.  In an encrypted image a
 * run is encrypted on the connection's pool on its way out, and a copy
 * or a part of a sector with the image's own cipher.
 */

#include <config.h>

#include <errno.h>
#include <string.h>

#include "qcow2-cluster.h"
#include "qcow2-alloc.h"
#include "qcow2-codec.h"
#include "qcow2-encrypt.h"
#include "qcow2-endian.h"
#include "qcow2-entries.h"
#include "qcow2-hostio.h"
#include "qcow2-map.h"
#include "qcow2-refcount.h"
#include "qcow2-writeback.h"

/* A run of guest data bound for contiguous host bytes, and in an
 * encrypted image where it is encrypted: CONN's pool, REQ's buffer and
 * calling thread's cipher.
 */
struct data_run {
  const uint8_t *src;
  uint64_t host;
  uint64_t len;
  struct qcow2_conn *conn;
  struct request *req;
};

static int
run_flush (struct qcow2_image *img, struct qcow2_io *io, struct data_run *run)
{
  const uint8_t *data = run->src;
  int r = 0;

  if (run->len == 0)
    return 0;
  if (img->crypt.enabled) {
    /* The client's buffer stays as it is: the ciphertext goes to the
     * request's own buffer.
     */
    if (run->req == NULL) {
      qcow2_error (img, "internal error: data for an encrypted image "
                   "without a connection to encrypt it");
      r = -EIO;
    }
    else {
      memcpy (run->req->crypt_buf, run->src, run->len);
      qcow2_encrypt_start (run->conn, &run->req->crypt, &run->req->caller,
                           true, run->req->crypt_buf, run->len, run->host);
      r = qcow2_encrypt_finish (run->conn, &run->req->crypt,
                                &run->req->caller);
      data = run->req->crypt_buf;
    }
  }
  if (r == 0)
    r = qcow2_pwrite_logged (img, io, data, run->len, run->host);
  run->len = 0;
  return r;
}

static int
run_add (struct qcow2_image *img, struct qcow2_io *io, struct data_run *run,
         const uint8_t *src, uint64_t host, uint64_t len)
{
  int r;

  if (run->len && run->host + run->len == host && run->src + run->len == src
      && run->len + len <= img->opts.request_size) {
    run->len += len;
    return 0;
  }
  r = run_flush (img, io, run);
  run->src = src;
  run->host = host;
  run->len = len;
  return r;
}

/* Fill img->wbuf with the current content of the guest cluster MAP
 * describes (decrypted, in an encrypted image).
 */
static int
read_old_cluster (struct qcow2_image *img, struct qcow2_io *io,
                  const struct cluster_map *map, uint64_t guest)
{
  const uint32_t cluster_size = img->header.cluster_size;
  char err[256];
  int r;

  switch (map->kind) {
  case CLUSTER_UNALLOCATED:
    if (img->backing)
      return img->read_backing (img, img->wbuf, cluster_size, guest);
    __attribute__ ((fallthrough));
  case CLUSTER_ZERO:
    memset (img->wbuf, 0, cluster_size);
    return 0;
  case CLUSTER_NORMAL:
    r = qcow2_pread_clamped (img, io, img->wbuf, cluster_size,
                             map->host_offset);
    if (r == 0 && img->crypt.enabled)
      r = qcow2_encrypt_here (img, img->wcipher, false, img->wbuf,
                              cluster_size, map->host_offset);
    return r;
  case CLUSTER_COMPRESSED:
    r = qcow2_pread_clamped (img, io, img->wcompressed, map->compressed_len,
                             map->host_offset);
    if (r < 0)
      return r;
    if (qcow2_decode_cluster (img->wdecoder, img->header.compression_type,
                              img->wcompressed, map->compressed_len,
                              img->wbuf, cluster_size,
                              err, sizeof err) < 0) {
      qcow2_error (img, "compressed cluster at guest offset 0x%" PRIx64
                   " (host offset 0x%" PRIx64 "): %s",
                   guest, map->host_offset, err);
      return -EIO;
    }
    return 0;
  }
  return -EIO;
}

/* May the cluster MAP (its L2 entry ENTRY) be written in place?  A
 * normal cluster with COPIED set has refcount 1.  With snapshots the
 * refcount is asked too: writing in place into a cluster that a
 * snapshot shares would change the snapshot.
 */
static int
owned_alone (struct qcow2_image *img, struct qcow2_io *io,
             const struct cluster_map *map, uint64_t entry, bool *alone)
{
  uint64_t refcount;
  int r;

  *alone = map->kind == CLUSTER_NORMAL && (entry & L2E_COPIED);
  if (!*alone || img->header.nb_snapshots == 0)
    return 0;
  r = qcow2_refcount_get (img, io, map->host_offset >> img->header.cluster_bits,
                          &refcount);
  if (r == 0)
    *alone = refcount == 1;
  return r;
}

/* Write SRC (or zeros, SRC NULL) at PART_OFF (LEN bytes) into the sectors
 * of the encrypted cluster MAP at once, through img->wbuf: the sectors
 * around a part of one are decrypted first, then the changed sectors are
 * encrypted and written.
 */
static int
write_encrypted_part (struct qcow2_image *img, struct qcow2_io *io,
                      const struct cluster_map *map, uint64_t guest,
                      const uint8_t *src, uint64_t part_off, uint64_t len)
{
  uint64_t lo = part_off & ~UINT64_C (511);
  uint64_t hi = (part_off + len + 511) & ~UINT64_C (511);
  int r = 0;

  if (lo != part_off || hi != part_off + len)
    r = read_old_cluster (img, io, map, guest);
  if (r < 0)
    return r;
  if (src)
    memcpy (img->wbuf + part_off, src, len);
  else
    memset (img->wbuf + part_off, 0, len);
  r = qcow2_encrypt_here (img, img->wcipher, true, img->wbuf + lo, hi - lo,
                          map->host_offset + lo);
  return r ? r : qcow2_pwrite_logged (img, io, img->wbuf + lo, hi - lo,
                                      map->host_offset + lo);
}

/* Write SRC (LEN bytes) at PART_OFF inside guest cluster GUEST_CLUSTER,
 * whose L2 entry is at INDEX in table T.  SRC NULL writes zeros.
 */
static int
write_cluster (struct qcow2_image *img, struct qcow2_io *io,
               struct data_run *run, struct meta_table *t, uint64_t index,
               uint64_t guest_cluster, const uint8_t *src,
               uint64_t part_off, uint64_t len)
{
  const uint32_t cluster_size = img->header.cluster_size;
  const uint64_t guest = guest_cluster << img->header.cluster_bits;
  uint64_t entry = be64 (t->data + index * 8);
  struct cluster_map map;
  uint64_t new_offset;
  bool alone = false;
  int r;

  r = qcow2_classify (img, guest_cluster, entry, &map);
  if (r == 0)
    r = owned_alone (img, io, &map, entry, &alone);
  if (r < 0)
    return r;

  if (alone) {
    bool sectors = !((part_off | len) & 511);
    if (src && (sectors || !img->crypt.enabled))
      return run_add (img, io, run, src, map.host_offset + part_off, len);
    r = run_flush (img, io, run);
    if (r < 0)
      return r;
    if (img->crypt.enabled)
      return write_encrypted_part (img, io, &map, guest, src, part_off, len);
    memset (img->wbuf, 0, len);
    return qcow2_pwrite_logged (img, io, img->wbuf, len,
                                map.host_offset + part_off);
  }

  /* A zero cluster that kept its host cluster (qemu's "zero, allocated",
   * or ours with qcow2-detect-zeroes=on) is written in place, as qemu
   * does: the entry says zero until the writeback makes it normal, so a
   * crash before that still reads zeros.  As for a normal cluster, a
   * snapshot may share it: then it is copied like any other.
   */
  bool zero_kept = map.kind == CLUSTER_ZERO && map.host_offset &&
    (entry & L2E_COPIED) && map.host_offset + cluster_size <= img->file_size;
  if (zero_kept && img->header.nb_snapshots) {
    uint64_t refcount;
    r = qcow2_refcount_get (img, io, map.host_offset >> img->header.cluster_bits,
                            &refcount);
    if (r < 0)
      return r;
    zero_kept = refcount == 1;
  }
  if (zero_kept) {
    if (len == cluster_size && src)
      r = run_add (img, io, run, src, map.host_offset, len);
    else {
      /* The run may use img->wbuf: it goes out first. */
      r = run_flush (img, io, run);
      if (r == 0) {
        memset (img->wbuf, 0, cluster_size);
        if (src)
          memcpy (img->wbuf + part_off, src, len);
        if (img->crypt.enabled)
          r = qcow2_encrypt_here (img, img->wcipher, true, img->wbuf,
                                  cluster_size, map.host_offset);
      }
      if (r == 0)
        r = qcow2_pwrite_logged (img, io, img->wbuf, cluster_size,
                                 map.host_offset);
    }
    if (r < 0)
      return r;
    put_be64 (t->data + index * 8, map.host_offset | L2E_COPIED);
    t->dirty = true;
    return 0;
  }

  r = qcow2_alloc_clusters (img, io, 1, QCOW2_ALLOC_ANY, &new_offset);
  if (r < 0)
    return r;
  if (len == cluster_size && src)
    r = run_add (img, io, run, src, new_offset, len);
  else {
    /* Copy on write: the old content around the new bytes. */
    r = run_flush (img, io, run);
    if (r == 0)
      r = read_old_cluster (img, io, &map, guest);
    if (r == 0) {
      if (src)
        memcpy (img->wbuf + part_off, src, len);
      else
        memset (img->wbuf + part_off, 0, len);
      if (img->crypt.enabled)
        r = qcow2_encrypt_here (img, img->wcipher, true, img->wbuf,
                                cluster_size, new_offset);
    }
    if (r == 0)
      r = qcow2_pwrite_logged (img, io, img->wbuf, cluster_size, new_offset);
  }
  if (r < 0) {
    /* The new cluster is unreferenced; give it back at the next writeback. */
    qcow2_free_later (img, new_offset, cluster_size, 0);
    return r;
  }
  put_be64 (t->data + index * 8, new_offset | L2E_COPIED);
  t->dirty = true;
  return qcow2_release (img, &map);
}

/* Zero or trim [PART_OFF, PART_OFF+LEN) of guest cluster GC (its L2 entry
 * is at INDEX in T).  A whole cluster becomes a zero cluster on v3
 * (releasing what it held), unallocated on v2 without a backing file
 * (which reads as zeros), and is written with zeros on v2 with one.  Part
 * of a cluster is written with zeros when zeroing, left alone when
 * trimming.  With KEEP (whole clusters of zeros written with
 * qcow2-detect-zeroes=on), a normal cluster the image alone owns becomes
 * a zero cluster that keeps its host cluster, as qemu's write-zeroes
 * without unmap makes it; on v2, which has no zero clusters, it is
 * written.
 */
static int
zero_cluster (struct qcow2_image *img, struct qcow2_io *io,
              struct data_run *run, enum qcow2_op op, struct meta_table *t,
              uint64_t index, uint64_t gc, const struct cluster_map *map,
              bool whole, bool keep, uint64_t part_off, uint64_t len)
{
  bool v3 = img->header.version >= 3;
  uint64_t entry = be64 (t->data + index * 8);

  if (map->kind == CLUSTER_UNALLOCATED && img->backing == NULL)
    return 0;
  if (map->kind == CLUSTER_ZERO && (map->host_offset == 0 || keep))
    return 0;
  if (whole && keep && !v3)
    return write_cluster (img, io, run, t, index, gc, NULL, part_off, len);
  if (whole && keep && map->kind == CLUSTER_NORMAL && (entry & L2E_COPIED)) {
    put_be64 (t->data + index * 8, map->host_offset | L2E_ZERO | L2E_COPIED);
    t->dirty = true;
    return 0;
  }
  if (whole && (v3 || img->backing == NULL)) {
    put_be64 (t->data + index * 8, v3 ? L2E_ZERO : 0);
    t->dirty = true;
    return qcow2_release (img, map);
  }
  if (op == QCOW2_OP_TRIM)
    return 0;                   /* a trim is only a hint */
  if (qcow2_reads_as_zeros (img, map))
    return 0;
  return write_cluster (img, io, run, t, index, gc, NULL, part_off, len);
}

static bool
all_zero (const uint8_t *p, size_t len)
{
  return len == 0 || (p[0] == 0 && memcmp (p, p + 1, len - 1) == 0);
}

int
qcow2_change_range (struct qcow2_image *img, struct qcow2_io *io,
                    struct qcow2_conn *conn, struct request *req,
                    enum qcow2_op op, const uint8_t *buf, uint64_t count,
                    uint64_t offset, uint64_t *done)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  const uint64_t end = offset + count;
  struct data_run run = { .conn = conn, .req = req };
  uint64_t pos = offset;
  int r = 0, r2;

  while (pos < end && r == 0) {
    uint64_t gc = pos >> bits;
    uint64_t cstart = gc << bits;
    uint64_t hi = end < cstart + cluster_size ? end : cstart + cluster_size;
    uint64_t l1_index = gc >> img->header.l2_bits;
    uint64_t index = gc & ((UINT64_C (1) << img->header.l2_bits) - 1);
    bool whole = pos == cstart && hi == cstart + cluster_size;
    /* The last cluster of a disk whose size is not a multiple of the
     * cluster size is whole once the request reaches the disk's end.
     */
    if (pos == cstart && hi == img->header.virtual_size)
      whole = true;
    struct meta_table *t;

    /* qcow2-detect-zeroes: a whole cluster of zeros written is zeroed
     * instead (qemu checks the whole request; each cluster here).
     */
    bool zeros = op == QCOW2_OP_WRITE && whole &&
      img->opts.detect_zeroes != QCOW2_DETECT_ZEROES_OFF &&
      all_zero (buf + (pos - offset), hi - pos);

    if (op == QCOW2_OP_WRITE && !zeros) {
      r = qcow2_l2_for_write (img, io, l1_index, true, &t);
      if (r == 0)
        r = write_cluster (img, io, &run, t, index, gc,
                           buf + (pos - offset), pos - cstart, hi - pos);
    }
    else {
      /* Zero and trim: a cluster without an L2 table reads as zeros,
       * unless a backing file shows through it.
       */
      r = qcow2_l2_for_write (img, io, l1_index, img->backing != NULL, &t);
      if (r == 0 && t) {
        uint64_t entry = be64 (t->data + index * 8);
        struct cluster_map map;

        r = qcow2_classify (img, gc, entry, &map);
        if (r == 0)
          r = zero_cluster (img, io, &run, zeros ? QCOW2_OP_ZERO : op, t,
                            index, gc, &map, whole,
                            zeros && img->opts.detect_zeroes
                            == QCOW2_DETECT_ZEROES_ON,
                            pos - cstart, hi - pos);
      }
    }
    if (r == 0)
      pos = hi;
  }
  *done = pos - offset;
  /* Before a reclaim too: the L2 entries of the run point at its data. */
  r2 = run_flush (img, io, &run);
  if (r2 < 0 && (r == 0 || r == QCOW2_RECLAIM))
    r = r2;
  if (r == 0 && qcow2_too_much_dirty (img))
    r = qcow2_writeback (img, io, false);
  return r;
}

int
qcow2_zero_needs_writes (struct qcow2_image *img, struct qcow2_io *io,
                         uint64_t count, uint64_t offset, bool *needs)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t end = offset + count;
  uint64_t edges[2] = { offset, end - 1 };
  unsigned i;
  int r;

  /* A v2 image cannot say "zero" over a backing file: it writes zeros. */
  *needs = img->header.version < 3 && img->backing != NULL;
  for (i = 0; i < 2; ++i) {
    uint64_t gc = edges[i] >> bits;
    uint64_t cstart = gc << bits;
    uint64_t cend = cstart + img->header.cluster_size;
    uint64_t entry;
    size_t n = 1;
    struct cluster_map map;

    if (cend > img->header.virtual_size)
      cend = img->header.virtual_size;
    if (offset <= cstart && end >= cend)
      continue;                 /* whole: metadata only */
    r = qcow2_l2_entries (img, io, gc, &n, &entry, NULL, img->wbuf);
    if (r == 0)
      r = qcow2_classify (img, gc, entry, &map);
    if (r < 0)
      return r;
    if (!qcow2_reads_as_zeros (img, &map))
      *needs = true;
  }
  return 0;
}

int
qcow2_release (struct qcow2_image *img, const struct cluster_map *map)
{
  switch (map->kind) {
  case CLUSTER_UNALLOCATED:
    return 0;
  case CLUSTER_ZERO:
    if (map->host_offset == 0)
      return 0;
    /* A zero cluster that kept its allocation releases it like a
     * normal one.
     */
    __attribute__ ((fallthrough));
  case CLUSTER_NORMAL:
    return qcow2_free_later (img, map->host_offset, img->header.cluster_size,
                             0);
  case CLUSTER_COMPRESSED: {
    uint64_t start, len;
    qcow2_compressed_span (map, &start, &len);
    return qcow2_free_later (img, start, len, map->l2_entry);
  }
  }
  return 0;
}

bool
qcow2_reads_as_zeros (const struct qcow2_image *img,
                      const struct cluster_map *map)
{
  return map->kind == CLUSTER_ZERO ||
    (map->kind == CLUSTER_UNALLOCATED && img->backing == NULL);
}

int
qcow2_write_cluster (struct qcow2_image *img, struct qcow2_io *io,
                     struct meta_table *t, uint64_t index,
                     uint64_t guest_cluster, const uint8_t *src,
                     uint64_t part_off, uint64_t len)
{
  struct data_run run = { 0 };
  int r = write_cluster (img, io, &run, t, index, guest_cluster, src,
                         part_off, len);

  return r ? r : run_flush (img, io, &run);
}
