/* qcow2zstd engine: writes, zeroes, trims and the metadata writeback.
 *
 * Every change runs with the image lock held exclusively.  Guest data is
 * written at once, either in place (a normal cluster with COPIED set,
 * i.e. refcount exactly 1) or into a newly allocated cluster.  L2 and L1
 * changes stay in memory until qcow2_flush (or until enough have piled
 * up), which writes them in the order that keeps the image consistent on
 * disk at every moment:
 *
 *   refcount blocks (increments) -> flush -> refcount table -> flush ->
 *   header if the table moved -> flush -> L2 tables -> flush -> L1 ->
 *   flush -> decrements of what was released -> refcount blocks -> flush
 *
 * A crash anywhere leaks clusters at worst.
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2-internal.h"
#include "qcow2-codec.h"
#include "qcow2-endian.h"

/* Write back before this much changed metadata piles up in memory. */
#define MAX_DIRTY_L2_BYTES (UINT64_C (16) << 20)
#define MIN_DIRTY_L2_TABLES 8
#define MAX_PENDING_FREES 65536

/* A run of guest data bound for contiguous host bytes. */
struct data_run {
  const uint8_t *src;
  uint64_t host;
  uint64_t len;
};

static int
run_flush (struct qcow2_image *img, struct qcow2_io *io, struct data_run *run)
{
  int r = 0;

  if (run->len)
    r = qcow2_pwrite_logged (img, io, run->src, run->len, run->host);
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

/* The L2 table for L1_INDEX, as a table that may be changed: made (and
 * hooked into the L1 table in memory) if the L1 entry is empty, else
 * loaded into the dirty set.  With CREATE false and no table, *OUT is
 * NULL.
 */
static int
l2_for_write (struct qcow2_image *img, struct qcow2_io *io,
              uint64_t l1_index, bool create, struct meta_table **out)
{
  const struct qcow2_header *h = &img->header;
  uint64_t l1e = img->l1[l1_index];
  uint64_t offset = l1e & L1E_OFFSET_MASK;
  struct meta_table *t;
  int r;

  *out = NULL;
  if (offset == 0) {
    if (!create)
      return 0;
    r = qcow2_alloc_clusters (img, io, 1, &offset);
    if (r < 0)
      return r;
    t = calloc (1, sizeof *t + h->cluster_size);
    if (t == NULL)
      goto nomem;
    t->offset = offset;
    t->dirty = true;
    if (tablemap_insert (&img->dirty_l2, t) == -1) {
      free (t);
      goto nomem;
    }
    img->l1[l1_index] = offset | L2E_COPIED;
    img->l1_dirty[l1_index] = 1;
    img->l1_any_dirty = true;
    *out = t;
    return 0;
  }

  if ((l1e & L1E_RESERVED_MASK) || (offset & (h->cluster_size - 1)) ||
      offset > img->file_size || h->cluster_size > img->file_size - offset) {
    qcow2_error (img, "L1 entry %" PRIu64 " (0x%016" PRIx64 ") is invalid: "
                 "reserved bits, unaligned or outside the file",
                 l1_index, l1e);
    return -EIO;
  }
  if (!(l1e & L2E_COPIED)) {
    qcow2_error (img, "L1 entry %" PRIu64 ": the L2 table is shared "
                 "(COPIED is clear) and cannot be written in place",
                 l1_index);
    return -EIO;
  }
  t = tablemap_find (&img->dirty_l2, offset);
  if (t) {
    *out = t;
    return 0;
  }
  t = malloc (sizeof *t + h->cluster_size);
  if (t == NULL)
    goto nomem;
  t->offset = offset;
  /* Written back only once an entry changes: a zero or trim of what
   * reads as zeros already changes nothing on disk.
   */
  t->dirty = false;
  if (!qcow2_cache_get (img->l2_cache, offset, 0, t->data, h->cluster_size)) {
    r = qcow2_pread_clamped (img, io, t->data, h->cluster_size, offset);
    if (r < 0) {
      free (t);
      return r;
    }
  }
  if (tablemap_insert (&img->dirty_l2, t) == -1) {
    free (t);
    goto nomem;
  }
  *out = t;
  return 0;

 nomem:
  qcow2_error (img, "out of memory for an L2 table");
  return -ENOMEM;
}

/* Queue the release of whatever MAP held. */
static int
release (struct qcow2_image *img, const struct cluster_map *map)
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
    /* qemu counts a compressed cluster in every host cluster that its
     * sector-rounded range touches.
     */
    uint64_t start = map->host_offset & ~UINT64_C (511);
    uint64_t len = ((map->host_offset & 511) + map->compressed_len);
    return qcow2_free_later (img, start, len, map->l2_entry);
  }
  }
  return 0;
}

