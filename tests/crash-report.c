/* SPDX-License-Identifier: BSD-3-Clause */
/* crash-report.so, for the tests only: preloaded into every nbdkit the
 * tests start (functions.sh), it makes a process that a crash signal
 * kills (SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE) say so on stderr
 * before it dies of it:
 *
 *   qcow2zstd tests: process 1234 killed by signal 6
 *
 * The exit status usually tells, but not always: nbdkit --run (1.32)
 * waits for its server process after the command and exits with the
 * command's status, whatever the server died of.  The handler is
 * installed only where the signal has its default action (the sanitizer
 * runtimes install their own), resets it and raises the signal again,
 * so the process still dies of it.
 */

#include <config.h>

#include <signal.h>
#include <string.h>
#include <unistd.h>

static const int crash_signals[] = { SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE };

/* Decimal digits of N at the end of BUF; returns where they start.
 * (No stdio in a signal handler.)
 */
static char *
digits (char *end, unsigned long n)
{
  do {
    *--end = '0' + n % 10;
    n /= 10;
  } while (n);
  return end;
}

static void
say_and_die (int sig)
{
  static const char head[] = "qcow2zstd tests: process ";
  static const char mid[] = " killed by signal ";
  char pid[24], num[24];
  char *p = digits (pid + sizeof pid, (unsigned long) getpid ());
  char *s = digits (num + sizeof num, (unsigned long) sig);
  ssize_t ignored;

  ignored = write (2, head, sizeof head - 1);
  ignored = write (2, p, pid + sizeof pid - p);
  ignored = write (2, mid, sizeof mid - 1);
  ignored = write (2, s, num + sizeof num - s);
  ignored = write (2, "\n", 1);
  (void) ignored;
  /* SA_RESETHAND restored the default action. */
  raise (sig);
}

__attribute__ ((constructor))
static void
install (void)
{
  size_t i;

  for (i = 0; i < sizeof crash_signals / sizeof crash_signals[0]; ++i) {
    struct sigaction old, sa;

    if (sigaction (crash_signals[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL)
      continue;
    memset (&sa, 0, sizeof sa);
    sa.sa_handler = say_and_die;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset (&sa.sa_mask);
    sigaction (crash_signals[i], &sa, NULL);
  }
}
