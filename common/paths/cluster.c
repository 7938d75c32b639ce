/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the plain path of writes, zeroes and trims (see
 * paths/cluster.h): the policy that the commit protocol runs for each
 * piece of a range, and the runs that write its data.
 */

#include <config.h>

#include <errno.h>
#include <string.h>

#include "paths/cluster.h"
#include "base/check.h"
#include "paths/conn.h"
#include "paths/run.h"
#include "meta/map.h"
#include "base/cache.h"
#include "format/codec.h"
#include "format/entries.h"
#include "meta/hostio.h"
#include "meta/log.h"
#include "meta/refcount.h"
#include "paths/commit.h"
#include "paths/encrypt.h"
#include "paths/scratch.h"
#include "base/lockorder.h"
#include "base/zeros.h"

/* What one guest cluster of a piece gets, before the commit is asked. */
enum plain_action {
  PLAIN_KEEP,                   /* nothing to do */
  PLAIN_IN_PLACE,               /* write into the cluster it has */
  PLAIN_NEW,                    /* write a new cluster, then link it */
  PLAIN_REUSE,                  /* write whole the host cluster a zero
                                   cluster kept, then make it normal */
  PLAIN_ZERO,                   /* only its entry changes: zero or
                                   unallocated, its cluster released */
  PLAIN_ZERO_KEEP,              /* only its entry changes: a zero cluster
                                   that keeps its host cluster */
};

/* One range's change, as the policy's opaque. */
struct plain_change {
  enum qcow2_op op;
  const uint8_t *buf;           /* a write's data, or NULL */
  uint64_t offset, end;         /* the whole request */
  const bool *zeros;            /* detect-zeroes: whole clusters of zeros
                                   written, per cluster of the piece */
  struct write_target target;
  /* Extended L2 entries: the bytes [from, to) of each cluster of the
   * piece decided NEW or REUSE that are written (the new bytes and the
   * old content of the subclusters they touch in part).  Without them,
   * the whole cluster.
   */
  uint32_t from[QCOW2_COMMIT_MAX], to[QCOW2_COMMIT_MAX];
};

/* ------------------------------------------------------------ the runs */

int
qcow2_write_mover (struct data_run *run, void *opaque)
{
  const struct write_target *w = opaque;
  struct qcow2_image *img = w->img;
  const uint8_t *data = run->buf;
  int r = 0;

  if (qcow2_image_encrypted (img)) {
    /* The client's buffer stays as it is: the ciphertext goes to the
     * request's own buffer, or a cluster at a time to the write's.
     */
    if (w->req == NULL && w->ws) {
      const uint64_t cluster_size = img->header.cluster_size;
      uint64_t done = 0;

      while (r == 0 && done < run->len) {
        uint64_t n = run->len - done < cluster_size ? run->len - done
          : cluster_size;
        memcpy (w->ws->sealed, run->buf + done, n);
        r = qcow2_encrypt_here (img, w->ws->cipher, true, w->ws->sealed, n,
                                run->host + done);
        if (r == 0)
          r = qcow2_pwrite_data (img, w->io, w->ws->sealed, n,
                                 run->host + done);
        done += n;
      }
      return r;
    }
    if (w->req == NULL) {
      QCOW2_ASSERT (w->req != NULL);
      qcow2_error (img, "internal error: data for an encrypted image "
                   "without a buffer to encrypt it in");
      return -EIO;
    }
    memcpy (w->req->crypt_buf, run->buf, run->len);
    qcow2_encrypt_start (w->conn, &w->req->crypt, &w->req->caller, true,
                         w->req->crypt_buf, run->len, run->host);
    r = qcow2_encrypt_finish (w->conn, &w->req->crypt, &w->req->caller);
    data = w->req->crypt_buf;
  }
  if (r == 0)
    r = qcow2_pwrite_data (img, w->io, data, run->len, run->host);
  return r;
}

/* Add LEN bytes of SRC for host offset HOST to RUN.  The run's movers only
 * read what it holds.
 */
