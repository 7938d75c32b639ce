/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: changing the guest clusters of one range.
 *
 * A write, zero or trim walks its range piece by piece.  Each cluster of
 * a piece gets an action: data goes in place into a normal cluster the
 * image alone owns (COPIED), or whole into the host cluster a zero
 * cluster kept (then the entry becomes normal), else into a newly
 * allocated cluster filled with the old content around the new bytes; a
 * whole cluster zeroed or trimmed only changes its entry.  With
 * qcow2-detect-zeroes, a whole cluster of zeros written is zeroed
 * instead.  What a cluster held before is released after the next
 * writeback.  Data bound for contiguous host bytes is written in runs.
 *
 * The image lock is held only to decide: shared for a piece written in
 * place, exclusively for one that allocates or changes entries.  Data is
 * read and written with no lock held; the guest clusters of a piece that
 * allocates (or writes a zero cluster's kept host cluster, which changes
 * its entry too) stay claimed until its clusters are linked, and a piece
 * that writes in place is registered for a grace period until its data
 * is written, so that no cluster it writes is reused meanwhile.
 *
 * In an encrypted image, or one with snapshots, every piece decides under
 * the lock held exclusively: whether a snapshot shares a cluster takes
 * its refcount, and a write into part of an encrypted sector reads,
 * decrypts and encrypts again the sectors around it, so each write in
 * place there claims its clusters until its data is written, as an
 * allocating piece does (two such writes into one sector would otherwise
 * each put back the other's old bytes).
 */

#include <config.h>

#include <errno.h>
#include <string.h>

#include "paths/cluster.h"
#include "meta/alloc.h"
#include "base/cache.h"
#include "format/codec.h"
#include "paths/encrypt.h"
#include "format/endian.h"
#include "format/entries.h"
#include "meta/first-change.h"
#include "meta/hostio.h"
#include "base/inflight.h"
#include "meta/map.h"
#include "meta/refcount.h"
#include "paths/scratch.h"
#include "meta/writeback.h"

_Static_assert (QCOW2_PIECE_MAX <= QCOW2_L2_BATCH,
                "a piece's entries are fetched at once");

enum piece_action {
  PIECE_NONE,                   /* nothing to do */
  PIECE_IN_PLACE,               /* write into the cluster it has */
  PIECE_NEW,                    /* write a new cluster, then link it */
  PIECE_REUSE,                  /* write whole the host cluster a zero
                                   cluster kept, then make it normal */
  PIECE_META,                   /* only its entry changes (under the lock):
                                   zero or unallocated, its cluster
                                   released */
  PIECE_ZERO_KEEP,              /* only its entry changes: a zero cluster
                                   that keeps its host cluster */
};

/* ------------------------------------------------------------ data runs */

int
qcow2_run_flush (struct qcow2_image *img, struct qcow2_io *io,
                 struct data_run *run)
{
  const uint8_t *data = run->src;
  int r = 0;

  if (run->len == 0)
    return 0;
  if (img->crypt.enabled) {
    /* The client's buffer stays as it is: the ciphertext goes to the
     * request's own buffer, or a cluster at a time to the write's.
     */
    if (run->req == NULL && run->ws) {
      const uint64_t cluster_size = img->header.cluster_size;
      uint64_t done = 0;

      while (r == 0 && done < run->len) {
        uint64_t n = run->len - done < cluster_size ? run->len - done
          : cluster_size;
        memcpy (run->ws->sealed, run->src + done, n);
        r = qcow2_encrypt_here (img, run->ws->cipher, true, run->ws->sealed,
                                n, run->host + done);
        if (r == 0)
          r = qcow2_pwrite_logged (img, io, run->ws->sealed, n,
                                   run->host + done);
        done += n;
      }
      run->len = 0;
      return r;
    }
    if (run->req == NULL) {
      qcow2_error (img, "internal error: data for an encrypted image "
                   "without a buffer to encrypt it in");
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

int
qcow2_run_add (struct qcow2_image *img, struct qcow2_io *io,
               struct data_run *run, const uint8_t *src, uint64_t host,
               uint64_t len)
{
  int r;

  if (run->len && run->host + run->len == host && run->src + run->len == src
      && run->len + len <= img->opts.request_size) {
    run->len += len;
    return 0;
  }
  r = qcow2_run_flush (img, io, run);
  run->src = src;
  run->host = host;
  run->len = len;
  return r;
}

/* ---------------------------------------------------- one cluster's part */

bool
qcow2_reads_as_zeros (const struct qcow2_image *img,
                      const struct cluster_map *map)
{
  return map->kind == CLUSTER_ZERO ||
    (map->kind == CLUSTER_UNALLOCATED && img->backing == NULL);
}

/* The request [OFFSET, END) in guest cluster GC: *PART_OFF bytes into it,
 * *LEN bytes long.  The last cluster of a disk whose size is not a
 * multiple of the cluster size is whole once the request reaches the
 * disk's end.
 */
static bool
cluster_part (const struct qcow2_image *img, uint64_t gc, uint64_t offset,
              uint64_t end, uint64_t *part_off, uint64_t *len)
{
  const uint64_t cstart = gc << img->header.cluster_bits;
  const uint64_t cend = cstart + img->header.cluster_size;
  uint64_t lo = offset > cstart ? offset : cstart;
  uint64_t hi = end < cend ? end : cend;

  *part_off = lo - cstart;
  *len = hi - lo;
  return lo == cstart && (hi == cend || hi == img->header.virtual_size);
}

/* Does the image alone own the host cluster MAP holds (a normal cluster,
 * or the one a zero cluster kept), so that it may be written in place?
 * COPIED says refcount 1; with snapshots the refcount is asked too, since
 * writing into a cluster that a snapshot shares would change the
 * snapshot.  Those images decide under the lock held exclusively
 * (change_piece): the refcounts are not looked up under it held shared.
 */
static int
owned_alone (struct qcow2_image *img, struct qcow2_io *io,
             const struct cluster_map *map, bool *alone)
{
  uint64_t refcount;
  int r;

  *alone = (map->kind == CLUSTER_NORMAL ||
            (map->kind == CLUSTER_ZERO && map->host_offset)) &&
    (map->l2_entry & L2E_COPIED);
  if (!*alone || img->header.nb_snapshots == 0)
    return 0;
  r = qcow2_refcount_get (img, io,
                          map->host_offset >> img->header.cluster_bits,
                          &refcount);
  if (r == 0)
    *alone = refcount == 1;
  return r;
}

/* ALONE: owned_alone's answer.  ZEROS: a whole cluster of zeros written
 * that qcow2-detect-zeroes turns into a zero request (keeping the host
 * cluster with "on").
 */
static enum piece_action
decide (const struct qcow2_image *img, enum qcow2_op op,
        const struct cluster_map *map, bool alone, bool whole, bool zeros)
{
  const bool v3 = img->header.version >= 3;
  const bool keep = zeros &&
    img->opts.detect_zeroes == QCOW2_DETECT_ZEROES_ON;
  bool in_place = map->kind == CLUSTER_NORMAL && alone;
  /* A zero cluster that kept its host cluster (qemu's "zero, allocated",
   * or ours with qcow2-detect-zeroes=on) is written in place, as qemu
   * does: the entry says zero until the data is written and the entry
   * linked, so a crash before the writeback still reads zeros.  As for a
   * normal cluster, a snapshot may share it: then it is copied.
   */
  bool reusable = map->kind == CLUSTER_ZERO && alone &&
    map->host_offset + img->header.cluster_size <= img->file_size;

  if (op == QCOW2_OP_WRITE && !zeros)
    return in_place ? PIECE_IN_PLACE : reusable ? PIECE_REUSE : PIECE_NEW;
  if (map->kind == CLUSTER_UNALLOCATED && img->backing == NULL)
    return PIECE_NONE;
  if (map->kind == CLUSTER_ZERO && (map->host_offset == 0 || keep))
    return PIECE_NONE;
  if (whole && keep) {
    /* As qemu's write-zeroes without unmap: the image alone owns the
     * cluster, so it stays allocated; v2 has no zero clusters and writes
     * the zeros.
     */
    if (!v3)
      return in_place ? PIECE_IN_PLACE : PIECE_NEW;
    if (in_place)
      return PIECE_ZERO_KEEP;
  }
  /* A whole cluster becomes a zero cluster on v3 (a zero cluster that
   * kept its host cluster gives it back), unallocated on v2 without a
   * backing file (which reads as zeros); on v2 with one it is written
   * with zeros.
   */
  if (whole && (v3 || img->backing == NULL))
    return PIECE_META;
  if (op == QCOW2_OP_TRIM)
    return PIECE_NONE;          /* a trim of part of a cluster is a hint */
  if (qcow2_reads_as_zeros (img, map))
    return PIECE_NONE;
  return in_place ? PIECE_IN_PLACE : PIECE_NEW;
}

static bool
all_zero (const uint8_t *p, size_t len)
{
  return len == 0 || (p[0] == 0 && memcmp (p, p + 1, len - 1) == 0);
}

int
qcow2_read_old_cluster (struct qcow2_image *img, struct qcow2_io *io,
                        struct write_scratch *ws,
                        const struct cluster_map *map,
                        uint64_t guest_cluster, uint8_t *out)
{
  const uint32_t cluster_size = img->header.cluster_size;
  uint64_t guest = guest_cluster << img->header.cluster_bits;
  char err[256];
  int r;

  switch (map->kind) {
  case CLUSTER_UNALLOCATED:
    if (img->backing)
      return img->read_backing (img, out, cluster_size, guest);
    __attribute__ ((fallthrough));
  case CLUSTER_ZERO:
    memset (out, 0, cluster_size);
    return 0;
  case CLUSTER_NORMAL:
    r = qcow2_pread_clamped (img, io, out, cluster_size, map->host_offset);
    if (r == 0 && img->crypt.enabled)
      r = qcow2_encrypt_here (img, ws->cipher, false, out, cluster_size,
                              map->host_offset);
    return r;
  case CLUSTER_COMPRESSED:
    if (qcow2_cache_get (img->cluster_cache, map->l2_entry, 0, out,
                         cluster_size))
      return 0;
    r = qcow2_pread_clamped (img, io, ws->compressed, map->compressed_len,
                             map->host_offset);
    if (r < 0)
      return r;
    if (qcow2_decode_cluster (ws->dec, img->header.compression_type,
                              ws->compressed, map->compressed_len,
                              out, cluster_size, err, sizeof err) < 0) {
      qcow2_error (img, "compressed cluster at guest offset 0x%" PRIx64
                   " (host offset 0x%" PRIx64 "): %s",
                   guest, map->host_offset, err);
      return -EIO;
    }
    return 0;
  }
  return -EIO;
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

/* ---------------------------------------------------------------- pieces */

/* What [OFFSET, END) does to the N guest clusters from GC0 (one L2 table),
 * into WS->piece: the entries as they are and the action for each
 * (ZEROS, unless NULL: ZEROS[i] says cluster GC0+i is a whole cluster of
 * zeros written, for qcow2-detect-zeroes).  With the image lock held
 * (shared is enough for an image without snapshots).
 */
static int
look_up (struct qcow2_image *img, struct qcow2_io *io,
         struct write_scratch *ws, enum qcow2_op op, const bool *zeros,
         uint64_t offset, uint64_t end, uint64_t gc0, size_t n)
{
  size_t got = n, i;
  int r;

  r = qcow2_l2_entries (img, io, gc0, &got, ws->entries, NULL, ws->l2buf);
  if (r < 0)
    return r;
  for (i = 0; i < n; ++i) {
    struct piece_cluster *pc = &ws->piece[i];
    uint64_t part_off, len;
    bool whole = cluster_part (img, gc0 + i, offset, end, &part_off, &len);

    bool alone = false;

    r = qcow2_classify (img, gc0 + i, ws->entries[i], &pc->old);
    if (r == 0)
      r = owned_alone (img, io, &pc->old, &alone);
    if (r < 0)
      return r;
    pc->action = decide (img, op, &pc->old, alone, whole, zeros && zeros[i]);
    pc->new_host = 0;
  }
  return 0;
}

/* Into MERGED (a cluster), the sectors of the encrypted cluster at HOST
 * that [PART_OFF, PART_OFF+LEN) touches, decrypted, with SRC written over
 * them; *LO and *HI bound those sectors.
 */
static int
merge_sectors (struct qcow2_image *img, struct qcow2_io *io,
               struct write_scratch *ws, uint64_t host, const uint8_t *src,
               uint64_t part_off, uint64_t len, uint8_t *merged,
               uint64_t *lo, uint64_t *hi)
{
  int r;

  *lo = part_off & ~UINT64_C (511);
  *hi = (part_off + len + 511) & ~UINT64_C (511);
  r = qcow2_pread_clamped (img, io, merged + *lo, *hi - *lo, host + *lo);
  if (r == 0)
    r = qcow2_encrypt_here (img, ws->cipher, false, merged + *lo, *hi - *lo,
                            host + *lo);
  if (r == 0)
    memcpy (merged + part_off, src, len);
  return r;
}

/* The data of the N clusters of the piece from GC0, written with no lock
 * held: in place, or whole into the new clusters (with the old content
 * around the new bytes).  BUF NULL writes zeros.  CONN and REQ encrypt a
 * write's runs (qcow2_run_flush).
 */
static int
write_piece_data (struct qcow2_image *img, struct qcow2_io *io,
                  struct qcow2_conn *conn, struct request *req,
                  struct write_scratch *ws, const uint8_t *buf,
                  uint64_t offset, uint64_t end, uint64_t gc0, size_t n)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  struct data_run run = { .conn = conn, .req = req, .ws = ws };
  size_t i;
  int r = 0;

  for (i = 0; i < n && r == 0; ++i) {
    const struct piece_cluster *pc = &ws->piece[i];
    uint64_t gc = gc0 + i, part_off, len;
    const uint8_t *src;
    uint8_t *merged;

    if (pc->action != PIECE_IN_PLACE && pc->action != PIECE_NEW &&
        pc->action != PIECE_REUSE)
      continue;
    cluster_part (img, gc, offset, end, &part_off, &len);
    src = buf ? buf + ((gc << bits) + part_off - offset) : img->zero_cluster;
    /* Only a request's first and last clusters are partial: a buffer
     * each, so the run may still hold the first while the last is made.
     */
    merged = ws->cow[(gc << bits) + part_off == offset ? 0 : 1];
    if (pc->action == PIECE_IN_PLACE) {
      const uint64_t host = pc->old.host_offset;
      uint64_t lo, hi;

      if (img->crypt.enabled && ((part_off | len) & 511)) {
        r = merge_sectors (img, io, ws, host, src, part_off, len, merged,
                           &lo, &hi);
        if (r == 0)
          r = qcow2_run_add (img, io, &run, merged + lo, host + lo, hi - lo);
      }
      else
        r = qcow2_run_add (img, io, &run, src, host + part_off, len);
      continue;
    }
    if (len == cluster_size) {
      r = qcow2_run_add (img, io, &run, src, pc->new_host, len);
      continue;
    }
    r = qcow2_read_old_cluster (img, io, ws, &pc->old, gc, merged);
    if (r == 0) {
      memcpy (merged + part_off, src, len);
      r = qcow2_run_add (img, io, &run, merged, pc->new_host, cluster_size);
    }
  }
  if (r == 0)
    r = qcow2_run_flush (img, io, &run);
  return r;
}

/* With the image lock held exclusively, once the data of the piece's new
 * clusters was written (WRITTEN) or failed: point their entries at them
 * and release what they held, or give the new clusters back.  A zero
 * cluster's kept host cluster written whole becomes a normal cluster,
 * or stays the zero cluster's (its entry was not changed meanwhile).
 */
static int
link_piece (struct qcow2_image *img, struct qcow2_io *io,
            struct write_scratch *ws, uint64_t gc0, size_t n, bool written)
{
  const uint64_t l2_mask = (UINT64_C (1) << img->header.l2_bits) - 1;
  struct meta_table *t = NULL;
  size_t i;
  int r = 0;

  if (written)
    r = qcow2_l2_for_write (img, io, gc0 >> img->header.l2_bits, false, &t);
  if (r == 0 && written && t == NULL) {
    qcow2_error (img, "internal error: the L2 table of guest cluster %"
                 PRIu64 " went away", gc0);
    r = -EIO;
  }
  for (i = 0; i < n; ++i) {
    struct piece_cluster *pc = &ws->piece[i];

    if ((pc->action != PIECE_NEW && pc->action != PIECE_REUSE) ||
        pc->new_host == 0)
      continue;
    if (r < 0 || !written) {
      /* Never referenced: back at the next writeback. */
      if (pc->action == PIECE_NEW)
        qcow2_free_later (img, pc->new_host, img->header.cluster_size, 0);
      continue;
    }
    put_be64 (t->data + ((gc0 + i) & l2_mask) * 8, pc->new_host | L2E_COPIED);
    t->dirty = true;
    if (pc->action == PIECE_NEW)
      r = qcow2_release (img, &pc->old);
  }
  return r;
}

/* Change the clusters of [OFFSET, END) from *POS on, up to the end of a
 * piece, and move *POS past what was changed.  0 with *POS unchanged
 * means: look again (a claim this piece waited for has ended).
 */
static int
change_piece (struct qcow2_image *img, struct qcow2_io *io,
              struct qcow2_conn *conn, struct request *req,
              struct write_scratch *ws, enum qcow2_op op, const uint8_t *buf,
              uint64_t offset, uint64_t end, uint64_t *pos,
              struct change_result *result)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t l2_mask = (UINT64_C (1) << img->header.l2_bits) - 1;
  const uint64_t gc0 = *pos >> bits;
  const uint64_t l1_index = gc0 >> img->header.l2_bits;
  uint64_t last = (end - 1) >> bits, ticket, piece_end;
  struct qcow2_inflight_op reg;
  struct qcow2_claim claim;
  struct meta_table *t = NULL;
  bool in_place = false, changes = false, allocates = false, claims;
  bool zero_flags[QCOW2_PIECE_MAX], *zeros = NULL;
  size_t n, i;
  int r, stop = 0;

  if (last > (gc0 | l2_mask))
    last = gc0 | l2_mask;
  if (last - gc0 >= QCOW2_PIECE_MAX)
    last = gc0 + QCOW2_PIECE_MAX - 1;
  n = last - gc0 + 1;

  /* qcow2-detect-zeroes looks at each whole cluster of a write (qemu at
   * the whole request), before any lock is taken.
   */
  if (op == QCOW2_OP_WRITE &&
      img->opts.detect_zeroes != QCOW2_DETECT_ZEROES_OFF) {
    zeros = zero_flags;
    for (i = 0; i < n; ++i) {
      uint64_t part_off, len;
      bool whole = cluster_part (img, gc0 + i, offset, end, &part_off, &len);

      zeros[i] = whole &&
        all_zero (buf + (((gc0 + i) << bits) + part_off - offset), len);
    }
  }

  /* Writes in place change no metadata: the lock held shared is enough
   * to see that no claim is on the clusters and that they stay where
   * they are until the grace period begins.  Not so with snapshots or
   * encryption (see the top of this file).
   */
  if (img->header.nb_snapshots || img->crypt.enabled)
    goto exclusive;
  pthread_rwlock_rdlock (&img->lock);
  r = look_up (img, io, ws, op, zeros, offset, end, gc0, n);
  for (i = 0; r == 0 && i < n; ++i) {
    if (ws->piece[i].action == PIECE_IN_PLACE)
      in_place = true;
    else if (ws->piece[i].action != PIECE_NONE)
      break;
  }
  /* Before the image's first change, even a write in place waits for the
   * lock held exclusively, which that change needs (qcow2_first_change).
   */
  if (in_place && atomic_load (&img->first_change_pending))
    i = 0;
  if (r == 0 && i > 0 && !qcow2_inflight_claimed (&img->inflight, gc0,
                                                  gc0 + i, &ticket)) {
    n = i;
    if (in_place) {
      qcow2_inflight_enter (&img->inflight, &reg);
      if (qcow2_l2_dirty (img, l1_index))
        result->needs_writeback = true;
    }
    pthread_rwlock_unlock (&img->lock);
    r = write_piece_data (img, io, conn, req, ws, buf, offset, end, gc0, n);
    if (in_place)
      qcow2_inflight_leave (&img->inflight, &reg);
    goto done;
  }
  pthread_rwlock_unlock (&img->lock);
  if (r < 0)
    return r;

  /* Anything else is decided with the lock held exclusively. */
 exclusive:
  in_place = false;
  pthread_rwlock_wrlock (&img->lock);
  if (qcow2_inflight_claimed (&img->inflight, gc0, gc0 + n, &ticket)) {
    pthread_rwlock_unlock (&img->lock);
    qcow2_inflight_wait_claim (&img->inflight, ticket);
    return 0;
  }
  r = look_up (img, io, ws, op, zeros, offset, end, gc0, n);
  for (i = 0; r == 0 && i < n; ++i) {
    struct piece_cluster *pc = &ws->piece[i];

    if (pc->action == PIECE_NONE)
      continue;
    /* The first thing the piece changes or writes: the image's first
     * change goes first (if this fails, nothing of the piece was
     * changed yet).
     */
    if (!in_place && !changes && (r = qcow2_first_change (img, io)) < 0)
      break;
    if (pc->action == PIECE_IN_PLACE) {
      in_place = true;
      continue;
    }
    if (t == NULL)
      r = qcow2_l2_for_write (img, io, l1_index, true, &t);
    if (r == 0 && pc->action == PIECE_NEW) {
      r = qcow2_alloc_clusters (img, io, 1, QCOW2_ALLOC_ANY, &pc->new_host);
      if (r == 0)
        allocates = true;
    }
    else if (r == 0 && pc->action == PIECE_REUSE) {
      /* Its entry changes once the data is written: claimed and linked
       * as a new cluster is, with no allocation and nothing released.
       */
      pc->new_host = pc->old.host_offset;
      allocates = true;
    }
    else if (r == 0 && pc->action == PIECE_ZERO_KEEP) {
      put_be64 (t->data + ((gc0 + i) & l2_mask) * 8,
                pc->old.host_offset | L2E_ZERO | L2E_COPIED);
      t->dirty = true;
    }
    else if (r == 0) {
      put_be64 (t->data + ((gc0 + i) & l2_mask) * 8,
                img->header.version >= 3 ? L2E_ZERO : 0);
      t->dirty = true;
      r = qcow2_release (img, &pc->old);
    }
    if (r == 0)
      changes = true;
  }
  if (r == QCOW2_RECLAIM) {
    /* Do what was decided up to here; the caller reclaims room. */
    stop = r;
    r = 0;
    n = i - 1;
  }
  if (r < 0) {
    link_piece (img, io, ws, gc0, i, false);
    pthread_rwlock_unlock (&img->lock);
    return r;
  }
  if (n == 0) {
    pthread_rwlock_unlock (&img->lock);
    return stop;
  }
  claims = allocates || (in_place && img->crypt.enabled);
  if (claims)
    qcow2_inflight_claim (&img->inflight, &claim, gc0, gc0 + n);
  if (in_place) {
    qcow2_inflight_enter (&img->inflight, &reg);
    if (qcow2_l2_dirty (img, l1_index))
      result->needs_writeback = true;
  }
  if (changes)
    result->needs_writeback = true;
  if (!allocates && qcow2_too_much_dirty (img))
    result->too_much_dirty = true;
  pthread_rwlock_unlock (&img->lock);

  r = write_piece_data (img, io, conn, req, ws, buf, offset, end, gc0, n);
  if (in_place)
    qcow2_inflight_leave (&img->inflight, &reg);

  if (claims) {
    int r2 = 0;

    pthread_rwlock_wrlock (&img->lock);
    if (allocates)
      r2 = link_piece (img, io, ws, gc0, n, r == 0);
    qcow2_inflight_unclaim (&img->inflight, &claim);
    if (qcow2_too_much_dirty (img))
      result->too_much_dirty = true;
    pthread_rwlock_unlock (&img->lock);
    if (r == 0)
      r = r2;
  }

 done:
  if (r < 0)
    return r;
  piece_end = (gc0 + n) << bits;
  *pos = piece_end < end ? piece_end : end;
  return stop;
}

int
qcow2_change_range (struct qcow2_image *img, struct qcow2_io *io,
                    struct qcow2_conn *conn, struct request *req,
                    enum qcow2_op op, const uint8_t *buf, uint64_t count,
                    uint64_t offset, uint64_t *done,
                    struct change_result *result)
{
  const uint64_t end = offset + count;
  struct write_scratch *ws = qcow2_scratch_get (img);
  uint64_t pos = offset;
  int r = 0;

  *done = 0;
  if (ws == NULL)
    return -ENOMEM;
  while (pos < end && r == 0)
    r = change_piece (img, io, conn, req, ws, op, buf, offset, end, &pos,
                      result);
  *done = pos - offset;
  qcow2_scratch_put (img, ws);
  return r;
}

int
qcow2_zero_needs_writes (struct qcow2_image *img, struct qcow2_io *io,
                         uint64_t count, uint64_t offset, bool *needs)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t end = offset + count;
  uint64_t edges[2] = { offset, end - 1 };
  struct write_scratch *ws;
  unsigned i;
  int r = 0;

  /* A v2 image cannot say "zero" over a backing file: it writes zeros. */
  *needs = img->header.version < 3 && img->backing != NULL;
  ws = qcow2_scratch_get (img);
  if (ws == NULL)
    return -ENOMEM;
  pthread_rwlock_rdlock (&img->lock);
  for (i = 0; i < 2 && r == 0; ++i) {
    uint64_t gc = edges[i] >> bits;
    uint64_t part_off, len;
    size_t n = 1;
    struct cluster_map map;

    if (cluster_part (img, gc, offset, end, &part_off, &len))
      continue;                 /* whole: metadata only */
    r = qcow2_l2_entries (img, io, gc, &n, ws->entries, NULL, ws->l2buf);
    if (r == 0)
      r = qcow2_classify (img, gc, ws->entries[0], &map);
    if (r == 0 && !qcow2_reads_as_zeros (img, &map))
      *needs = true;
  }
  pthread_rwlock_unlock (&img->lock);
  qcow2_scratch_put (img, ws);
  return r;
}
