/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: a sequence of writes, zeroes, trims, flushes and reads over
 * an arbitrary image held in memory, opened for writing.  If the image's
 * refcounts covered its references before (no cluster is referenced more
 * often than its refcount says, so every referenced cluster has a
 * refcount of at least 1), they must still after the sequence and a
 * final flush.  Then no guest cluster may read differently but as the
 * sequence's successful writes and zeroes made it, read through the
 * image opened again, read-only, from what reached the storage (only
 * clusters no request touched, if the image ended marked corrupt): a
 * write that landed on metadata, or data that went to the wrong place,
 * shows there, on a damaged image too; and after every request the
 * clusters no request touched yet must read as before from a copy of the
 * storage as it stands (what a crash would leave).  Checked are guest clusters that
 * read without error before, whose host clusters are no metadata, hold
 * no other guest cluster's data (a damaged image may map two guest
 * clusters to one host cluster, and a write in place to one then changes
 * both, in qemu too) and have refcounts that count their references.
 *
 * Released clusters are discarded (bit 1 of the second byte), whole
 * clusters of zeros written detected (the next bits).
 *
 * Input: 64 bytes of operations (8 of 8 bytes each), then the image.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
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
  /* Per host cluster: held metadata; guest clusters whose data it
   * holds, plain and compressed.  Left for the guest check.
   */
  bool *metadata;
  uint32_t *plain, *compressed;
};

static void
ref (struct refs *refs, uint64_t offset)
{
  if ((offset >> refs->bits) < refs->nclusters)
    refs->count[offset >> refs->bits]++;
  else
    refs->ok = false;
}

static void
ref_metadata (struct refs *refs, uint64_t offset)
{
  ref (refs, offset);
  if ((offset >> refs->bits) < refs->nclusters)
    refs->metadata[offset >> refs->bits] = true;
}

static int
ref_block (void *opaque, uint64_t offset)
{
  ref_metadata (opaque, offset);
  return 0;
}

/* REFS (the caller's, freed by refs_free) keeps what the walk saw. */
static bool
refcounts_cover_references (struct qcow2_image *img, struct qcow2_io *io,
                            struct refs *keep)
{
  const struct qcow2_header *h = &img->header;
  const uint32_t bits = h->cluster_bits;
  uint64_t nclusters = (img->file_size + h->cluster_size - 1) >> bits;
  struct refs r = {
    .count = calloc (nclusters + 1, sizeof *r.count),
    .nclusters = nclusters, .bits = bits, .ok = true,
    .metadata = calloc (nclusters + 1, sizeof *r.metadata),
    .plain = calloc (nclusters + 1, sizeof *r.plain),
    .compressed = calloc (nclusters + 1, sizeof *r.compressed),
  };
  uint32_t *refs = r.count;
  uint8_t *l2 = malloc (h->cluster_size);
  uint64_t i, j, c, refcount, rt_offset;
  uint32_t rt_clusters;
  bool ok;

