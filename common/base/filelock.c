/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: image locking the way qemu locks image files. */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/filelock.h"

#define PERM_BITS 4

static const char *const perm_names[PERM_BITS] = {
  "consistent read", "write", "write unchanged", "resize",
};

const char *
qcow2_lock_perm_name (unsigned bit)
{
  unsigned i;

  for (i = 0; i < PERM_BITS; ++i)
    if (bit == 1u << i)
      return perm_names[i];
  return "unknown";
}

struct qcow2_lock_perms
qcow2_lock_perms_for (bool writable, enum qcow2_lock_policy policy)
{
  struct qcow2_lock_perms p = {
    .held = QCOW2_PERM_CONSISTENT_READ,
    .shared = QCOW2_PERM_CONSISTENT_READ | QCOW2_PERM_WRITE_UNCHANGED,
  };

  if (policy == QCOW2_LOCK_OFF) {
    p.held = 0;
    p.shared = QCOW2_PERM_ALL;
  }
  else if (policy == QCOW2_LOCK_FORCE_SHARE && !writable)
    p.shared = QCOW2_PERM_ALL;
  else if (writable)
    p.held |= QCOW2_PERM_WRITE | QCOW2_PERM_RESIZE;
  return p;
}

static int
set_byte (int fd, short type, int offset)
{
  struct flock fl = {
    .l_type = type, .l_whence = SEEK_SET, .l_start = offset, .l_len = 1,
  };

  return fcntl (fd, F_OFD_SETLK, &fl) == -1 ? -errno : 0;
}

/* 1 if an open file description other than FD's holds a lock on byte
 * OFFSET, 0 if none does, or -errno.
 */
static int
byte_taken (int fd, int offset)
{
  struct flock fl = {
    .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = offset, .l_len = 1,
  };

  if (fcntl (fd, F_OFD_GETLK, &fl) == -1)
    return -errno;
  return fl.l_type != F_UNLCK;
}

static void
unlock_bytes (int fd, int base, unsigned bits)
{
  unsigned i;

  for (i = 0; i < PERM_BITS; ++i)
    if (bits & (1u << i))
      set_byte (fd, F_UNLCK, base + i);
}

static void
unlock_all (int fd)
{
  struct flock fl = {
    .l_type = F_UNLCK, .l_whence = SEEK_SET,
    .l_start = QCOW2_LOCK_PERM_BASE,
    .l_len = QCOW2_LOCK_SHARED_BASE + PERM_BITS - QCOW2_LOCK_PERM_BASE,
  };

  fcntl (fd, F_OFD_SETLK, &fl);
}

static void
unsupported (char *errbuf, size_t errlen, const char *path, int err)
{
  snprintf (errbuf, errlen, "cannot lock the image %s: %s (the filesystem "
            "may not support open file description locks; "
            "qcow2-locking=auto serves it without locks where they fail "
            "so, qcow2-locking=off takes none at all)",
            path, strerror (err));
}

/* The first bit of BITS whose byte BASE + bit another open file
 * description locks: 1 and *BIT set, 0 if none, or -errno.
 */
static int
first_taken (int fd, int base, unsigned bits, unsigned *bit)
{
  unsigned i;
  int r;

  for (i = 0; i < PERM_BITS; ++i) {
    if (!(bits & (1u << i)))
      continue;
    r = byte_taken (fd, base + i);
    if (r != 0) {
      *bit = i;
      return r;
    }
  }
  return 0;
}

/* The conflict tests of qemu's raw_check_lock_bytes, in its order: the
 * permissions wanted (someone refuses to share one), then those not
 * shared (someone holds one).
 */
static int
check_conflicts (int fd, const char *path, struct qcow2_lock_perms perms,
                 char *errbuf, size_t errlen)
{
  unsigned bit;
  int r;

  r = first_taken (fd, QCOW2_LOCK_SHARED_BASE, perms.held, &bit);
  if (r == 1) {
    snprintf (errbuf, errlen, "Failed to get \"%s\" lock: %s is open "
              "elsewhere (another process or another export) and does "
              "not share \"%s\".  Is another process using the image "
              "[%s]?", perm_names[bit], path, perm_names[bit], path);
    return -EAGAIN;
  }
  if (r == 0)
    r = first_taken (fd, QCOW2_LOCK_PERM_BASE,
                     ~perms.shared & QCOW2_PERM_ALL, &bit);
  if (r == 1) {
    snprintf (errbuf, errlen, "Failed to get shared \"%s\" lock: %s "
              "is open elsewhere (another process or another export) "
              "for \"%s\".  Is another process using the image [%s]?",
              perm_names[bit], path, perm_names[bit], path);
    return -EAGAIN;
  }
  if (r < 0)
    unsupported (errbuf, errlen, path, -r);
  return r;
}

