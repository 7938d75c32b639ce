/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: the engine's log, errors and block sizes in nbdkit's
 * terms, the same for the filter and the plugin.
 */
#ifndef QCOW2ZSTD_GLUE_H
#define QCOW2ZSTD_GLUE_H

#include <stdint.h>

#include "qcow2.h"

/* The engine's messages as nbdkit errors and debug lines, "qcow2zstd: "
 * first, then SUBJECT and ": " if it is not NULL (the plugin names its
 * file).  SUBJECT must outlive every image opened with the log.
 */
struct qcow2_log glue_engine_log (const char *subject);

/* An engine warning as nbdkit logs it: "qcow2zstd: warning: ", then
 * SUBJECT and ": " if it is not NULL, then MSG.
 */
void glue_warning (const char *subject, const char *msg);

/* An engine result for nbdkit: R (0 or -errno) becomes 0, or -1 with
 * *ERR set to the errno.  A filter passes its err argument, a plugin
 * &errno.
 */
int glue_result (int r, int *err);

/* What .block_size answers for IMAGE. */
void glue_block_size (const struct qcow2_image *image, uint32_t *minimum,
                      uint32_t *preferred, uint32_t *maximum);

#endif /* QCOW2ZSTD_GLUE_H */
