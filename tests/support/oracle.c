/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: qemu-img and qemu-io as the oracle. */
#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "oracle.h"
#include "format/endian.h"

static char dir[4096];

static void
dir_remove (void)
{
  char cmd[4200];

  if (dir[0] && !getenv ("UNIT_KEEP_DIR")) {
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system (cmd) != 0)
      fprintf (stderr, "could not remove %s\n", dir);
  }
}

const char *
scratch_dir_make (void)
{
  const char *tmp = getenv ("TMPDIR") ? getenv ("TMPDIR") : "/tmp";

  snprintf (dir, sizeof dir, "%s/qcow2zstd-unit-XXXXXX", tmp);
  if (mkdtemp (dir) == NULL) {
    perror ("mkdtemp");
    exit (1);
  }
  atexit (dir_remove);
  return dir;
}

const char *
scratch_dir (void)
{
  return dir;
}

int
run_command (const char *fmt, ...)
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

const char *
top_srcdir (void)
{
  const char *env = getenv ("top_srcdir");

  return env && *env ? env : QCOW2ZSTD_TOP_SRCDIR;
}

bool
have_command (const char *program)
{
  return run_command ("command -v %s >/dev/null 2>&1", program) == 0;
}

uint8_t *
read_whole_file (const char *path, size_t *len)
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

uint64_t
guest_to_host (const uint8_t *file, size_t len, const struct qcow2_header *h,
               uint64_t l1_offset, uint32_t l1_size, uint64_t guest)
{
  const uint64_t offset_mask = UINT64_C (0x00fffffffffffe00);
  uint64_t l1_index = guest >> (h->cluster_bits + h->l2_bits);
  uint64_t l2_index = (guest >> h->cluster_bits) &
                      ((UINT64_C (1) << h->l2_bits) - 1);
  uint64_t l1e, l2e, l2;

  if (l1_index >= l1_size || l1_offset + (l1_index + 1) * 8 > len)
    return 0;
  l1e = be64 (file + l1_offset + l1_index * 8);
  l2 = l1e & offset_mask;
  if (l2 == 0 || l2 + (l2_index + 1) * h->l2_entry_size > len)
    return 0;
  l2e = be64 (file + l2 + l2_index * h->l2_entry_size);
  if (l2e & (UINT64_C (1) << 62) || l2e & 1)
    return 0;
  return l2e & offset_mask;
}
