/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the external data file (see datafile.h). */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "datafile.h"
#include "namedfile.h"
#include "base/fileio.h"
#include "format/header.h"
#include "meta/log.h"

struct qcow2_data_file {
  char *path;
  struct qcow2_io io;
};

/* The data file extension's name; a longer one than qemu writes (it
 * keeps names under 1024 bytes) is taken as damage.
 */
struct name_search {
  char name[1024];
  bool found, too_long;
};

static int
find_name (void *opaque, uint32_t type, const uint8_t *data, uint32_t len)
{
  struct name_search *ns = opaque;

  if (type != QCOW2_EXT_DATA_FILE)
    return 0;
  ns->found = true;
  if (len >= sizeof ns->name) {
    ns->too_long = true;
    return 1;
  }
  memcpy (ns->name, data, len);
  ns->name[len] = '\0';
  ns->too_long = strlen (ns->name) != len;
  return 1;
}

int
qcow2_data_file_open (struct qcow2_image *img, const uint8_t *first,
                      size_t first_len)
{
  struct name_search ns = { .found = false };
  struct qcow2_data_file *d;
  char err[256];
  int64_t size;
  int r;

  if (qcow2_header_walk_extensions (first, first_len, &img->header,
                                    find_name, &ns, err, sizeof err) == -1) {
    qcow2_error (img, "%s", err);
    return -EINVAL;
  }
  if (ns.too_long || (ns.found && ns.name[0] == '\0')) {
    qcow2_error (img, "invalid or unsupported qcow2 image: the data file "
                 "name in the header is empty, too long or holds a NUL "
                 "byte");
    return -EINVAL;
  }
  if (!ns.found && img->opts.data_file_path == NULL) {
    qcow2_error (img, "invalid or unsupported qcow2 image: the image has an "
                 "external data file but its header does not name it "
                 "('data-file' is required for this image, as qemu says; "
                 "qcow2-data-file=PATH names it)");
    return -EINVAL;
  }

  d = calloc (1, sizeof *d);
  if (d == NULL) {
    qcow2_error (img, "out of memory");
    return -ENOMEM;
  }
  img->data_file = d;
  r = qcow2_named_file_path (img, "data file", "qcow2-data-file",
                             img->opts.data_file_path, ns.name, &d->path);
  if (r < 0)
    return r;
  r = qcow2_fileio_open (d->path, img->opts.writable, &d->io);
  if (r < 0) {
    qcow2_error (img, "cannot open the data file %s%s: %s", d->path,
                 img->opts.writable ? " for writing" : "", strerror (-r));
    return r;
  }
  /* Read, it is locked here as backing files are; written, it is locked
   * by the caller, as the image is (qcow2_image_named_files).
   */
  if (!img->opts.writable) {
    r = qcow2_named_file_lock (img, "data file", &d->io, d->path);
    if (r < 0)
      return r;
  }
  size = d->io.size (d->io.opaque);
  if (size < 0) {
    qcow2_error (img, "cannot get the size of the data file %s: %s",
                 d->path, strerror ((int) -size));
    return (int) size;
  }
  img->data_io = &d->io;
  img->data_size = size;
  img->data_path = d->path;
  qcow2_debug (img, "data file %s (%" PRIu64 " bytes%s)", d->path,
               img->data_size,
               img->header.autoclear_features & QCOW2_AUTOCLEAR_DATA_FILE_RAW
               ? ", data_file_raw" : "");
  return 0;
}

void
qcow2_data_file_close (struct qcow2_image *img)
{
  struct qcow2_data_file *d = img->data_file;

  if (d == NULL)
    return;
  if (d->io.opaque)
    qcow2_fileio_close (&d->io);
  free (d->path);
  free (d);
  img->data_file = NULL;
  img->data_io = NULL;
  img->data_size = 0;
  img->data_path = NULL;
}