/* Fill img->wbuf with the current content of the guest cluster MAP
 * describes.
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
      return qcow2_backing_read (img, img->wbuf, cluster_size, guest);
    __attribute__ ((fallthrough));
  case CLUSTER_ZERO:
    memset (img->wbuf, 0, cluster_size);
    return 0;
  case CLUSTER_NORMAL:
    return qcow2_pread_clamped (img, io, img->wbuf, cluster_size,
                                map->host_offset);
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
  uint64_t entry = be64 (t->data + index * 8);
  struct cluster_map map;
  uint64_t new_offset;
  int r;

  r = qcow2_classify (img, guest_cluster, entry, &map);
  if (r < 0)
    return r;

  if (map.kind == CLUSTER_NORMAL && (entry & L2E_COPIED)) {
    if (src)
      return run_add (img, io, run, src, map.host_offset + part_off, len);
    r = run_flush (img, io, run);
    if (r == 0)
      memset (img->wbuf, 0, len);
    return r ? r : qcow2_pwrite_logged (img, io, img->wbuf, len,
                                        map.host_offset + part_off);
  }

  r = qcow2_alloc_clusters (img, io, 1, &new_offset);
  if (r < 0)
    return r;
  if (len == cluster_size && src)
    r = run_add (img, io, run, src, new_offset, len);
  else {
    r = read_old_cluster (img, io, &map, guest_cluster << img->header.cluster_bits);
    if (r == 0) {
      if (src)
        memcpy (img->wbuf + part_off, src, len);
      else
        memset (img->wbuf + part_off, 0, len);
      r = run_flush (img, io, run);
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
  return release (img, &map);
}

static bool
too_much_dirty (struct qcow2_image *img)
{
  uint64_t limit = MAX_DIRTY_L2_BYTES / img->header.cluster_size;

  if (limit < MIN_DIRTY_L2_TABLES)
    limit = MIN_DIRTY_L2_TABLES;
  return img->dirty_l2.count > limit || img->rc.npending > MAX_PENDING_FREES;
}

static int flush_locked (struct qcow2_image *img, struct qcow2_io *io,
                         bool flush_underneath);

static int
check_writable (struct qcow2_image *img, uint64_t count, uint64_t offset)
{
  if (!img->opts.writable) {
    qcow2_error (img, "the image was opened read-only");
    return -EROFS;
  }
  if (offset > img->header.virtual_size ||
      count > img->header.virtual_size - offset) {
    qcow2_error (img, "request of %" PRIu64 " bytes at %" PRIu64
                 " is beyond the virtual size %" PRIu64,
                 count, offset, img->header.virtual_size);
    return -EINVAL;
  }
  return 0;
}

enum op { OP_WRITE, OP_ZERO, OP_TRIM };

/* Does the cluster MAP describes read as zeros now? */
static bool
reads_as_zeros (const struct qcow2_image *img, const struct cluster_map *map)
{
  return map->kind == CLUSTER_ZERO ||
    (map->kind == CLUSTER_UNALLOCATED && img->backing == NULL);
}

/* Zero or trim [PART_OFF, PART_OFF+LEN) of guest cluster GC (its L2 entry
 * is at INDEX in T).  A whole cluster becomes a zero cluster on v3
 * (releasing what it held), unallocated on v2 without a backing file
 * (which reads as zeros), and is written with zeros on v2 with one.  Part
 * of a cluster is written with zeros when zeroing, left alone when
 * trimming.
 */
static int
zero_cluster (struct qcow2_image *img, struct qcow2_io *io,
              struct data_run *run, enum op op, struct meta_table *t,
              uint64_t index, uint64_t gc, const struct cluster_map *map,
              bool whole, uint64_t part_off, uint64_t len)
{
  bool v3 = img->header.version >= 3;

  if (reads_as_zeros (img, map))
    return 0;
  if (whole && (v3 || img->backing == NULL)) {
    put_be64 (t->data + index * 8, v3 ? L2E_ZERO : 0);
    t->dirty = true;
    return release (img, map);
  }
  if (op == OP_TRIM)
    return 0;                   /* a trim is only a hint */
  return write_cluster (img, io, run, t, index, gc, NULL, part_off, len);
}

