/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: the check counters. */
#include <config.h>

#include <string.h>

#include "unit.h"

atomic_ulong unit_checks;
atomic_ulong unit_failures;

unsigned
unit_rounds (unsigned full)
{
  const char *quick = getenv ("UNIT_QUICK");

  return quick && *quick && *quick != '0' ? 1 : full;
}

int
unit_finish (void)
{
  unsigned long checks = atomic_load (&unit_checks);
  unsigned long failures = atomic_load (&unit_failures);

  fprintf (stderr, "%lu checks, %lu failed\n", checks, failures);
  return failures ? 1 : 0;
}

void
unit_skip (void)
{
  unsigned long failures = atomic_load (&unit_failures);

  if (failures) {
    fprintf (stderr, "%lu of %lu checks failed before the skip: the test "
             "fails (a failure never ends as a skip)\n", failures,
             atomic_load (&unit_checks));
    exit (1);
  }
  fprintf (stderr, "%lu checks passed before the skip\n",
           atomic_load (&unit_checks));
  exit (77);
}

bool
unit_says (const char *message, const char *part)
{
  bool found = strstr (message, part) != NULL;

  if (!found)
    fprintf (stderr, "  message \"%s\" lacks \"%s\"\n", message, part);
  return found;
}
