/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: the qemu-style image locks (base/filelock.c).
 *
 * Open file description locks conflict between two open()s of a file
 * in one process as they do between processes, so one process can play
 * both sides.  The bytes each mode locks are compared with what qemu 7.2
 * was seen to lock (/proc/locks while qemu-nbd held an image); the
 * interplay with qemu itself is tests/test-locking.sh.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/filelock.h"
#include "unit.h"

static char dir[] = "/tmp/qcow2zstd-lock.XXXXXX";
static char path[64], link_path[64];

/* Is byte OFFSET locked by an open file description other than a fresh
 * one of our own?
 */
static bool
byte_locked (int offset)
{
  struct flock fl = {
    .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = offset, .l_len = 1,
  };
  int fd = open (path, O_RDONLY);
  bool locked;

  if (fd == -1 || fcntl (fd, F_OFD_GETLK, &fl) == -1) {
    perror ("F_OFD_GETLK");
    exit (1);
  }
  locked = fl.l_type != F_UNLCK;
  close (fd);
  return locked;
}

/* The bitmaps of held and unshared bytes now locked on the file. */
static void
locked_bytes (unsigned *held, unsigned *unshared)
{
  *held = *unshared = 0;
  for (unsigned i = 0; i < 8; ++i) {
    if (byte_locked (100 + i))
      *held |= 1u << i;
    if (byte_locked (200 + i))
      *unshared |= 1u << i;
  }
}

static int
lock (const char *p, bool writable, enum qcow2_lock_policy policy, int *fd,
      char *err, size_t errlen)
{
  uint64_t size;
  int r;

  *fd = -1;
  err[0] = '\0';
  r = qcow2_lock_open (p, fd, &size, err, errlen);
  if (r < 0)
    return r;
  CHECK_EQ (size, 1 << 20);
  r = qcow2_lock_fd (*fd, p, qcow2_lock_perms_for (writable, policy),
                     err, errlen);
  if (r < 0) {
    close (*fd);
    *fd = -1;
  }
  return r;
}

static void
test_bytes_as_qemu (void)
{
  char err[512];
  unsigned held, unshared;
  int fd;

  /* qemu-nbd: 100-101, 103 and 201, 203. */
  CHECK_EQ (lock (path, true, QCOW2_LOCK_ON, &fd, err, sizeof err), 0);
  locked_bytes (&held, &unshared);
  CHECK_EQ (held, 0x0b);
  CHECK_EQ (unshared, 0x0a);
  close (fd);
  locked_bytes (&held, &unshared);
  CHECK_EQ (held | unshared, 0);

  /* qemu-nbd -r, qemu-img info, backing files: 100 and 201, 203. */
  CHECK_EQ (lock (path, false, QCOW2_LOCK_ON, &fd, err, sizeof err), 0);
  locked_bytes (&held, &unshared);
  CHECK_EQ (held, 0x01);
  CHECK_EQ (unshared, 0x0a);
  close (fd);

  /* qemu-img -U: 100 only. */
  CHECK_EQ (lock (path, false, QCOW2_LOCK_FORCE_SHARE, &fd, err, sizeof err),
            0);
  locked_bytes (&held, &unshared);
  CHECK_EQ (held, 0x01);
  CHECK_EQ (unshared, 0);
  close (fd);

  /* Force share means nothing for a writer (the callers refuse it). */
  CHECK_EQ (lock (path, true, QCOW2_LOCK_FORCE_SHARE, &fd, err, sizeof err),
            0);
  locked_bytes (&held, &unshared);
  CHECK_EQ (held, 0x0b);
  close (fd);
}

struct pair_case {
  const char *what;
  bool first_writable;
  enum qcow2_lock_policy first_policy;
  bool second_writable;
  enum qcow2_lock_policy second_policy;
  const char *refusal;          /* NULL: the second is granted */
};

static const struct pair_case pairs[] = {
  { "writer, writer", true, QCOW2_LOCK_ON, true, QCOW2_LOCK_ON,
    "Failed to get \"write\" lock" },
  { "writer, reader", true, QCOW2_LOCK_ON, false, QCOW2_LOCK_ON,
    "Failed to get shared \"write\" lock" },
  { "reader, writer", false, QCOW2_LOCK_ON, true, QCOW2_LOCK_ON,
    "Failed to get \"write\" lock" },
  { "reader, reader", false, QCOW2_LOCK_ON, false, QCOW2_LOCK_ON, NULL },
  { "writer, force share", true, QCOW2_LOCK_ON,
    false, QCOW2_LOCK_FORCE_SHARE, NULL },
  { "force share, writer", false, QCOW2_LOCK_FORCE_SHARE,
    true, QCOW2_LOCK_ON, NULL },
  { "force share, reader", false, QCOW2_LOCK_FORCE_SHARE,
    false, QCOW2_LOCK_ON, NULL },
};

