/* qcow2zstd unit test: the whole engine over in-memory qcow2 images.
 *
 * The images are assembled here byte by byte (header, L1, L2, data,
 * compressed streams made with zlib and zstd as qemu makes them), so the
 * test knows every guest byte and every host offset.  The engine reads
 * them through a struct qcow2_io over a memory buffer that also checks the
 * engine keeps its side of the contract (reads inside the file, from the
 * calling thread only) and can be told to fail.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>
#include <zstd.h>

#include "qcow2.h"
#include "unit.h"

#define KiB (UINT64_C (1) << 10)
#define MiB (UINT64_C (1) << 20)

#define L2E_ZERO       (UINT64_C (1) << 0)
#define L2E_COMPRESSED (UINT64_C (1) << 62)
#define COPIED         (UINT64_C (1) << 63)

/* Filler of unused host space: 0xee is neither valid deflate (block type
 * 3) nor a zstd magic, and it is not zero, so reading it by mistake shows.
 */
#define GARBAGE 0xee

static void *
xmalloc (size_t len)
{
  void *p = malloc (len ? len : 1);

  if (p == NULL) {
    perror ("malloc");
    exit (1);
  }
  return p;
}

static void *
xcalloc (size_t n, size_t size)
{
  void *p = calloc (n ? n : 1, size);

  if (p == NULL) {
    perror ("calloc");
    exit (1);
  }
  return p;
}

static void
put32 (uint8_t *p, uint32_t v)
{
  for (int i = 3; i >= 0; --i, v >>= 8)
    p[i] = v & 0xff;
}

static void
put64 (uint8_t *p, uint64_t v)
{
  for (int i = 7; i >= 0; --i, v >>= 8)
    p[i] = v & 0xff;
}

static uint64_t
get64 (const uint8_t *p)
{
  uint64_t v = 0;

  for (int i = 0; i < 8; ++i)
    v = v << 8 | p[i];
  return v;
}

static uint64_t
rng (uint64_t *state)
{
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return *state * UINT64_C (0x2545f4914f6cdd1d);
}

/* ------------------------------------------------------------ images */

enum kind { UNALLOC, ZERO, ZERO_ALLOC, NORMAL, COMPRESSED };

struct range { uint64_t first, end; };  /* guest clusters [first, end) */

struct image_spec {
  const char *name;
  unsigned version;
  unsigned cluster_bits;
  enum qcow2_compression compression;
  uint64_t nclusters;
  uint64_t short_by;            /* virtual size = nclusters * C - short_by */
  struct range populated[2];    /* clusters that may hold anything */
  uint64_t seed;
  /* If set, the kinds of all clusters, one letter each: '.' unallocated,
   * 'z' zero, 'a' zero-allocated, 'n' normal, 'c' compressed, 's'
   * compressed sharing the previous compressed cluster's data.
   */
  const char *layout;
};

struct image {
  const struct image_spec *spec;
  uint64_t cluster_size;
  uint64_t virtual_size;
  uint64_t nclusters;
  uint8_t *kind;                /* enum kind, per guest cluster */
  uint8_t **content;            /* NORMAL/COMPRESSED: the cluster's bytes */
  uint64_t *entry;              /* the L2 entry written */
  uint64_t *entry_pos;          /* its host offset; 0: no L2 table */
  uint64_t *csize;              /* COMPRESSED: length of the stream */
  uint64_t l1_offset;
  uint32_t l1_size;
  uint64_t garbage_offset;      /* a host cluster full of GARBAGE */
  uint64_t compressed_start;    /* host offset of the first stream */
  uint8_t *file;
  uint64_t file_size;
};

/* Cluster content: 16-byte text records naming the cluster's SEED and
 * the record number.  It compresses like ordinary data, and any shifted,
 * misplaced or mixed-up byte compares unequal.
 */
static void
fill_pattern (uint8_t *buf, uint64_t len, uint32_t seed)
{
  static const char hex[] = "0123456789abcdef";

  for (uint64_t i = 0; i < len; ++i) {
    uint64_t record = i / 16;
    unsigned col = i % 16;

    if (col < 6)
      buf[i] = hex[(seed >> (4 * (5 - col))) & 15];
    else if (col == 6)
      buf[i] = ':';
    else if (col < 14)
      buf[i] = hex[(record >> (4 * (13 - col))) & 15];
    else
      buf[i] = col == 14 ? ';' : '\n';
  }
}

static uint64_t
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
  put64 (img->file + 24, img->virtual_size);
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

static struct image *
image_new (const struct image_spec *spec)
{
  struct image *img = xcalloc (1, sizeof *img);

  img->spec = spec;
  img->cluster_size = UINT64_C (1) << spec->cluster_bits;
  img->nclusters = spec->nclusters;
  img->virtual_size = spec->nclusters * img->cluster_size - spec->short_by;
  img->kind = xcalloc (img->nclusters, 1);
  img->content = xcalloc (img->nclusters, sizeof *img->content);
  img->entry = xcalloc (img->nclusters, sizeof *img->entry);
  img->entry_pos = xcalloc (img->nclusters, sizeof *img->entry_pos);
  img->csize = xcalloc (img->nclusters, sizeof *img->csize);
  plan (img);
  build (img);
  return img;
}

static void
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

/* The guest bytes [OFFSET, OFFSET+LEN) as the image defines them. */
static void
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

static bool
reads_as_zero (const struct image *img, uint64_t k)
{
  return img->kind[k] == UNALLOC || img->kind[k] == ZERO ||
    img->kind[k] == ZERO_ALLOC;
}

/* ------------------------------------------------- I/O and logging */

/* Set by the test around its calls into the engine: the engine may call
 * io->pread only from such a thread, never from a pool worker.
 */
static _Thread_local bool in_engine_call;

struct mem_io {
  struct qcow2_io io;
  const uint8_t *data;
  uint64_t size;
  int size_errno;               /* size () fails with this */
  int fail_errno;               /* preads touching [fail_from, fail_to) */
  uint64_t fail_from, fail_to;
  atomic_ulong preads;
  atomic_ulong largest;         /* largest pread so far */
  atomic_ulong outside;         /* preads beyond the file: contract broken */
  atomic_ulong wrong_thread;    /* preads from a pool worker */
};

