/* SPDX-License-Identifier: BSD-3-Clause */
/* asan-locale-fix.so, for the tests only: preloaded into nbdkit after
 * the ASan runtime (functions.sh, --enable-sanitizers builds), it makes
 * freelocale do nothing.
 *
 * With libasan preloaded into nbdkit (which is not built with it),
 * glibc's setlocale lock already has a negative reader count when main
 * starts (its __readers is 0xfffffff9 at __libc_start_main, 0x1 without
 * libasan).  Once anything has translated a message (strerror, %m: an
 * error message such as nbdkit's own "could not parse number: ...:
 * Numerical result out of range"), the freelocale in libp11-kit's
 * destructor waits for that lock forever and nbdkit never exits.  This
 * happens with nbdkit and its own filters alone.  Not freeing the
 * locale (at exit, with leak detection off) avoids the wait; a hang of
 * any other kind is still one.
 */

#include <config.h>

#include <locale.h>

void
freelocale (locale_t locale)
{
  (void) locale;
}
