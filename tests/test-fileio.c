/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: the file the plugin form serves (base/fileio.c)
 * reaches the disk when it is flushed.
 *
 * The engine is driven over a real file as the plugin drives it (a
 * growable image made by qcow2_create, written, flushed): every flush
 * must end with fdatasync on that file after the last write to it, a
 * FUA write too, and a failing fdatasync must fail the flush with its
 * errno.  test-power-loss sees the same from crash states (a flush the
 * plugin does not sync loses data there); this counts the calls.
 *
 * The calls are counted by this program's own fdatasync, fsync and
 * pwrite, which take the place of libc's for the engine linked into it
 * and pass each call on to the kernel (syscall (2)).
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "qcow2.h"
#include "base/fileio.h"
#include "lock-watch.h"
#include "meta/image.h"
#include "oracle.h"
#include "session.h"
#include "unit.h"
#include "util.h"

/* The file under test, and what was done to it, in order. */
static int watched_fd = -1;
static atomic_ulong syncs, writes;
static atomic_ulong write_after_sync;   /* writes since the last sync */
static atomic_int fail_syncs;           /* errno for the next syncs, or 0 */

static int
counted_sync (int fd, long nr)
{
  if (fd == watched_fd) {
    int e = atomic_load (&fail_syncs);
    if (e) {
      errno = e;
      return -1;
    }
    atomic_fetch_add (&syncs, 1);
    atomic_store (&write_after_sync, 0);
  }
  return syscall (nr, fd);
}

int
fdatasync (int fd)
{
  return counted_sync (fd, SYS_fdatasync);
}

int
fsync (int fd)
{
  return counted_sync (fd, SYS_fsync);
}

ssize_t
pwrite (int fd, const void *buf, size_t count, off_t offset)
{
  if (fd == watched_fd) {
    atomic_fetch_add (&writes, 1);
    atomic_fetch_add (&write_after_sync, 1);
  }
  return syscall (SYS_pwrite64, fd, buf, count, offset);
}

/* An empty file NAME in the scratch directory (its path in PATH, of
 * PATH_LEN bytes), opened for writing as the plugin form opens its file.
 */
