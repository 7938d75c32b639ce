/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the internal snapshot table: parse, look up, check. */

#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/endian.h"
#include "format/errbuf.h"
#include "format/snapshot.h"

/* Offsets in an entry's fixed part and in its extra data. */
enum {
  OFF_L1_OFFSET = 0, OFF_L1_SIZE = 8, OFF_ID_LEN = 12, OFF_NAME_LEN = 14,
  OFF_DATE_SEC = 16, OFF_DATE_NSEC = 20, OFF_VM_CLOCK = 24,
  OFF_VM_STATE = 32, OFF_EXTRA_LEN = 36,
  EXTRA_VM_STATE = 0, EXTRA_DISK_SIZE = 8, EXTRA_ICOUNT = 16,
};

/* L1 tables are at most 32 MiB (qemu's QCOW_MAX_L1_SIZE). */
#define MAX_L1_BYTES (UINT64_C (32) << 20)

/* Typical entry: 40 fixed bytes, 24 of extra data, short ID and name. */
#define HINT_BYTES_PER_ENTRY 128

static uint16_t
be16 (const uint8_t *p)
{
  return (uint16_t) p[0] << 8 | p[1];
}

size_t
qcow2_snapshot_table_read_hint (const struct qcow2_snapshot_image *im)
{
  uint64_t n = (uint64_t) im->nb_snapshots * HINT_BYTES_PER_ENTRY;

  if (im->nb_snapshots == 0 || im->snapshots_offset >= im->file_size)
    return 0;
  if (n > im->file_size - im->snapshots_offset)
    n = im->file_size - im->snapshots_offset;
  if (n > QCOW2_MAX_SNAPSHOT_TABLE_BYTES)
    n = QCOW2_MAX_SNAPSHOT_TABLE_BYTES;
  return n;
}

/* Where the walk is: the bytes read so far and where to report. */
struct cursor {
  const uint8_t *buf;
  size_t len;
  const struct qcow2_snapshot_image *im;
  uint64_t in_file;                 /* bytes from the table to the EOF */
  size_t *needed;
  char *errbuf;
  size_t errlen;
};

/* May entry I read up to END (from the table's start)?  0 if BUF holds
 * it; 1 with *NEEDED if it is in the file but not yet read; -1 if it is
 * past qemu's limit or the file.
 */
static int
reach (const struct cursor *c, uint32_t i, uint64_t end)
{
  if (end > QCOW2_MAX_SNAPSHOT_TABLE_BYTES)
    return qcow2_fail (c->errbuf, c->errlen,
                       "snapshot table entry %" PRIu32 ": the snapshot table "
                       "grows past qemu's limit of 64 MiB (qemu-img check -r "
                       "all drops the %" PRIu32 " snapshots from this one on)",
                       i, c->im->nb_snapshots - i);
  if (end > c->in_file)
    return qcow2_fail (c->errbuf, c->errlen,
                       "snapshot table entry %" PRIu32 ": it runs past the "
                       "end of the file (the table starts at 0x%" PRIx64 ", "
                       "the file has %" PRIu64 " bytes): nb_snapshots or the "
                       "entries are wrong",
                       i, c->im->snapshots_offset, c->im->file_size);
  if (end > c->len) {
    /* Ask for more than this entry needs: the next ones are likely in
     * the same few clusters.
     */
    uint64_t want = end > (uint64_t) c->len * 2 ? end : (uint64_t) c->len * 2;
    uint64_t cap = c->in_file < QCOW2_MAX_SNAPSHOT_TABLE_BYTES
                   ? c->in_file : QCOW2_MAX_SNAPSHOT_TABLE_BYTES;
    *c->needed = want < cap ? want : cap;
    return 1;
  }
  return 0;
}

/* Walk the table.  Without a table to fill (SNAPSHOTS NULL) it checks and
 * sizes: the bytes the table spans into *TABLE_BYTES and the string bytes
 * into *STRING_BYTES.  With one, it fills the entries and copies the
 * strings to STRINGS.  Returns 0, 1 with *NEEDED when BUF is too short,
 * or -1.
 */
