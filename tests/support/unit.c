/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: the check counters. */
#include <config.h>

#include "unit.h"

atomic_ulong unit_checks;
atomic_ulong unit_failures;

int
unit_finish (void)
{
  unsigned long checks = atomic_load (&unit_checks);
  unsigned long failures = atomic_load (&unit_failures);

  fprintf (stderr, "%lu checks, %lu failed\n", checks, failures);
  return failures ? 1 : 0;
}
