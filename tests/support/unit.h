/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: minimal assertion helpers.
 *
 * CHECK (cond) records one check and, when COND is false, prints
 * file:line and the expression, then carries on so that one run shows
 * every failure.  CHECK_EQ also prints both values.  The counters are
 * atomic because some tests check from several threads at once, and
 * shared with the helpers in tests/support, which check too.  main ends
 * with "return unit_finish ();": 0 if every check passed, 1 if not
 * (automake's convention; 77 means skipped, see UNIT_SKIP).
 */
#ifndef QCOW2ZSTD_UNIT_H
#define QCOW2ZSTD_UNIT_H

#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

extern atomic_ulong unit_checks;
extern atomic_ulong unit_failures;

#define CHECK(cond)                                                     \
  do {                                                                  \
    atomic_fetch_add (&unit_checks, 1);                                 \
    if (!(cond)) {                                                      \
      atomic_fetch_add (&unit_failures, 1);                             \
      fprintf (stderr, "%s:%d: CHECK failed: %s\n",                     \
               __FILE__, __LINE__, #cond);                              \
    }                                                                   \
  } while (0)

/* Integer equality that shows both sides when it fails. */
#define CHECK_EQ(actual, expected)                                      \
  do {                                                                  \
    intmax_t unit_actual_ = (intmax_t) (actual);                        \
    intmax_t unit_expected_ = (intmax_t) (expected);                    \
    atomic_fetch_add (&unit_checks, 1);                                 \
    if (unit_actual_ != unit_expected_) {                               \
      atomic_fetch_add (&unit_failures, 1);                             \
      fprintf (stderr, "%s:%d: CHECK failed: %s == %s "                 \
               "(%" PRIdMAX " != %" PRIdMAX ")\n",                      \
               __FILE__, __LINE__, #actual, #expected,                  \
               unit_actual_, unit_expected_);                           \
    }                                                                   \
  } while (0)

/* Context printed on stderr so that a failure inside a loop says which
 * iteration it was.  Only when something already failed: quiet runs stay
 * quiet.
 */
#define UNIT_NOTE_IF_FAILED(before, ...)                                \
  do {                                                                  \
    if (atomic_load (&unit_failures) != (before)) {                     \
      fprintf (stderr, "  (while: ");                                   \
      fprintf (stderr, __VA_ARGS__);                                    \
      fprintf (stderr, ")\n");                                          \
    }                                                                   \
  } while (0)

/* Exit now with automake's "skipped" status, saying why, unless a check
 * failed already: then the test fails (exit 1), because a failure that
 * ends as a skip is never seen (make check and CI count skips as fine).
 */
#define UNIT_SKIP(...)                                                  \
  do {                                                                  \
    fprintf (stderr, "SKIP: ");                                         \
    fprintf (stderr, __VA_ARGS__);                                      \
    fprintf (stderr, "\n");                                             \
    unit_skip ();                                                       \
  } while (0)

/* The exit of UNIT_SKIP: 77, or 1 after a failed check. */
_Noreturn void unit_skip (void);

int unit_finish (void);

/* How many rounds of a randomized test to run: FULL, or 1 when the
 * environment sets UNIT_QUICK (make check-tsan does: the code runs some
 * twenty times slower under ThreadSanitizer, which is there for the
 * threads, while the full rounds run in the other builds).
 */
unsigned unit_rounds (unsigned full);
/* Does MESSAGE contain PART?  If not, says so on stderr, for the CHECK
 * that fails next: CHECK (unit_says (err, "wrong passphrase")).
 */
bool unit_says (const char *message, const char *part);

#endif /* QCOW2ZSTD_UNIT_H */
