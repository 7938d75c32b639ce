/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: backing files (see backing.h). */

#include <config.h>

#include "qcow2.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backing.h"
#include "namedfile.h"
#include "paths/conn.h"
#include "format/endian.h"
#include "base/fileio.h"
#include "format/header.h"
#include "meta/log.h"

#define MAX_CHAIN 16

struct qcow2_backing {
  char *path;
  bool is_qcow2;
  struct qcow2_io io;
  uint64_t size;                /* raw: file size; qcow2: virtual size */
  struct qcow2_image *img;      /* qcow2 only */
  struct qcow2_conn *conn;
};

struct format_search {
  char format[32];
};

static int
find_format (void *opaque, uint32_t type, const uint8_t *data, uint32_t len)
{
  struct format_search *fs = opaque;

  if (type != QCOW2_EXT_BACKING_FORMAT)
    return 0;
  if (len >= sizeof fs->format)
    len = sizeof fs->format - 1;
  memcpy (fs->format, data, len);
  fs->format[len] = '\0';
  return 1;
}

/* How many of the LEN bytes at OFFSET of the backing disk lie inside it:
 * a backing file smaller than the image reads as zeros past its end.
 */
static uint64_t
inside (const struct qcow2_backing *b, uint64_t offset, uint64_t len)
{
  uint64_t avail = offset < b->size ? b->size - offset : 0;

  return len < avail ? len : avail;
}

static int
backing_read (struct qcow2_image *img, void *buf, uint64_t len,
              uint64_t offset)
{
  struct qcow2_backing *b = img->backing;
  uint64_t n = inside (b, offset, len);
  int r = 0;

  if (n > 0) {
    if (b->is_qcow2)
      r = qcow2_read (b->conn, &b->io, buf, n, offset);
    else {
      r = b->io.pread (b->io.opaque, buf, n, offset);
      if (r < 0)
        qcow2_error (img, "read of the backing file %s failed: %s",
                     b->path, strerror (-r));
    }
    if (r < 0)
      return r;
  }
  if (n < len)
    memset ((uint8_t *) buf + n, 0, len - n);
  return 0;
}

/* A raw backing file reports its holes, as qemu's file driver finds
 * them (SEEK_DATA and SEEK_HOLE).
 */
static int
raw_extents (struct qcow2_image *img, uint64_t offset, uint64_t len,
             qcow2_extent_fn fn, void *opaque)
{
  struct qcow2_backing *b = img->backing;
  uint64_t end = offset + len;
  int r;

  while (offset < end) {
    uint64_t n = end - offset;
    bool hole = false;

    if (b->io.block_status) {
      r = b->io.block_status (b->io.opaque, end - offset, offset, &n, &hole);
      if (r < 0) {
        qcow2_error (img, "block status of the backing file %s failed: %s",
                     b->path, strerror (-r));
        return r;
      }
      if (n == 0 || n > end - offset)
        n = end - offset;
    }
    r = fn (opaque, offset, n, hole);
    if (r != 0)
      return r;
    offset += n;
  }
  return 0;
}

static int
backing_extents (struct qcow2_image *img, uint64_t offset, uint64_t len,
                 qcow2_extent_fn fn, void *opaque)
{
  struct qcow2_backing *b = img->backing;
  uint64_t n = inside (b, offset, len);
  int r = 0;

  if (n > 0) {
    /* qcow2_extents reports all of its range (it may stop early only on
     * an error, and then the error comes back).
     */
    if (b->is_qcow2)
      r = qcow2_extents (b->conn, &b->io, offset, n, fn, opaque);
    else
      r = raw_extents (img, offset, n, fn, opaque);
    if (r != 0)
      return r;
  }
  return n < len ? fn (opaque, offset + n, len - n, true) : 0;
}

static int
note_data (void *opaque, uint64_t offset, uint64_t length, bool zero)
{
  bool *all_zero = opaque;

  *all_zero &= zero;
  return 0;
}

static int
backing_zero_fast (struct qcow2_image *img, uint64_t offset, uint64_t len,
                   bool *zero)
{
  struct qcow2_backing *b = img->backing;
  uint64_t n = inside (b, offset, len);

  *zero = true;
  if (n == 0)
    return 0;
  /* qemu's block status of a raw file, asked without wanting zeros,
   * calls every byte inside it data.
   */
  if (!b->is_qcow2) {
    *zero = false;
    return 0;
  }
  return qcow2_extents (b->conn, &b->io, offset, n, note_data, zero);
}

