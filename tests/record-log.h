/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd tests: the write log of the power-loss harness.
 *
 * The recording plugin (record-plugin.c, under the filter) and the
 * recording shim (record-shim.c, preloaded into nbdkit for the plugin
 * form) append one record per call that changes the storage, in the
 * order the calls completed; the calls are serialized, so that order is
 * the order the storage saw them.  tests/power-loss-check.py rebuilds
 * crash states from the log.  Integers are little-endian.
 *
 *   'W' u64 offset, u32 length, then LENGTH bytes   a write
 *   'F'                                             a flush that returned
 *   'T' u64 size                                    ftruncate
 *   'A' u32 mode, u64 offset, u64 length            fallocate
 *   'X' u32 length, then LENGTH bytes of text       a call the harness
 *                                                   cannot model
 */
#ifndef QCOW2ZSTD_RECORD_LOG_H
#define QCOW2ZSTD_RECORD_LOG_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static inline void
record_put_le (uint8_t *p, uint64_t v, int bytes)
{
  for (int i = 0; i < bytes; ++i)
    p[i] = v >> (8 * i);
}

/* Write all of BUF to FD, or abort: a log with a hole in it would make
 * every crash state after the hole wrong.
 */
static inline void
record_write_all (int fd, const void *buf, size_t len)
{
  const char *p = buf;

  while (len > 0) {
    ssize_t n = write (fd, p, len);
    if (n == -1 && errno == EINTR)
      continue;
    if (n <= 0)
      abort ();
    p += n;
    len -= n;
  }
}

static inline void
record_log_write (int fd, uint64_t offset, const void *data, uint32_t len)
{
  uint8_t head[13];

  head[0] = 'W';
  record_put_le (head + 1, offset, 8);
  record_put_le (head + 9, len, 4);
  record_write_all (fd, head, sizeof head);
  record_write_all (fd, data, len);
}

static inline void
record_log_flush (int fd)
{
  record_write_all (fd, "F", 1);
}

#endif /* QCOW2ZSTD_RECORD_LOG_H */
