/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: qcow2 images assembled byte by byte, for reading. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>
#include <zstd.h>

#include "read-image.h"
#include "util.h"

const struct image_spec read_image_specs[] = {
  /* 512-byte clusters: 64 entries per L2 table, 4 tables, the second
   * one absent (L1 entry 0); the size field ends inside the last
   * cluster, which is then not served (a disk is whole sectors).
   */
  { "v3, 512 B clusters, zlib", 3, 9, QCOW2_COMPRESSION_ZLIB, 209, 100,
    { { 0, 64 }, { 128, 209 } }, 11, NULL },
  { "v3, 512 B clusters, zstd", 3, 9, QCOW2_COMPRESSION_ZSTD, 209, 100,
    { { 0, 64 }, { 128, 209 } }, 12, NULL },
  { "v2, 512 B clusters", 2, 9, QCOW2_COMPRESSION_ZLIB, 209, 1,
    { { 0, 64 }, { 128, 209 } }, 13, NULL },
  /* 64 KiB clusters: 8192 entries per L2 table; data at the start and
   * across the boundary of the first two tables (512 MiB).
   */
  { "v3, 64 KiB clusters, zlib", 3, 16, QCOW2_COMPRESSION_ZLIB, 8240, 1000,
    { { 0, 40 }, { 8180, 8240 } }, 14, NULL },
  { "v3, 64 KiB clusters, zstd", 3, 16, QCOW2_COMPRESSION_ZSTD, 8240, 1000,
    { { 0, 40 }, { 8180, 8240 } }, 15, NULL },
  { "v2, 64 KiB clusters", 2, 16, QCOW2_COMPRESSION_ZLIB, 8240, 0,
    { { 0, 40 }, { 8180, 8240 } }, 16, NULL },
  /* 4 KiB clusters, three L2 tables. */
  { "v3, 4 KiB clusters, zstd", 3, 12, QCOW2_COMPRESSION_ZSTD, 1200, 4095,
    { { 0, 600 }, { 1100, 1200 } }, 17, NULL },
  /* 2 MiB clusters: the largest; compressed ranges up to 4 MiB.  Few
   * clusters, so their kinds are laid out by hand.
   */
  { "v3, 2 MiB clusters, zstd", 3, 21, QCOW2_COMPRESSION_ZSTD, 10, 12345,
    { { 0, 10 }, { 10, 10 } }, 18, "nnccazcs.c" },
};
const size_t read_image_nspecs =
  sizeof read_image_specs / sizeof read_image_specs[0];

uint64_t
compress_cluster (enum qcow2_compression type, const uint8_t *src,
                  uint64_t len, uint8_t *dst, uint64_t cap)
{
  if (type == QCOW2_COMPRESSION_ZSTD) {
    size_t r = ZSTD_compress (dst, cap, src, len, 3);
    if (ZSTD_isError (r)) {
      fprintf (stderr, "ZSTD_compress: %s\n", ZSTD_getErrorName (r));
      exit (1);
    }
    return r;
  }
  else {
    /* qemu's parameters: raw deflate, 4 KiB window. */
    z_stream zs;
    uint64_t out;

    memset (&zs, 0, sizeof zs);
    if (deflateInit2 (&zs, 6, Z_DEFLATED, -12, 9, Z_DEFAULT_STRATEGY) != Z_OK)
      exit (1);
    zs.next_in = (Bytef *) src;
    zs.avail_in = len;
    zs.next_out = dst;
    zs.avail_out = cap;
    if (deflate (&zs, Z_FINISH) != Z_STREAM_END) {
      fprintf (stderr, "deflate did not finish\n");
      exit (1);
    }
    out = cap - zs.avail_out;
    deflateEnd (&zs);
    return out;
  }
}

/* Decide what each guest cluster is: runs of random kinds inside the
 * populated ranges, unallocated elsewhere, the last cluster compressed (a
 * partial cluster, zero padded as qemu does), and a few clusters sharing
 * another one's data (as after a snapshot or a copy).
 */