static void
test_pairs (void)
{
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; ++i) {
    const struct pair_case *c = &pairs[i];
    unsigned long before = atomic_load (&unit_failures);
    unsigned held0, unshared0, held1, unshared1;
    char err[512];
    int fd1, fd2, r;

    CHECK_EQ (lock (path, c->first_writable, c->first_policy, &fd1,
                    err, sizeof err), 0);
    locked_bytes (&held0, &unshared0);
    /* Through the symlink: the same file, another open file description. */
    r = lock (link_path, c->second_writable, c->second_policy, &fd2,
              err, sizeof err);
    if (c->refusal) {
      CHECK_EQ (r, -EAGAIN);
      CHECK_EQ (fd2, -1);
      CHECK (strstr (err, c->refusal) != NULL);
      CHECK (strstr (err, "Is another process using the image") != NULL);
      CHECK (strstr (err, link_path) != NULL);
      /* The refused opener keeps no byte. */
      locked_bytes (&held1, &unshared1);
      CHECK_EQ (held1, held0);
      CHECK_EQ (unshared1, unshared0);
      /* The probe sees the same conflict, and takes nothing either. */
      CHECK_EQ (qcow2_lock_probe (path, qcow2_lock_perms_for
                                  (c->second_writable, c->second_policy),
                                  err, sizeof err), -EAGAIN);
      CHECK (strstr (err, c->refusal) != NULL);
    }
    else {
      CHECK_EQ (r, 0);
      CHECK (fd2 >= 0);
      if (fd2 >= 0)
        close (fd2);
    }
    close (fd1);
    /* Once the first is closed the second always gets its locks. */
    CHECK_EQ (lock (path, c->second_writable, c->second_policy, &fd2,
                    err, sizeof err), 0);
    if (fd2 >= 0)
      close (fd2);
    UNIT_NOTE_IF_FAILED (before, "%s: %s", c->what, err);
  }
}

static void
test_off_and_errors (void)
{
  char err[512];
  int fd, fd2;
  unsigned held, unshared;
  struct qcow2_lock_perms off = qcow2_lock_perms_for (true, QCOW2_LOCK_OFF);

  CHECK_EQ (off.held, 0);
  CHECK_EQ (off.shared, QCOW2_PERM_ALL);
  /* Locking off takes nothing and is never refused. */
  CHECK_EQ (lock (path, true, QCOW2_LOCK_ON, &fd, err, sizeof err), 0);
  CHECK_EQ (lock (path, true, QCOW2_LOCK_OFF, &fd2, err, sizeof err), 0);
  close (fd2);
  close (fd);
  CHECK_EQ (lock (path, true, QCOW2_LOCK_OFF, &fd, err, sizeof err), 0);
  locked_bytes (&held, &unshared);
  CHECK_EQ (held | unshared, 0);
  close (fd);

  CHECK_EQ (lock ("/nonexistent/image", false, QCOW2_LOCK_ON, &fd,
                  err, sizeof err), -ENOENT);
  CHECK (strstr (err, "/nonexistent/image") != NULL);
  CHECK_EQ (lock (dir, false, QCOW2_LOCK_ON, &fd, err, sizeof err), -EINVAL);
  CHECK (strstr (err, "not a regular file") != NULL);
  CHECK_EQ (qcow2_lock_probe ("/nonexistent/image", qcow2_lock_perms_for
                              (false, QCOW2_LOCK_ON), err, sizeof err),
            -ENOENT);
  CHECK (strcmp (qcow2_lock_perm_name (QCOW2_PERM_RESIZE), "resize") == 0);
  CHECK (strcmp (qcow2_lock_perm_name (QCOW2_PERM_CONSISTENT_READ),
                 "consistent read") == 0);
}

/* A reader's locks made a writer's, in place; refused while another
 * reader shares the file, and then the reader's locks are still held.
 */
static void
test_upgrade (void)
{
  struct qcow2_lock_perms reader = qcow2_lock_perms_for (false, QCOW2_LOCK_ON);
  struct qcow2_lock_perms writer = qcow2_lock_perms_for (true, QCOW2_LOCK_ON);
  struct qcow2_lock_perms auto_writer =
    qcow2_lock_perms_for (true, QCOW2_LOCK_AUTO);
  char err[512];
  unsigned held, unshared;
  int fd, other;

  CHECK (memcmp (&writer, &reader, sizeof reader) != 0);
  CHECK (memcmp (&auto_writer, &writer, sizeof writer) == 0);
  CHECK_EQ (lock (path, false, QCOW2_LOCK_ON, &fd, err, sizeof err), 0);
  CHECK_EQ (lock (path, false, QCOW2_LOCK_ON, &other, err, sizeof err), 0);
  CHECK_EQ (qcow2_lock_upgrade (fd, path, reader, writer, err, sizeof err),
            -EAGAIN);
  CHECK (strstr (err, "Failed to get \"write\" lock") != NULL);
  close (other);
  locked_bytes (&held, &unshared);
  CHECK_EQ (held, 0x1u);
  CHECK_EQ (unshared, 0xau);
  CHECK_EQ (qcow2_lock_upgrade (fd, path, reader, writer, err, sizeof err), 0);
  locked_bytes (&held, &unshared);
  CHECK_EQ (held, 0xbu);
  CHECK_EQ (unshared, 0xau);
  CHECK_EQ (lock (path, false, QCOW2_LOCK_ON, &other, err, sizeof err),
            -EAGAIN);
  close (fd);
  CHECK (!qcow2_lock_unsupported (-EAGAIN));
  CHECK (qcow2_lock_unsupported (-ENOLCK));
}

int
main (void)
{
  int fd;

  if (mkdtemp (dir) == NULL) {
    perror ("mkdtemp");
    return 1;
  }
  snprintf (path, sizeof path, "%s/disk.qcow2", dir);
  snprintf (link_path, sizeof link_path, "%s/link.qcow2", dir);
  fd = open (path, O_WRONLY | O_CREAT, 0644);
  if (fd == -1 || ftruncate (fd, 1 << 20) == -1 ||
      symlink ("disk.qcow2", link_path) == -1) {
    perror (path);
    return 1;
  }
  close (fd);

  test_bytes_as_qemu ();
  test_pairs ();
  test_off_and_errors ();
  test_upgrade ();

  unlink (link_path);
  unlink (path);
  rmdir (dir);
  return unit_finish ();
}