static void
new_file (char *path, size_t path_len, const char *name, struct qcow2_io *io)
{
  int fd;

  snprintf (path, path_len, "%s/%s", scratch_dir (), name);
  fd = open (path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  CHECK (fd >= 0);
  if (fd >= 0)
    close (fd);
  CHECK_EQ (qcow2_fileio_open (path, true, io), 0);
}

/* qcow2-create on IO as the plugin form runs it (an 8 MiB disk of 64 KiB
 * clusters, OPTS made writable and growable), into S with a connection:
 * false, with the check failed, if not.
 */
static bool
create_image (struct qcow2_io *io, struct qcow2_options *opts,
              struct session *s)
{
  const struct qcow2_create_options c = {
    .virtual_size = 8 * MiB, .cluster_bits = 16,
    .compression_type = QCOW2_COMPRESSION_ZLIB,
  };
  int r;

  opts->writable = true;
  opts->growable = true;
  memset (s, 0, sizeof *s);
  session_log_init (s);
  r = qcow2_create (io, &s->qlog, &c, opts, &s->img);
  CHECK_EQ (r, 0);
  if (r == 0)
    s->conn = qcow2_conn_new (s->img);
  CHECK (s->conn != NULL);
  return s->conn != NULL;
}

/* Close S's connection and image, for qemu to look at the file. */
static void
close_image (struct session *s)
{
  mem_io_engine_call = true;
  qcow2_conn_free (s->conn);
  s->conn = NULL;
  qcow2_image_close (s->img);
  s->img = NULL;
  mem_io_engine_call = false;
}

static void
test_flushes_sync (void)
{
  char path[4200];
  struct qcow2_io io;
  struct qcow2_options opts = default_options;
  struct session s;
  uint8_t *buf = xmalloc (256 * KiB);
  unsigned long before;
  int r;

  new_file (path, sizeof path, "image.qcow2", &io);
  watched_fd = qcow2_fileio_fd (&io);
  mem_io_engine_call = true;
  if (!create_image (&io, &opts, &s))
    goto out;
  /* qcow2-create made its tables and header durable. */
  CHECK (atomic_load (&syncs) >= 2);
  CHECK_EQ (atomic_load (&write_after_sync), 0);

  /* Writes, then a flush: it ends with a sync after every write. */
  fill_pattern (buf, 256 * KiB, 7);
  CHECK_EQ (qcow2_write (s.conn, &io, buf, 256 * KiB, 1 * MiB, false), 0);
  CHECK_EQ (qcow2_write (s.conn, &io, buf, 4 * KiB, 5 * MiB + 512, false), 0);
  CHECK (atomic_load (&write_after_sync) > 0);
  before = atomic_load (&syncs);
  CHECK_EQ (qcow2_flush (s.img, &io), 0);
  CHECK (atomic_load (&syncs) > before);
  CHECK_EQ (atomic_load (&write_after_sync), 0);

  /* An overwrite in place with FUA: synced before it returns. */
  before = atomic_load (&syncs);
  CHECK_EQ (qcow2_write (s.conn, &io, buf + 512, 4096, 1 * MiB, true), 0);
  CHECK (atomic_load (&syncs) > before);
  CHECK_EQ (atomic_load (&write_after_sync), 0);

  /* A new cluster with FUA: its metadata too. */
  before = atomic_load (&syncs);
  CHECK_EQ (qcow2_write (s.conn, &io, buf, 64 * KiB, 7 * MiB, true), 0);
  CHECK (atomic_load (&syncs) > before);
  CHECK_EQ (atomic_load (&write_after_sync), 0);

  /* A sync that fails fails the flush with its errno, and the next
   * flush, once the file recovers, syncs what the failed one left.
   */
  CHECK_EQ (qcow2_write (s.conn, &io, buf, 64 * KiB, 3 * MiB, false), 0);
  atomic_store (&fail_syncs, EIO);
  CHECK_EQ (qcow2_flush (s.img, &io), -EIO);
  atomic_store (&fail_syncs, 0);
  before = atomic_load (&syncs);
  CHECK_EQ (qcow2_flush (s.img, &io), 0);
  CHECK (atomic_load (&syncs) > before);
  CHECK_EQ (atomic_load (&write_after_sync), 0);
  mem_io_engine_call = false;

  /* And qemu reads what was written. */
  close_image (&s);
  r = run_command ("qemu-img check -q '%s'", path);
  CHECK (r == 0 || r == 3);             /* leaks after the failed sync */
  CHECK_EQ (run_command ("qemu-io -r -f qcow2 -c 'read -P 0x%02x 7340032 1' "
                         "'%s' > /dev/null", buf[0], path), 0);

 out:
  close_image (&s);
  watched_fd = -1;
  qcow2_fileio_close (&io);
  CHECK (s.log.errors >= 1);            /* the failed sync was said */
  free (buf);
}

/* The file's free tail is cut with no image lock held, as the discards
 * are (meta/release.h): written clusters at the end of a growable image,
 * trimmed with qcow2-discard=unmap, leave the file shorter after the
 * writebacks, and no storage call was made with the image lock held
 * exclusively (tests/support/lock-watch.h).  qemu reads the image.
 */
static void
test_tail_cut_unlocked (void)
{
  char path[4200];
  struct qcow2_io io;
  struct qcow2_options opts = default_options;
  struct lock_watch w;
  struct session s;
  uint8_t *buf = xmalloc (2 * MiB);
  struct stat st;
  off_t written;

  new_file (path, sizeof path, "tail.qcow2", &io);
  opts.discard = QCOW2_DISCARD_UNMAP;
  mem_io_engine_call = true;
  if (!create_image (&io, &opts, &s))
    goto out;
  fill_pattern (buf, 2 * MiB, 9);
  CHECK_EQ (qcow2_write (s.conn, &io, buf, 1 * MiB, 0, false), 0);
  CHECK_EQ (qcow2_write (s.conn, &io, buf, 2 * MiB, 4 * MiB, false), 0);
  CHECK_EQ (qcow2_flush (s.img, &io), 0);
  CHECK_EQ (fstat (qcow2_fileio_fd (&io), &st), 0);
  written = st.st_size;

  lock_watch_install (&w, &io, &s.img->lock.l);
  CHECK_EQ (qcow2_trim (s.img, &io, 2 * MiB, 4 * MiB, false), 0);
  CHECK_EQ (qcow2_flush (s.img, &io), 0);
  CHECK_EQ (qcow2_flush (s.img, &io), 0);
  CHECK (atomic_load (&w.calls[WATCH_TRUNCATE]) > 0);
  if (lock_watch_exclusive (&w))
    lock_watch_report (&w, "test_tail_cut_unlocked");
  CHECK_EQ (lock_watch_exclusive (&w), 0);
  lock_watch_remove (&w);
  CHECK_EQ (fstat (qcow2_fileio_fd (&io), &st), 0);
  CHECK (st.st_size <= written - 2 * (off_t) MiB);

  /* Written again after the cut: the file grows back. */
  CHECK_EQ (qcow2_write (s.conn, &io, buf, 1 * MiB, 6 * MiB, false), 0);
  CHECK_EQ (qcow2_flush (s.img, &io), 0);
  close_image (&s);
  CHECK_EQ (run_command ("qemu-img check -q '%s'", path), 0);
  CHECK_EQ (run_command ("qemu-io -r -f qcow2 -c 'read -P 0 4M 2M' "
                         "-c 'read -P 0x%02x 6M 1' '%s' > /dev/null",
                         buf[0], path), 0);

 out:
  mem_io_engine_call = false;
  close_image (&s);
  qcow2_fileio_close (&io);
  CHECK_EQ (s.log.errors, 0);
  free (buf);
}

/* A write that needs new clusters while the free tail is being cut
 * waits for the cut, and lands after it: a file of the plugin form,
 * whose truncate is held until the writer has either finished (it must
 * not have) or waited a while.
 */
struct held_cut {
  struct qcow2_io under;
  struct qcow2_conn *conn;
  struct qcow2_io *io;
  const uint8_t *buf;
  pthread_t writer;
  bool started;
  atomic_bool written;
  int write_result;
};

static void *
write_during_cut (void *arg)
{
  struct held_cut *h = arg;

  h->write_result = qcow2_write (h->conn, h->io, h->buf, 1 * MiB, 7 * MiB,
                                 false);
  atomic_store (&h->written, true);
  return NULL;
}

static int
held_truncate (void *opaque, uint64_t size)
{
  struct held_cut *h = opaque;

  if (!h->started) {
    h->started = true;
    CHECK_EQ (pthread_create (&h->writer, NULL, write_during_cut, h), 0);
    /* A writer let through finishes at once; one held back waits for the
     * writeback that cuts, which waits here.
     */
    for (int ms = 0; ms < 300 && !atomic_load (&h->written); ++ms)
      usleep (1000);
    CHECK (!atomic_load (&h->written));
  }
  return h->under.truncate (h->under.opaque, size);
}

static int
held_pread (void *opaque, void *buf, size_t count, uint64_t offset)
{
  struct held_cut *h = opaque;
  return h->under.pread (h->under.opaque, buf, count, offset);
}

static int
held_pwrite (void *opaque, const void *buf, size_t count, uint64_t offset)
{
  struct held_cut *h = opaque;
  return h->under.pwrite (h->under.opaque, buf, count, offset);
}

static int
held_flush (void *opaque)
{
  struct held_cut *h = opaque;
  return h->under.flush (h->under.opaque);
}

static int64_t
held_size (void *opaque)
{
  struct held_cut *h = opaque;
  return h->under.size (h->under.opaque);
}

static int
held_discard (void *opaque, uint64_t count, uint64_t offset)
{
  struct held_cut *h = opaque;
  return h->under.discard (h->under.opaque, count, offset);
}

static void
test_write_during_cut (void)
{
  char path[4200];
  struct qcow2_io file_io, io;
  struct qcow2_options opts = default_options;
  struct held_cut h = { .started = false };
  struct session s;
  uint8_t *buf = xmalloc (2 * MiB), *back = xmalloc (1 * MiB);

  new_file (path, sizeof path, "cut.qcow2", &file_io);
  h.under = file_io;
  io = (struct qcow2_io) {
    .opaque = &h, .pread = held_pread, .pwrite = held_pwrite,
    .flush = held_flush, .size = held_size,
    .discard = file_io.discard ? held_discard : NULL,
    .truncate = held_truncate,
  };
  opts.discard = QCOW2_DISCARD_UNMAP;
  if (!create_image (&io, &opts, &s))
    goto out;
  h.conn = qcow2_conn_new (s.img);
  CHECK (h.conn != NULL);
  if (h.conn == NULL)
    goto out;
  fill_pattern (buf, 2 * MiB, 11);
  h.io = &io;
  h.buf = buf + 512;
  CHECK_EQ (qcow2_write (s.conn, &io, buf, 1 * MiB, 0, false), 0);
  CHECK_EQ (qcow2_write (s.conn, &io, buf, 2 * MiB, 4 * MiB, false), 0);
  CHECK_EQ (qcow2_flush (s.img, &io), 0);
  CHECK_EQ (qcow2_trim (s.img, &io, 2 * MiB, 4 * MiB, false), 0);
  CHECK_EQ (qcow2_flush (s.img, &io), 0);
  CHECK_EQ (qcow2_flush (s.img, &io), 0);
  CHECK (h.started);
  if (h.started)
    CHECK_EQ (pthread_join (h.writer, NULL), 0);
  CHECK_EQ (h.write_result, 0);
  CHECK_EQ (qcow2_flush (s.img, &io), 0);
  CHECK_EQ (qcow2_read (s.conn, &io, back, 1 * MiB, 7 * MiB), 0);
  CHECK (memcmp (back, buf + 512, 1 * MiB) == 0);
  qcow2_conn_free (h.conn);
  h.conn = NULL;
  qcow2_conn_free (s.conn);
  s.conn = NULL;
  qcow2_image_close (s.img);
  s.img = NULL;
  CHECK_EQ (run_command ("qemu-img check -q '%s'", path), 0);
  CHECK_EQ (run_command ("qemu-io -r -f qcow2 -c 'read -P 0 4M 2M' "
                         "-c 'read -P 0x%02x 7M 1' '%s' > /dev/null",
                         buf[512], path), 0);

 out:
  if (h.conn)
    qcow2_conn_free (h.conn);
  close_image (&s);
  qcow2_fileio_close (&file_io);
  CHECK_EQ (s.log.errors, 0);
  free (buf);
  free (back);
}

int
main (void)
{
  if (!have_command ("qemu-img") || !have_command ("qemu-io"))
    UNIT_SKIP ("qemu-img or qemu-io not found");
  scratch_dir_make ();
  test_flushes_sync ();
  test_tail_cut_unlocked ();
  test_write_during_cut ();
  return unit_finish ();
}
