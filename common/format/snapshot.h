/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the internal snapshot table.
 *
 * The header's snapshots_offset and nb_snapshots locate a table of
 * variable-length entries (qcow2.txt "Snapshots"), each 8-byte aligned:
 * a 40-byte fixed part (L1 table offset and size, ID and name lengths,
 * dates, 32-bit VM state size, extra data size), extra data (64-bit VM
 * state size, disk size, icount, then fields yet unknown), the ID, the
 * name.  qcow2_snapshot_table_parse() checks what qemu checks when it
 * opens an image, and the table's place in the file; qcow2_snapshot_check()
 * checks what qemu checks before it loads one snapshot (its L1 table).
 * The dates, the VM state size, the disk size and icount are shown, not
 * checked: qemu does not use them to read a snapshot.
 *
 * How qemu serves a snapshot (qemu-nbd -l, qemu-img convert -l), measured
 * with qemu 7.2: the snapshot's L1 table with the ACTIVE image's virtual
 * size; L1 entries past the snapshot's l1_size read as unallocated.
 *
 * No I/O, no nbdkit: the caller reads the bytes and may be asked for more.
 */
#ifndef QCOW2_SNAPSHOT_H
#define QCOW2_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* qemu's limits (block/qcow2.h). */
#define QCOW2_MAX_SNAPSHOTS 65536
#define QCOW2_MAX_SNAPSHOT_EXTRA_DATA 1024
#define QCOW2_MAX_SNAPSHOT_TABLE_BYTES (UINT64_C (64) << 20)
#define QCOW2_SNAPSHOT_FIXED_BYTES 40

struct qcow2_snapshot {
  uint64_t l1_table_offset;
  uint32_t l1_size;                 /* entries */
  /* NUL-terminated copies of the on-disk strings.  A NUL inside one ends
   * it early for every comparison, as qemu's strcmp does; ID_LEN and
   * NAME_LEN are the on-disk lengths.
   */
  const char *id;
  const char *name;
  uint16_t id_len, name_len;
  uint32_t date_sec, date_nsec;
  uint64_t vm_clock_nsec;
  uint64_t vm_state_size;           /* the 64-bit extra field if present */
  uint32_t extra_data_size;
  bool has_disk_size;               /* extra data holds it (v3 must) */
  uint64_t disk_size;               /* else the image's virtual size */
  bool has_icount;
  uint64_t icount;
  uint64_t entry_offset;            /* of the entry, from the table start */
};

struct qcow2_snapshot_table {
  uint32_t count;
  uint64_t table_bytes;             /* what the entries span, qemu's
                                       snapshots_size */
  struct qcow2_snapshot *snapshots; /* COUNT entries, in table order */
};

/* What parsing needs from the image header. */
struct qcow2_snapshot_image {
  uint32_t version;
  uint32_t cluster_bits;
  uint64_t virtual_size;
  uint64_t file_size;
  uint32_t nb_snapshots;
  uint64_t snapshots_offset;
};

/* How many bytes from snapshots_offset to read first: enough for entries
 * with short IDs and names, never past the file's end.  Returns 0 when
 * there is no table.
 */
size_t qcow2_snapshot_table_read_hint (const struct qcow2_snapshot_image *im);

/* Parse the snapshot table from BUF, LEN bytes read at IM->snapshots_offset.
 *
 * Returns 0 and sets *TABLE (free it with qcow2_snapshot_table_free; an
 * image without snapshots gives a table of 0 entries).  Returns 1 if BUF
 * ends before the table does: read *NEEDED bytes (more than LEN) from the
 * same offset and call again; *NEEDED never exceeds the file or qemu's
 * 64 MiB limit.  Returns -1 with a sentence in ERRBUF naming the header
 * field or the table entry: nb_snapshots above 65536, snapshots_offset not
 * cluster aligned, an entry running past the end of the file, extra data
 * above 1024 bytes, the table above 64 MiB.  Never reads outside BUF.
 */
int qcow2_snapshot_table_parse (const uint8_t *buf, size_t len,
                                const struct qcow2_snapshot_image *im,
                                struct qcow2_snapshot_table **table,
                                size_t *needed, char *errbuf, size_t errlen);

/* Accepts NULL. */
void qcow2_snapshot_table_free (struct qcow2_snapshot_table *table);

/* qemu's find_snapshot_by_id_and_name: with ID and NAME both set, the
 * first snapshot that has both; with one of them, the first that has it.
 * NULL if none.
 */
const struct qcow2_snapshot *
qcow2_snapshot_find (const struct qcow2_snapshot_table *table,
                     const char *id, const char *name);

/* Pick the snapshot SELECTOR names, as qemu-nbd -l and qemu-img convert -l
 * read their argument: "snapshot.id=ID", "snapshot.name=NAME" or both
 * joined by a comma (",," is a literal comma), both must then match one
 * snapshot; any other string is an ID or a name, and the ID wins: only if
 * no snapshot has that ID does the first one with that name count.
 * Returns the snapshot, or NULL with a sentence in ERRBUF that says what
 * was not found and lists the snapshots there are.
 */
const struct qcow2_snapshot *
qcow2_snapshot_select (const struct qcow2_snapshot_table *table,
                       const char *selector, char *errbuf, size_t errlen);

/* Before serving SN: its L1 table must be cluster aligned, not at offset
 * 0, at most 32 MiB (qemu's checks) and inside the file.  Returns 0, or -1
 * with a sentence naming the snapshot (ID and name) and the field.
 */
int qcow2_snapshot_check (const struct qcow2_snapshot *sn,
                          const struct qcow2_snapshot_image *im,
                          char *errbuf, size_t errlen);

/* One line for the debug output, like a row of qemu-img snapshot -l:
 * "id 1 name \"before\" l1 0x50000 (1 entries) disk 1048576 vm-state 0
 * date 2026-12-01 09:28:24 vm-clock 00:00:00.000 icount 0".  Bytes that
 * are not printable ASCII in the ID and name appear as \xNN.
 */
void qcow2_snapshot_describe (const struct qcow2_snapshot *sn,
                              char *buf, size_t len);

#endif /* QCOW2_SNAPSHOT_H */
