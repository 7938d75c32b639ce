/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the error convention of the leaf modules.
 *
 * A function that can fail takes a buffer ERRBUF of ERRLEN bytes and, when
 * it fails, writes one sentence there that names what is wrong (the field,
 * the key slot, the snapshot) and returns -1.  qcow2_fail does both.
 */
#ifndef QCOW2_ERRBUF_H
#define QCOW2_ERRBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline int __attribute__ ((format (printf, 3, 4)))
qcow2_fail (char *errbuf, size_t errlen, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (errbuf, errlen, fmt, ap);
  va_end (ap);
  return -1;
}

#endif /* QCOW2_ERRBUF_H */