static int
mem_pread (void *opaque, void *buf, size_t count, uint64_t offset)
{
  struct mem_io *m = opaque;

  atomic_fetch_add (&m->preads, 1);
  for (unsigned long seen = atomic_load (&m->largest); count > seen; )
    if (atomic_compare_exchange_weak (&m->largest, &seen, count))
      break;
  if (!in_engine_call)
    atomic_fetch_add (&m->wrong_thread, 1);
  if (offset > m->size || count > m->size - offset) {
    atomic_fetch_add (&m->outside, 1);
    return -EIO;
  }
  if (m->fail_errno && offset < m->fail_to && offset + count > m->fail_from)
    return -m->fail_errno;
  memcpy (buf, m->data + offset, count);
  return 0;
}

static int64_t
mem_size (void *opaque)
{
  struct mem_io *m = opaque;

  if (m->size_errno)
    return -m->size_errno;
  return (int64_t) m->size;
}

static void
mem_io_init (struct mem_io *m, const uint8_t *data, uint64_t size)
{
  memset (m, 0, sizeof *m);
  m->io.opaque = m;
  m->io.pread = mem_pread;
  m->io.size = mem_size;
  m->data = data;
  m->size = size;
}

struct log_capture {
  pthread_mutex_t lock;
  unsigned errors;
  unsigned malformed;           /* empty, or ending in a newline */
  char last[600];
};

static void
log_error (void *opaque, const char *msg)
{
  struct log_capture *lc = opaque;
  size_t len = strlen (msg);

  pthread_mutex_lock (&lc->lock);
  lc->errors++;
  if (len == 0 || msg[len - 1] == '\n')
    lc->malformed++;
  snprintf (lc->last, sizeof lc->last, "%s", msg);
  pthread_mutex_unlock (&lc->lock);
}

static void
log_debug (void *opaque, const char *msg)
{
  (void) opaque;
  (void) msg;
}

/* One open image with its connection, I/O and log. */
struct session {
  struct mem_io mio;
  struct log_capture log;
  struct qcow2_log qlog;
  struct qcow2_image *img;
  struct qcow2_conn *conn;
};

static int
session_open (struct session *s, const uint8_t *file, uint64_t size,
              const struct qcow2_options *opts)
{
  int r;

  memset (s, 0, sizeof *s);
  mem_io_init (&s->mio, file, size);
  pthread_mutex_init (&s->log.lock, NULL);
  s->qlog = (struct qcow2_log) {
    .opaque = &s->log, .error = log_error, .debug = log_debug,
  };
  in_engine_call = true;
  r = qcow2_image_open (&s->mio.io, &s->qlog, opts, &s->img);
  if (r == 0) {
    s->conn = qcow2_conn_new (s->img);
    if (s->conn == NULL)
      r = -ENOMEM;
  }
  in_engine_call = false;
  return r;
}

/* Close, and check the contract the I/O layer watched. */
static void
session_close (struct session *s)
{
  qcow2_conn_free (s->conn);
  qcow2_image_close (s->img);
  CHECK_EQ (atomic_load (&s->mio.outside), 0);
  CHECK_EQ (atomic_load (&s->mio.wrong_thread), 0);
  CHECK_EQ (s->log.malformed, 0);
  pthread_mutex_destroy (&s->log.lock);
  s->conn = NULL;
  s->img = NULL;
}

static int
do_read (struct session *s, void *buf, uint64_t count, uint64_t offset)
{
  int r;

  in_engine_call = true;
  r = qcow2_read (s->conn, &s->mio.io, buf, count, offset);
  in_engine_call = false;
  return r;
}

static int
do_prefetch (struct session *s, uint64_t offset, uint64_t count)
{
  int r;

  in_engine_call = true;
  r = qcow2_prefetch (s->conn, &s->mio.io, offset, count);
  in_engine_call = false;
  return r;
}

/* Read guest cluster K (the part inside the disk) and compare. */
static bool read_and_compare (struct session *s, const struct image *img,
                              uint64_t offset, uint64_t len, const char *ctx);

static bool
read_cluster (struct session *s, const struct image *img, uint64_t k,
              const char *ctx)
{
  const uint64_t C = img->cluster_size;
  uint64_t len = img->virtual_size - k * C < C ? img->virtual_size - k * C : C;

  return read_and_compare (s, img, k * C, len, ctx);
}

/* Did the engine log (at least) one more error since *SEEN?  Moves *SEEN
 * on, so that the next call checks the next failure.
 */
static bool
logged (struct session *s, unsigned *seen)
{
  unsigned now;

  pthread_mutex_lock (&s->log.lock);
  now = s->log.errors;
  pthread_mutex_unlock (&s->log.lock);
  if (now > *seen) {
    *seen = now;
    return true;
  }
  return false;
}

/* Read [OFFSET, OFFSET+LEN) and compare with the image.  Returns true if
 * it matched; on a mismatch says where.
 */
static bool
read_and_compare (struct session *s, const struct image *img,
                  uint64_t offset, uint64_t len, const char *ctx)
{
  uint8_t *got = xmalloc (len);
  uint8_t *want = xmalloc (len);
  bool ok = true;
  int r;

  memset (got, 0xcd, len);
  r = do_read (s, got, len, offset);
  CHECK_EQ (r, 0);
  if (r != 0) {
    fprintf (stderr, "  %s: read of %" PRIu64 " at %" PRIu64 " failed: %s\n",
             ctx, len, offset, s->log.last);
    ok = false;
  }
  else {
    expected_bytes (img, want, offset, len);
    if (memcmp (got, want, len) != 0) {
      uint64_t i = 0;
      while (got[i] == want[i])
        ++i;
      CHECK (!"guest bytes differ");
      fprintf (stderr, "  %s: read of %" PRIu64 " at %" PRIu64 ": first "
               "difference at guest offset %" PRIu64 " (cluster %" PRIu64
               ", kind %d): got 0x%02x, want 0x%02x\n", ctx, len, offset,
               offset + i, (offset + i) / img->cluster_size,
               img->kind[(offset + i) / img->cluster_size], got[i], want[i]);
      ok = false;
    }
  }
  free (got);
  free (want);
  return ok;
}

/* ------------------------------------------------------- the specs */

static const struct image_spec specs[] = {
  /* 512-byte clusters: 64 entries per L2 table, 4 tables, the second
   * one absent (L1 entry 0); the last cluster is partial.
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
#define NSPECS (sizeof specs / sizeof specs[0])

struct options_case {
  struct qcow2_options opts;
  bool tiny_caches;             /* l2 2 slots, clusters 3 slots */
};

#define OPTIONS(t, r, l2, cc)                                           \
  { .threads = (t), .request_size = (r),                                \
    .l2_cache_size = (l2), .cluster_cache_size = (cc) }

