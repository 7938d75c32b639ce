/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit test: the internal snapshot table.
 *
 * Tables made by qemu-img snapshot -c are read from the image's bytes:
 * every entry must come out as qemu wrote it, and each snapshot's L1
 * table must map the data the image held when it was taken.  The lookup
 * must pick what qemu-img convert -l picks for the same selector (qemu is
 * run on every selector).  Hand-built tables then break one thing each.
 */
#include <config.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/endian.h"
#include "format/header.h"
#include "format/snapshot.h"
#include "oracle.h"
#include "unit.h"
#include "util.h"

static struct qcow2_snapshot_image
image_of (const struct qcow2_header *h)
{
  struct qcow2_snapshot_image im = {
    .version = h->version, .cluster_bits = h->cluster_bits,
    .virtual_size = h->virtual_size, .file_size = h->file_size,
    .nb_snapshots = h->nb_snapshots, .snapshots_offset = h->snapshots_offset,
  };
  return im;
}

/* Parse the way the engine will: the hinted read first, then what the
 * parser asks for.  Counts the rounds in *ROUNDS.
 */
static struct qcow2_snapshot_table *
parse_from_image (const uint8_t *img, size_t len,
                  const struct qcow2_snapshot_image *im, int *rounds,
                  char *err, size_t errlen)
{
  struct qcow2_snapshot_table *t = NULL;
  size_t want = qcow2_snapshot_table_read_hint (im), needed = 0;
  int r;

  *rounds = 0;
  for (;;) {
    ++*rounds;
    CHECK (im->snapshots_offset + want <= len);
    r = qcow2_snapshot_table_parse (img + im->snapshots_offset, want, im, &t,
                                    &needed, err, errlen);
    if (r != 1)
      break;
    CHECK (needed > want);
    if (needed <= want || *rounds > 40)
      return NULL;
    want = needed;
  }
  CHECK_EQ (r, 0);
  return t;
}

/* First byte of guest offset GUEST as snapshot SN maps it, or -1 if it
 * maps nowhere.
 */
static int
byte_in_snapshot (const uint8_t *img, size_t len, const struct qcow2_header *h,
                  const struct qcow2_snapshot *sn, uint64_t guest)
{
  uint64_t host = guest_to_host (img, len, h, sn->l1_table_offset,
                                      sn->l1_size, guest);
  return host && host < len ? img[host + (guest & (h->cluster_size - 1))]
                            : -1;
}

/* ---------------------------------------------------------------- qemu */

static char img_path[4200];

static void
make_image (void)
{
  snprintf (img_path, sizeof img_path, "%s/snap.qcow2", scratch_dir ());
#define QIO(cmd) "qemu-io -f qcow2 -c '" cmd "' %1$s >/dev/null && "
  if (run_command ("qemu-img create -q -f qcow2 %1$s 1M && "
                QIO ("write -P 0x11 0 64k")
                "qemu-img snapshot -c 2 %1$s && "
                QIO ("write -P 0x22 0 64k")
                QIO ("write -P 0x2f 512k 64k")
                "qemu-img snapshot -c x %1$s && "
                QIO ("write -P 0x33 0 64k")
                "qemu-img resize -q %1$s 2M && "
                QIO ("write -P 0x44 1536k 64k")
                "qemu-img snapshot -c 'a, b' %1$s && "
                QIO ("write -P 0x55 0 64k")
                "true", img_path) != 0) {
    fprintf (stderr, "making the image with qemu-img failed\n");
    exit (1);
  }
#undef QIO
}

