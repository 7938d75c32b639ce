/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: what nbdkit's own command line says, for the checks at
 * start-up that nbdkit 1.32 gives no call for (cmdline.c says how).
 */
#ifndef QCOW2ZSTD_CMDLINE_H
#define QCOW2ZSTD_CMDLINE_H

/* 1 if nbdkit was started with -r (--readonly, --read-only), 0 if not,
 * -1 if its command line cannot be read (then nobody knows until a
 * client connects).
 */
int cmdline_readonly (void);

#endif /* QCOW2ZSTD_CMDLINE_H */
