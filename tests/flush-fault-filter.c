/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-flushfault-filter, for the tests only: fails a share of the
 * flushes of the plugin under it with EIO.  nbdkit 1.32's error filter
 * injects errors into reads, writes, zeroes, trims, extents and cache
 * requests, but not into flushes.
 *
 *   nbdkit --filter=.../nbdkit-flushfault-filter.so PLUGIN ... \
 *          flushfault-rate=30% [flushfault-file=FILE]
 *
 * flushfault-rate: the share of flushes that fail (0% to 100%), drawn
 * from a fixed-seed generator, so that a run is the same every time.
 * flushfault-file: fail flushes only while FILE exists.  Each failure
 * is logged: "flushfault: injecting EIO into flush".
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nbdkit-filter.h>

static unsigned rate_per_million;
static char *trigger_file;

static pthread_mutex_t draw_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t draw_state = 0x9e3779b97f4a7c15;

static void
flushfault_unload (void)
{
  free (trigger_file);
}

static int
flushfault_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                   const char *key, const char *value)
{
  if (strcmp (key, "flushfault-rate") == 0) {
    char *end;
    double percent = strtod (value, &end);

    if (end == value || strcmp (end, "%") != 0 || percent < 0 || percent > 100) {
      nbdkit_error ("flushfault-rate: '%s' is not a percentage from 0%% to 100%%",
                    value);
      return -1;
    }
    rate_per_million = (unsigned) (percent * 10000);
    return 0;
  }
  if (strcmp (key, "flushfault-file") == 0) {
    free (trigger_file);
    trigger_file = nbdkit_absolute_path (value);
    return trigger_file ? 0 : -1;
  }
  return next (nxdata, key, value);
}

#define flushfault_config_help \
  "flushfault-rate=N%          The share of flushes that fail with EIO.\n" \
  "flushfault-file=FILE        Fail them only while FILE exists."

/* xorshift64: a fixed sequence, so that a test run repeats. */
static bool
draw_failure (void)
{
  uint64_t x;

  if (rate_per_million == 0)
    return false;
  if (trigger_file && access (trigger_file, F_OK) != 0)
    return false;
  pthread_mutex_lock (&draw_lock);
  x = draw_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  draw_state = x;
  pthread_mutex_unlock (&draw_lock);
  return x % 1000000 < rate_per_million;
}

static int
flushfault_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  if (draw_failure ()) {
    nbdkit_error ("flushfault: injecting EIO into flush");
    *err = EIO;
    return -1;
  }
  return next->flush (next, flags, err);
}

static struct nbdkit_filter filter = {
  .name = "flushfault",
  .longname = "qcow2zstd tests: inject errors into flush",
  .unload = flushfault_unload,
  .config = flushfault_config,
  .config_help = flushfault_config_help,
  .flush = flushfault_flush,
};

NBDKIT_REGISTER_FILTER (filter)
