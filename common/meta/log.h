/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the image's messages.
 *
 * Errors, warnings and debug lines go to the struct qcow2_log the image
 * was opened with (base/io.h): a complete sentence each, formatted here.
 * A debug line is sent only when the image's options ask for its
 * category.
 *
 * Offers: qcow2_error, qcow2_warning, qcow2_debug, qcow2_debug_if.
 * Locks: none taken; callable with any lock held, from any thread.
 * Needs: the image's log and options.
 */
#ifndef QCOW2_LOG_H
#define QCOW2_LOG_H

#include <inttypes.h>

#include "meta/image.h"

void qcow2_error (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
void qcow2_warning (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
/* A debug message of category QCOW2_DEBUG_IMAGE. */
void qcow2_debug (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
/* A debug message of category FLAG (QCOW2_DEBUG_*). */
void qcow2_debug_if (struct qcow2_image *img, unsigned flag,
                     const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));

#endif /* QCOW2_LOG_H */
