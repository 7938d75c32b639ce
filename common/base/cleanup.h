/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: scoped cleanup.
 *
 * A variable declared with one of these is released when it goes out of
 * scope, on every return path, so that a function with several ways out
 * needs no ladder of gotos.  To hand the value on instead, set the
 * variable to NULL (or, for a lock guard, leave it with
 * qcow2_guard_release) before returning.  Built on gcc's and clang's
 * cleanup attribute.
 */
#ifndef QCOW2_CLEANUP_H
#define QCOW2_CLEANUP_H

#include <stdlib.h>

#include "base/lockorder.h"

static inline void
qcow2_cleanup_free (void *ptr)
{
  free (*(void **) ptr);
}

/* free () at the end of the scope. */
#define CLEANUP_FREE __attribute__ ((cleanup (qcow2_cleanup_free)))

/* A mutex held until the end of the scope:
 *     QCOW2_GUARD guard = qcow2_guard_lock (&x->lock);
 */
struct qcow2_guard {
  struct qcow2_mutex *m;
};

static inline struct qcow2_guard
qcow2_guard_lock (struct qcow2_mutex *m)
{
  qcow2_mutex_lock (m);
  return (struct qcow2_guard) { m };
}

static inline void
qcow2_guard_release (struct qcow2_guard *g)
{
  if (g->m)
    qcow2_mutex_unlock (g->m);
  g->m = NULL;
}

#define QCOW2_GUARD \
  __attribute__ ((cleanup (qcow2_guard_release))) struct qcow2_guard

#endif /* QCOW2_CLEANUP_H */
