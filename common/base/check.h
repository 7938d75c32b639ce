/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: invariants checked where they hold.
 *
 * QCOW2_ASSERT (COND) states something the code around it relies on
 * (a caller's contract, a count that cannot go below zero, a table that
 * must be there).  Built with --enable-debug it aborts at once, naming
 * the file, the line and the condition, so that a broken invariant shows
 * where it broke rather than as an error far from it; otherwise it
 * compiles to nothing and COND is not evaluated, so COND must have no
 * side effect.  Input from the image or the client is never asserted: it
 * is checked, and refused with a message.
 */
#ifndef QCOW2_CHECK_H
#define QCOW2_CHECK_H

#ifdef QCOW2_DEBUG
#include <stdio.h>
#include <stdlib.h>

#define QCOW2_ASSERT(cond)                                              \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf (stderr, "qcow2zstd: %s:%d: %s: invariant broken: %s\n",  \
               __FILE__, __LINE__, __func__, #cond);                    \
      abort ();                                                         \
    }                                                                   \
  } while (0)
#else
#define QCOW2_ASSERT(cond) do { } while (0)
#endif

#endif /* QCOW2_CHECK_H */