/* Apply FN's change to every guest cluster of [OFFSET, OFFSET+COUNT). */
static int
change_range (struct qcow2_image *img, struct qcow2_io *io, enum op op,
              const uint8_t *buf, uint64_t count, uint64_t offset)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  const uint64_t end = offset + count;
  struct data_run run = { 0 };
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

    if (op == OP_WRITE) {
      r = l2_for_write (img, io, l1_index, true, &t);
      if (r == 0)
        r = write_cluster (img, io, &run, t, index, gc,
                           buf + (pos - offset), pos - cstart, hi - pos);
    }
    else {
      /* Zero and trim: a cluster without an L2 table reads as zeros,
       * unless a backing file shows through it.
       */
      r = l2_for_write (img, io, l1_index, img->backing != NULL, &t);
      if (r == 0 && t) {
        uint64_t entry = be64 (t->data + index * 8);
        struct cluster_map map;

        r = qcow2_classify (img, gc, entry, &map);
        if (r == 0)
          r = zero_cluster (img, io, &run, op, t, index, gc, &map, whole,
                            pos - cstart, hi - pos);
      }
    }
    pos = hi;
  }
  r2 = run_flush (img, io, &run);
  if (r == 0)
    r = r2;
  if (r == 0 && too_much_dirty (img))
    r = flush_locked (img, io, false);
  return r;
}

/* Put LEN bytes of one cluster's compressed data into the packing area,
 * back to back with the previous cluster's as qemu packs them: into the
 * rest of the current host cluster, running on into the next host cluster
 * if that one can be allocated right after it, else into a new one.
 * Every host cluster the sector-rounded range touches gets one more
 * reference (a newly allocated one already has its first).
 */
static int
pack_compressed (struct qcow2_image *img, struct qcow2_io *io,
                 const uint8_t *data, uint64_t len, uint64_t *host)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  uint64_t cur = img->pack_cursor;
  uint64_t fresh[2], c, first, last, offset;
  unsigned nfresh = 0, i;
  int r;

  if (cur) {
    /* With narrow refcounts (refcount_bits 1 to 4) a host cluster can
     * run out of references before it runs out of bytes; start a new
     * one then, as qemu does.  Only the cluster packed so far can be
     * full: any other that the range runs into is allocated here.
     */
    uint64_t refcount;
    r = qcow2_refcount_get (img, io, (cur & ~UINT64_C (511)) >> bits,
                            &refcount);
    if (r < 0)
      return r;
    if (refcount >= img->rc.max_refcount) {
      qcow2_pack_reset (img);
      cur = 0;
    }
  }
  if (cur) {
    uint64_t next = qcow2_pack_next_cluster (img);
    if (cur + len > next << bits) {
      /* No writeback here: it could release the cluster CUR is in. */
      img->rc.no_reclaim = true;
      r = qcow2_alloc_cluster_at (img, io, next);
      img->rc.no_reclaim = false;
      if (r == -EBUSY)
        cur = 0;
      else if (r < 0)
        return r;
      else
        fresh[nfresh++] = next;
    }
  }
  if (cur == 0) {
    r = qcow2_alloc_pack_cluster (img, io, &offset);
    if (r < 0)
      return r;
    cur = offset;
    fresh[nfresh++] = offset >> bits;
  }
  if (cur > img->coffset_mask) {
    qcow2_error (img, "host offset 0x%" PRIx64 " is too large for a "
                 "compressed cluster descriptor", cur);
    r = -EFBIG;
    goto fail;
  }

  first = (cur & ~UINT64_C (511)) >> bits;
  last = ((cur + len - 1) | 511) >> bits;
  for (c = first; c <= last; ++c) {
    bool is_fresh = false;
    for (i = 0; i < nfresh; ++i)
      is_fresh |= fresh[i] == c;
    if (!is_fresh && (r = qcow2_refcount_add (img, io, c, 1)) < 0)
      goto fail;
  }
  r = qcow2_pwrite_logged (img, io, data, len, cur);
  if (r < 0)
    goto fail;
  *host = cur;
  img->pack_cursor = cur + len;
  return 0;

 fail:
  for (i = 0; i < nfresh; ++i)
    qcow2_free_later (img, fresh[i] << bits, cluster_size, 0);
  qcow2_pack_reset (img);
  return r;
}