static const struct options_case option_cases[] = {
  { OPTIONS (0, 4 * KiB, 0, 0), false },
  { OPTIONS (0, 4 * MiB, 0, 0), false },
  { OPTIONS (3, 4 * KiB, 0, 0), false },
  { OPTIONS (3, 4 * MiB, 0, 0), false },
  { OPTIONS (0, 4 * KiB, 8 * MiB, 8 * MiB), false },
  { OPTIONS (0, 4 * MiB, 8 * MiB, 8 * MiB), false },
  { OPTIONS (3, 4 * KiB, 8 * MiB, 8 * MiB), false },
  { OPTIONS (3, 4 * MiB, 8 * MiB, 8 * MiB), false },
  { OPTIONS (3, 64 * KiB, 0, 0), true },
};
#define NOPTIONS (sizeof option_cases / sizeof option_cases[0])

static struct qcow2_options
options_for (const struct options_case *oc, const struct image *img)
{
  struct qcow2_options o = oc->opts;

  if (oc->tiny_caches) {
    o.l2_cache_size = 2 * img->cluster_size;
    o.cluster_cache_size = 3 * img->cluster_size;
  }
  return o;
}

static const struct qcow2_options default_options = {
  .threads = 3, .request_size = 4 * MiB,
  .l2_cache_size = 8 * MiB, .cluster_cache_size = 8 * MiB,
};

/* ------------------------------------------------------ read pairs */

struct pair { uint64_t offset, len; };

struct pairs {
  struct pair *p;
  size_t n, cap;
};

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

/* Offsets around every populated cluster's edges, lengths from one byte
 * to several clusters, random pairs, and whole regions.
 */
static struct pairs
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

/* ------------------------------------------------------------ tests */

/* Every pair, under every option combination. */
static void
test_reads (const struct image *img)
{
  struct pairs ps = make_pairs (img);
  const bool huge = img->cluster_size >= 2 * MiB;

  for (size_t o = 0; o < NOPTIONS; ++o) {
    struct qcow2_options opts = options_for (&option_cases[o], img);
    struct session s;
    unsigned mismatches = 0;
    char ctx[200];

    /* The 2 MiB image: one combination with and one without threads. */
    if (huge && o != 1 && o != 7)
      continue;
    snprintf (ctx, sizeof ctx, "%s, threads %u, request %" PRIu64
              ", l2 cache %" PRIu64 ", cluster cache %" PRIu64,
              img->spec->name, opts.threads, opts.request_size,
              opts.l2_cache_size, opts.cluster_cache_size);
    CHECK_EQ (session_open (&s, img->file, img->file_size, &opts), 0);
    if (s.conn == NULL) {
      fprintf (stderr, "  %s: open failed: %s\n", ctx, s.log.last);
      qcow2_image_close (s.img);
      continue;
    }
    /* Opening reads the first cluster and the L1 table in one go each;
     * after that no read underneath may exceed request_size, except to
     * fetch one cluster or one compressed range (at most 2 clusters).
     */
    atomic_store (&s.mio.largest, 0);
    for (size_t i = 0; i < ps.n && mismatches < 5; ++i)
      if (!read_and_compare (&s, img, ps.p[i].offset, ps.p[i].len, ctx))
        mismatches++;
    CHECK_EQ (s.log.errors, 0);
    {
      uint64_t limit = opts.request_size > 2 * img->cluster_size
        ? opts.request_size : 2 * img->cluster_size;
      CHECK (atomic_load (&s.mio.largest) <= limit);
      /* And coalescing happens: some read underneath is bigger than a
       * cluster when the limit allows it.
       */
      if (opts.request_size >= 4 * img->cluster_size)
        CHECK (atomic_load (&s.mio.largest) > img->cluster_size);
    }
    session_close (&s);
  }
  free (ps.p);
}

/* What the header says, and the trivial reads. */
static void
test_basics (const struct image *img)
{
  struct session s;
  const struct qcow2_header *h;
  uint8_t byte;
  unsigned errors;

  CHECK_EQ (session_open (&s, img->file, img->file_size, &default_options),
            0);
  if (s.conn == NULL)
    return;
  h = qcow2_image_header (s.img);
  CHECK_EQ (h->version, img->spec->version);
  CHECK_EQ (h->cluster_bits, img->spec->cluster_bits);
  CHECK_EQ (h->virtual_size, img->virtual_size);
  CHECK_EQ (h->compression_type, img->spec->compression);
  CHECK_EQ (h->l1_size, img->l1_size);
  CHECK_EQ (h->file_size, img->file_size);

  /* Nothing to read; past the end; an overflowing range. */
  CHECK_EQ (do_read (&s, &byte, 0, 0), 0);
  CHECK_EQ (do_read (&s, &byte, 0, img->virtual_size), 0);
  errors = s.log.errors;
  CHECK_EQ (do_read (&s, &byte, 1, img->virtual_size), -EINVAL);
  CHECK_EQ (s.log.errors, errors + 1);
  {
    uint8_t two[2];
    CHECK_EQ (do_read (&s, two, 2, img->virtual_size - 1), -EINVAL);
    CHECK_EQ (do_read (&s, two, 2, UINT64_MAX), -EINVAL);
    CHECK_EQ (do_prefetch (&s, UINT64_MAX - 1, 2), -EINVAL);
  }
  CHECK_EQ (s.log.errors, errors + 4);
  CHECK (read_and_compare (&s, img, img->virtual_size - 1, 1, "last byte"));
  session_close (&s);
}

/* ---------------------------------------------------------- extents */

struct extent_check {
  const struct image *img;
  uint64_t next;                /* where the next range must start */
  unsigned calls;
  unsigned stop_after;          /* fail with -EINTR on this call (1-based) */
  bool bad;
};

static int
check_extent (void *opaque, uint64_t offset, uint64_t length, bool zero)
{
  struct extent_check *ec = opaque;
  const uint64_t C = ec->img->cluster_size;

  ec->calls++;
  if (ec->stop_after && ec->calls > ec->stop_after) {
    /* Not allowed; answer like a callback that does not expect it. */
    if (!ec->bad)
      fprintf (stderr, "  extent callback called again after it returned "
               "an error (range at %" PRIu64 ", +%" PRIu64 ")\n",
               offset, length);
    ec->bad = true;
    return 0;
  }
  if (ec->stop_after && ec->calls == ec->stop_after)
    return -EINTR;
  if (offset != ec->next || length == 0) {
    if (!ec->bad)
      fprintf (stderr, "  extent at %" PRIu64 " (+%" PRIu64 "), expected "
               "one at %" PRIu64 "\n", offset, length, ec->next);
    ec->bad = true;
  }
  for (uint64_t k = offset / C; length && k <= (offset + length - 1) / C;
       ++k)
    if (reads_as_zero (ec->img, k) != zero) {
      if (!ec->bad)
        fprintf (stderr, "  extent at %" PRIu64 " (+%" PRIu64 ") says "
                 "zero=%d, but cluster %" PRIu64 " is of kind %d\n",
                 offset, length, zero, k, ec->img->kind[k]);
      ec->bad = true;
      break;
    }
  ec->next = offset + length;
  return 0;
}