  if (refs == NULL || l2 == NULL || r.metadata == NULL || r.plain == NULL ||
      r.compressed == NULL)
    abort ();
#define REF(off) ref (&r, (off))
#define REF_METADATA(off) ref_metadata (&r, (off))
  REF_METADATA (0);
  qcow2_refcount_table_location (img, &rt_offset, &rt_clusters);
  for (c = 0; c < rt_clusters; ++c)
    REF_METADATA (rt_offset + (c << bits));
  for (c = 0; c < ((uint64_t) h->l1_size * 8 + h->cluster_size - 1) >> bits; ++c)
    REF_METADATA (h->l1_table_offset + (c << bits));
  qcow2_refcount_each_block (img, ref_block, &r);
  /* The walk goes on past a bad entry: the guest check needs every
   * reference it can see counted.
   */
  for (i = 0; i < h->l1_size; ++i) {
    uint64_t l2_offset = qcow2_l1_entry (img, i) & L1E_OFFSET_MASK;
    if (l2_offset == 0)
      continue;
    REF_METADATA (l2_offset);
    size_t n = (size_t) 1 << h->l2_bits;
    uint64_t entries[512];
    for (j = 0; j < n; j += 512) {
      size_t got = n - j < 512 ? n - j : 512;
      if (qcow2_l2_entries (img, io, (i << h->l2_bits) + j, &got, entries,
                            NULL, l2) < 0) {
        r.ok = false;
        break;
      }
      for (size_t k = 0; k < got; ++k) {
        struct cluster_map map;
        if (qcow2_classify (img, (i << h->l2_bits) + j + k, entries[k],
                            &map) < 0) {
          r.ok = false;
          continue;
        }
        if (map.kind == CLUSTER_NORMAL ||
            (map.kind == CLUSTER_ZERO && map.host_offset)) {
          REF (map.host_offset);
          if ((map.host_offset >> bits) < nclusters)
            r.plain[map.host_offset >> bits]++;
        }
        if (map.kind == CLUSTER_COMPRESSED) {
          uint64_t s = map.host_offset & ~UINT64_C (511);
          uint64_t e = map.host_offset + map.compressed_len - 1;
          for (c = s >> bits; c <= e >> bits; ++c)
            if (c < nclusters) {
              refs[c]++;
              r.compressed[c]++;
            }
        }
      }
    }
  }
#undef REF
#undef REF_METADATA
  ok = r.ok;
  for (c = 0; ok && c < nclusters; ++c) {
    if (refs[c] == 0)
      continue;
    if (qcow2_refcount_get (img, io, c, &refcount) < 0 || refcount < refs[c])
      ok = false;
  }
  free (l2);
  *keep = r;
  return ok;
}

static void
refs_free (struct refs *r)
{
  free (r->count);
  free (r->metadata);
  free (r->plain);
  free (r->compressed);
}

static void quiet (void *opaque, const char *msg);
struct guest_check;
static void guest_check_refcounts (struct guest_check *gc,
                                   struct qcow2_image *img,
                                   struct qcow2_io *io, const char *when);

/* The guest clusters checked, with what each must read as. */
#define CHECK_BYTES (1 << 20)   /* at most this much guest data kept */
#define CHECK_CLUSTERS 64

#define CHECK_METADATA 256

struct guest_cluster {
  uint64_t index;
  bool unknown;                 /* a failed request or a trim touched it */
  bool touched;                 /* a request changed it */
  uint8_t *expect;
  /* A plain cluster's host cluster and refcount, which no request on
   * other guest clusters changes; UINT64_MAX: not a plain cluster.
   */
  uint64_t host_cluster, refcount;
};

struct guest_check {
  struct guest_cluster c[CHECK_CLUSTERS];
  unsigned n;
  uint64_t cluster_size;
  /* Host clusters that held metadata with a refcount of at least 1:
   * while they hold metadata, their refcount must not drop to 0 (that
   * would hand them out for data).
   */
  uint64_t metadata[CHECK_METADATA];
  unsigned nmetadata;
};

/* Is guest cluster G's data alone in host clusters that hold no
 * metadata and whose refcounts count every reference to them (so that
 * no legitimate change of anything else alters it: a damaged image may
 * still send other writes onto metadata, which the engine must refuse)?
 * Called with the image lock held exclusively (refcount blocks load).
 */
static bool
stands_alone (struct qcow2_image *img, struct qcow2_io *io,
              const struct refs *r, uint64_t g, struct guest_cluster *gcl)
{
  const unsigned bits = img->header.cluster_bits;
  size_t got = 1;
  uint64_t entry, c, first, last;
  struct cluster_map map;
  uint8_t *l2 = malloc (img->header.cluster_size);
  bool alone = true;

  if (l2 == NULL)
    abort ();
  if (qcow2_l2_entries (img, io, g, &got, &entry, NULL, l2) < 0 || got != 1 ||
      qcow2_classify (img, g, entry, &map) < 0) {
    free (l2);
    return false;
  }
  free (l2);
  gcl->host_cluster = UINT64_MAX;
  if (map.kind == CLUSTER_NORMAL ||
      (map.kind == CLUSTER_ZERO && map.host_offset)) {
    first = last = map.host_offset >> bits;
    gcl->host_cluster = first;
  }
  else if (map.kind == CLUSTER_COMPRESSED) {
    first = (map.host_offset & ~UINT64_C (511)) >> bits;
    last = (map.host_offset + map.compressed_len - 1) >> bits;
  }
  else
    return true;                /* no host cluster of its own */
  for (c = first; alone && c <= last; ++c) {
    uint64_t refcount;

    alone = c < r->nclusters && !r->metadata[c] &&
      (r->plain[c] == 0 || r->plain[c] + r->compressed[c] == 1) &&
      qcow2_refcount_get (img, io, c, &refcount) == 0 &&
      refcount >= r->count[c];
    if (c == gcl->host_cluster)
      gcl->refcount = refcount;
  }
  return alone;
}