static int
run_add (struct data_run *run, const uint8_t *src, uint64_t host,
         uint64_t len)
{
  return qcow2_run_add (run, (uint8_t *) src, host, len);
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
 * snapshot.  Those images decide under the lock held exclusively: the
 * refcounts are not looked up under it held shared.
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
static enum plain_action
plain_action (const struct qcow2_image *img, enum qcow2_op op,
              const struct cluster_map *map, bool alone, bool whole,
              bool zeros)
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
    (img->data_file ||
     map->host_offset + img->header.cluster_size <= img->file_size);

  if (op == QCOW2_OP_WRITE && !zeros)
    return in_place ? PLAIN_IN_PLACE : reusable ? PLAIN_REUSE : PLAIN_NEW;
  if (map->kind == CLUSTER_UNALLOCATED && img->backing == NULL)
    return PLAIN_KEEP;
  if (map->kind == CLUSTER_ZERO && (map->host_offset == 0 || keep))
    return PLAIN_KEEP;
  if (whole && keep) {
    /* As qemu's write-zeroes without unmap: the image alone owns the
     * cluster, so it stays allocated; v2 has no zero clusters and writes
     * the zeros.
     */
    if (!v3)
      return in_place ? PLAIN_IN_PLACE : PLAIN_NEW;
    if (in_place)
      return PLAIN_ZERO_KEEP;
  }
  /* A whole cluster becomes a zero cluster on v3 (a zero cluster that
   * kept its host cluster gives it back), unallocated on v2 without a
   * backing file (which reads as zeros); on v2 with one it is written
   * with zeros.
   */
  if (whole && (v3 || img->backing == NULL))
    return PLAIN_ZERO;
  if (op == QCOW2_OP_TRIM)
    return PLAIN_KEEP;          /* a trim of part of a cluster is a hint */
  if (qcow2_reads_as_zeros (img, map))
    return PLAIN_KEEP;
  return in_place ? PLAIN_IN_PLACE : PLAIN_NEW;
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
    r = qcow2_pread_data (img, io, out, cluster_size, map->host_offset);
    if (r == 0 && qcow2_image_encrypted (img))
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

/* -------------------------------------------- extended L2 entries
 *
 * A cluster of an image with extended L2 entries is 32 subclusters, each
 * allocated (its bytes at its place in the host cluster), zero, or
 * unallocated (the backing file's bytes, or zeros), as the entry's
 * bitmap says: the low 32 bits allocation, the high 32 zero.  qemu's
 * calculate_l2_meta and qcow2_alloc_cluster_link_l2 are the reference: a
 * write copies on write only the subclusters it touches in part (and
 * whole clusters only where their old content cannot stay: a compressed
 * cluster, or one a snapshot shares), and allocates the subclusters it
 * wrote.
 */

#define SUB_ALL UINT64_C (0xffffffff)

/* The bitmap bits of subclusters [FIRST, LAST]: allocation bits (the
 * zero bits are these shifted up 32).
 */
static uint64_t
sub_range (unsigned first, unsigned last)
{
  return (SUB_ALL >> (31 - last + first)) << first;
}

/* BITMAP with subclusters [FIRST, LAST] allocated (ALLOC) or zero. */
static uint64_t
sub_set (uint64_t bitmap, unsigned first, unsigned last, bool alloc)
{
  const uint64_t bits = sub_range (first, last);

  return alloc ? (bitmap | bits) & ~(bits << 32)
    : (bitmap | (bits << 32)) & ~bits;
}

/* Subcluster SC of what MAP and BITMAP say: allocated, and zero. */
static bool
sub_allocated (uint64_t bitmap, unsigned sc)
{
  return bitmap & (UINT64_C (1) << sc);
}

static bool
sub_zero (uint64_t bitmap, unsigned sc)
{
  return bitmap & (UINT64_C (1) << (32 + sc));
}

/* Into OUT (a cluster, bytes [FROM, TO) of it), the guest content of the
 * cluster MAP and BITMAP describe, subcluster by subcluster: allocated
 * ones from the host cluster (decrypted), zero ones as zeros, the others
 * from the backing file (or zeros).  A compressed cluster is read whole.
 */
static int
read_old_subclusters (struct qcow2_image *img, struct qcow2_io *io,
                      struct write_scratch *ws, const struct cluster_map *map,
                      uint64_t bitmap, uint64_t guest_cluster, uint8_t *out,
                      uint64_t from, uint64_t to)
{
  const uint64_t guest = guest_cluster << img->header.cluster_bits;
  uint64_t pos, end;
  int r = 0;

  if (map->kind == CLUSTER_COMPRESSED)
    return qcow2_read_old_cluster (img, io, ws, map, guest_cluster, out);
  /* FROM and TO may lie inside subclusters. */
  for (pos = from; r == 0 && pos < to; pos = end) {
    switch (qcow2_subcluster_run (img, map, bitmap, pos, to, &end)) {
    case SUB_HOST:
      r = qcow2_pread_data (img, io, out + pos, end - pos,
                            map->host_offset + pos);
      if (r == 0 && qcow2_image_encrypted (img))
        r = qcow2_encrypt_here (img, ws->cipher, false, out + pos,
                                end - pos, map->host_offset + pos);
      break;
    case SUB_ZEROS:
      memset (out + pos, 0, end - pos);
      break;
    case SUB_BACKING:
      r = img->read_backing (img, out + pos, end - pos, guest + pos);
      break;
    }
  }
  return r;
}

/* The decision for cluster I of an image with extended L2 entries,
 * whose part [PART_OFF, PART_OFF+LEN) the request covers (WHOLE: all
 * of it), ALONE: owned_alone's answer.
 */
static enum commit_step
sub_decide (struct commit *commit, size_t i, struct plain_change *ch,
            uint64_t part_off, uint64_t len, bool whole, bool alone)
{
  struct qcow2_image *img = commit->img;
  struct commit_cluster *c = &commit->c[i];
  const struct cluster_map *old = &c->old;
  const uint64_t cluster_size = img->header.cluster_size;
  const uint64_t sub = cluster_size / 32;
  const uint64_t ob = c->old_bitmap;
  const unsigned fs = part_off / sub, ls = (part_off + len - 1) / sub;
  const bool zeros = ch->zeros && ch->zeros[i];
  const uint64_t guest_end = ((commit->first + i) << img->header.cluster_bits)
    + part_off + len;
  const bool sub_aligned = part_off % sub == 0 &&
    ((part_off + len) % sub == 0 || guest_end == img->header.virtual_size);
  enum qcow2_op op = zeros ? QCOW2_OP_ZERO : ch->op;
  unsigned first_alloc, last_alloc, k;

  /* A compressed cluster cannot be zeroed in part, nor a subcluster
   * only in part: those zeros are written as data, as qemu falls back to.
   */
  if (op == QCOW2_OP_WRITE ||
      (op == QCOW2_OP_ZERO && !whole &&
       (old->kind == CLUSTER_COMPRESSED || !sub_aligned))) {
    ch->from[i] = fs * sub;
    ch->to[i] = (ls + 1) * sub;
    if (old->kind == CLUSTER_NORMAL && alone) {
      for (k = fs; k <= ls && sub_allocated (ob, k); ++k)
        ;
      if (k > ls)
        return commit_in_place (commit, i);
      /* The new bytes in allocated subclusters stay where they are,
       * which in an encrypted image means whole sectors.
       */
      if (sub_allocated (ob, fs))
        ch->from[i] = qcow2_image_encrypted (img) ? part_off & ~UINT64_C (511)
          : part_off;
      if (sub_allocated (ob, ls))
        ch->to[i] = qcow2_image_encrypted (img)
          ? (part_off + len + 511) & ~UINT64_C (511) : part_off + len;
      c->bitmap = sub_set (ob, fs, ls, true);
      return commit_reuse_kept (commit, i);
    }
    if (old->kind == CLUSTER_COMPRESSED) {
      ch->from[i] = 0;
      ch->to[i] = cluster_size;
      c->bitmap = SUB_ALL;
      return commit_new_cluster (commit, i);
    }
    if (old->kind == CLUSTER_NORMAL && (ob & SUB_ALL)) {
      /* Shared with a snapshot: its allocated subclusters come along. */
      first_alloc = __builtin_ctzll (ob & SUB_ALL);
      last_alloc = 63 - __builtin_clzll (ob & SUB_ALL);
      ch->from[i] = (fs < first_alloc ? fs : first_alloc) * sub;
      ch->to[i] = ((ls > last_alloc ? ls : last_alloc) + 1) * sub;
    }
    c->bitmap = sub_set (ob, ch->from[i] / sub, ch->to[i] / sub - 1, true);
    return commit_new_cluster (commit, i);
  }

  if (whole) {
    /* As qemu's zero_in_l2_slice and discard_in_l2_slice: every
     * subcluster zero, the host cluster released (kept by a zero of a
     * cluster the image alone owns with qcow2-detect-zeroes=on).
     */
    uint64_t entry = 0;

    if (op == QCOW2_OP_TRIM && old->kind == CLUSTER_UNALLOCATED &&
        img->backing == NULL)
      return commit_keep (commit, i);
    if (zeros && img->opts.detect_zeroes == QCOW2_DETECT_ZEROES_ON &&
        old->kind == CLUSTER_NORMAL && alone)
      entry = old->l2_entry;
    c->bitmap = SUB_ALL << 32;
    if (entry == old->l2_entry && c->bitmap == ob)
      return commit_keep (commit, i);
    return commit_set_entry (commit, i, entry);
  }
  if (op == QCOW2_OP_TRIM)
    return commit_keep (commit, i);   /* a hint, as qemu 7.2 takes it */
  /* Zeroes of whole subclusters (qcow2_zero writes the parts of
   * subclusters at either end as data): their zero bits, the host
   * cluster kept.
   */
  c->bitmap = sub_set (ob, fs, ls, false);
  if (c->bitmap == ob)
    return commit_keep (commit, i);
  return commit_set_entry (commit, i, old->l2_entry);
}

/* ---------------------------------------------------------- the policy */

static enum commit_step
plain_decide (struct commit *commit, size_t i, void *opaque)
{
  struct plain_change *ch = opaque;
  struct qcow2_image *img = commit->img;
  const struct cluster_map *old = &commit->c[i].old;
  uint64_t part_off, len;
  bool whole = cluster_part (img, commit->first + i, ch->offset, ch->end,
                             &part_off, &len);
  bool alone;
  int r = owned_alone (img, commit->io, old, &alone);

  if (r < 0) {
    commit->error = r;
    return COMMIT_STEP_FAILED;
  }
  if (img->header.extended_l2)
    return sub_decide (commit, i, ch, part_off, len, whole, alone);
  switch (plain_action (img, ch->op, old, alone, whole,
                        ch->zeros && ch->zeros[i])) {
  case PLAIN_KEEP:
    return commit_keep (commit, i);
  case PLAIN_IN_PLACE:
    return commit_in_place (commit, i);
  case PLAIN_NEW:
    return commit_new_cluster (commit, i);
  case PLAIN_REUSE:
    /* Its entry changes once the data is written: claimed and linked as
     * a new cluster is, with no allocation and nothing released.
     */
    return commit_reuse_kept (commit, i);
  case PLAIN_ZERO:
    return commit_set_entry (commit, i,
                             img->header.version >= 3 ? L2E_ZERO : 0);
  case PLAIN_ZERO_KEEP:
    return commit_set_entry (commit, i,
                             old->host_offset | L2E_ZERO | L2E_COPIED);
  }
  return COMMIT_STEP_FAILED;
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
  r = qcow2_pread_data (img, io, merged + *lo, *hi - *lo, host + *lo);
  if (r == 0)
    r = qcow2_encrypt_here (img, ws->cipher, false, merged + *lo, *hi - *lo,
                            host + *lo);
  if (r == 0)
    memcpy (merged + part_off, src, len);
  return r;
}

/* Whether the new host cluster HOST of a guest cluster that read as
 * zeros (OLD) needs only the bytes written: where the storage says the
 * host cluster reads as zeros already (a hole: a file given room with
 * truncate, or grown), the rest of it need not be written as zeros.
 * qemu gets the same with a write of zeros that moves no data
 * (handle_alloc_space).  The cluster is this commit's alone, so nothing
 * writes it meanwhile.  Only past every byte the engine discarded or cut
 * off since the image opened (img->discarded_end): a discard promises
 * nothing about what the bytes read afterwards.  Not for an encrypted
 * image, whose zeros are ciphertext, nor for an external data file.
 */
static bool
new_cluster_zeroed (struct qcow2_image *img, struct qcow2_io *io,
                    const struct cluster_map *old, uint64_t host)
{
  const uint64_t cluster_size = img->header.cluster_size;
  uint64_t length;
  bool hole;

  if (qcow2_image_encrypted (img) || img->data_io ||
      !qcow2_reads_as_zeros (img, old) || io->block_status == NULL ||
      host < atomic_load (&img->discarded_end))
    return false;
  return io->block_status (io->opaque, cluster_size, host, &length,
                           &hole) == 0 &&
    hole && length == cluster_size;
}

/* The data of the piece's clusters, with no lock held: in place, or
 * whole into the new clusters (with the old content around the new
 * bytes).  No BUF writes zeros.
 */
static int
plain_write (struct commit *commit, void *opaque)
{
  struct plain_change *ch = opaque;
  struct qcow2_image *img = commit->img;
  struct write_scratch *ws = ch->target.ws;
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t cluster_size = img->header.cluster_size;
  struct data_run run = qcow2_run_new (img->opts.request_size,
                                       qcow2_write_mover, &ch->target);
  size_t i;
  int r = 0;

  for (i = 0; i < commit->done && r == 0; ++i) {
    const struct commit_cluster *c = &commit->c[i];
    uint64_t gc = commit->first + i, part_off, len;
    const uint8_t *src;
    uint8_t *merged;

    if (c->action != COMMIT_IN_PLACE && c->action != COMMIT_NEW &&
        c->action != COMMIT_REUSE)
      continue;
    cluster_part (img, gc, ch->offset, ch->end, &part_off, &len);
    src = ch->buf ? ch->buf + ((gc << bits) + part_off - ch->offset)
      : qcow2_scratch_zeros (img);
    /* Only a request's first and last clusters are partial: a buffer
     * each, so the run may still hold the first while the last is made.
     */
    merged = ws->cow[(gc << bits) + part_off == ch->offset ? 0 : 1];
    if (c->action == COMMIT_IN_PLACE) {
      const uint64_t host = c->old.host_offset;
      uint64_t lo, hi;

      if (qcow2_image_encrypted (img) && ((part_off | len) & 511)) {
        r = merge_sectors (img, commit->io, ws, host, src, part_off, len,
                           merged, &lo, &hi);
        if (r == 0)
          r = run_add (&run, merged + lo, host + lo, hi - lo);
      }
      else
        r = run_add (&run, src, host + part_off, len);
      continue;
    }
    if (img->header.extended_l2) {
      const uint64_t from = ch->from[i], to = ch->to[i];

      if (from == part_off && to == part_off + len) {
        r = run_add (&run, src, c->host + from, len);
        continue;
      }
      r = read_old_subclusters (img, commit->io, ws, &c->old, c->old_bitmap,
                                gc, merged, from, to);
      if (r == 0) {
        memcpy (merged + part_off, src, len);
        r = run_add (&run, merged + from, c->host + from, to - from);
      }
      continue;
    }
    if (len == cluster_size ||
        (c->action == COMMIT_NEW &&
         new_cluster_zeroed (img, commit->io, &c->old, c->host))) {
      r = run_add (&run, src, c->host + part_off, len);
      continue;
    }
    r = qcow2_read_old_cluster (img, commit->io, ws, &c->old, gc, merged);
    if (r == 0) {
      memcpy (merged + part_off, src, len);
      r = run_add (&run, merged, c->host, cluster_size);
    }
  }
  if (r == 0)
    r = qcow2_run_flush (&run);
  return r;
}

/* ------------------------------------------------------------ a range */

enum change_outcome
qcow2_change_range (struct qcow2_image *img, struct qcow2_io *io,
                    struct qcow2_conn *conn, struct request *req,
                    enum qcow2_op op, const uint8_t *buf, uint64_t count,
                    uint64_t offset, uint64_t *done,
                    struct change_result *result, int *error)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t l2_mask = (UINT64_C (1) << img->header.l2_bits) - 1;
  const uint64_t end = offset + count;
  struct write_scratch *ws = qcow2_scratch_get (img);
  struct plain_change ch = {
    .op = op, .buf = buf, .offset = offset, .end = end,
    .target = { .img = img, .io = io, .conn = conn, .req = req, .ws = ws },
  };
  /* Snapshots make the decisions ask the refcounts, and encryption makes
   * writes in place claim their clusters (paths/cluster.h).
   */
  const struct commit_policy policy = {
    .decide = plain_decide, .write = plain_write,
    .exclusive = img->header.nb_snapshots || qcow2_image_encrypted (img),
    .claim_in_place = qcow2_image_encrypted (img),
  };
  bool zero_flags[QCOW2_COMMIT_MAX];
  enum change_outcome outcome = CHANGE_DONE;
  uint64_t pos = offset;

  *done = 0;
  if (ws == NULL) {
    *error = -ENOMEM;
    return CHANGE_FAILED;
  }
  while (pos < end && outcome == CHANGE_DONE) {
    const uint64_t gc0 = pos >> bits;
    uint64_t last = (end - 1) >> bits, piece_end;
    struct commit commit;
    size_t i;

    if (last > (gc0 | l2_mask))
      last = gc0 | l2_mask;
    if (last - gc0 >= QCOW2_COMMIT_MAX)
      last = gc0 + QCOW2_COMMIT_MAX - 1;

    /* qcow2-detect-zeroes looks at each whole cluster of a write (qemu at
     * the whole request), before any lock is taken.
     */
    ch.zeros = NULL;
    if (op == QCOW2_OP_WRITE &&
        img->opts.detect_zeroes != QCOW2_DETECT_ZEROES_OFF) {
      for (i = 0; i <= last - gc0; ++i) {
        uint64_t part_off, len;
        bool whole = cluster_part (img, gc0 + i, offset, end, &part_off,
                                   &len);
        uint64_t in_buf = ((gc0 + i) << bits) + part_off - offset;

        zero_flags[i] = whole && qcow2_all_zero (buf + in_buf, len);
      }
      ch.zeros = zero_flags;
    }

    commit_init (&commit, img, io, gc0, last - gc0 + 1, ws->piece,
                 ws->entries, ws->bitmaps, ws->l2buf);
    switch (commit_run (&commit, &policy, &ch)) {
    case COMMIT_OK:
    case COMMIT_STOPPED:
      break;
    case COMMIT_NEEDS_ROOM:
      outcome = CHANGE_NEEDS_ROOM;
      break;
    case COMMIT_FAILED:
      *error = commit.error;
      outcome = CHANGE_FAILED;
      break;
    }
    result->needs_writeback |= commit.needs_writeback;
    result->too_much_dirty |= commit.too_much_dirty;
    if (outcome == CHANGE_FAILED)
      break;
    piece_end = (gc0 + commit.done) << bits;
    if (commit.done)
      pos = piece_end < end ? piece_end : end;
  }
  *done = pos - offset;
  qcow2_scratch_put (img, ws);
  return outcome;
}

