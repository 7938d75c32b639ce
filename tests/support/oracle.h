/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: qemu-img and qemu-io as the oracle.
 *
 * What the C tests that run qemu's tools share: a scratch directory
 * removed at exit, shell commands, a whole file in memory, and the
 * host offset of a guest cluster found by walking an image's L1 and L2
 * tables in its bytes (enough for images the test itself wrote).
 */
#ifndef QCOW2ZSTD_TEST_ORACLE_H
#define QCOW2ZSTD_TEST_ORACLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/header.h"

/* Make the scratch directory (under $TMPDIR), removed at exit unless
 * UNIT_KEEP_DIR is set; exit 1 if impossible.  Returns its path, which
 * scratch_dir () returns afterwards too.
 */
const char *scratch_dir_make (void);
const char *scratch_dir (void);

/* Run a shell command; its exit status, or -1 if it did not exit.
 * UNIT_VERBOSE shows each command and its status.
 */
int run_command (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));

/* The source tree, for the tests' scripts: $top_srcdir (make check sets
 * it), else the one this was built from.
 */
const char *top_srcdir (void);

/* Is PROGRAM on the PATH? */
bool have_command (const char *program);

/* The whole file in a malloc'd buffer; exit 1 if unreadable. */
uint8_t *read_whole_file (const char *path, size_t *len);

/* Host offset of the standard cluster holding GUEST through the L1 table
 * at L1_OFFSET (L1_SIZE entries) of the image FILE (LEN bytes, header H);
 * 0 if unallocated, zero, compressed, or outside the file.
 */
uint64_t guest_to_host (const uint8_t *file, size_t len,
                        const struct qcow2_header *h, uint64_t l1_offset,
                        uint32_t l1_size, uint64_t guest);

#endif /* QCOW2ZSTD_TEST_ORACLE_H */