/* Ask for [OFFSET, OFFSET+LEN) as a client does: again from where the
 * last answer stopped, until all is covered.
 */
static bool
extents_cover (struct session *s, const struct image *img, uint64_t offset,
               uint64_t len)
{
  struct extent_check ec = { .img = img, .next = offset };
  uint64_t end = offset + len;
  unsigned rounds = 0;

  while (ec.next < end && !ec.bad && rounds++ < 100000) {
    uint64_t from = ec.next;
    unsigned calls = ec.calls;
    int r;

    in_engine_call = true;
    r = qcow2_extents (s->conn, &s->mio.io, from, end - from,
                       check_extent, &ec);
    in_engine_call = false;
    CHECK_EQ (r, 0);
    CHECK (ec.calls > calls);           /* at least one range */
    CHECK (ec.next > from);
    CHECK (ec.next <= end);
    if (r != 0 || ec.next <= from)
      return false;
  }
  CHECK (!ec.bad);
  CHECK_EQ (ec.next, end);
  return !ec.bad && ec.next == end;
}

static void
test_extents (const struct image *img)
{
  struct pairs ps = make_pairs (img);
  struct session s;
  unsigned failures = 0;

  CHECK_EQ (session_open (&s, img->file, img->file_size, &default_options),
            0);
  if (s.conn == NULL)
    return;
  for (size_t i = 0; i < ps.n && failures < 5; ++i)
    if (!extents_cover (&s, img, ps.p[i].offset, ps.p[i].len)) {
      failures++;
      fprintf (stderr, "  (%s: extents of %" PRIu64 " at %" PRIu64 ")\n",
               img->spec->name, ps.p[i].len, ps.p[i].offset);
    }
  /* The whole disk at once: for the 64 KiB images 512 MiB, mostly an
   * unallocated stretch inside an L2 table.
   */
  CHECK (extents_cover (&s, img, 0, img->virtual_size));

  /* The callback's error stops the walk and is returned, and the
   * callback is not called again.
   */
  {
    struct extent_check ec = { .img = img, .next = 0, .stop_after = 1 };
    in_engine_call = true;
    CHECK_EQ (qcow2_extents (s.conn, &s.mio.io, 0, img->virtual_size,
                             check_extent, &ec), -EINTR);
    in_engine_call = false;
    /* "FN returns ... a negative errno to stop with that error": no
     * call after that one.
     */
    CHECK_EQ (ec.calls, 1);
  }
  {
    /* Failing on the second range, and on the last (only) one. */
    struct extent_check ec = { .img = img, .next = 0, .stop_after = 2 };
    in_engine_call = true;
    CHECK_EQ (qcow2_extents (s.conn, &s.mio.io, 0, img->virtual_size,
                             check_extent, &ec), -EINTR);
    CHECK_EQ (ec.calls, 2);
    ec = (struct extent_check) { .img = img, .next = 0, .stop_after = 1 };
    CHECK_EQ (qcow2_extents (s.conn, &s.mio.io, 0, 1, check_extent, &ec),
              -EINTR);
    CHECK_EQ (ec.calls, 1);
    in_engine_call = false;
  }
  /* Nothing asked, nothing reported. */
  {
    struct extent_check ec = { .img = img, .next = 0 };
    in_engine_call = true;
    CHECK_EQ (qcow2_extents (s.conn, &s.mio.io, 5, 0, check_extent, &ec),
              0);
    in_engine_call = false;
    CHECK_EQ (ec.calls, 0);
  }
  CHECK_EQ (s.log.errors, 0);
  session_close (&s);
  free (ps.p);
}

/* ---------------------------------------------------------- caching */

static void
stats (struct session *s, struct qcow2_stats *st)
{
  qcow2_image_get_stats (s->img, st);
}

/* The first guest cluster at or after FROM of kind KIND, whose successor
 * is of kind NEXT_KIND (or any if NEXT_KIND < 0); UINT64_MAX if none.
 */