/* Cluster GC's entry and bitmap, looked up with the image lock held. */
static int
look_up_one (struct qcow2_image *img, struct qcow2_io *io,
             struct write_scratch *ws, uint64_t gc, struct cluster_map *map,
             uint64_t *bitmap)
{
  size_t n = 1;
  int r = qcow2_l2_entries (img, io, gc, &n, ws->entries, ws->bitmaps,
                            ws->l2buf);

  if (r == 0)
    r = qcow2_classify_fetched (img, gc, 0, ws->entries, ws->bitmaps, map);
  *bitmap = ws->bitmaps[0];
  return r;
}

int
qcow2_sub_edge (struct qcow2_image *img, struct qcow2_io *io, uint64_t start,
                uint64_t end, bool *whole_sub, bool *compressed)
{
  const uint32_t bits = img->header.cluster_bits;
  const uint64_t sub = img->header.cluster_size / 32;
  const uint64_t sub_start = start / sub * sub;
  uint64_t sub_end = sub_start + sub, bitmap;
  struct write_scratch *ws = qcow2_scratch_get (img);
  struct cluster_map map;
  unsigned sc;
  bool unallocated = false, zero;
  int r;

  if (ws == NULL)
    return -ENOMEM;
  qcow2_rwlock_rdlock (&img->lock);
  r = look_up_one (img, io, ws, start >> bits, &map, &bitmap);
  qcow2_rwlock_unlock (&img->lock);
  qcow2_scratch_put (img, ws);
  if (r < 0)
    return r;
  sc = (start & (img->header.cluster_size - 1)) / sub;
  *compressed = map.kind == CLUSTER_COMPRESSED;
  *whole_sub = !*compressed && !sub_allocated (bitmap, sc);
  if (*whole_sub && !sub_zero (bitmap, sc))
    unallocated = img->backing != NULL;
  /* The rest of the subcluster, up to the disk's end, must read as zeros
   * by the metadata, as qemu's is_zero asks.
   */
  if (sub_end > img->header.virtual_size)
    sub_end = img->header.virtual_size;
  if (unallocated && start > sub_start) {
    r = img->backing_zero_fast (img, sub_start, start - sub_start, &zero);
    *whole_sub = r == 0 && zero;
  }
  if (unallocated && r == 0 && *whole_sub && end < sub_end) {
    r = img->backing_zero_fast (img, end, sub_end - end, &zero);
    *whole_sub = r == 0 && zero;
  }
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
  qcow2_rwlock_rdlock (&img->lock);
  for (i = 0; i < 2 && r == 0; ++i) {
    uint64_t gc = edges[i] >> bits;
    uint64_t part_off, len, bitmap;
    struct cluster_map map;

    if (cluster_part (img, gc, offset, end, &part_off, &len))
      continue;                 /* whole: metadata only */
    r = look_up_one (img, io, ws, gc, &map, &bitmap);
    if (r == 0 && !qcow2_reads_as_zeros (img, &map))
      *needs = true;
  }
  qcow2_rwlock_unlock (&img->lock);
  qcow2_scratch_put (img, ws);
  return r;
}
