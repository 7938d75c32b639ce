/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the image's messages (see meta/log.h). */

#include <config.h>

#include <stdarg.h>
#include <stdio.h>

#include "meta/log.h"

static void
vlog (void (*fn) (void *, const char *), void *opaque,
      const char *fmt, va_list ap)
{
  char msg[1024];

  if (fn == NULL)
    return;
  vsnprintf (msg, sizeof msg, fmt, ap);
  fn (opaque, msg);
}

void
qcow2_error (struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vlog (img->log.error, img->log.opaque, fmt, ap);
  va_end (ap);
}

void
qcow2_warning (struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vlog (img->log.warning, img->log.opaque, fmt, ap);
  va_end (ap);
}

void
qcow2_debug (struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;

  if (img->log.debug == NULL || !(img->opts.debug & QCOW2_DEBUG_IMAGE))
    return;
  va_start (ap, fmt);
  vlog (img->log.debug, img->log.opaque, fmt, ap);
  va_end (ap);
}

void
qcow2_debug_if (struct qcow2_image *img, unsigned flag, const char *fmt, ...)
{
  va_list ap;

  if (img->log.debug == NULL || !(img->opts.debug & flag))
    return;
  va_start (ap, fmt);
  vlog (img->log.debug, img->log.opaque, fmt, ap);
  va_end (ap);
}