static int
walk (const struct cursor *c, struct qcow2_snapshot *snapshots, char *strings,
      uint64_t *table_bytes, uint64_t *string_bytes)
{
  const struct qcow2_snapshot_image *im = c->im;
  uint64_t off = 0, strings_used = 0;
  int r;

  for (uint32_t i = 0; i < im->nb_snapshots; ++i) {
    uint64_t entry = (off + 7) & ~UINT64_C (7);
    uint64_t end = entry + QCOW2_SNAPSHOT_FIXED_BYTES;
    const uint8_t *p;
    uint32_t extra;
    uint16_t id_len, name_len;

    if ((r = reach (c, i, end)) != 0)
      return r;
    p = c->buf + entry;
    extra = be32 (p + OFF_EXTRA_LEN);
    id_len = be16 (p + OFF_ID_LEN);
    name_len = be16 (p + OFF_NAME_LEN);
    if (extra > QCOW2_MAX_SNAPSHOT_EXTRA_DATA)
      return qcow2_fail (c->errbuf, c->errlen,
                         "snapshot table entry %" PRIu32 ": extra_data_size: "
                         "%" PRIu32 " bytes of extra data exceed qemu's "
                         "limit of %d (qemu-img check -r all removes them)",
                         i, extra, QCOW2_MAX_SNAPSHOT_EXTRA_DATA);
    end += (uint64_t) extra + id_len + name_len;
    if ((r = reach (c, i, end)) != 0)
      return r;

    if (snapshots) {
      struct qcow2_snapshot *sn = &snapshots[i];
      const uint8_t *x = p + QCOW2_SNAPSHOT_FIXED_BYTES;
      const uint8_t *text = x + extra;

      sn->entry_offset = entry;
      sn->l1_table_offset = be64 (p + OFF_L1_OFFSET);
      sn->l1_size = be32 (p + OFF_L1_SIZE);
      sn->date_sec = be32 (p + OFF_DATE_SEC);
      sn->date_nsec = be32 (p + OFF_DATE_NSEC);
      sn->vm_clock_nsec = be64 (p + OFF_VM_CLOCK);
      sn->vm_state_size = be32 (p + OFF_VM_STATE);
      sn->extra_data_size = extra;
      if (extra >= EXTRA_VM_STATE + 8)
        sn->vm_state_size = be64 (x + EXTRA_VM_STATE);
      sn->has_disk_size = extra >= EXTRA_DISK_SIZE + 8;
      sn->disk_size = sn->has_disk_size ? be64 (x + EXTRA_DISK_SIZE)
                                        : im->virtual_size;
      sn->has_icount = extra >= EXTRA_ICOUNT + 8;
      sn->icount = sn->has_icount ? be64 (x + EXTRA_ICOUNT) : UINT64_MAX;

      sn->id_len = id_len;
      sn->name_len = name_len;
      memcpy (strings + strings_used, text, id_len);
      strings[strings_used + id_len] = '\0';
      sn->id = strings + strings_used;
      strings_used += id_len + 1;
      memcpy (strings + strings_used, text + id_len, name_len);
      strings[strings_used + name_len] = '\0';
      sn->name = strings + strings_used;
      strings_used += name_len + 1;
    }
    else
      strings_used += (uint64_t) id_len + name_len + 2;
    off = end;
  }
  *table_bytes = off;
  *string_bytes = strings_used;
  return 0;
}

int
qcow2_snapshot_table_parse (const uint8_t *buf, size_t len,
                            const struct qcow2_snapshot_image *im,
                            struct qcow2_snapshot_table **table_ret,
                            size_t *needed, char *errbuf, size_t errlen)
{
  uint64_t cluster_size = UINT64_C (1) << im->cluster_bits;
  uint64_t table_bytes = 0, string_bytes = 0;
  struct cursor c = {
    .buf = buf, .len = len, .im = im, .needed = needed,
    .errbuf = errbuf, .errlen = errlen,
  };
  struct qcow2_snapshot_table *t;
  size_t entries_bytes;
  int r;

  *table_ret = NULL;
  if (im->nb_snapshots > QCOW2_MAX_SNAPSHOTS)
    return qcow2_fail (errbuf, errlen,
                       "nb_snapshots: %" PRIu32 " snapshots exceed qemu's "
                       "limit of %d", im->nb_snapshots, QCOW2_MAX_SNAPSHOTS);
  /* qemu checks the alignment even of an empty table. */
  if (im->snapshots_offset & (cluster_size - 1))
    return qcow2_fail (errbuf, errlen,
                       "snapshots_offset: 0x%" PRIx64 " is not cluster "
                       "aligned", im->snapshots_offset);
  if (im->nb_snapshots > 0) {
    if (im->snapshots_offset == 0)
      return qcow2_fail (errbuf, errlen,
                         "snapshots_offset: the snapshot table overlaps the "
                         "header");
    if (im->snapshots_offset >= im->file_size)
      return qcow2_fail (errbuf, errlen,
                         "snapshots_offset: the snapshot table (0x%" PRIx64
                         ") starts past the end of the file (%" PRIu64 " "
                         "bytes)", im->snapshots_offset, im->file_size);
    c.in_file = im->file_size - im->snapshots_offset;
    r = walk (&c, NULL, NULL, &table_bytes, &string_bytes);
    if (r != 0)
      return r;
  }

  entries_bytes = (size_t) im->nb_snapshots * sizeof (struct qcow2_snapshot);
  t = calloc (1, sizeof *t + entries_bytes + string_bytes);
  if (t == NULL)
    return qcow2_fail (errbuf, errlen,
                       "out of memory for a table of %" PRIu32 " snapshots",
                       im->nb_snapshots);
  t->count = im->nb_snapshots;
  t->table_bytes = table_bytes;
  t->snapshots = (struct qcow2_snapshot *) (t + 1);
  if (im->nb_snapshots > 0)
    walk (&c, t->snapshots, (char *) t->snapshots + entries_bytes,
          &table_bytes, &string_bytes);
  *table_ret = t;
  return 0;
}