int
qcow2_backing_open (struct qcow2_image *img, const uint8_t *first,
                    size_t first_len)
{
  const struct qcow2_header *h = &img->header;
  struct format_search fs = { .format = "" };
  char name[1024], err[256], magic[4];
  struct qcow2_backing *b;
  int r;

  if (img->opts.backing_depth >= MAX_CHAIN) {
    qcow2_error (img, "the backing chain is more than %d images deep",
                 MAX_CHAIN);
    return -ELOOP;
  }
  memcpy (name, first + h->backing_file_offset, h->backing_file_size);
  name[h->backing_file_size] = '\0';
  if (strlen (name) != h->backing_file_size || name[0] == '\0') {
    qcow2_error (img, "backing_file_offset: the backing file name is empty "
                 "or holds a NUL byte");
    return -EINVAL;
  }
  if (qcow2_header_walk_extensions (first, first_len, h, find_format, &fs,
                                    err, sizeof err) == -1) {
    qcow2_error (img, "%s", err);
    return -EINVAL;
  }

  b = calloc (1, sizeof *b);
  if (b == NULL)
    return -ENOMEM;
  img->backing = b;
  img->read_backing = backing_read;
  img->backing_extents = backing_extents;
  img->backing_zero_fast = backing_zero_fast;
  r = qcow2_named_file_path (img, "backing file", "qcow2-backing",
                             img->opts.backing_path, name, &b->path);
  if (r < 0)
    return r;
  r = qcow2_fileio_open (b->path, false, &b->io);
  if (r < 0) {
    qcow2_error (img, "cannot open the backing file %s (named '%s' in the "
                 "image): %s", b->path, name, strerror (-r));
    return r;
  }
  r = qcow2_named_file_lock (img, "backing file", &b->io, b->path);
  if (r < 0)
    return r;

  /* The header's format extension says what the backing file is; without
   * one, look at its first bytes, as qemu does.
   */
  if (strcmp (fs.format, "qcow2") == 0)
    b->is_qcow2 = true;
  else if (strcmp (fs.format, "raw") == 0 || fs.format[0] == '\0') {
    int64_t size = b->io.size (b->io.opaque);
    b->is_qcow2 = fs.format[0] == '\0' && size >= 4 &&
      b->io.pread (b->io.opaque, magic, 4, 0) == 0 &&
      be32 (magic) == QCOW2_MAGIC;
  }
  else {
    qcow2_error (img, "backing file %s: unsupported backing format '%s' "
                 "(raw or qcow2)", b->path, fs.format);
    return -ENOTSUP;
  }

  if (b->is_qcow2) {
    struct qcow2_options opts = img->opts;
    char *slash = strrchr (b->path, '/');
    char *dir = NULL;
    struct qcow2_log log = img->log;

    if (slash && (dir = strndup (b->path, slash - b->path + (slash == b->path))) == NULL)
      return -ENOMEM;
    opts.writable = false;
    opts.compress = false;
    opts.threads = 0;
    opts.backing_path = NULL;
    /* The passphrase and the snapshot are the top image's. */
    opts.passphrase = NULL;
    opts.snapshot = NULL;
    opts.image_dir = dir ? dir : ".";
    opts.backing_depth = img->opts.backing_depth + 1;
    r = qcow2_image_open (&b->io, &log, &opts, &b->img);
    free (dir);
    if (r < 0) {
      qcow2_error (img, "cannot open the backing file %s as qcow2", b->path);
      return r;
    }
    b->img->opts.image_dir = NULL;  /* the string is gone; not needed now */
    b->conn = qcow2_conn_new (b->img);
    if (b->conn == NULL)
      return -ENOMEM;
    b->size = b->img->header.virtual_size;
  }
  else {
    int64_t size = b->io.size (b->io.opaque);
    if (size < 0)
      return (int) size;
    b->size = size;
  }
  qcow2_debug (img, "backing file %s (%s, %" PRIu64 " bytes)", b->path,
               b->is_qcow2 ? "qcow2" : "raw", b->size);
  return 0;
}

void
qcow2_backing_close (struct qcow2_image *img)
{
  struct qcow2_backing *b = img->backing;

  if (b == NULL)
    return;
  qcow2_conn_free (b->conn);
  qcow2_image_close (b->img);
  if (b->io.opaque)
    qcow2_fileio_close (&b->io);
  free (b->path);
  free (b);
  img->backing = NULL;
  img->read_backing = NULL;
  img->backing_extents = NULL;
  img->backing_zero_fast = NULL;
}

int
qcow2_image_named_files (const struct qcow2_image *img,
                         int (*fn) (void *opaque, const char *path,
                                    bool written),
                         void *opaque)
{
  int r;

  for (; img; img = img->backing ? img->backing->img : NULL) {
    if (img->data_path) {
      r = fn (opaque, img->data_path, img->opts.writable);
      if (r != 0)
        return r;
    }
    if (img->backing) {
      r = fn (opaque, img->backing->path, false);
      if (r != 0)
        return r;
    }
  }
  return 0;
}