static void
test_qemu_table (void)
{
  size_t len;
  uint8_t *img;
  struct qcow2_header h;
  struct qcow2_snapshot_image im;
  struct qcow2_snapshot_table *t;
  char err[512];
  int rounds;
  time_t before = time (NULL);

  make_image ();
  img = read_whole_file (img_path, &len);
  CHECK_EQ (qcow2_header_parse (img, len, len, &h, err, sizeof err), 0);
  CHECK_EQ (h.nb_snapshots, 3);
  im = image_of (&h);
  t = parse_from_image (img, len, &im, &rounds, err, sizeof err);
  CHECK (t != NULL);
  if (t == NULL)
    goto out;
  CHECK_EQ (rounds, 1);
  CHECK_EQ (t->count, 3);

  static const struct {
    const char *id, *name;
    uint64_t disk_size;
    int at0, at512k, at1536k;
  } want[] = {
    { "1", "2", 1 * MiB, 0x11, -1, -1 },
    { "2", "x", 1 * MiB, 0x22, 0x2f, -1 },
    { "3", "a, b", 2 * MiB, 0x33, 0x2f, 0x44 },
  };
  for (uint32_t i = 0; i < 3 && i < t->count; ++i) {
    const struct qcow2_snapshot *sn = &t->snapshots[i];
    unsigned long failures = atomic_load (&unit_failures);
    CHECK (strcmp (sn->id, want[i].id) == 0);
    CHECK (strcmp (sn->name, want[i].name) == 0);
    CHECK_EQ (sn->id_len, strlen (want[i].id));
    CHECK_EQ (sn->name_len, strlen (want[i].name));
    CHECK (sn->has_disk_size);
    CHECK_EQ (sn->disk_size, want[i].disk_size);
    CHECK_EQ (sn->extra_data_size, 24);
    CHECK (sn->has_icount);
    CHECK_EQ (sn->vm_state_size, 0);
    CHECK (sn->date_sec >= before - 600 && sn->date_sec <= time (NULL) + 1);
    CHECK (sn->date_nsec < 1000000000);
    CHECK_EQ (sn->entry_offset % 8, 0);
    CHECK_EQ (qcow2_snapshot_check (sn, &im, err, sizeof err), 0);
    CHECK_EQ (byte_in_snapshot (img, len, &h, sn, 0), want[i].at0);
    CHECK_EQ (byte_in_snapshot (img, len, &h, sn, 512 * KiB),
              want[i].at512k);
    CHECK_EQ (byte_in_snapshot (img, len, &h, sn, 1536 * KiB),
              want[i].at1536k);
    UNIT_NOTE_IF_FAILED (failures, "snapshot %u", i);
  }
  CHECK_EQ (guest_to_host (img, len, &h, h.l1_table_offset, h.l1_size,
                                0) != 0, 1);

  char line[512];
  qcow2_snapshot_describe (&t->snapshots[2], line, sizeof line);
  CHECK (unit_says (line, "id 3 name \"a, b\""));
  CHECK (unit_says (line, "disk 2097152 vm-state 0"));
  CHECK (unit_says (line, "vm-clock 00:00:00.000 icount 0"));

  /* Each selector against qemu-img convert -l on the same image: the
   * snapshot we pick must hold what qemu's output holds at offset 0.
   */
  static const char *const selectors[] = {
    "2", "x", "1", "3", "a, b", "snapshot.name=2", "snapshot.id=2",
    "snapshot.id=1,snapshot.name=2", "snapshot.id=2,snapshot.name=2",
    "snapshot.name=a,, b", "nope", "snapshot.name=nope",
  };
  for (size_t k = 0; k < sizeof selectors / sizeof selectors[0]; ++k) {
    unsigned long failures = atomic_load (&unit_failures);
    const struct qcow2_snapshot *sn =
      qcow2_snapshot_select (t, selectors[k], err, sizeof err);
    char out[4300];
    snprintf (out, sizeof out, "%s/out.raw", scratch_dir ());
    int qemu = run_command ("rm -f %s; qemu-img convert -l \"%s\" -O raw %s %s "
                         "2>/dev/null", out, selectors[k], img_path, out);
    if (sn == NULL) {
      CHECK (qemu != 0);
      CHECK (unit_says (err, "the image has: ID 1 name \"2\", ID 2 name "
                       "\"x\", ID 3 name \"a, b\""));
    }
    else {
      size_t out_len = 0;
      uint8_t *raw;
      CHECK_EQ (qemu, 0);
      if (qemu != 0)
        continue;
      raw = read_whole_file (out, &out_len);
      /* qemu serves a snapshot with the active image's size. */
      CHECK_EQ (out_len, 2 * MiB);
      CHECK_EQ (raw[0], byte_in_snapshot (img, len, &h, sn, 0));
      free (raw);
    }
    UNIT_NOTE_IF_FAILED (failures, "selector \"%s\"", selectors[k]);
  }
  qcow2_snapshot_table_free (t);
 out:
  free (img);
}