static void
plan (struct image *img)
{
  const struct image_spec *spec = img->spec;
  const uint64_t C = img->cluster_size;
  uint64_t state = spec->seed;
  uint64_t last_normal = UINT64_MAX, last_compressed = UINT64_MAX;
  int64_t *share = xmalloc (img->nclusters * sizeof *share);
  static const enum kind weighted[] = {
    UNALLOC, UNALLOC, ZERO, ZERO_ALLOC, NORMAL, NORMAL, NORMAL,
    COMPRESSED, COMPRESSED, COMPRESSED, COMPRESSED,
  };

  for (uint64_t k = 0; k < img->nclusters; ++k)
    share[k] = -1;
  for (uint64_t k = 0; spec->layout && k < img->nclusters; ++k) {
    switch (spec->layout[k]) {
    case '.': img->kind[k] = UNALLOC; break;
    case 'z': img->kind[k] = ZERO; break;
    case 'a': img->kind[k] = ZERO_ALLOC; break;
    case 'n': img->kind[k] = NORMAL; break;
    case 'c': img->kind[k] = COMPRESSED; last_compressed = k; break;
    case 's':
      img->kind[k] = COMPRESSED;
      share[k] = last_compressed;
      break;
    default: abort ();
    }
  }
  for (int r = 0; r < 2 && !spec->layout; ++r) {
    const struct range *pr = &spec->populated[r];
    uint64_t k = pr->first;

    while (k < pr->end) {
      enum kind kind = weighted[rng (&state) % (sizeof weighted / sizeof weighted[0])];
      uint64_t run = 1 + rng (&state) % 5;

      if (spec->version == 2 && (kind == ZERO || kind == ZERO_ALLOC))
        kind = UNALLOC;
      for (; run > 0 && k < pr->end; --run, ++k) {
        img->kind[k] = kind;
        if (kind == NORMAL) {
          if (last_normal != UINT64_MAX && rng (&state) % 12 == 0)
            share[k] = last_normal;
          else
            last_normal = k;
        }
        if (kind == COMPRESSED) {
          if (last_compressed != UINT64_MAX && rng (&state) % 12 == 0)
            share[k] = last_compressed;
          else
            last_compressed = k;
        }
      }
    }
  }
  if (!spec->layout && (spec->populated[1].end == img->nclusters ||
                        spec->populated[0].end == img->nclusters)) {
    img->kind[img->nclusters - 1] = COMPRESSED;
    share[img->nclusters - 1] = -1;
  }

  for (uint64_t k = 0; k < img->nclusters; ++k) {
    if (img->kind[k] != NORMAL && img->kind[k] != COMPRESSED)
      continue;
    img->content[k] = xcalloc (1, C);
    if (share[k] >= 0)
      memcpy (img->content[k], img->content[share[k]], C);
    else {
      uint64_t end = (k + 1) * C;
      fill_pattern (img->content[k], C, (uint32_t) (spec->seed * 977 + k));
      if (end > img->virtual_size)
        memset (img->content[k] + (C - (end - img->virtual_size)), 0,
                end - img->virtual_size);
    }
  }

  /* Remember the sharing in entry[] for build (): a shared cluster copies
   * the entry of the one it shares with.
   */
  for (uint64_t k = 0; k < img->nclusters; ++k)
    img->entry[k] = share[k] >= 0 ? (uint64_t) share[k] | COPIED : 0;
  free (share);
}

/* Lay the image out:
 *   cluster 0 header (+ an unknown header extension), 1 refcount table,
 *   then the L1 table, one L2 table per L1 entry with anything in it, a
 *   garbage cluster, the data clusters (mostly in guest order, some pairs
 *   swapped, a garbage cluster after every seventh), and last the
 *   compressed streams packed back to back from an unaligned offset, also
 *   with some pairs swapped.  The file ends where the last stream ends, so
 *   that stream's sector range runs past the end of the file.
 */