/* Compress a cluster whose shared copy turned out to be gone or different
 * (under the lock: rare).  Returns what compress_job would have stored in
 * result: the length in OUT, or 0 to store it plain.
 */
static int64_t
compress_locked (struct qcow2_image *img, const uint8_t *src,
                 uint32_t src_len, uint8_t *out)
{
  const uint32_t cluster_size = img->header.cluster_size;
  const uint8_t *in = src;
  char err[256];
  int64_t len;

  if (img->wencoder == NULL) {
    img->wencoder = qcow2_encoder_new ();
    if (img->wencoder == NULL) {
      qcow2_error (img, "out of memory for compressing a write");
      return -ENOMEM;
    }
  }
  if (src_len < cluster_size) {
    memcpy (img->wbuf, src, src_len);
    memset (img->wbuf + src_len, 0, cluster_size - src_len);
    in = img->wbuf;
  }
  len = qcow2_encode_cluster (img->wencoder, img->header.compression_type,
                              img->opts.compression_level, in, cluster_size,
                              out, cluster_size - 1, err, sizeof err);
  if (len < 0) {
    qcow2_error (img, "%s", err);
    return -EIO;
  }
  return len;
}

/* Pack LEN bytes of compressed data of cluster I of CTX (guest cluster
 * GC), and set *NEW_ENTRY to describe them.  If MAY_SHARE, first look
 * for a copy of the same data that another write placed while this one
 * was being compressed (or that came earlier in the same batch), and
 * share it instead.
 */
static int
store_compressed (struct qcow2_image *img, struct qcow2_io *io,
                  struct compress_ctx *ctx, size_t i, uint64_t gc,
                  int64_t len, bool may_share, uint64_t *new_entry)
{
  const bool whole = ctx->src_len[i] == img->header.cluster_size;
  uint64_t copy, host;
  int r;

  if (may_share && whole &&
      (copy = qcow2_dedup_find (img, ctx->hash[i])) != 0) {
    r = qcow2_dedup_share (img, io, gc, copy, ctx->src[i], ctx->src_len[i]);
    if (r < 0)
      return r;
    if (r == 1) {
      *new_entry = copy;
      return 0;
    }
  }
  r = pack_compressed (img, io,
                       ctx->out + i * (size_t) img->header.cluster_size,
                       len, &host);
  if (r < 0)
    return r;
  *new_entry = L2E_COMPRESSED | host |
    ((((host + len - 1) >> 9) - (host >> 9)) << img->csize_shift);
  if (whole)
    qcow2_dedup_remember (img, ctx->hash[i], *new_entry);
  return 0;
}

/* Store the compression result of cluster I of CTX, guest cluster GC:
 * its compressed data, its shared copy, its plain data or nothing (all
 * zero).
 */
static int
place_cluster (struct qcow2_image *img, struct qcow2_io *io,
               struct compress_ctx *ctx, size_t i, uint64_t gc)
{
  uint64_t l1_index = gc >> img->header.l2_bits;
  uint64_t index = gc & ((UINT64_C (1) << img->header.l2_bits) - 1);
  const uint8_t *src = ctx->src[i];
  const uint32_t src_len = ctx->src_len[i];
  uint8_t *cdata = ctx->out + i * (size_t) img->header.cluster_size;
  int64_t result = ctx->result[i];
  struct data_run run = { 0 };
  struct meta_table *t;
  struct cluster_map map;
  uint64_t entry, new_entry;
  int r;

  r = l2_for_write (img, io, l1_index, true, &t);
  if (r < 0)
    return r;
  entry = be64 (t->data + index * 8);
  r = qcow2_classify (img, gc, entry, &map);
  if (r < 0)
    return r;
  if (result == QCOW2_COMPRESS_DUPLICATE) {
    r = qcow2_dedup_share (img, io, gc, ctx->dedup[i], src, src_len);
    if (r < 0)
      return r;
    qcow2_debug_if (img, QCOW2_DEBUG_MAP, "guest cluster %" PRIu64 ": %s "
                    "compressed entry 0x%" PRIx64, gc,
                    r ? "shares" : "cannot share", ctx->dedup[i]);
    if (r == 0) {
      result = compress_locked (img, src, src_len, cdata);
      if (result < 0)
        return result;
    }
  }
  if (result == 0) {
    r = write_cluster (img, io, &run, t, index, gc, src, 0, src_len);
    if (r == 0)
      r = run_flush (img, io, &run);
    return r;
  }

