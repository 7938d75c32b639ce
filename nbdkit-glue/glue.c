/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: the engine's log, errors and block sizes. */

#include <config.h>

#include "nbdkit.h"
#include "glue.h"

static void
log_error (void *opaque, const char *msg)
{
  const char *subject = opaque;

  if (subject)
    nbdkit_error ("qcow2zstd: %s: %s", subject, msg);
  else
    nbdkit_error ("qcow2zstd: %s", msg);
}

/* nbdkit has no warning level: the error level is the one a user sees
 * without -v, and the word says it did not stop anything.
 */
static void
log_warning (void *opaque, const char *msg)
{
  glue_warning (opaque, msg);
}

void
glue_warning (const char *subject, const char *msg)
{
  if (subject)
    nbdkit_error ("qcow2zstd: warning: %s: %s", subject, msg);
  else
    nbdkit_error ("qcow2zstd: warning: %s", msg);
}

static void
log_debug (void *opaque, const char *msg)
{
  nbdkit_debug ("qcow2zstd: %s", msg);
}

struct qcow2_log
glue_engine_log (const char *subject)
{
  return (struct qcow2_log) {
    .opaque = (void *) subject, .error = log_error, .debug = log_debug,
    .warning = log_warning,
  };
}

int
glue_result (int r, int *err)
{
  if (r < 0) {
    *err = -r;
    return -1;
  }
  return 0;
}

void
glue_block_size (const struct qcow2_image *image, uint32_t *minimum,
                 uint32_t *preferred, uint32_t *maximum)
{
  uint32_t cluster_size = qcow2_image_header (image)->cluster_size;

  *minimum = 1;
  /* Whole clusters decode straight into the client's buffer. */
  *preferred = cluster_size > 4096 ? cluster_size : 4096;
  *maximum = 0xffffffff;
}
