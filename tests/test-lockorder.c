/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: the lock order and its check (base/lockorder.h).
 *
 * In every build: locks taken down the order, a lock tried while one of
 * a higher rank is held, and a lock that is only ever tried held while
 * the image lock is taken, all go through.  In a debug build
 * (--enable-debug), each break of the order, run in a child process,
 * aborts it with a message naming the lock: a lock of a lower or the
 * same rank taken while a higher one is held, a lock taken twice,
 * waiting for a lock that is only ever tried, a caller's contract of
 * holding a lock exclusively broken, and an engine invariant
 * (QCOW2_ASSERT) broken.  Without --enable-debug the checks are not
 * built (and the breaks would deadlock for real): only the first part
 * runs, and the test says so.
 */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/check.h"
#include "base/lockorder.h"
#include "unit.h"

static struct qcow2_mutex writeback, dedup, cache, tried;
static struct qcow2_rwlock image;

/* Run FN in a child, its stderr into a pipe.  In a debug build it must
 * abort, saying SAYS; otherwise it must exit 0.
 */
static void
expect_break (const char *what, void (*fn) (void), const char *says)
{
  char out[4096] = "";
  int fds[2], status;
  ssize_t n, got = 0;
  pid_t pid;

#ifndef QCOW2_DEBUG
  printf ("not run: %s (the order is checked in --enable-debug builds)\n",
          what);
  return;
#endif
  if (pipe (fds) == -1) {
    perror ("pipe");
    exit (1);
  }
  pid = fork ();
  if (pid == 0) {
    dup2 (fds[1], 2);
    close (fds[0]);
    fn ();
    _exit (0);
  }
  close (fds[1]);
  while ((n = read (fds[0], out + got, sizeof out - 1 - got)) > 0)
    got += n;
  out[got] = '\0';
  close (fds[0]);
  CHECK (waitpid (pid, &status, 0) == pid);
  CHECK (WIFSIGNALED (status) && WTERMSIG (status) == SIGABRT);
  CHECK (strstr (out, says) != NULL);
  printf ("ok: %s aborts: %s", what, out);
  if (!strstr (out, says))
    fprintf (stderr, "(%s said: %s)\n", what, out);
}

static void
upward (void)
{
  qcow2_rwlock_rdlock (&image);
  qcow2_mutex_lock (&writeback);
}

static void
same_rank (void)
{
  qcow2_mutex_lock (&cache);
  qcow2_mutex_lock (&cache);
}

static void
wait_for_tried (void)
{
  qcow2_mutex_lock (&tried);
}

static void
not_exclusive (void)
{
  qcow2_rwlock_rdlock (&image);
  qcow2_rwlock_assert_held (&image, true);
  qcow2_rwlock_unlock (&image);
}

/* Read only by QCOW2_ASSERT, which only --enable-debug builds keep. */
static volatile int zero __attribute__ ((unused));

static void
invariant (void)
{
  QCOW2_ASSERT (zero == 1);
}

int
main (void)
{
  qcow2_mutex_init (&writeback, QCOW2_RANK_WRITEBACK, "writeback");
  qcow2_rwlock_init (&image, QCOW2_RANK_IMAGE, "image");
  qcow2_mutex_init (&dedup, QCOW2_RANK_DEDUP, "dedup");
  qcow2_mutex_init (&cache, QCOW2_RANK_CACHE, "cache");
  qcow2_mutex_init (&tried, QCOW2_RANK_TRIED_ONLY, "tried");

  /* Down the order, and back. */
  qcow2_mutex_lock (&writeback);
  qcow2_rwlock_wrlock (&image);
  qcow2_rwlock_assert_held (&image, true);
  qcow2_mutex_lock (&dedup);
  qcow2_mutex_lock (&cache);
  qcow2_mutex_unlock (&cache);
  qcow2_mutex_unlock (&dedup);
  qcow2_rwlock_unlock (&image);
  /* A try may go against the order: it cannot wait. */
  qcow2_mutex_lock (&cache);
  CHECK (qcow2_mutex_trylock (&dedup));
  qcow2_mutex_unlock (&dedup);
  qcow2_mutex_unlock (&cache);
  qcow2_mutex_unlock (&writeback);
  /* A lock only ever tried orders nothing while held. */
  CHECK (qcow2_mutex_trylock (&tried));
  qcow2_rwlock_rdlock (&image);
  CHECK (!qcow2_mutex_trylock (&tried));
  qcow2_rwlock_unlock (&image);
  qcow2_mutex_unlock (&tried);
  printf ("ok: locks down the order, tries and a tried-only lock\n");

  expect_break ("the writeback lock taken under the image lock", upward,
                "lock order broken: taking writeback");
  expect_break ("a cache shard taken twice", same_rank,
                "lock order broken: taking again cache");
  expect_break ("waiting for a lock only ever tried", wait_for_tried,
                "only ever tried: tried");
  expect_break ("the image lock held shared where the contract says "
                "exclusively", not_exclusive, "not holding exclusively image");
  expect_break ("a broken invariant", invariant,
                "invariant broken: zero == 1");
  return unit_finish ();
}