  if (result == QCOW2_COMPRESS_ALL_ZERO) {
    /* What already reads as zeros stays as it is (an unallocated cluster
     * of a new image, as qemu-img convert leaves it).
     */
    if (reads_as_zeros (img, &map))
      return 0;
    if (img->header.version < 3 && img->backing) {
      r = write_cluster (img, io, &run, t, index, gc, src, 0, src_len);
      return r ? r : run_flush (img, io, &run);
    }
    new_entry = img->header.version >= 3 ? L2E_ZERO : 0;
  }
  else if (result == QCOW2_COMPRESS_DUPLICATE)
    new_entry = ctx->dedup[i];
  else {
    r = store_compressed (img, io, ctx, i, gc, result,
                          ctx->result[i] != QCOW2_COMPRESS_DUPLICATE,
                          &new_entry);
    if (r < 0)
      return r;
  }
  put_be64 (t->data + index * 8, new_entry);
  t->dirty = true;
  return release (img, &map);
}

/* Compress the batch outside the lock, then place it under the lock. */
static int
flush_compress_batch (struct qcow2_io *io, struct compress_ctx *ctx,
                      uint64_t first_gc)
{
  struct qcow2_image *img = ctx->img;
  size_t i;
  int pass, r;

  if (ctx->count == 0)
    return 0;
  r = qcow2_compress_run (ctx);
  if (r < 0)
    return r;
  pthread_rwlock_wrlock (&img->lock);
  /* Compressed clusters first, plain ones after: a plain cluster placed
   * in between would take the host cluster that the packed data was to
   * run on into, and leave the rest of the current one unused.
   */
  for (pass = 0; pass < 2; ++pass)
    for (i = 0; i < ctx->count && r == 0; ++i)
      if ((ctx->result[i] == 0) == (pass == 1))
        r = place_cluster (img, io, ctx, i, first_gc + i);
  if (r == 0 && too_much_dirty (img))
    r = flush_locked (img, io, false);
  pthread_rwlock_unlock (&img->lock);
  ctx->count = 0;
  return r;
}

/* A write with compression on: whole clusters (and the disk's last
 * cluster when the write reaches the end of the disk) are compressed;
 * the parts of clusters at either end take the plain path.
 */
static int
write_compressed (struct qcow2_reader *reader, struct qcow2_io *io,
                  const uint8_t *buf, uint64_t count, uint64_t offset)
{
  struct qcow2_image *img = qcow2_reader_image (reader);
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  const uint64_t end = offset + count;
  struct compress_ctx *ctx;
  uint64_t pos = offset, batch_gc = 0;
  size_t clusters = (count >> bits) + 1;
  int r = 0, r2;

  if (clusters > qcow2_compress_batch_max (img))
    clusters = qcow2_compress_batch_max (img);
  ctx = qcow2_compress_ctx_get (reader, clusters);
  if (ctx == NULL)
    return -ENOMEM;

  while (pos < end && r == 0) {
    uint64_t cstart = pos & ~(cluster_size - 1);
    uint64_t cend = cstart + cluster_size;
    uint64_t hi = end < cend ? end : cend;

    if (cend > img->header.virtual_size)
      cend = img->header.virtual_size;
    if (pos == cstart && cend <= end) {
      if (ctx->count == 0)
        batch_gc = cstart >> bits;
      ctx->src[ctx->count] = buf + (pos - offset);
      ctx->src_len[ctx->count] = cend - cstart;
      /* Hashed here, where the data just came in and is still in this
       * CPU's cache (a compressor thread would fetch it from memory).
       * The zero padded last cluster is never shared.
       */
      ctx->hash[ctx->count] = 0;
      ctx->dedup[ctx->count] = 0;
      if (cend - cstart == cluster_size) {
        ctx->hash[ctx->count] = qcow2_dedup_hash (ctx->src[ctx->count],
                                                  cluster_size);
        ctx->dedup[ctx->count] = qcow2_dedup_find (img,
                                                   ctx->hash[ctx->count]);
      }
      ctx->count++;
      pos = cend;
      if (ctx->count == ctx->capacity)
        r = flush_compress_batch (io, ctx, batch_gc);
      continue;
    }
    r = flush_compress_batch (io, ctx, batch_gc);
    if (r < 0)
      break;
    pthread_rwlock_wrlock (&img->lock);
    r = change_range (img, io, OP_WRITE, buf + (pos - offset), hi - pos, pos);
    pthread_rwlock_unlock (&img->lock);
    pos = hi;
  }
  r2 = flush_compress_batch (io, ctx, batch_gc);
  if (r == 0)
    r = r2;
  qcow2_compress_ctx_put (reader, ctx);
  return r;
}