void
qcow2_snapshot_table_free (struct qcow2_snapshot_table *table)
{
  free (table);
}

const struct qcow2_snapshot *
qcow2_snapshot_find (const struct qcow2_snapshot_table *table,
                     const char *id, const char *name)
{
  if (id == NULL && name == NULL)
    return NULL;
  for (uint32_t i = 0; i < table->count; ++i) {
    const struct qcow2_snapshot *sn = &table->snapshots[i];
    if ((id == NULL || strcmp (sn->id, id) == 0) &&
        (name == NULL || strcmp (sn->name, name) == 0))
      return sn;
  }
  return NULL;
}

/* S with bytes outside printable ASCII (and the quote and backslash)
 * written as \xNN, truncated to fit OUT.
 */
static void
escape (const char *s, char *out, size_t out_len)
{
  size_t o = 0;

  if (out_len == 0)
    return;
  for (; *s; ++s) {
    unsigned char c = *s;
    char piece[5];
    size_t n;
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
      piece[0] = c, piece[1] = '\0';
    else
      snprintf (piece, sizeof piece, "\\x%02x", c);
    n = strlen (piece);
    if (o + n >= out_len)
      break;
    memcpy (out + o, piece, n);
    o += n;
  }
  out[o] = '\0';
}

/* "snapshot 1 ("name")" for messages. */
static void
label (const struct qcow2_snapshot *sn, char *out, size_t out_len)
{
  char id[64], name[128];

  escape (sn->id, id, sizeof id);
  escape (sn->name, name, sizeof name);
  snprintf (out, out_len, "snapshot %s (\"%s\")", id, name);
}

/* Append the list of snapshots to the message in ERRBUF. */
static void
append_list (const struct qcow2_snapshot_table *table,
             char *errbuf, size_t errlen)
{
  size_t used = strlen (errbuf);

  if (table->count == 0) {
    snprintf (errbuf + used, errlen - used, "; the image has no snapshots");
    return;
  }
  used += snprintf (errbuf + used, errlen - used, "; the image has:");
  for (uint32_t i = 0; i < table->count && used < errlen; ++i) {
    char id[64], name[128];
    escape (table->snapshots[i].id, id, sizeof id);
    escape (table->snapshots[i].name, name, sizeof name);
    used += snprintf (errbuf + used, errlen - used, "%s ID %s name \"%s\"",
                      i ? "," : "", id, name);
  }
}

/* Split "snapshot.id=A,snapshot.name=B" (",," is a comma) in place. */
static int
parse_selector_options (char *s, char **id, char **name,
                        char *errbuf, size_t errlen)
{
  char *r = s;

  *id = *name = NULL;
  while (*r) {
    char *key = r, *value, *w;
    value = strchr (key, '=');
    if (value == NULL)
      return qcow2_fail (errbuf, errlen,
                         "snapshot selector: \"%s\" is not KEY=VALUE "
                         "(snapshot.id=ID or snapshot.name=NAME)", key);
    *value++ = '\0';
    /* Copy the value over itself, turning ",," into ",". */
    for (r = w = value; *r; ++r) {
      if (*r == ',') {
        if (r[1] != ',')
          break;
        ++r;
      }
      *w++ = *r;
    }
    if (*r == ',')
      ++r;
    *w = '\0';
    if (strcmp (key, "snapshot.id") == 0)
      *id = value;
    else if (strcmp (key, "snapshot.name") == 0)
      *name = value;
    else
      return qcow2_fail (errbuf, errlen,
                         "snapshot selector: unknown key \"%s\" (snapshot.id "
                         "and snapshot.name are known)", key);
  }
  if (*id == NULL && *name == NULL)
    return qcow2_fail (errbuf, errlen,
                       "snapshot selector: empty (snapshot.id=ID or "
                       "snapshot.name=NAME)");
  return 0;
}