static uint64_t
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
test_prefetch (const struct image *img, unsigned threads)
{
  const uint64_t C = img->cluster_size;
  const struct range *pr = &img->spec->populated[0];
  struct qcow2_options opts = default_options;
  struct qcow2_stats s0, s1, s2, s3;
  struct session s;
  uint64_t ncompressed = 0, unique = 0, k, pair;
  uint64_t range_len = (pr->end - pr->first) * C;

  if (range_len > img->virtual_size - pr->first * C)
    range_len = img->virtual_size - pr->first * C;

  opts.threads = threads;
  /* Room for every compressed cluster of the range in its shard: 64 MiB
   * is at least 64 slots per shard; 2 MiB clusters get one shard of 15.
   */
  opts.cluster_cache_size = C >= MiB ? 15 * C : 64 * MiB;
  for (k = pr->first; k < pr->end; ++k)
    if (img->kind[k] == COMPRESSED) {
      bool seen = false;
      ncompressed++;
      for (uint64_t j = pr->first; j < k; ++j)
        seen |= img->entry[j] == img->entry[k];
      unique += !seen;
    }
  k = find_cluster (img, pr->first, COMPRESSED, -1);
  pair = find_cluster (img, pr->first, COMPRESSED, COMPRESSED);
  CHECK (ncompressed > 0 && k < pr->end && pair < pr->end);
  if (ncompressed == 0 || k >= pr->end || pair >= pr->end)
    return;

  CHECK_EQ (session_open (&s, img->file, img->file_size, &opts), 0);
  if (s.conn == NULL)
    return;
  stats (&s, &s0);
  CHECK_EQ (s0.clusters_decompressed, 0);
  CHECK_EQ (do_prefetch (&s, pr->first * C, range_len), 0);
  stats (&s, &s1);
  /* Shared clusters may be decoded once or twice, depending on timing. */
  CHECK (s1.clusters_decompressed >= unique);
  CHECK (s1.clusters_decompressed <= ncompressed);
  CHECK (s1.bytes_read_underneath > s0.bytes_read_underneath);
  CHECK (s1.reads_underneath > s0.reads_underneath);

  /* A partial read of a prefetched cluster is served from the cache. */
  CHECK (read_and_compare (&s, img, k * C + 100, 50, "after prefetch"));
  stats (&s, &s2);
  CHECK_EQ (s2.cluster_cache_hits, s1.cluster_cache_hits + 1);
  CHECK_EQ (s2.clusters_decompressed, s1.clusters_decompressed);
  /* Two partial clusters in one read: two hits. */
  CHECK (read_and_compare (&s, img, pair * C + C - 10, 20, "pair"));
  stats (&s, &s3);
  CHECK_EQ (s3.cluster_cache_hits, s2.cluster_cache_hits + 2);
  CHECK_EQ (s3.clusters_decompressed, s1.clusters_decompressed);

  /* Prefetching again decodes nothing. */
  CHECK_EQ (do_prefetch (&s, pr->first * C, range_len), 0);
  stats (&s, &s2);
  CHECK_EQ (s2.clusters_decompressed, s1.clusters_decompressed);
  CHECK_EQ (s2.cluster_cache_hits, s3.cluster_cache_hits + ncompressed);

  /* The L2 cache: the second lookup of a table is a hit. */
  CHECK (s2.l2_cache_misses > 0);
  CHECK (s2.l2_cache_hits > 0);
  CHECK_EQ (s.log.errors, 0);
  session_close (&s);

  /* Without a cluster cache every partial read decodes; nothing hits. */
  opts.cluster_cache_size = 0;
  opts.l2_cache_size = 0;
  CHECK_EQ (session_open (&s, img->file, img->file_size, &opts), 0);
  if (s.conn == NULL)
    return;
  CHECK_EQ (do_prefetch (&s, pr->first * C, range_len), 0);
  stats (&s, &s1);
  CHECK (read_and_compare (&s, img, k * C + 100, 50, "no cache"));
  CHECK (read_and_compare (&s, img, k * C + 200, 50, "no cache"));
  stats (&s, &s2);
  CHECK_EQ (s2.clusters_decompressed, s1.clusters_decompressed + 2);
  CHECK_EQ (s2.cluster_cache_hits, 0);
  CHECK_EQ (s2.l2_cache_hits, 0);
  session_close (&s);
}

/* --------------------------------------------------- corrupt images */

/* A copy of the image's file with one 64-bit value replaced. */
static uint8_t *
patched (const struct image *img, uint64_t pos, uint64_t value)
{
  uint8_t *copy = xmalloc (img->file_size);

  memcpy (copy, img->file, img->file_size);
  put64 (copy + pos, value);
  return copy;
}

enum effect {
  METADATA,     /* read, prefetch and extents fail */
  DATA,         /* read and prefetch fail; extents are fine */
};

/* Open FILE, expect reads touching guest cluster K to fail with -EIO,
 * each failure logged, while cluster GOOD still reads fine, before and
 * after the failures.  WORD must appear in the logged message.
 */
static void
expect_corrupt (const char *what, const struct image *img, uint8_t *file,
                uint64_t k, uint64_t good, enum effect effect,
                const char *word)
{
  const uint64_t C = img->cluster_size;
  static const unsigned thread_counts[] = { 0, 3 };

  for (int t = 0; t < 2; ++t) {
    struct qcow2_options opts = default_options;
    unsigned long before = atomic_load (&unit_failures);
    struct session s;
    uint8_t *buf = xmalloc (3 * C);
    unsigned errors;

    opts.threads = thread_counts[t];
    CHECK_EQ (session_open (&s, file, img->file_size, &opts), 0);
    if (s.conn == NULL) {
      fprintf (stderr, "  %s: open failed: %s\n", what, s.log.last);
      qcow2_image_close (s.img);
      free (buf);
      continue;
    }
    CHECK (read_cluster (&s, img, good, what));

    errors = s.log.errors;
    CHECK_EQ (do_read (&s, buf, C, k * C), -EIO);
    CHECK (logged (&s, &errors));
    CHECK (strstr (s.log.last, word) != NULL);
    if (strstr (s.log.last, word) == NULL)
      fprintf (stderr, "  %s: message without \"%s\": %s\n", what, word,
               s.log.last);
    /* A part of the cluster, and a range around it. */
    CHECK_EQ (do_read (&s, buf, 10, k * C + C / 2), -EIO);
    CHECK (logged (&s, &errors));
    if (k > 0 && (k + 2) * C <= img->virtual_size) {
      CHECK_EQ (do_read (&s, buf, 3 * C - 2, k * C - C + 1), -EIO);
      CHECK (logged (&s, &errors));
    }
    /* The same again: an error is not cached as success. */
    CHECK_EQ (do_read (&s, buf, C, k * C), -EIO);
    CHECK (logged (&s, &errors));
    CHECK_EQ (do_prefetch (&s, k * C, C), -EIO);
    CHECK (logged (&s, &errors));

    {
      struct extent_check ec = { .img = img, .next = k * C };
      int r;

      in_engine_call = true;
      r = qcow2_extents (s.conn, &s.mio.io, k * C, C, check_extent, &ec);
      in_engine_call = false;
      if (effect == METADATA) {
        CHECK_EQ (r, -EIO);
        CHECK (logged (&s, &errors));
      }
      else {
        CHECK_EQ (r, 0);
        CHECK (!ec.bad);
        CHECK_EQ (ec.next, (k + 1) * C);
      }
    }
    /* The connection is still fine for good clusters. */
    CHECK (read_cluster (&s, img, good, what));
    session_close (&s);
    free (buf);
    UNIT_NOTE_IF_FAILED (before, "%s, %s, threads %u", img->spec->name, what,
                         opts.threads);
  }
}

/* Replace guest cluster K's L2 entry by ENTRY and expect corruption. */
static void
corrupt_entry (const char *what, const struct image *img, uint64_t k,
               uint64_t entry, uint64_t good, enum effect effect,
               const char *word)
{
  uint8_t *file;

  CHECK (k != UINT64_MAX && img->entry_pos[k] != 0);
  if (k == UINT64_MAX || img->entry_pos[k] == 0)
    return;
  file = patched (img, img->entry_pos[k], entry);
  expect_corrupt (what, img, file, k, good, effect, word);
  free (file);
}

