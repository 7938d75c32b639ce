/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the L2 tables held in memory for change (see
 * meta/dirty.h).
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/log.h"
#include "base/tablemap.h"
#include "meta/dirty.h"
#include "base/check.h"
#include "meta/hostio.h"

struct qcow2_dirty {
  struct tablemap tables;
};

int
qcow2_dirty_open (struct qcow2_image *img)
{
  img->dirty = calloc (1, sizeof *img->dirty);
  if (img->dirty == NULL) {
    qcow2_error (img, "out of memory for the write state");
    return -ENOMEM;
  }
  return 0;
}

void
qcow2_dirty_close (struct qcow2_image *img)
{
  if (img->dirty == NULL)
    return;
  tablemap_clear (&img->dirty->tables);
  free (img->dirty);
  img->dirty = NULL;
}

struct meta_table *
qcow2_dirty_table (const struct qcow2_image *img, uint64_t offset)
{
  if (img->dirty == NULL || img->dirty->tables.count == 0)
    return NULL;
  return tablemap_find (&img->dirty->tables, offset);
}

int
qcow2_dirty_add (struct qcow2_image *img, uint64_t offset,
                 const uint8_t *content, bool changed,
                 struct meta_table **out)
{
  const uint32_t cluster_size = img->header.cluster_size;
  struct meta_table *t = malloc (sizeof *t + cluster_size);

  QCOW2_ASSERT (tablemap_find (&img->dirty->tables, offset) == NULL);
  if (t == NULL)
    goto nomem;
  t->offset = offset;
  t->dirty = changed;
  if (content)
    memcpy (t->data, content, cluster_size);
  else
    memset (t->data, 0, cluster_size);
  if (tablemap_insert (&img->dirty->tables, t) == -1) {
    free (t);
    goto nomem;
  }
  *out = t;
  return 0;

 nomem:
  qcow2_error (img, "out of memory for an L2 table");
  return -ENOMEM;
}

void
qcow2_dirty_drop (struct qcow2_image *img, uint64_t offset)
{
  free (tablemap_remove (&img->dirty->tables, offset));
}

size_t
qcow2_dirty_count (const struct qcow2_image *img)
{
  return img->dirty ? img->dirty->tables.count : 0;
}

struct copy_ctx {
  struct dirty_copy *copy;
  size_t capacity;
  size_t cluster_size;
};

static int
count_changed (void *opaque, struct meta_table *t)
{
  size_t *n = opaque;

  *n += t->dirty;
  return 0;
}

static int
copy_one (void *opaque, struct meta_table *t)
{
  struct copy_ctx *c = opaque;
  struct dirty_copy *copy = c->copy;

  if (!t->dirty || copy->count == c->capacity)
    return 0;
  memcpy (copy->data + copy->count * c->cluster_size, t->data,
          c->cluster_size);
  copy->tables[copy->count++] = t;
  t->dirty = false;
  return 0;
}

int
qcow2_dirty_copy (struct qcow2_image *img, struct dirty_copy *copy)
{
  struct copy_ctx c = {
    .copy = copy, .cluster_size = img->header.cluster_size,
  };
  size_t n = 0;

  memset (copy, 0, sizeof *copy);
  if (img->dirty == NULL)
    return 0;
  tablemap_each (&img->dirty->tables, count_changed, &n);
  if (n == 0)
    return 0;
  copy->tables = malloc (n * sizeof *copy->tables);
  copy->data = malloc (n * c.cluster_size);
  if (copy->tables == NULL || copy->data == NULL) {
    free (copy->tables);
    free (copy->data);
    memset (copy, 0, sizeof *copy);
    qcow2_error (img, "out of memory writing the metadata back");
    return -ENOMEM;
  }
  c.capacity = n;
  tablemap_each (&img->dirty->tables, copy_one, &c);
  return 0;
}

int
qcow2_dirty_copy_write (struct qcow2_image *img, struct qcow2_io *io,
                        const struct dirty_copy *copy)
{
  const size_t cluster_size = img->header.cluster_size;
  size_t i;
  int r;

  for (i = 0; i < copy->count; ++i) {
    r = qcow2_pwrite_meta (img, io, QCOW2_REGION_L2,
                           copy->data + i * cluster_size, cluster_size,
                           copy->tables[i]->offset);
    if (r < 0)
      return r;
  }
  return 0;
}

void
qcow2_dirty_copy_done (struct qcow2_image *img, struct dirty_copy *copy,
                       bool written,
                       void (*clean) (struct qcow2_image *img,
                                      uint64_t offset, const uint8_t *data))
{
  struct tablemap *tables = &img->dirty->tables;
  size_t i;

  if (!written)
    for (i = 0; i < copy->count; ++i)
      copy->tables[i]->dirty = true;
  else
    for (i = 0; i < tables->capacity; ) {
      struct meta_table *t = tables->slots[i];
      if (t && !t->dirty) {
        clean (img, t->offset, t->data);
        free (tablemap_remove (tables, t->offset));
        continue;             /* the removal may have moved another here */
      }
      i++;
    }
  free (copy->tables);
  free (copy->data);
  memset (copy, 0, sizeof *copy);
}
