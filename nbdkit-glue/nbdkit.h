/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: the nbdkit declarations the shared glue uses.
 *
 * The glue is built once and linked into both the filter and the plugin,
 * so it may only use what nbdkit declares for both: nbdkit-common.h
 * (nbdkit_error, nbdkit_debug, nbdkit_parse_*, nbdkit_add_extent, ...).
 * That header refuses to be included on its own; the plugin header is
 * the smaller of the two that include it, and nothing of it beyond
 * nbdkit-common.h is used here.
 */
#ifndef QCOW2ZSTD_GLUE_NBDKIT_H
#define QCOW2ZSTD_GLUE_NBDKIT_H

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#endif /* QCOW2ZSTD_GLUE_NBDKIT_H */