static void
test_corrupt (const struct image *img)
{
  const uint64_t C = img->cluster_size;
  const unsigned csize_shift = 62 - (img->spec->cluster_bits - 8);
  const uint64_t normal = find_cluster (img, 1, NORMAL, -1);
  const uint64_t compressed = find_cluster (img, 1, COMPRESSED, -1);
  const uint64_t beyond = ((img->file_size + C - 1) / C + 4) * C;
  uint64_t good = UINT64_MAX, good_other_table = UINT64_MAX;
  uint64_t cut = UINT64_MAX;

  if (normal == UINT64_MAX || compressed == UINT64_MAX) {
    CHECK (!"the test image lacks normal or compressed clusters");
    return;
  }
  /* A compressed cluster whose stream still has 8 bytes or more in its
   * last sector: one sector less must cut it (a deflate stream cut by
   * fewer bytes may lose only its end-of-block code, and qemu accepts
   * what still fills the cluster).
   */
  for (uint64_t k = 1; k < img->nclusters && cut == UINT64_MAX; ++k) {
    uint64_t e = img->entry[k];
    uint64_t off = e & ((UINT64_C (1) << csize_shift) - 1);
    uint64_t nsect = ((e >> csize_shift) & ((C >> 8) - 1)) + 1;
    uint64_t tail = (off + img->csize[k]) & 511;

    if (img->kind[k] == COMPRESSED && k != compressed && nsect >= 2 &&
        (tail == 0 || tail >= 8))
      cut = k;
  }
  CHECK (cut != UINT64_MAX);
  /* Clusters to read while others are broken: any cluster that is not
   * broken, and, for broken L1 entries, one under another L1 entry.
   */
  for (uint64_t k = 0; k < img->nclusters; ++k)
    if (k != normal && k != compressed && k != cut &&
        img->kind[k] != UNALLOC) {
      if (good == UINT64_MAX)
        good = k;
      if (k / (C / 8) != normal / (C / 8))
        good_other_table = k;
    }
  CHECK (good != UINT64_MAX);
  if (good == UINT64_MAX)
    return;

  /* Reserved bits, low and high; in a normal, zero and unallocated entry. */
  corrupt_entry ("reserved bit 1", img, normal,
                 img->entry[normal] | 2, good, METADATA, "reserved");
  corrupt_entry ("reserved bit 61", img, normal,
                 img->entry[normal] | UINT64_C (1) << 61, good, METADATA,
                 "reserved");
  corrupt_entry ("reserved bit 8, no offset", img, normal,
                 UINT64_C (1) << 8, good, METADATA, "reserved");
  if (img->spec->version == 3)
    corrupt_entry ("reserved bit 4 on a zero entry", img, normal,
                   L2E_ZERO | 16, good, METADATA, "reserved");

  /* Normal data not on a cluster boundary (only possible above 512 B). */
  if (C > 512)
    corrupt_entry ("unaligned offset", img, normal,
                   (img->entry[normal] + 512) | COPIED, good, METADATA,
                   "aligned");
  corrupt_entry ("data past the end of the file", img, normal,
                 beyond | COPIED, good, METADATA, "end of the file");

  /* The zero flag means nothing in v2: corruption. */
  if (img->spec->version == 2)
    corrupt_entry ("zero flag in v2", img, normal, L2E_ZERO, good, METADATA,
                   "version 2");

  /* Compressed: data past the end; too few sectors; garbage. */
  corrupt_entry ("compressed data past the end of the file", img, compressed,
                 L2E_COMPRESSED | beyond, good, METADATA, "end of the file");
  if (cut != UINT64_MAX) {
    uint64_t e = img->entry[cut];
    uint64_t nsect = ((e >> csize_shift) & ((C >> 8) - 1)) + 1;
    uint64_t off = e & ((UINT64_C (1) << csize_shift) - 1);

    corrupt_entry ("compressed count one too small", img, cut,
                   L2E_COMPRESSED | (nsect - 2) << csize_shift | off, good,
                   DATA, "compressed");
    if (nsect > 2)
      corrupt_entry ("compressed count 0", img, cut, L2E_COMPRESSED | off,
                     good, DATA, "compressed");
  }
  corrupt_entry ("compressed garbage", img, compressed,
                 L2E_COMPRESSED | (C / 512 - 1) << csize_shift |
                 (img->garbage_offset + 3), good, DATA, "compressed");
  /* The header as compressed data: "QFI\xfb..." is no stream either. */
  corrupt_entry ("compressed header", img, compressed,
                 L2E_COMPRESSED | UINT64_C (1) << csize_shift | 0, good, DATA,
                 "compressed");

  /* L1 entries: reserved bits, an unaligned L2 table, one past the end
   * (only if some cluster lives under another L1 entry).
   */
  good = good_other_table;
  if (good != UINT64_MAX) {
    uint64_t l1_index = normal / (C / 8);
    uint64_t pos = img->l1_offset + 8 * l1_index;
    uint64_t l1e = get64 (img->file + pos);
    uint8_t *file;

    file = patched (img, pos, l1e | UINT64_C (1) << 62);
    expect_corrupt ("L1 reserved bit 62", img, file, normal, good, METADATA,
                    "reserved");
    free (file);
    file = patched (img, pos, l1e | 1);
    expect_corrupt ("L1 reserved bit 0", img, file, normal, good, METADATA,
                    "reserved");
    free (file);
    if (C > 512) {
      file = patched (img, pos, l1e + 512);
      expect_corrupt ("L1 unaligned", img, file, normal, good, METADATA,
                      "aligned");
      free (file);
    }
    file = patched (img, pos, beyond | COPIED);
    expect_corrupt ("L2 table past the end", img, file, normal, good,
                    METADATA, "outside the file");
    free (file);
  }
}

/* -------------------------------------------------------- I/O errors */

