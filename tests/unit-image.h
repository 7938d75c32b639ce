/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: images made by qemu, read as bytes.
 *
 * Helpers for the unit tests that take qemu-img and qemu-io as the
 * oracle: a scratch directory removed at exit, shell commands, a whole
 * file in memory, the guest-to-host mapping of a standard cluster through
 * an L1 table (enough for images the test itself wrote), and a check that
 * an error message says what it should.
 */
#ifndef QCOW2ZSTD_UNIT_IMAGE_H
#define QCOW2ZSTD_UNIT_IMAGE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qcow2-endian.h"
#include "qcow2-header.h"

static char unit_dir[4096];

static void
unit_dir_remove (void)
{
  char cmd[4200];

  if (unit_dir[0] && !getenv ("UNIT_KEEP_DIR")) {
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", unit_dir);
    if (system (cmd) != 0)
      fprintf (stderr, "could not remove %s\n", unit_dir);
  }
}

/* Make the scratch directory (under $TMPDIR); exit 1 if impossible. */
static const char *
unit_dir_make (void)
{
  const char *tmp = getenv ("TMPDIR") ? getenv ("TMPDIR") : "/tmp";

  snprintf (unit_dir, sizeof unit_dir, "%s/qcow2zstd-unit-XXXXXX", tmp);
  if (mkdtemp (unit_dir) == NULL) {
    perror ("mkdtemp");
    exit (1);
  }
  atexit (unit_dir_remove);
  return unit_dir;
}

/* Run a shell command; its exit status, or -1 if it did not exit. */
static int
unit_run (const char *fmt, ...)
{
  va_list ap;
  char *cmd;
  int status;

  va_start (ap, fmt);
  if (vasprintf (&cmd, fmt, ap) < 0) {
    perror ("vasprintf");
    exit (1);
  }
  va_end (ap);
  status = system (cmd);
  if (getenv ("UNIT_VERBOSE"))
    fprintf (stderr, "[%d] %s\n", status, cmd);
  free (cmd);
  return WIFEXITED (status) ? WEXITSTATUS (status) : -1;
}

static bool
unit_have (const char *program)
{
  return unit_run ("command -v %s >/dev/null 2>&1", program) == 0;
}

/* The whole file in a malloc'd buffer; exit 1 if unreadable. */
static uint8_t *
unit_read_file (const char *path, size_t *len)
{
  FILE *fp = fopen (path, "rb");
  uint8_t *data;
  long n;

  if (fp == NULL || fseek (fp, 0, SEEK_END) != 0 || (n = ftell (fp)) < 0) {
    perror (path);
    exit (1);
  }
  rewind (fp);
  data = malloc (n ? n : 1);
  if (data == NULL || fread (data, 1, n, fp) != (size_t) n) {
    perror (path);
    exit (1);
  }
  fclose (fp);
  *len = n;
  return data;
}

/* Host offset of the standard cluster holding GUEST through the L1 table
 * at L1_OFFSET (L1_SIZE entries) of the image IMG (LEN bytes); 0 if
 * unallocated, zero, compressed, or outside the file.
 */
static uint64_t
unit_guest_to_host (const uint8_t *img, size_t len,
                    const struct qcow2_header *h, uint64_t l1_offset,
                    uint32_t l1_size, uint64_t guest)
{
  const uint64_t offset_mask = UINT64_C (0x00fffffffffffe00);
  uint64_t l1_index = guest >> (h->cluster_bits + h->l2_bits);
  uint64_t l2_index = (guest >> h->cluster_bits) &
                      ((UINT64_C (1) << h->l2_bits) - 1);
  uint64_t l1e, l2e, l2;

  if (l1_index >= l1_size || l1_offset + (l1_index + 1) * 8 > len)
    return 0;
  l1e = be64 (img + l1_offset + l1_index * 8);
  l2 = l1e & offset_mask;
  if (l2 == 0 || l2 + (l2_index + 1) * h->l2_entry_size > len)
    return 0;
  l2e = be64 (img + l2 + l2_index * h->l2_entry_size);
  if (l2e & (UINT64_C (1) << 62) || l2e & 1)
    return 0;
  return l2e & offset_mask;
}

/* Does MESSAGE contain PART?  If not, says so on stderr, for the CHECK
 * that fails next.
 */
static bool
unit_says (const char *message, const char *part)
{
  bool found = strstr (message, part) != NULL;
  if (!found)
    fprintf (stderr, "  message \"%s\" lacks \"%s\"\n", message, part);
  return found;
}

#endif /* QCOW2ZSTD_UNIT_IMAGE_H */