/* A stream of writes (a whole disk copied in) leaves its data in the
 * host's page cache, where the kernel's own writeback may not touch it
 * for many seconds; the final flush then waits for all of it at once.
 * Flushing each time this much has been written, from the writing thread
 * and outside the image lock, lets the device write while other threads
 * go on compressing.  It is only a flush of data already written: it
 * takes no part in the ordering of metadata updates.
 */
#define EARLY_FLUSH_BYTES (UINT64_C (64) << 20)

static int
flush_data_early (struct qcow2_image *img, struct qcow2_io *io)
{
  bool running = false;
  int r;

  if (atomic_load_explicit (&img->unflushed_bytes, memory_order_relaxed)
      < EARLY_FLUSH_BYTES)
    return 0;
  if (!atomic_compare_exchange_strong (&img->early_flush_running,
                                       &running, true))
    return 0;
  r = qcow2_flush_logged (img, io);
  atomic_store (&img->early_flush_running, false);
  return r;
}

int
qcow2_write (struct qcow2_reader *reader, struct qcow2_io *io,
             const void *buf, uint64_t count, uint64_t offset, bool fua)
{
  struct qcow2_image *img = qcow2_reader_image (reader);
  int r = check_writable (img, count, offset);

  if (r < 0 || count == 0)
    return r;
  qcow2_debug_if (img, QCOW2_DEBUG_MAP, "write 0x%" PRIx64 "+%" PRIu64 "%s%s",
                  offset, count, img->opts.compress ? " (compressing)" : "",
                  fua ? " FUA" : "");
  if (img->opts.compress) {
    r = write_compressed (reader, io, buf, count, offset);
    if (r == 0 && fua)
      r = qcow2_flush (img, io);
  }
  else {
    pthread_rwlock_wrlock (&img->lock);
    r = change_range (img, io, OP_WRITE, buf, count, offset);
    if (r == 0 && fua)
      r = flush_locked (img, io, true);
    pthread_rwlock_unlock (&img->lock);
  }
  if (r == 0)
    r = flush_data_early (img, io);
  return r;
}

/* Would zeroing this range have to write data (a part of an allocated
 * cluster)?
 */
static int
zero_needs_writes (struct qcow2_image *img, struct qcow2_io *io,
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
    if (!reads_as_zeros (img, &map))
      *needs = true;
  }
  return 0;
}

int
qcow2_zero (struct qcow2_reader *reader, struct qcow2_io *io,
            uint64_t count, uint64_t offset, bool fast, bool fua)
{
  struct qcow2_image *img = qcow2_reader_image (reader);
  int r = check_writable (img, count, offset);

  if (r < 0 || count == 0)
    return r;
  pthread_rwlock_wrlock (&img->lock);
  if (fast) {
    bool needs;
    r = zero_needs_writes (img, io, count, offset, &needs);
    if (r == 0 && needs)
      r = -ENOTSUP;
  }
  if (r == 0)
    r = change_range (img, io, OP_ZERO, NULL, count, offset);
  if (r == 0 && fua)
    r = flush_locked (img, io, true);
  pthread_rwlock_unlock (&img->lock);
  return r;
}

int
qcow2_trim (struct qcow2_reader *reader, struct qcow2_io *io,
            uint64_t count, uint64_t offset, bool fua)
{
  struct qcow2_image *img = qcow2_reader_image (reader);
  int r = check_writable (img, count, offset);

  if (r < 0 || count == 0)
    return r;
  pthread_rwlock_wrlock (&img->lock);
  r = change_range (img, io, OP_TRIM, NULL, count, offset);
  if (r == 0 && fua)
    r = flush_locked (img, io, true);
  pthread_rwlock_unlock (&img->lock);
  return r;
}

