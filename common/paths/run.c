/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: runs of host bytes moved with one request (see
 * paths/run.h).
 */

#include <config.h>

#include "paths/run.h"

int
qcow2_run_flush (struct data_run *run)
{
  int r;

  if (run->len == 0)
    return 0;
  r = run->move (run, run->opaque);
  run->len = 0;
  return r;
}

int
qcow2_run_add (struct data_run *run, uint8_t *buf, uint64_t host,
               uint64_t len)
{
  int r;

  if (run->len && run->host + run->len == host && run->buf + run->len == buf
      && run->len + len <= run->max) {
    run->len += len;
    return 0;
  }
  r = qcow2_run_flush (run);
  run->buf = buf;
  run->host = host;
  run->len = len;
  return r;
}
