/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: the internal snapshot table.  The first 16 bytes give the
 * image (version, cluster_bits, nb_snapshots, virtual size); the rest is
 * the table, read at cluster 5 of a file that ends with it.  Every parsed
 * snapshot is checked, described and looked up by its ID and name.
 */
#include <config.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "format/endian.h"
#include "format/snapshot.h"

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  struct qcow2_snapshot_image im;
  struct qcow2_snapshot_table *t;
  size_t needed;
  char err[512], line[512], selector[300];

  if (size < 16)
    return 0;
  im.version = 2 + (data[0] & 1);
  im.cluster_bits = 9 + data[1] % 13;
  im.nb_snapshots = be32 (data + 2) % 70000;
  im.virtual_size = be64 (data + 8);
  im.snapshots_offset = (uint64_t) 5 << im.cluster_bits;
  im.file_size = im.snapshots_offset + (size - 16);

  if (qcow2_snapshot_table_parse (data + 16, size - 16, &im, &t, &needed,
                                  err, sizeof err) != 0)
    return 0;
  for (uint32_t i = 0; i < t->count; ++i) {
    const struct qcow2_snapshot *sn = &t->snapshots[i];
    qcow2_snapshot_check (sn, &im, err, sizeof err);
    qcow2_snapshot_describe (sn, line, sizeof line);
    /* A name can only be missed when it reads as KEY=VALUE options. */
    if (qcow2_snapshot_find (t, sn->id, NULL) == NULL ||
        (strncmp (sn->name, "snapshot.", 9) != 0 &&
         qcow2_snapshot_select (t, sn->name, err, sizeof err) == NULL))
      __builtin_trap ();
    snprintf (selector, sizeof selector, "snapshot.id=%.100s,snapshot.name=x",
              sn->id);
    qcow2_snapshot_select (t, selector, err, sizeof err);
  }
  qcow2_snapshot_select (t, "snapshot.name=", err, sizeof err);
  qcow2_snapshot_table_free (t);
  return 0;
}