static void
build (struct image *img)
{
  const struct image_spec *spec = img->spec;
  const uint64_t C = img->cluster_size;
  const uint64_t l2_entries = C / 8;
  const uint64_t n_l2 = (img->nclusters + l2_entries - 1) / l2_entries;
  const unsigned csize_shift = 62 - (spec->cluster_bits - 8);
  uint64_t *host = xcalloc (img->nclusters, sizeof *host);
  uint64_t *l2_offset = xcalloc (n_l2 + 1, sizeof *l2_offset);
  uint64_t *order = xcalloc (img->nclusters, sizeof *order);
  uint8_t **stream = xcalloc (img->nclusters, sizeof *stream);
  uint64_t cursor, norder, cpos;

  /* One more L1 entry than needed: allowed, and never looked at. */
  img->l1_size = n_l2 + 1;
  img->l1_offset = 2 * C;
  cursor = img->l1_offset + ((img->l1_size * 8 + C - 1) / C) * C;

  for (uint64_t i = 0; i < n_l2; ++i) {
    bool used = false;
    for (uint64_t k = i * l2_entries;
         k < (i + 1) * l2_entries && k < img->nclusters; ++k)
      used |= img->kind[k] != UNALLOC;
    if (used) {
      l2_offset[i] = cursor;
      cursor += C;
    }
  }
  img->garbage_offset = cursor;
  cursor += C;

  /* Data clusters. */
  norder = 0;
  for (uint64_t k = 0; k < img->nclusters; ++k)
    if ((img->kind[k] == NORMAL || img->kind[k] == ZERO_ALLOC) &&
        img->entry[k] == 0)
      order[norder++] = k;
  for (uint64_t i = 4; i + 1 < norder; i += 8) {
    uint64_t t = order[i];
    order[i] = order[i + 1];
    order[i + 1] = t;
  }
  for (uint64_t i = 0; i < norder; ++i) {
    host[order[i]] = cursor;
    cursor += C;
    if (i % 7 == 6)
      cursor += C;              /* a hole of garbage */
  }

  /* Compressed streams. */
  norder = 0;
  for (uint64_t k = 0; k < img->nclusters; ++k)
    if (img->kind[k] == COMPRESSED && img->entry[k] == 0) {
      uint64_t cap = ZSTD_compressBound (C) + C;
      stream[k] = xmalloc (cap);
      img->csize[k] = compress_cluster (spec->compression, img->content[k],
                                        C, stream[k], cap);
      if (img->csize[k] >= C) {
        fprintf (stderr, "test data does not compress\n");
        exit (1);
      }
      order[norder++] = k;
    }
  for (uint64_t i = 2; i + 1 < norder; i += 5) {
    uint64_t t = order[i];
    order[i] = order[i + 1];
    order[i + 1] = t;
  }
  img->compressed_start = cursor + 37;
  cpos = img->compressed_start;
  for (uint64_t i = 0; i < norder; ++i) {
    host[order[i]] = cpos;
    cpos += img->csize[order[i]];
  }
  img->file_size = norder ? cpos : cursor;

  /* Now the bytes. */
  img->file = xcalloc (1, img->file_size);
  memset (img->file + img->garbage_offset, GARBAGE, C);
  put32 (img->file + 0, 0x514649fb);
  put32 (img->file + 4, spec->version);
  put32 (img->file + 20, spec->cluster_bits);
  put64 (img->file + 24, img->size_field);
  put32 (img->file + 36, img->l1_size);
  put64 (img->file + 40, img->l1_offset);
  put64 (img->file + 48, C);                    /* refcount table */
  put32 (img->file + 56, 1);
  if (spec->version == 3) {
    put64 (img->file + 72, spec->compression == QCOW2_COMPRESSION_ZSTD
           ? UINT64_C (1) << 3 : 0);
    put32 (img->file + 96, 4);
    put32 (img->file + 100, 112);
    img->file[104] = spec->compression;
  }
  /* An extension of a type nobody knows: to be skipped. */
  {
    uint64_t ext = spec->version == 3 ? 112 : 72;
    put32 (img->file + ext, 0x7e577e57);
    put32 (img->file + ext + 4, 5);
    memcpy (img->file + ext + 8, "tests", 5);
  }

  for (uint64_t i = 0; i < n_l2; ++i)
    if (l2_offset[i])
      put64 (img->file + img->l1_offset + 8 * i, l2_offset[i] | COPIED);

  for (uint64_t k = 0; k < img->nclusters; ++k) {
    uint64_t shared = img->entry[k] ? img->entry[k] & ~COPIED : UINT64_MAX;
    uint64_t src = shared != UINT64_MAX ? shared : k;
    uint64_t entry = 0;

    switch ((enum kind) img->kind[k]) {
    case UNALLOC:
      break;
    case ZERO:
      entry = L2E_ZERO;
      break;
    case ZERO_ALLOC:
      entry = host[k] | L2E_ZERO | COPIED;
      break;
    case NORMAL:
      entry = host[src];
      /* A cluster used twice has refcount 2, so no COPIED flag. */
      if (shared == UINT64_MAX)
        entry |= COPIED;
      if (src == k)
        memcpy (img->file + host[k], img->content[k], C);
      break;
    case COMPRESSED: {
      uint64_t off = host[src];
      uint64_t nsect = ((off & 511) + img->csize[src] + 511) / 512;
      entry = L2E_COMPRESSED | (nsect - 1) << csize_shift | off;
      img->csize[k] = img->csize[src];
      if (src == k)
        memcpy (img->file + off, stream[k], img->csize[k]);
      break;
    }
    }
    img->entry[k] = entry;
  }
  /* Zero-allocated clusters hold stale data that must not show. */
  for (uint64_t k = 0; k < img->nclusters; ++k)
    if (img->kind[k] == ZERO_ALLOC)
      memset (img->file + host[k], GARBAGE, C);
  for (uint64_t k = 0; k < img->nclusters; ++k) {
    uint64_t i = k / l2_entries;
    img->entry_pos[k] = l2_offset[i] ? l2_offset[i] + 8 * (k % l2_entries) : 0;
    if (img->entry_pos[k])
      put64 (img->file + img->entry_pos[k], img->entry[k]);
  }

  for (uint64_t k = 0; k < img->nclusters; ++k)
    free (stream[k]);
  free (stream);
  free (order);
  free (l2_offset);
  free (host);
}