/* Many snapshots with long names: more than the hinted first read. */
static void
test_qemu_many (void)
{
  char path[4200], err[512];
  size_t len;
  int rounds;

  snprintf (path, sizeof path, "%s/many.qcow2", scratch_dir ());
  if (run_command ("qemu-img create -q -f qcow2 -o compat=0.10,cluster_size=4k "
                "%1$s 64k && for i in $(seq 1 40); do "
                "qemu-io -f qcow2 -c \"write -P $i 0 4k\" %1$s >/dev/null && "
                "qemu-img snapshot -c \"snapshot-$i-$(printf '%%0200d' $i)\" "
                "%1$s || exit 1; done", path) != 0) {
    fprintf (stderr, "making the image with qemu-img failed\n");
    exit (1);
  }
  uint8_t *img = read_whole_file (path, &len);
  struct qcow2_header h;
  CHECK_EQ (qcow2_header_parse (img, len, len, &h, err, sizeof err), 0);
  CHECK_EQ (h.version, 2);
  struct qcow2_snapshot_image im = image_of (&h);
  struct qcow2_snapshot_table *t =
    parse_from_image (img, len, &im, &rounds, err, sizeof err);
  CHECK (t != NULL);
  if (t) {
    CHECK (rounds > 1);
    CHECK_EQ (t->count, 40);
    for (uint32_t i = 0; i < t->count; ++i) {
      char name[300], id[16];
      snprintf (name, sizeof name, "snapshot-%u-%0200u", i + 1, i + 1);
      snprintf (id, sizeof id, "%u", i + 1);
      CHECK (strcmp (t->snapshots[i].name, name) == 0);
      CHECK (strcmp (t->snapshots[i].id, id) == 0);
      /* qemu writes the extra data into v2 images too. */
      CHECK (t->snapshots[i].has_disk_size);
      CHECK_EQ (t->snapshots[i].disk_size, 64 * KiB);
      CHECK_EQ (byte_in_snapshot (img, len, &h, &t->snapshots[i], 0), i + 1);
    }
    char seventh[300];
    snprintf (seventh, sizeof seventh, "snapshot-7-%0200d", 7);
    CHECK (qcow2_snapshot_select (t, seventh, err, sizeof err) ==
           &t->snapshots[6]);
    /* The list of snapshots in a message stops where the buffer does. */
    char small[100];
    CHECK (qcow2_snapshot_select (t, "none", small, sizeof small) == NULL);
    CHECK_EQ (strlen (small), sizeof small - 1);
  }
  qcow2_snapshot_table_free (t);
  free (img);
}

/* ---------------------------------------------------------------- hostile */

struct entry {
  uint64_t l1_offset;
  uint32_t l1_size;
  const char *id, *name;
  size_t id_len, name_len;          /* 0: strlen */
  uint32_t extra_len;
  uint64_t vm_state32, vm_state64, disk_size, icount;
};

/* Append ENTRY to the table at BUF (at *LEN), 8-byte aligned. */
static void
put_entry (uint8_t *buf, size_t *len, const struct entry *e)
{
  size_t off = (*len + 7) & ~(size_t) 7;
  size_t id_len = e->id_len ? e->id_len : strlen (e->id);
  size_t name_len = e->name_len ? e->name_len : strlen (e->name);
  uint8_t extra[1100] = { 0 };

  memset (buf + *len, 0, off - *len);
  put_be64 (buf + off, e->l1_offset);
  put_be32 (buf + off + 8, e->l1_size);
  buf[off + 12] = id_len >> 8, buf[off + 13] = id_len;
  buf[off + 14] = name_len >> 8, buf[off + 15] = name_len;
  put_be32 (buf + off + 16, 1700000000);
  put_be32 (buf + off + 20, 5);
  put_be64 (buf + off + 24, UINT64_C (3723004000000));
  put_be32 (buf + off + 32, e->vm_state32);
  put_be32 (buf + off + 36, e->extra_len);
  put_be64 (extra, e->vm_state64);
  put_be64 (extra + 8, e->disk_size);
  put_be64 (extra + 16, e->icount);
  memcpy (buf + off + 40, extra, e->extra_len);
  memcpy (buf + off + 40 + e->extra_len, e->id, id_len);
  memcpy (buf + off + 40 + e->extra_len + id_len, e->name, name_len);
  *len = off + 40 + e->extra_len + id_len + name_len;
}