/* Take a shared lock on byte BASE + BIT for each bit of BITS. */
static int
take_bytes (int fd, const char *path, int base, unsigned bits,
            char *errbuf, size_t errlen)
{
  unsigned i;
  int r;

  for (i = 0; i < PERM_BITS; ++i) {
    if (!(bits & (1u << i)))
      continue;
    r = set_byte (fd, F_RDLCK, base + i);
    if (r == -EAGAIN || r == -EACCES) {
      /* An exclusive lock: not qemu's, but in the way all the same. */
      snprintf (errbuf, errlen, "Failed to lock byte %d of %s.  Is "
                "another process using the image [%s]?", base + i,
                path, path);
      return -EAGAIN;
    }
    if (r < 0) {
      unsupported (errbuf, errlen, path, -r);
      return r;
    }
  }
  return 0;
}

int
qcow2_lock_fd (int fd, const char *path, struct qcow2_lock_perms perms,
               char *errbuf, size_t errlen)
{
  int r;

  r = take_bytes (fd, path, QCOW2_LOCK_PERM_BASE, perms.held,
                  errbuf, errlen);
  if (r == 0)
    r = take_bytes (fd, path, QCOW2_LOCK_SHARED_BASE,
                    ~perms.shared & QCOW2_PERM_ALL, errbuf, errlen);
  if (r == 0)
    r = check_conflicts (fd, path, perms, errbuf, errlen);
  if (r < 0)
    unlock_all (fd);
  return r;
}

int
qcow2_lock_upgrade (int fd, const char *path, struct qcow2_lock_perms from,
                    struct qcow2_lock_perms to, char *errbuf, size_t errlen)
{
  unsigned held = to.held & ~from.held;
  unsigned unshared = ~to.shared & from.shared & QCOW2_PERM_ALL;
  int r;

  r = take_bytes (fd, path, QCOW2_LOCK_PERM_BASE, held, errbuf, errlen);
  if (r == 0)
    r = take_bytes (fd, path, QCOW2_LOCK_SHARED_BASE, unshared,
                    errbuf, errlen);
  if (r == 0)
    r = check_conflicts (fd, path, to, errbuf, errlen);
  if (r < 0) {
    /* Only the bytes this call took: the caller goes on holding FROM,
     * and unlock_all would leave the image unlocked under it.
     */
    unlock_bytes (fd, QCOW2_LOCK_PERM_BASE, held);
    unlock_bytes (fd, QCOW2_LOCK_SHARED_BASE, unshared);
  }
  return r;
}

bool
qcow2_lock_unsupported (int r)
{
  return r != -EAGAIN && r < 0;
}

/* Only regular files and block devices are images; opening anything
 * else (a FIFO) could block.
 */
int
qcow2_lock_open (const char *path, int *fdp, uint64_t *size,
                 char *errbuf, size_t errlen)
{
  struct stat st;
  off_t end;
  int fd, err;

  if (stat (path, &st) == -1) {
    err = errno;
    snprintf (errbuf, errlen, "%s: %s", path, strerror (err));
    return -err;
  }
  if (!S_ISREG (st.st_mode) && !S_ISBLK (st.st_mode)) {
    snprintf (errbuf, errlen, "%s: not a regular file or block device",
              path);
    return -EINVAL;
  }
  fd = open (path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd == -1 || (end = lseek (fd, 0, SEEK_END)) == -1) {
    err = errno;
    snprintf (errbuf, errlen, "cannot open %s to lock it: %s", path,
              strerror (err));
    if (fd >= 0)
      close (fd);
    return -err;
  }
  *fdp = fd;
  *size = end;
  return 0;
}

int
qcow2_lock_probe (const char *path, struct qcow2_lock_perms perms,
                  char *errbuf, size_t errlen)
{
  uint64_t size;
  int fd, r;

  r = qcow2_lock_open (path, &fd, &size, errbuf, errlen);
  if (r < 0)
    return r;
  /* This descriptor holds nothing, so every lock there is someone
   * else's.
   */
  r = check_conflicts (fd, path, perms, errbuf, errlen);
  close (fd);
  return r;
}