struct image *
image_new (const struct image_spec *spec)
{
  struct image *img = xcalloc (1, sizeof *img);

  img->spec = spec;
  img->cluster_size = UINT64_C (1) << spec->cluster_bits;
  img->nclusters = spec->nclusters;
  img->size_field = spec->nclusters * img->cluster_size - spec->short_by;
  img->virtual_size = img->size_field & ~UINT64_C (511);
  img->kind = xcalloc (img->nclusters, 1);
  img->content = xcalloc (img->nclusters, sizeof *img->content);
  img->entry = xcalloc (img->nclusters, sizeof *img->entry);
  img->entry_pos = xcalloc (img->nclusters, sizeof *img->entry_pos);
  img->csize = xcalloc (img->nclusters, sizeof *img->csize);
  plan (img);
  build (img);
  return img;
}

void
image_free (struct image *img)
{
  for (uint64_t k = 0; k < img->nclusters; ++k)
    free (img->content[k]);
  free (img->content);
  free (img->kind);
  free (img->entry);
  free (img->entry_pos);
  free (img->csize);
  free (img->file);
  free (img);
}

void
expected_bytes (const struct image *img, uint8_t *buf, uint64_t offset,
                uint64_t len)
{
  const uint64_t C = img->cluster_size;

  while (len > 0) {
    uint64_t k = offset / C, in = offset % C;
    uint64_t n = C - in < len ? C - in : len;

    if (img->content[k])
      memcpy (buf, img->content[k] + in, n);
    else
      memset (buf, 0, n);
    buf += n;
    offset += n;
    len -= n;
  }
}

bool
reads_as_zero (const struct image *img, uint64_t k)
{
  return img->kind[k] == UNALLOC || img->kind[k] == ZERO ||
    img->kind[k] == ZERO_ALLOC;
}

uint64_t
find_cluster (const struct image *img, uint64_t from, enum kind kind,
              int next_kind)
{
  for (uint64_t k = from; k + 1 < img->nclusters; ++k)
    if (img->kind[k] == kind &&
        (next_kind < 0 || img->kind[k + 1] == next_kind))
      return k;
  return UINT64_MAX;
}

static void
add_pair (struct pairs *ps, const struct image *img, uint64_t offset,
          uint64_t len)
{
  if (offset >= img->virtual_size)
    return;
  if (len > img->virtual_size - offset)
    len = img->virtual_size - offset;
  if (len == 0)
    return;
  if (ps->n == ps->cap) {
    ps->cap = ps->cap ? 2 * ps->cap : 256;
    ps->p = realloc (ps->p, ps->cap * sizeof *ps->p);
    if (ps->p == NULL)
      exit (1);
  }
  ps->p[ps->n++] = (struct pair) { offset, len };
}

struct pairs
make_pairs (const struct image *img)
{
  const uint64_t C = img->cluster_size;
  const bool huge = C >= 2 * MiB;
  /* Offsets relative to a cluster's start: the first three straddle
   * its edge.
   */
  const int64_t deltas[] = { -1, 0, 1, C / 2, 511, C - 1 };
  const uint64_t lens[] = {
    1, 7, 511, 512, 513, C - 1, C, C + 1, 2 * C + 1, 5 * C - 3, 9 * C,
  };
  const size_t ndeltas = huge ? 3 : sizeof deltas / sizeof deltas[0];
  struct pairs ps = { NULL, 0, 0 };
  uint64_t state = img->spec->seed;

  for (int r = 0; r < 2; ++r) {
    const struct range *pr = &img->spec->populated[r];
    uint64_t step = C >= 64 * KiB && !huge ? 2 : 1;

    for (uint64_t k = pr->first; k < pr->end; k += step)
      for (size_t d = 0; d < ndeltas; ++d)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; ++l) {
          /* Keep the big image's run time in check. */
          if (huge && l % 3 != 0)
            continue;
          if (!huge && C >= 64 * KiB && (d + l) % 2)
            continue;
          if (k == 0 && deltas[d] < 0)
            continue;
          add_pair (&ps, img, k * C + deltas[d], lens[l]);
        }
  }
  for (int i = 0; i < (huge ? 10 : 400); ++i) {
    const struct range *pr = &img->spec->populated[i & 1];
    uint64_t span = (pr->end - pr->first) * C;
    uint64_t offset, len;

    if (span == 0)
      continue;
    offset = pr->first * C + rng (&state) % span;
    len = 1 + rng (&state) % (4 * C);
    add_pair (&ps, img, offset, len);
  }
  /* Whole populated regions, and everything for the small disks. */
  for (int r = 0; r < 2; ++r) {
    const struct range *pr = &img->spec->populated[r];
    add_pair (&ps, img, pr->first * C, (pr->end - pr->first) * C);
  }
  if (img->virtual_size <= 16 * MiB)
    add_pair (&ps, img, 0, img->virtual_size);
  add_pair (&ps, img, img->virtual_size - 1, 1);
  return ps;
}