static const struct qcow2_snapshot_image base = {
  .version = 3, .cluster_bits = 16, .virtual_size = 10 * MiB,
  .file_size = 100 * MiB, .nb_snapshots = 1, .snapshots_offset = 0x50000,
};

static void
test_hostile_tables (void)
{
  uint8_t buf[8192];
  size_t len = 0, needed = 0;
  struct qcow2_snapshot_table *t;
  struct qcow2_snapshot_image im;
  char err[512];

#define EXPECT_ERROR(im_, len_, message)                                \
  do {                                                                  \
    t = (struct qcow2_snapshot_table *) 1;                              \
    CHECK_EQ (qcow2_snapshot_table_parse (buf, (len_), &(im_), &t,      \
                                          &needed, err, sizeof err), -1); \
    CHECK (t == NULL);                                                  \
    CHECK (unit_says (err, message));                                    \
  } while (0)

  struct entry one = { .l1_offset = 0x60000, .l1_size = 1, .id = "1",
                       .name = "one", .extra_len = 24, .disk_size = 5 * MiB };
  put_entry (buf, &len, &one);

  im = base;
  im.nb_snapshots = 65537;
  EXPECT_ERROR (im, len, "nb_snapshots: 65537 snapshots exceed qemu's limit");
  im = base;
  im.snapshots_offset = 0x50008;
  EXPECT_ERROR (im, len, "snapshots_offset: 0x50008 is not cluster aligned");
  im.nb_snapshots = 0;
  EXPECT_ERROR (im, len, "snapshots_offset");
  im = base;
  im.snapshots_offset = 0;
  EXPECT_ERROR (im, len, "overlaps the header");
  im = base;
  im.file_size = 0x50000;
  EXPECT_ERROR (im, len, "starts past the end of the file");
  im = base;
  im.file_size = 0x50000 + len - 1;
  EXPECT_ERROR (im, len, "entry 0: it runs past the end of the file");

  /* No snapshots: an empty table, whatever the buffer. */
  im = base;
  im.nb_snapshots = 0;
  CHECK_EQ (qcow2_snapshot_table_parse (NULL, 0, &im, &t, &needed,
                                        err, sizeof err), 0);
  CHECK (t && t->count == 0 && t->table_bytes == 0);
  CHECK (qcow2_snapshot_select (t, "1", err, sizeof err) == NULL);
  CHECK (unit_says (err, "the image has no snapshots"));
  CHECK (qcow2_snapshot_find (t, "1", NULL) == NULL);
  qcow2_snapshot_table_free (t);
  qcow2_snapshot_table_free (NULL);
  CHECK_EQ (qcow2_snapshot_table_read_hint (&im), 0);

  /* Short buffers ask for more, up to the whole table. */
  im = base;
  for (size_t short_len = 0; short_len < len; short_len += 7) {
    CHECK_EQ (qcow2_snapshot_table_parse (buf, short_len, &im, &t, &needed,
                                          err, sizeof err), 1);
    CHECK (needed > short_len && needed <= base.file_size - 0x50000);
  }
  CHECK_EQ (qcow2_snapshot_table_parse (buf, len, &im, &t, &needed,
                                        err, sizeof err), 0);
  CHECK_EQ (t->table_bytes, len);
  CHECK_EQ (t->snapshots[0].disk_size, 5 * MiB);
  qcow2_snapshot_table_free (t);

  /* Extra data: 1024 bytes pass (unknown fields skipped), 1025 do not. */
  struct entry big = one;
  big.extra_len = 1024;
  len = 0;
  put_entry (buf, &len, &big);
  put_entry (buf, &len, &one);
  im.nb_snapshots = 2;
  CHECK_EQ (qcow2_snapshot_table_parse (buf, len, &im, &t, &needed,
                                        err, sizeof err), 0);
  CHECK (strcmp (t->snapshots[1].name, "one") == 0);
  CHECK_EQ (t->snapshots[1].entry_offset, (40 + 1024 + 4 + 7) & ~7);
  qcow2_snapshot_table_free (t);
  big.extra_len = 1025;
  len = 0;
  put_entry (buf, &len, &one);
  put_entry (buf, &len, &big);
  EXPECT_ERROR (im, len, "entry 1: extra_data_size: 1025 bytes");

  /* Old entries without extra data: the 32-bit VM state size and the
   * image's size; 8 bytes of extra data: the 64-bit VM state size.
   */
  struct entry old = { .l1_offset = 0x60000, .l1_size = 1, .id = "7",
                       .name = "old", .extra_len = 0, .vm_state32 = 4096,
                       .vm_state64 = UINT64_C (1) << 33 };
  len = 0;
  put_entry (buf, &len, &old);
  old.extra_len = 8;
  old.id = "8";
  put_entry (buf, &len, &old);
  CHECK_EQ (qcow2_snapshot_table_parse (buf, len, &im, &t, &needed,
                                        err, sizeof err), 0);
  CHECK (!t->snapshots[0].has_disk_size && !t->snapshots[1].has_disk_size);
  CHECK_EQ (t->snapshots[0].disk_size, 10 * MiB);
  CHECK_EQ (t->snapshots[0].vm_state_size, 4096);
  CHECK_EQ (t->snapshots[1].vm_state_size, UINT64_C (1) << 33);
  CHECK (!t->snapshots[0].has_icount);
  qcow2_snapshot_table_free (t);

  /* A NUL inside a name ends it for comparisons, as in qemu; odd bytes
   * are escaped in messages; the first of two equal IDs wins.
   */
  struct entry odd = { .l1_offset = 0x60000, .l1_size = 1, .id = "1",
                       .name = "ab\0cd", .name_len = 5, .extra_len = 24 };
  struct entry quote = { .l1_offset = 0x70000, .l1_size = 1, .id = "1",
                         .name = "\x01\"q\\", .extra_len = 24 };
  len = 0;
  put_entry (buf, &len, &odd);
  put_entry (buf, &len, &quote);
  CHECK_EQ (qcow2_snapshot_table_parse (buf, len, &im, &t, &needed,
                                        err, sizeof err), 0);
  CHECK_EQ (t->snapshots[0].name_len, 5);
  CHECK (qcow2_snapshot_find (t, NULL, "ab") == &t->snapshots[0]);
  CHECK (qcow2_snapshot_find (t, NULL, "ab\0cd") == &t->snapshots[0]);
  CHECK (qcow2_snapshot_find (t, "1", NULL) == &t->snapshots[0]);
  CHECK (qcow2_snapshot_find (t, "1", "\x01\"q\\") == &t->snapshots[1]);
  CHECK (qcow2_snapshot_find (t, NULL, NULL) == NULL);
  char line[512];
  qcow2_snapshot_describe (&t->snapshots[1], line, sizeof line);
  CHECK (unit_says (line, "name \"\\x01\\x22q\\x5c\""));
  CHECK (unit_says (line, "vm-clock 01:02:03.004"));
  CHECK (qcow2_snapshot_select (t, "snapshot.id", err, sizeof err) == NULL);
  CHECK (unit_says (err, "is not KEY=VALUE"));
  CHECK (qcow2_snapshot_select (t, "snapshot.tag=1", err, sizeof err) == NULL);
  CHECK (unit_says (err, "unknown key \"snapshot.tag\""));
  CHECK (qcow2_snapshot_select (t, "snapshot.id=1,snapshot.name=\x01\"q\\",
                                err, sizeof err) == &t->snapshots[1]);
  CHECK (qcow2_snapshot_select (t, "snapshot.id=9", err, sizeof err) == NULL);
  CHECK (unit_says (err, "no snapshot has the ID \"9\""));

  /* The checks before serving one snapshot. */
  struct qcow2_snapshot sn = t->snapshots[1];
  CHECK_EQ (qcow2_snapshot_check (&sn, &im, err, sizeof err), 0);
  sn.l1_table_offset = 0x70200;
  CHECK_EQ (qcow2_snapshot_check (&sn, &im, err, sizeof err), -1);
  CHECK (unit_says (err, "snapshot 1 (\"\\x01\\x22q\\x5c\"): l1_table_offset: "
                   "0x70200 is not cluster aligned"));
  sn.l1_table_offset = 0;
  CHECK_EQ (qcow2_snapshot_check (&sn, &im, err, sizeof err), -1);
  CHECK (unit_says (err, "overlaps the header"));
  sn.l1_table_offset = 100 * MiB - 64 * KiB;
  sn.l1_size = 8193;
  CHECK_EQ (qcow2_snapshot_check (&sn, &im, err, sizeof err), -1);
  CHECK (unit_says (err, "lies outside the file"));
  sn.l1_size = 4 * MiB + 1;
  CHECK_EQ (qcow2_snapshot_check (&sn, &im, err, sizeof err), -1);
  CHECK (unit_says (err, "l1_size: 4194305 entries exceed the 32 MiB limit"));
  sn.l1_size = 0;
  sn.l1_table_offset = 12345;
  CHECK_EQ (qcow2_snapshot_check (&sn, &im, err, sizeof err), 0);
  qcow2_snapshot_table_free (t);
#undef EXPECT_ERROR
}

