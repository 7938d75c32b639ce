/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-noflush-filter, for the tests only: the plugin under it cannot
 * flush, and offers no FUA.  nbdkit 1.32's plugins that serve a file
 * all flush (the memory plugin too); this makes one that does not, so
 * that test-noflush.sh can see what the qcow2zstd filter offers over
 * it, and qemu can still read the file written through it.
 *
 *   nbdkit --filter=qcow2zstd --filter=.../nbdkit-noflush-filter.so file ...
 */

#include <config.h>

#include <nbdkit-filter.h>

static int
noflush_can_flush (nbdkit_next *next, void *handle)
{
  return 0;
}

static int
noflush_can_fua (nbdkit_next *next, void *handle)
{
  return NBDKIT_FUA_NONE;
}

static struct nbdkit_filter filter = {
  .name = "noflush",
  .longname = "qcow2zstd tests: a plugin that cannot flush",
  .can_flush = noflush_can_flush,
  .can_fua = noflush_can_fua,
};

NBDKIT_REGISTER_FILTER (filter)