static void
test_io_errors (const struct image *img)
{
  const uint64_t C = img->cluster_size;
  const uint64_t normal = find_cluster (img, 0, NORMAL, -1);
  const uint64_t compressed = find_cluster (img, 0, COMPRESSED, -1);
  static const unsigned thread_counts[] = { 0, 3 };
  struct session s;
  uint8_t *buf = xmalloc (4 * C);

  /* Open: size () fails; the header read fails. */
  memset (&s, 0, sizeof s);
  mem_io_init (&s.mio, img->file, img->file_size);
  pthread_mutex_init (&s.log.lock, NULL);
  s.qlog = (struct qcow2_log) { .opaque = &s.log, .error = log_error };
  s.mio.size_errno = ENOTTY;
  in_engine_call = true;
  CHECK_EQ (qcow2_image_open (&s.mio.io, &s.qlog, &default_options, &s.img),
            -ENOTTY);
  CHECK (s.img == NULL);
  CHECK_EQ (s.log.errors, 1);
  s.mio.size_errno = 0;
  s.mio.fail_errno = ENXIO;
  s.mio.fail_from = 0;
  s.mio.fail_to = 1;
  CHECK_EQ (qcow2_image_open (&s.mio.io, &s.qlog, &default_options, &s.img),
            -ENXIO);
  CHECK (s.img == NULL);
  CHECK_EQ (s.log.errors, 2);
  /* The first cluster (for small images it holds the L1 table too) or,
   * for big ones, the L1 table cannot be read.
   */
  s.mio.fail_from = img->l1_offset;
  s.mio.fail_to = img->l1_offset + 8;
  CHECK_EQ (qcow2_image_open (&s.mio.io, &s.qlog, &default_options, &s.img),
            -ENXIO);
  CHECK (s.img == NULL);
  CHECK_EQ (s.log.errors, 3);
  in_engine_call = false;
  pthread_mutex_destroy (&s.log.lock);

  for (int t = 0; t < 2; ++t) {
    struct qcow2_options opts = default_options;
    unsigned long before = atomic_load (&unit_failures);
    unsigned errors;
    uint64_t l2 = img->entry_pos[normal] & ~(C - 1);
    uint64_t long_read = img->virtual_size - compressed * C;

    if (long_read > 4 * C)
      long_read = 4 * C;

    opts.threads = thread_counts[t];
    CHECK_EQ (session_open (&s, img->file, img->file_size, &opts), 0);
    if (s.conn == NULL) {
      qcow2_image_close (s.img);
      continue;
    }

    /* The L2 table cannot be read: the errno comes back as it is. */
    s.mio.fail_errno = ENXIO;
    s.mio.fail_from = l2;
    s.mio.fail_to = l2 + C;
    errors = s.log.errors;
    CHECK_EQ (do_read (&s, buf, C, normal * C), -ENXIO);
    CHECK_EQ (s.log.errors, errors + 1);
    CHECK_EQ (do_read (&s, buf, 1, normal * C), -ENXIO);
    CHECK_EQ (s.log.errors, errors + 2);
    CHECK_EQ (do_prefetch (&s, 0, 4 * C), -ENXIO);
    CHECK_EQ (s.log.errors, errors + 3);
    {
      struct extent_check ec = { .img = img, .next = normal * C };
      in_engine_call = true;
      CHECK_EQ (qcow2_extents (s.conn, &s.mio.io, normal * C, C,
                               check_extent, &ec), -ENXIO);
      in_engine_call = false;
      CHECK_EQ (s.log.errors, errors + 4);
    }
    /* Once the storage recovers, so do the reads: no half-read table was
     * kept in the cache.
     */
    s.mio.fail_errno = 0;
    CHECK (read_and_compare (&s, img, normal * C, C, "after an L2 error"));

    /* The data of a normal cluster. */
    s.mio.fail_errno = EROFS;
    s.mio.fail_from = get64 (img->file + img->entry_pos[normal]) & ~COPIED;
    s.mio.fail_to = s.mio.fail_from + C;
    errors = s.log.errors;
    CHECK_EQ (do_read (&s, buf, C, normal * C), -EROFS);
    CHECK_EQ (s.log.errors, errors + 1);
    CHECK_EQ (do_read (&s, buf, 3, normal * C + 7), -EROFS);
    CHECK_EQ (s.log.errors, errors + 2);

    /* The compressed streams: whole cluster, part, prefetch. */
    s.mio.fail_errno = EPIPE;
    s.mio.fail_from = img->compressed_start;
    s.mio.fail_to = img->file_size;
    errors = s.log.errors;
    CHECK_EQ (do_read (&s, buf, C, compressed * C), -EPIPE);
    CHECK_EQ (s.log.errors, errors + 1);
    CHECK_EQ (do_read (&s, buf, 5, compressed * C + 3), -EPIPE);
    CHECK_EQ (s.log.errors, errors + 2);
    CHECK_EQ (do_prefetch (&s, compressed * C, C), -EPIPE);
    CHECK_EQ (s.log.errors, errors + 3);
    /* A long read over many compressed clusters fails as a whole. */
    CHECK_EQ (do_read (&s, buf, long_read, compressed * C), -EPIPE);
    CHECK_EQ (s.log.errors, errors + 4);

    s.mio.fail_errno = 0;
    CHECK (read_and_compare (&s, img, compressed * C, C, "after EPIPE"));
    CHECK (read_and_compare (&s, img, compressed * C + 3, 5, "after EPIPE"));
    session_close (&s);
    UNIT_NOTE_IF_FAILED (before, "%s, I/O errors, threads %u",
                         img->spec->name, opts.threads);
  }
  free (buf);
}

/* Images that open must not be half-checked: each of these is refused
 * with -EINVAL and a message.
 */
static void
test_open_refusals (const struct image *img)
{
  struct {
    const char *what;
    uint64_t pos, value;
    uint64_t size;              /* 0: the image's own */
    const char *word;
  } cases[] = {
    { "bad magic", 0, UINT64_C (0x514649fa00000003), 0, "magic" },
    { "version 4", 0, UINT64_C (0x514649fb00000004), 0, "version" },
    { "backing file", 8, 512, 0, "backing" },
    { "empty file", 0, 0, 1, "small" },
    { "encrypted", 32, UINT64_C (0x0000000100000000) | img->l1_size, 0,
      "crypt" },
  };

  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    uint8_t *file = patched (img, cases[i].pos, cases[i].value);
    struct session s;
    int r;

    if (i == 2)
      put32 (file + 16, 10);           /* backing name of 10 bytes */
    r = session_open (&s, file, cases[i].size ? cases[i].size - 1
                      : img->file_size, &default_options);
    CHECK_EQ (r, -EINVAL);
    CHECK (s.img == NULL);
    CHECK_EQ (s.log.errors, 1);
    CHECK (strstr (s.log.last, cases[i].word) != NULL);
    if (r != -EINVAL || strstr (s.log.last, cases[i].word) == NULL)
      fprintf (stderr, "  %s: %d \"%s\"\n", cases[i].what, r, s.log.last);
    pthread_mutex_destroy (&s.log.lock);

    /* Without a log: the same refusal, no crash. */
    {
      struct mem_io m;
      struct qcow2_image *image = NULL;
      mem_io_init (&m, file, cases[i].size ? cases[i].size - 1
                   : img->file_size);
      in_engine_call = true;
      CHECK_EQ (qcow2_image_open (&m.io, NULL, &default_options, &image),
                -EINVAL);
      in_engine_call = false;
      CHECK (image == NULL);
    }
    free (file);
  }

  /* A good image without a log still reads, and its errors are silent. */
  {
    struct mem_io m;
    struct qcow2_image *image = NULL;
    struct qcow2_conn *conn;
    uint8_t byte;

    mem_io_init (&m, img->file, img->file_size);
    in_engine_call = true;
    CHECK_EQ (qcow2_image_open (&m.io, NULL, &default_options, &image), 0);
    if (image) {
      conn = qcow2_conn_new (image);
      CHECK (conn != NULL);
      CHECK_EQ (qcow2_read (conn, &m.io, &byte, 1, img->virtual_size),
                -EINVAL);
      CHECK_EQ (qcow2_read (conn, &m.io, &byte, 1, 0), 0);
      qcow2_conn_free (conn);
      qcow2_image_close (image);
    }
    in_engine_call = false;
  }
}