/* qemu's 64 MiB limit on the whole table. */
static void
test_table_too_big (void)
{
  size_t cap = QCOW2_MAX_SNAPSHOT_TABLE_BYTES + 200 * KiB, len = 0, needed;
  uint8_t *buf = calloc (1, cap);
  static char id[65535], name[65535];
  struct qcow2_snapshot_table *t;
  struct qcow2_snapshot_image im = base;
  char err[512];
  uint32_t n = 0;

  memset (id, 'i', sizeof id);
  memset (name, 'n', sizeof name);
  struct entry e = { .l1_offset = 0x60000, .id = id, .name = name,
                     .id_len = sizeof id, .name_len = sizeof name,
                     .extra_len = 24 };
  while (len < QCOW2_MAX_SNAPSHOT_TABLE_BYTES) {
    put_entry (buf, &len, &e);
    ++n;
  }
  im.nb_snapshots = n;
  im.file_size = UINT64_C (1) << 40;
  CHECK_EQ (qcow2_snapshot_table_parse (buf, len, &im, &t, &needed,
                                        err, sizeof err), -1);
  CHECK (unit_says (err, "grows past qemu's limit of 64 MiB"));
  im.nb_snapshots = n - 1;
  CHECK_EQ (qcow2_snapshot_table_parse (buf, len, &im, &t, &needed,
                                        err, sizeof err), 0);
  CHECK_EQ (t->count, n - 1);
  CHECK_EQ (t->snapshots[n - 2].id_len, 65535);
  qcow2_snapshot_table_free (t);
  /* Asked for more, the parser never asks past the limit. */
  im.nb_snapshots = n;
  CHECK_EQ (qcow2_snapshot_table_parse (buf, 100, &im, &t, &needed,
                                        err, sizeof err), 1);
  CHECK (needed <= QCOW2_MAX_SNAPSHOT_TABLE_BYTES);
  free (buf);
}

int
main (void)
{
  test_hostile_tables ();
  test_table_too_big ();
  if (!have_command ("qemu-img") || !have_command ("qemu-io"))
    UNIT_SKIP ("qemu-img or qemu-io not found: the checks against qemu "
               "did not run");
  scratch_dir_make ();
  test_qemu_table ();
  test_qemu_many ();
  return unit_finish ();
}