/* Pick the guest clusters to check (those that hold data first, then
 * from the start of the disk) and read what they hold now.
 */
static void
guest_check_start (struct guest_check *gc, struct qcow2_image *img,
                   struct qcow2_io *io, struct qcow2_conn *conn,
                   const struct refs *r)
{
  const struct qcow2_header *h = &img->header;
  const uint64_t clusters = (h->virtual_size + h->cluster_size - 1) >>
    h->cluster_bits;
  uint64_t g, pass;

  gc->n = gc->nmetadata = 0;
  gc->cluster_size = h->cluster_size;
  qcow2_rwlock_wrlock (&img->lock);
  for (g = 0; g < r->nclusters && gc->nmetadata < CHECK_METADATA; ++g) {
    uint64_t refcount;

    if (r->metadata[g] && qcow2_refcount_get (img, io, g, &refcount) == 0 &&
        refcount > 0)
      gc->metadata[gc->nmetadata++] = g;
  }
  qcow2_rwlock_unlock (&img->lock);
  if (h->cluster_size * CHECK_CLUSTERS > CHECK_BYTES * 4 ||
      h->virtual_size % h->cluster_size)
    return;                     /* big clusters: too slow to fuzz */
  for (pass = 0; pass < 2; ++pass)
    for (g = 0; g < clusters && gc->n < CHECK_CLUSTERS &&
           gc->n * h->cluster_size < CHECK_BYTES; ++g) {
      size_t got = 1;
      uint64_t entry;
      struct cluster_map map;
      unsigned k;
      bool seen = false;

      for (k = 0; k < gc->n; ++k)
        seen |= gc->c[k].index == g;
      if (seen)
        continue;
      bool wanted = true;

      /* Lookups under the image lock, reads (which take it) outside. */
      qcow2_rwlock_wrlock (&img->lock);
      if (pass == 0) {
        uint8_t *l2 = malloc (h->cluster_size);
        int e;

        if (l2 == NULL)
          abort ();
        e = qcow2_l2_entries (img, io, g, &got, &entry, NULL, l2);
        free (l2);
        wanted = e == 0 && got == 1 &&
          qcow2_classify (img, g, entry, &map) == 0 &&
          map.kind != CLUSTER_UNALLOCATED;
      }
      struct guest_cluster *c = &gc->c[gc->n];
      wanted = wanted && stands_alone (img, io, r, g, c);
      qcow2_rwlock_unlock (&img->lock);
      if (!wanted)
        continue;
      c->index = g;
      c->unknown = c->touched = false;
      c->expect = malloc (h->cluster_size);
      if (c->expect == NULL)
        abort ();
      if (qcow2_read (conn, io, c->expect, h->cluster_size,
                      g << h->cluster_bits) < 0) {
        free (c->expect);
        continue;
      }
      gc->n++;
    }
}

/* A request on [OFF, OFF + LEN) ended with R: what the checked clusters
 * must read as now.  FILL: the byte written (a zero request: 0); TRIM:
 * a trim, after which a cluster may read as before or as zeros.
 */