struct l2_writeback {
  struct qcow2_image *img;
  struct qcow2_io *io;
};

static int
write_l2 (void *opaque, struct meta_table *t)
{
  struct l2_writeback *ctx = opaque;
  int r;

  if (!t->dirty)
    return 0;
  r = qcow2_pwrite_logged (ctx->img, ctx->io, t->data,
                           ctx->img->header.cluster_size, t->offset);
  if (r == 0)
    t->dirty = false;
  return r;
}

/* Written L2 tables leave the dirty set for the shared read cache. */
static int
retire_l2 (struct qcow2_image *img)
{
  size_t i;

  for (i = 0; i < img->dirty_l2.capacity; ) {
    struct meta_table *t = img->dirty_l2.slots[i];
    if (t && !t->dirty) {
      qcow2_cache_put (img->l2_cache, t->offset, t->data);
      free (tablemap_remove (&img->dirty_l2, t->offset));
      continue;                 /* the removal may have moved another here */
    }
    i++;
  }
  return 0;
}

static int
write_l1 (struct qcow2_image *img, struct qcow2_io *io)
{
  uint32_t i = 0, n = img->header.l1_size;
  uint8_t *buf = img->wbuf;
  uint64_t per_buf = img->header.cluster_size / 8;
  int r;

  while (i < n) {
    uint32_t start, j;

    if (!img->l1_dirty[i]) {
      i++;
      continue;
    }
    /* A run of dirty entries, at most a buffer's worth. */
    start = i;
    for (j = 0; i < n && img->l1_dirty[i] && j < per_buf; ++i, ++j)
      put_be64 (buf + 8 * j, img->l1[i]);
    r = qcow2_pwrite_logged (img, io, buf, 8 * (uint64_t) j,
                             img->header.l1_table_offset + 8 * (uint64_t) start);
    if (r < 0)
      return r;
    memset (img->l1_dirty + start, 0, j);
  }
  img->l1_any_dirty = false;
  return 0;
}

static int writeback (struct qcow2_image *img, struct qcow2_io *io,
                      bool flush_underneath, bool retire);

static int
flush_locked (struct qcow2_image *img, struct qcow2_io *io,
              bool flush_underneath)
{
  return writeback (img, io, flush_underneath, true);
}

int
qcow2_writeback_for_room (struct qcow2_image *img, struct qcow2_io *io)
{
  return writeback (img, io, false, false);
}

/* RETIRE: move written L2 tables to the read cache (freeing them); not
 * while a caller may be holding one.
 */
static int
writeback (struct qcow2_image *img, struct qcow2_io *io,
           bool flush_underneath, bool retire)
{
  struct l2_writeback ctx = { .img = img, .io = io };
  bool l2_dirty = img->dirty_l2.count > 0;
  int r;

  /* 1. Increments: refcount blocks, table, header. */
  r = qcow2_refcount_writeback (img, io);
  if (r < 0)
    return r;

  /* 2. L2 tables, then L1, each only after what it points at is durable. */
  if (l2_dirty || img->l1_any_dirty) {
    r = qcow2_flush_logged (img, io);
    if (r < 0)
      return r;
    r = tablemap_each (&img->dirty_l2, write_l2, &ctx);
    if (r < 0)
      return r;
    if (retire)
      retire_l2 (img);
    if (img->l1_any_dirty) {
      r = qcow2_flush_logged (img, io);
      if (r == 0)
        r = write_l1 (img, io);
      if (r < 0)
        return r;
    }
  }

  /* 3. Decrements, now that nothing on disk points at those clusters. */
  if (img->rc.npending) {
    r = qcow2_flush_logged (img, io);
    if (r == 0)
      r = qcow2_refcount_apply_frees (img, io);
    if (r == 0)
      r = qcow2_refcount_writeback (img, io);
    if (r < 0)
      return r;
    flush_underneath = true;
  }

  if (flush_underneath)
    r = qcow2_flush_logged (img, io);
  return r;
}

int
qcow2_flush (struct qcow2_image *img, struct qcow2_io *io)
{
  int r;

  if (!img->opts.writable)
    return 0;
  pthread_rwlock_wrlock (&img->lock);
  r = flush_locked (img, io, true);
  pthread_rwlock_unlock (&img->lock);
  return r;
}
