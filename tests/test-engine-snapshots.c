/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: writes to images with internal snapshots.
 *
 * qemu-img makes images with three snapshots (64 KiB, 4 KiB and 512 B
 * clusters, v3 and v2), which the engine opens writable in memory.  After
 * random writes, zeroes, trims and flushes to the active disk:
 * - the active disk reads as the model, also opened again;
 * - the test's own check finds the image exact, counting every
 *   snapshot's L1 table, its L2 tables and their data as qemu-img check
 *   does (a table shared by two L1 tables counts twice, and so does what
 *   it maps);
 * - each snapshot, served through qcow2_options.snapshot, reads as it did
 *   before, and as qemu-img convert -l reads it afterwards.
 */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2.h"
#include "oracle.h"
#include "session.h"
#include "unit.h"
#include "util.h"
#include "write-image.h"

#define NSNAPSHOTS 3
#define ROOM (8 * MiB)

struct config {
  const char *name;
  const char *options;          /* qemu-img create -o */
  uint32_t cluster_size;
  unsigned ops;
};

static const struct config configs[] = {
  { "64 KiB clusters", "cluster_size=65536", 65536, 300 },
  { "4 KiB clusters", "cluster_size=4096", 4096, 400 },
  { "512 B clusters, v2", "cluster_size=512,compat=0.10", 512, 300 },
};
#define NCONFIGS (sizeof configs / sizeof configs[0])

#define DISK (2 * MiB)

/* The guest disk of snapshot ID (or the active disk, ID NULL) of the
 * image in STORAGE (SIZE bytes), read through the engine.
 */
static uint8_t *
read_disk (const uint8_t *storage, uint64_t size, const char *id)
{
  struct qcow2_options opts = default_options;
  struct session s;
  uint8_t *disk = xcalloc (1, DISK);

  opts.snapshot = id;
  CHECK_EQ (session_open (&s, storage, size, &opts), 0);
  if (s.conn)
    CHECK_EQ (do_read (&s, disk, DISK, 0), 0);
  else
    fprintf (stderr, "  snapshot %s: %s\n", id ? id : "-", s.log.last);
  session_close (&s);
  return disk;
}

static void
test_config (const struct config *cfg)
{
  const char *dir = scratch_dir ();
  char img[4200], out[4200];
  struct qcow2_options opts = default_options;
  uint8_t *snapshot[NSNAPSHOTS], *model, *file, *qemu;
  unsigned long failures = atomic_load (&unit_failures);
  struct session s;
  size_t len, qlen;

  snprintf (img, sizeof img, "%s/snap.qcow2", dir);
  snprintf (out, sizeof out, "%s/out.raw", dir);
  if (run_command ("rm -f %1$s && qemu-img create -q -f qcow2 -o %2$s %1$s 2M && "
                   "qemu-io -c 'write -P 0x11 0 2M' %1$s >/dev/null && "
                   "qemu-img snapshot -c one %1$s && "
                   "qemu-io -c 'write -P 0x22 100k 700k' %1$s >/dev/null && "
                   "qemu-img snapshot -c two %1$s && "
                   "qemu-io -c 'write -z 1M 300k' -c 'discard 0 64k' %1$s "
                   ">/dev/null && qemu-img snapshot -c three %1$s && "
                   "qemu-io -c 'write -P 0x33 1500k 100k' %1$s >/dev/null",
                   img, cfg->options) != 0) {
    CHECK (!"qemu-img could not make the image");
    return;
  }
  file = read_whole_file (img, &len);
  for (int i = 0; i < NSNAPSHOTS; ++i) {
    char id[12];                /* any int in decimal */
    snprintf (id, sizeof id, "%d", i + 1);
    snapshot[i] = read_disk (file, len, id);
  }
  model = read_disk (file, len, NULL);

  /* Writes to the active disk, with room to allocate. */
  memset (&s, 0, sizeof s);
  mem_io_init (&s.mio, file, len, len + ROOM, MEM_IO_WRITABLE);
  opts.writable = true;
  CHECK_EQ (session_open_io (&s, &opts), 0);
  if (s.conn == NULL) {
    fprintf (stderr, "  %s: %s\n", cfg->name, s.log.last);
    session_close (&s);
    goto out;
  }
  random_changes (&s, model, 0, DISK, cfg->cluster_size, cfg->cluster_size,
                  cfg->ops, cfg->name);
  CHECK_EQ (do_flush (&s), 0);
  session_close_image (&s);
  check_file (s.mio.data, s.mio.size, true, cfg->name);
  free (file);
  file = xmalloc (s.mio.size);
  memcpy (file, s.mio.data, s.mio.size);
  len = s.mio.size;
  mem_io_free (&s.mio);

  uint8_t *active = read_disk (file, len, NULL);
  CHECK (memcmp (active, model, DISK) == 0);
  free (active);
  for (int i = 0; i < NSNAPSHOTS; ++i) {
    uint8_t *now = read_disk (file, len, i == 1 ? "two" : i == 0 ? "1" : "3");
    CHECK (memcmp (now, snapshot[i], DISK) == 0);
    free (now);
  }

  /* qemu reads every snapshot the same from what the engine wrote. */
  FILE *fp = fopen (img, "wb");
  CHECK (fp && fwrite (file, 1, len, fp) == len);
  if (fp)
    fclose (fp);
  for (int i = 0; i < NSNAPSHOTS; ++i) {
    CHECK_EQ (run_command ("rm -f %s && qemu-img convert -l snapshot.id=%d "
                           "-O raw %s %s", out, i + 1, img, out), 0);
    qemu = read_whole_file (out, &qlen);
    CHECK (qlen == DISK && memcmp (qemu, snapshot[i], DISK) == 0);
    free (qemu);
  }
  CHECK_EQ (run_command ("qemu-img check -q %s", img), 0);

 out:
  for (int i = 0; i < NSNAPSHOTS; ++i)
    free (snapshot[i]);
  free (model);
  free (file);
  UNIT_NOTE_IF_FAILED (failures, "%s", cfg->name);
}

int
main (void)
{
  if (!have_command ("qemu-img") || !have_command ("qemu-io"))
    UNIT_SKIP ("qemu-img and qemu-io are needed");
  scratch_dir_make ();
  for (size_t i = 0; i < NCONFIGS; ++i)
    test_config (&configs[i]);
  return unit_finish ();
}