const struct qcow2_snapshot *
qcow2_snapshot_select (const struct qcow2_snapshot_table *table,
                       const char *selector, char *errbuf, size_t errlen)
{
  const struct qcow2_snapshot *sn;
  char shown[128], shown2[128];

  if (strncmp (selector, "snapshot.", 9) == 0) {
    char *copy = strdup (selector), *id, *name;
    if (copy == NULL) {
      qcow2_fail (errbuf, errlen, "out of memory");
      return NULL;
    }
    if (parse_selector_options (copy, &id, &name, errbuf, errlen) == -1) {
      free (copy);
      return NULL;
    }
    sn = qcow2_snapshot_find (table, id, name);
    if (sn == NULL) {
      if (id && name) {
        escape (id, shown, sizeof shown);
        escape (name, shown2, sizeof shown2);
        qcow2_fail (errbuf, errlen,
                    "no snapshot has both the ID \"%s\" and the name \"%s\"",
                    shown, shown2);
      }
      else {
        escape (id ? id : name, shown, sizeof shown);
        qcow2_fail (errbuf, errlen,
                    "no snapshot has the %s \"%s\"",
                    id ? "ID" : "name", shown);
      }
      append_list (table, errbuf, errlen);
    }
    free (copy);
    return sn;
  }

  /* qemu's bdrv_snapshot_load_tmp_by_id_or_name: the ID first. */
  sn = qcow2_snapshot_find (table, selector, NULL);
  if (sn == NULL)
    sn = qcow2_snapshot_find (table, NULL, selector);
  if (sn == NULL) {
    escape (selector, shown, sizeof shown);
    qcow2_fail (errbuf, errlen,
                "no snapshot has the ID or the name \"%s\"", shown);
    append_list (table, errbuf, errlen);
  }
  return sn;
}

int
qcow2_snapshot_check (const struct qcow2_snapshot *sn,
                      const struct qcow2_snapshot_image *im,
                      char *errbuf, size_t errlen)
{
  uint64_t cluster_size = UINT64_C (1) << im->cluster_bits;
  uint64_t l1_bytes = (uint64_t) sn->l1_size * 8;
  char who[256];

  label (sn, who, sizeof who);
  if (l1_bytes > MAX_L1_BYTES)
    return qcow2_fail (errbuf, errlen,
                       "%s: l1_size: %" PRIu32 " entries exceed the 32 MiB "
                       "limit", who, sn->l1_size);
  if (sn->l1_size == 0)
    return 0;
  if (sn->l1_table_offset & (cluster_size - 1))
    return qcow2_fail (errbuf, errlen,
                       "%s: l1_table_offset: 0x%" PRIx64 " is not cluster "
                       "aligned", who, sn->l1_table_offset);
  if (sn->l1_table_offset == 0)
    return qcow2_fail (errbuf, errlen,
                       "%s: l1_table_offset: the L1 table overlaps the header",
                       who);
  if (sn->l1_table_offset > im->file_size ||
      l1_bytes > im->file_size - sn->l1_table_offset)
    return qcow2_fail (errbuf, errlen,
                       "%s: l1_table_offset, l1_size: the L1 table (0x%"
                       PRIx64 ", %" PRIu32 " entries) lies outside the file "
                       "(%" PRIu64 " bytes)",
                       who, sn->l1_table_offset, sn->l1_size, im->file_size);
  return 0;
}

void
qcow2_snapshot_describe (const struct qcow2_snapshot *sn,
                         char *buf, size_t len)
{
  char id[64], name[128], date[32] = "?";
  time_t t = sn->date_sec;
  struct tm tm;
  uint64_t secs = sn->vm_clock_nsec / 1000000000;

  escape (sn->id, id, sizeof id);
  escape (sn->name, name, sizeof name);
  if (localtime_r (&t, &tm))
    strftime (date, sizeof date, "%Y-%m-%d %H:%M:%S", &tm);
  snprintf (buf, len,
            "id %s name \"%s\" l1 0x%" PRIx64 " (%" PRIu32 " entries) "
            "disk %" PRIu64 "%s vm-state %" PRIu64 " date %s "
            "vm-clock %02" PRIu64 ":%02" PRIu64 ":%02" PRIu64 ".%03" PRIu64,
            id, name, sn->l1_table_offset, sn->l1_size, sn->disk_size,
            sn->has_disk_size ? "" : " (from the image)", sn->vm_state_size,
            date, secs / 3600, secs / 60 % 60, secs % 60,
            sn->vm_clock_nsec / 1000000 % 1000);
  if (sn->has_icount) {
    size_t used = strlen (buf);
    if (used < len)
      snprintf (buf + used, len - used, " icount %" PRIu64, sn->icount);
  }
}