static void
guest_check_apply (struct guest_check *gc, uint64_t off, uint64_t len,
                   int r, int fill, bool trim)
{
  unsigned k;

  for (k = 0; k < gc->n; ++k) {
    struct guest_cluster *c = &gc->c[k];
    uint64_t start = c->index * gc->cluster_size;
    uint64_t end = start + gc->cluster_size;
    uint64_t lo = off > start ? off : start;
    uint64_t hi = off + len < end ? off + len : end;

    if (lo >= hi)
      continue;
    c->touched = true;
    if (r < 0 || trim)
      c->unknown = true;
    else
      memset (c->expect + (lo - start), fill, hi - lo);
  }
}

/* Read every checked cluster through IMG (opened afresh) and abort if
 * one reads differently from what it must.
 */
static void
guest_check_finish (struct guest_check *gc, struct qcow2_image *img,
                    struct qcow2_io *io, struct qcow2_conn *conn,
                    bool ended_corrupt)
{
  uint8_t *now = malloc (gc->cluster_size);
  unsigned k;

  if (now == NULL)
    abort ();
  for (k = 0; k < gc->n; ++k) {
    struct guest_cluster *c = &gc->c[k];

    if (c->unknown || (ended_corrupt && c->touched))
      continue;
    if (qcow2_read (conn, io, now, gc->cluster_size,
                    c->index * gc->cluster_size) < 0 ||
        memcmp (now, c->expect, gc->cluster_size) != 0) {
      fprintf (stderr, "guest cluster %" PRIu64 " (%s) reads differently "
               "after the writes%s\n", c->index,
               c->touched ? "written" : "not written",
               ended_corrupt ? " (the image was marked corrupt)" : "");
      abort ();
    }
  }
  if (img->opts.writable)
    guest_check_refcounts (gc, img, io, "after the writes");
  free (now);
}

/* Is the corrupt bit set in the header of the image in DATA? */
static bool
marked_corrupt (const uint8_t *data, uint64_t size)
{
  return size >= 80 && (be64 (data + 72) & 2);
}

/* The refcounts in IMG that no request may have changed: those of the
 * untouched plain clusters checked, and of metadata still metadata.
 */
static void
guest_check_refcounts (struct guest_check *gc, struct qcow2_image *img,
                       struct qcow2_io *io, const char *when)
{
  struct refs now;
  uint64_t refcount;
  unsigned k;

  qcow2_rwlock_wrlock (&img->lock);
  for (k = 0; k < gc->n; ++k) {
    struct guest_cluster *c = &gc->c[k];

    if (c->touched || c->unknown || c->host_cluster == UINT64_MAX)
      continue;
    if (qcow2_refcount_get (img, io, c->host_cluster, &refcount) < 0 ||
        refcount != c->refcount) {
      fprintf (stderr, "the refcount of host cluster %" PRIu64 " (guest "
               "cluster %" PRIu64 ", not written) changed %s\n",
               c->host_cluster, c->index, when);
      abort ();
    }
  }
  (void) refcounts_cover_references (img, io, &now);
  for (k = 0; k < gc->nmetadata; ++k) {
    uint64_t cl = gc->metadata[k];

    if (cl < now.nclusters && now.metadata[cl] &&
        (qcow2_refcount_get (img, io, cl, &refcount) < 0 || refcount == 0)) {
      fprintf (stderr, "host cluster %" PRIu64 " holds metadata but its "
               "refcount dropped to 0 %s\n", cl, when);
      abort ();
    }
  }
  refs_free (&now);
  qcow2_rwlock_unlock (&img->lock);
}

/* The storage as it is between two requests, opened read-only on a
 * copy: a crash now would leave it so, and the clusters no request has
 * touched must read as they did before the first (data that a damaged
 * entry sent over metadata shows here, even where a later writeback
 * rewrites that metadata from memory).
 */
