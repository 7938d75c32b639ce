/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the buffers of writes in progress (see
 * paths/scratch.h).
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "paths/scratch.h"
#include "format/codec.h"
#include "format/crypto.h"
#include "meta/hostio.h"

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
  char err[256];

  ws->sealed = malloc (img->header.cluster_size);
  ws->cipher = qcow2_sector_cipher_new (&img->crypt.spec,
                                        img->crypt.master_key,
                                        err, sizeof err);
  return ws->sealed && ws->cipher ? 0 : -ENOMEM;
}

struct write_scratch *
qcow2_scratch_get (struct qcow2_image *img)
{
  const size_t cluster_size = img->header.cluster_size;
  struct write_scratch *ws;

  pthread_mutex_lock (&img->scratch_lock);
  ws = img->free_scratch;
  if (ws)
    img->free_scratch = ws->next_free;
  pthread_mutex_unlock (&img->scratch_lock);
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
        && (!img->crypt.enabled || make_cipher (img, ws) == 0))
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
  pthread_mutex_lock (&img->scratch_lock);
  ws->next_free = img->free_scratch;
  img->free_scratch = ws;
  pthread_mutex_unlock (&img->scratch_lock);
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

void
qcow2_scratch_free_all (struct qcow2_image *img)
{
  struct write_scratch *ws;

  while ((ws = img->free_scratch) != NULL) {
    img->free_scratch = ws->next_free;
    scratch_free (ws);
  }
}