/* ------------------------------------------------------ concurrency */

struct reader_thread {
  struct session *s;
  struct qcow2_conn *conn;
  const struct image *img;
  uint64_t seed;
  unsigned reads;
};

static void *
reader_thread_main (void *arg)
{
  struct reader_thread *rt = arg;
  const struct image *img = rt->img;
  const uint64_t C = img->cluster_size;
  uint8_t *got = xmalloc (6 * C), *want = xmalloc (6 * C);

  in_engine_call = true;
  for (unsigned i = 0; i < rt->reads; ++i) {
    const struct range *pr = &img->spec->populated[i & 1];
    uint64_t span, offset;

    if (pr->end == pr->first)
      pr = &img->spec->populated[0];
    span = (pr->end - pr->first) * C;
    offset = pr->first * C + rng (&rt->seed) % span;
    if (offset >= img->virtual_size)
      offset = img->virtual_size - 1;
    uint64_t len = 1 + rng (&rt->seed) % (5 * C);
    int r;

    if (len > img->virtual_size - offset)
      len = img->virtual_size - offset;
    r = qcow2_read (rt->conn, &rt->s->mio.io, got, len, offset);
    CHECK_EQ (r, 0);
    expected_bytes (img, want, offset, len);
    if (r != 0 || memcmp (got, want, len) != 0) {
      CHECK (!"concurrent read returned wrong bytes");
      fprintf (stderr, "  (%s: %" PRIu64 " bytes at %" PRIu64 ")\n",
               img->spec->name, len, offset);
      break;
    }
    if (i % 16 == 0)
      qcow2_prefetch (rt->conn, &rt->s->mio.io, offset, len);
  }
  in_engine_call = false;
  free (got);
  free (want);
  return NULL;
}

/* Several threads read through one connection at once (the contract allows
 * it), and a second connection shares the image with the first; small caches
 * keep them evicting each other's entries.
 */
static void
test_concurrency (const struct image *img)
{
  enum { NTHREADS = 4 };
  struct qcow2_options opts = default_options;
  struct reader_thread rt[NTHREADS];
  pthread_t threads[NTHREADS];
  struct qcow2_conn *second;
  struct session s;
  int started = 0;

  opts.cluster_cache_size = 5 * img->cluster_size;
  opts.l2_cache_size = 2 * img->cluster_size;
  CHECK_EQ (session_open (&s, img->file, img->file_size, &opts), 0);
  if (s.conn == NULL)
    return;
  second = qcow2_conn_new (s.img);
  CHECK (second != NULL);
  for (int t = 0; t < NTHREADS; ++t) {
    rt[t] = (struct reader_thread) {
      .s = &s, .conn = t % 2 && second ? second : s.conn, .img = img,
      .seed = UINT64_C (0xabcdef) * (t + 1),
      .reads = img->cluster_size >= 2 * MiB ? 10 : 300,
    };
    if (pthread_create (&threads[t], NULL, reader_thread_main, &rt[t]) != 0)
      break;
    started++;
  }
  CHECK_EQ (started, NTHREADS);
  for (int t = 0; t < started; ++t)
    pthread_join (threads[t], NULL);
  CHECK_EQ (s.log.errors, 0);
  qcow2_conn_free (second);
  session_close (&s);
}

/* The image builder must have made what the tests rely on. */
static void
check_image (const struct image *img)
{
  const uint64_t C = img->cluster_size;
  unsigned counts[5] = { 0 };
  uint64_t last_end = 0, last_k = UINT64_MAX;
  bool shared_host_cluster = false;

  for (uint64_t k = 0; k < img->nclusters; ++k)
    counts[img->kind[k]]++;
  CHECK (counts[NORMAL] > 0);
  CHECK (counts[COMPRESSED] > 1);
  CHECK (counts[UNALLOC] > 0);
  if (img->spec->version == 3) {
    CHECK (counts[ZERO] > 0);
    CHECK (counts[ZERO_ALLOC] > 0);
  }
  /* The last stream's sector range runs past the end of the file, and
   * two streams start in one host cluster.
   */
  for (uint64_t k = 0; k < img->nclusters; ++k)
    if (img->kind[k] == COMPRESSED) {
      uint64_t off = img->entry[k] & ((UINT64_C (1) << (62 - (img->spec->cluster_bits - 8))) - 1);
      if (off + img->csize[k] > last_end) {
        last_end = off + img->csize[k];
        last_k = k;
      }
      for (uint64_t j = 0; j < k; ++j)
        if (img->kind[j] == COMPRESSED && img->entry[j] != img->entry[k] &&
            ((img->entry[j] & ((UINT64_C (1) << (62 - (img->spec->cluster_bits - 8))) - 1)) / C) == off / C)
          shared_host_cluster = true;
    }
  CHECK (last_k != UINT64_MAX);
  if (last_k != UINT64_MAX) {
    uint64_t off = last_end - img->csize[last_k];
    uint64_t range = ((off & 511) + img->csize[last_k] + 511) / 512 * 512
      - (off & 511);
    CHECK_EQ (last_end, img->file_size);
    CHECK (off + range > img->file_size);
  }
  if (C <= 64 * KiB)
    CHECK (shared_host_cluster);
}

int
main (void)
{
  for (size_t i = 0; i < NSPECS; ++i) {
    struct image *img = image_new (&specs[i]);
    unsigned long before = atomic_load (&unit_failures);

    check_image (img);
    test_basics (img);
    test_reads (img);
    test_extents (img);
    test_prefetch (img, 0);
    test_prefetch (img, 3);
    test_corrupt (img);
    test_io_errors (img);
    if (i == 0)
      test_open_refusals (img);
    test_concurrency (img);
    UNIT_NOTE_IF_FAILED (before, "image %s", specs[i].name);
    image_free (img);
  }
  return unit_finish ();
}
