/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the buffers of writes in progress (see
 * paths/scratch.h).
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include "paths/scratch.h"
#include "base/lockorder.h"
#include "format/codec.h"
#include "format/crypto.h"
#include "meta/log.h"
#include "meta/crypt.h"

struct qcow2_scratch_list {
  struct qcow2_mutex lock;      /* a leaf */
  struct write_scratch *free;
  uint8_t *zeros;               /* a cluster */
};

static void
scratch_free (struct write_scratch *ws)
{
  if (ws == NULL)
    return;
  free (ws->cow[0]);
  free (ws->cow[1]);
  free (ws->compressed);
  free (ws->l2buf);
  qcow2_decoder_free (ws->dec);
  qcow2_encoder_free (ws->enc);
  qcow2_sector_cipher_free (ws->cipher);
  free (ws->sealed);
  free (ws);
}

/* The image checked at open that its key makes a cipher: a failure here
 * is memory.
 */
static int
make_cipher (struct qcow2_image *img, struct write_scratch *ws)
{
  ws->sealed = malloc (img->header.cluster_size);
  ws->cipher = qcow2_crypt_cipher_new (img);
  return ws->sealed && ws->cipher ? 0 : -ENOMEM;
}

struct write_scratch *
qcow2_scratch_get (struct qcow2_image *img)
{
  const size_t cluster_size = img->header.cluster_size;
  struct write_scratch *ws;

  qcow2_mutex_lock (&img->scratch->lock);
  ws = img->scratch->free;
  if (ws)
    img->scratch->free = ws->next_free;
  qcow2_mutex_unlock (&img->scratch->lock);
  if (ws)
    return ws;

  ws = calloc (1, sizeof *ws);
  if (ws) {
    ws->cow[0] = malloc (cluster_size);
    ws->cow[1] = malloc (cluster_size);
    ws->compressed = malloc (2 * cluster_size);
    ws->l2buf = malloc (cluster_size);
    ws->dec = qcow2_decoder_new ();
    if (ws->cow[0] && ws->cow[1] && ws->compressed && ws->l2buf && ws->dec
        && (!qcow2_image_encrypted (img) || make_cipher (img, ws) == 0))
      return ws;
  }
  scratch_free (ws);
  qcow2_error (img, "out of memory for a write");
  return NULL;
}

void
qcow2_scratch_put (struct qcow2_image *img, struct write_scratch *ws)
{
  if (ws == NULL)
    return;
  qcow2_mutex_lock (&img->scratch->lock);
  ws->next_free = img->scratch->free;
  img->scratch->free = ws;
  qcow2_mutex_unlock (&img->scratch->lock);
}

struct qcow2_encoder *
qcow2_scratch_encoder (struct qcow2_image *img, struct write_scratch *ws)
{
  if (ws->enc == NULL) {
    ws->enc = qcow2_encoder_new ();
    if (ws->enc == NULL)
      qcow2_error (img, "out of memory for compressing a write");
  }
  return ws->enc;
}

int
qcow2_scratch_open (struct qcow2_image *img)
{
  struct qcow2_scratch_list *s = calloc (1, sizeof *s);

  if (s == NULL || (s->zeros = calloc (1, img->header.cluster_size)) == NULL) {
    free (s);
    qcow2_error (img, "out of memory for the write state");
    return -ENOMEM;
  }
  qcow2_mutex_init (&s->lock, QCOW2_RANK_LEAF, "the write buffers");
  img->scratch = s;
  return 0;
}

void
qcow2_scratch_close (struct qcow2_image *img)
{
  struct qcow2_scratch_list *s = img->scratch;
  struct write_scratch *ws;

  if (s == NULL)
    return;
  while ((ws = s->free) != NULL) {
    s->free = ws->next_free;
    scratch_free (ws);
  }
  free (s->zeros);
  qcow2_mutex_destroy (&s->lock);
  free (s);
  img->scratch = NULL;
}

const uint8_t *
qcow2_scratch_zeros (const struct qcow2_image *img)
{
  return img->scratch->zeros;
}