static void
guest_check_between (struct guest_check *gc, const struct mem_io *file,
                     const struct qcow2_options *opts, unsigned after_op)
{
  struct mem_io copy;
  struct qcow2_log log = { .error = quiet };
  struct qcow2_options ro = *opts;
  struct qcow2_image *img;
  struct qcow2_conn *conn;
  uint8_t *now;
  unsigned k;
  bool any = false;

  for (k = 0; k < gc->n; ++k)
    any |= !gc->c[k].touched && !gc->c[k].unknown;
  if (!any)
    return;
  /* Opened for writing (the refcounts are loaded only then) unless it
   * is marked corrupt, which only a read-only open accepts.
   */
  ro.writable = !marked_corrupt (file->data, file->size);
  ro.threads = 0;
  mem_io_init (&copy, file->data, file->size, file->size,
               MEM_IO_ABORT | (ro.writable ? MEM_IO_WRITABLE : 0));
  if (qcow2_image_open (&copy.io, &log, &ro, &img) < 0) {
    fprintf (stderr, "the storage after request %u cannot be opened\n",
             after_op);
    abort ();
  }
  conn = qcow2_conn_new (img);
  now = malloc (gc->cluster_size);
  if (conn == NULL || now == NULL)
    abort ();
  for (k = 0; k < gc->n; ++k) {
    struct guest_cluster *c = &gc->c[k];

    if (c->touched || c->unknown)
      continue;
    if (qcow2_read (conn, &copy.io, now, gc->cluster_size,
                    c->index * gc->cluster_size) < 0 ||
        memcmp (now, c->expect, gc->cluster_size) != 0) {
      fprintf (stderr, "guest cluster %" PRIu64 " (not written) reads "
               "differently from the storage after request %u\n",
               c->index, after_op);
      abort ();
    }
  }
  if (ro.writable)
    guest_check_refcounts (gc, img, &copy.io,
                           "in the storage between requests");
  free (now);
  qcow2_conn_free (conn);
  qcow2_image_close (img);
  mem_io_free (&copy);
}

static void
guest_check_free (struct guest_check *gc)
{
  unsigned k;

  for (k = 0; k < gc->n; ++k)
    free (gc->c[k].expect);
  gc->n = 0;
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
  struct refs before, after;
  struct guest_check gc = { .n = 0 };
  bool was_consistent, ended_corrupt;

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
  was_consistent = refcounts_cover_references (img, io, &before);
  qcow2_rwlock_unlock (&img->lock);
  guest_check_start (&gc, img, io, conn, &before);
  refs_free (&before);

  uint64_t vsize = img->header.virtual_size;
  int r;
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
    case 0:
      r = qcow2_write (conn, io, buf, len, off, op[1] & 1);
      guest_check_apply (&gc, off, len, r, op[1], false);
      break;
    case 1:
      r = qcow2_zero (img, io, len, off, op[1] & 2, false);
      guest_check_apply (&gc, off, len, r, 0, false);
      break;
    case 2:
      r = qcow2_trim (img, io, len, off, false);
      guest_check_apply (&gc, off, len, r, 0, true);
      break;
    case 3: qcow2_flush (img, io); break;
    case 4: qcow2_read (conn, io, buf, len, off); break;
    }
    guest_check_between (&gc, &file, &opts, i);
  }
  qcow2_flush (img, io);
  if (was_consistent) {
    qcow2_rwlock_wrlock (&img->lock);
    if (!refcounts_cover_references (img, io, &after)) {
      fprintf (stderr, "a cluster has fewer refcounts than references after writing\n");
      abort ();
    }
    refs_free (&after);
    qcow2_rwlock_unlock (&img->lock);
  }
  ended_corrupt = atomic_load (&img->corrupt);
  qcow2_conn_free (conn);
  qcow2_image_close (img);

  /* What reached the storage, opened again. */
  if (gc.n > 0) {
    opts.writable = !marked_corrupt (file.data, file.size);
    if (qcow2_image_open (io, &log, &opts, &img) < 0) {
      fprintf (stderr, "the image cannot be opened again after the writes\n");
      abort ();
    }
    conn = qcow2_conn_new (img);
    if (conn == NULL)
      abort ();
    guest_check_finish (&gc, img, io, conn, ended_corrupt);
    qcow2_conn_free (conn);
    qcow2_image_close (img);
  }
 out:
  guest_check_free (&gc);
  mem_io_free (&file);
  return 0;
}
