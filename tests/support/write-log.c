/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: what a recorded storage log says (a mem_io made
 * with MEM_IO_RECORD): what each write changed, whether the writes came
 * in an order that keeps every crash state consistent, and whether the
 * discards were safe.
 */
#include <config.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"
#include "unit.h"
#include "util.h"
#include "write-image.h"
#include "write-log.h"

static const char *const kind_names[] = {
  [WRITE_DATA] = "D", [WRITE_HEADER] = "H", [WRITE_REFCOUNT_TABLE] = "T",
  [WRITE_REFCOUNT_BLOCK] = "B", [WRITE_L1] = "L1", [WRITE_L2] = "L2",
  [WRITE_LUKS] = "K", [WRITE_SNAPSHOT_TABLE] = "S",
};

/* A cluster holds what the final storage says it holds, since the last
 * time its refcount on disk dropped to 0: before that it held data that
 * was released (metadata is never released, but for a refcount table
 * that moved, which is not written after it moved).
 */
int *
classify_log (const struct mem_io *m)
{
  int *kind = xmalloc ((m->nops + 1) * sizeof *kind);
  uint8_t *state = mem_io_state_at (m, m->nops);
  struct image_report final, report;
  size_t nflush = 0, f;
  size_t *flush_at;
  uint8_t **free_at;            /* per flush: a bit per cluster, refcount 0 */
  uint64_t clusters;
  struct mem_replay replay;

  check_image (state, m->size, false, &final);
  free (state);
  clusters = final.host_clusters;
  flush_at = xmalloc ((m->nops + 1) * sizeof *flush_at);
  free_at = xmalloc ((m->nops + 1) * sizeof *free_at);
  mem_replay_init (&replay, m);
  for (size_t i = 0; i < m->nops; ++i) {
    if (!m->ops[i].flush)
      continue;
    check_image (mem_replay_to (&replay, i), m->size, false, &report);
    flush_at[nflush] = i;
    free_at[nflush] = xcalloc (1, (clusters + 7) / 8);
    for (uint64_t c = 0; c < clusters && c < report.host_clusters; ++c)
      if (report.refcount[c] == 0)
        free_at[nflush][c / 8] |= 1 << (c % 8);
    nflush++;
    image_report_free (&report);
  }
  mem_replay_free (&replay);

  for (size_t i = 0; i < m->nops; ++i) {
    uint64_t c = m->ops[i].offset / final.cluster_size;

    kind[i] = m->ops[i].discard ? OP_DISCARD : OP_FLUSH;
    if (m->ops[i].flush || m->ops[i].discard)
      continue;
    kind[i] = c < clusters && final.refs[c]
      ? classify_write (&final, m->ops[i].offset, m->ops[i].len) : WRITE_DATA;
    /* The last flush at which the count had dropped to 0. */
    for (f = nflush; f-- > 1; )
      if (c < clusters && (free_at[f][c / 8] & (1 << (c % 8))) &&
          !(free_at[f - 1][c / 8] & (1 << (c % 8))))
        break;
    if (f != (size_t) -1 && f > 0 && flush_at[f] > i)
      kind[i] = WRITE_DATA;
  }
  for (f = 0; f < nflush; ++f)
    free (free_at[f]);
  free (free_at);
  free (flush_at);
  image_report_free (&final);
  return kind;
}

void
log_sequence (const struct mem_io *m, const int *kind, size_t from, size_t to,
          char *out, size_t len)
{
  const char *last = NULL;

  out[0] = '\0';
  for (size_t i = from; i < to; ++i) {
    const char *name = kind[i] == OP_FLUSH ? "F"
      : kind[i] == OP_DISCARD ? "X" : kind_names[kind[i]];
    if (last && strcmp (name, last) == 0 && kind[i] >= 0)
      continue;
    snprintf (out + strlen (out), len - strlen (out), "%s%s",
              out[0] ? " " : "", name);
    last = name;
  }
}

/* What a write of each kind refers to: those must be durable first. */
void
check_dependencies (const struct mem_io *m, const int *kind, const char *ctx)
{
  static const unsigned deps[] = {
    [WRITE_DATA] = 0,
    [WRITE_HEADER] = 1u << WRITE_REFCOUNT_TABLE,
    [WRITE_REFCOUNT_TABLE] = 1u << WRITE_REFCOUNT_BLOCK,
    [WRITE_REFCOUNT_BLOCK] = 1u << WRITE_L2 | 1u << WRITE_L1,
    [WRITE_L2] = 1u << WRITE_DATA | 1u << WRITE_REFCOUNT_BLOCK |
      1u << WRITE_REFCOUNT_TABLE | 1u << WRITE_HEADER,
    [WRITE_L1] = 1u << WRITE_L2 | 1u << WRITE_DATA |
      1u << WRITE_REFCOUNT_BLOCK | 1u << WRITE_REFCOUNT_TABLE |
      1u << WRITE_HEADER,
    [WRITE_LUKS] = 0, [WRITE_SNAPSHOT_TABLE] = 0,
  };
  unsigned unflushed = 0, bad = 0;

  for (size_t i = 0; i < m->nops; ++i) {
    if (kind[i] == OP_FLUSH)
      unflushed = 0;
    if (kind[i] < 0)
      continue;
    if ((deps[kind[i]] & unflushed) && bad++ == 0) {
      char seq[200];
      log_sequence (m, kind, i >= 8 ? i - 8 : 0, i + 1, seq, sizeof seq);
      fprintf (stderr, "  %s: op %zu (%s at 0x%" PRIx64 ") before a flush "
               "of what it depends on: ... %s\n", ctx, i,
               kind_names[kind[i]], m->ops[i].offset, seq);
    }
    unflushed |= 1u << kind[i];
  }
  CHECK_EQ (bad, 0);
}

/* Per 512-byte sector of a state: 1 if a discard left it garbage and
 * nothing was written there since.
 */
static void
note_op (uint8_t *discarded, const struct mem_op *op)
{
  if (op->flush)
    return;
  for (uint64_t sec = op->offset / 512;
       sec < (op->offset + op->len + 511) / 512; ++sec)
    discarded[sec] = op->discard;
}

/* Does STATE (SIZE bytes) reference what DISCARDED says is garbage?  A
 * table's cluster must hold no garbage sector, a data cluster not only
 * garbage (packed compressed data may go back into part of a cluster
 * that was discarded, whose other sectors no reference reads).
 */
static bool
references_discarded (const uint8_t *state, uint64_t size,
                      const uint8_t *discarded, const char *what)
{
  struct image_report report;
  bool bad = false;

  check_image (state, size, false, &report);
  for (uint64_t c = 0; c < report.host_clusters && !bad; ++c) {
    uint64_t per = report.cluster_size / 512, marked = 0;

    if (report.refs[c] == 0)
      continue;
    for (uint64_t sec = c * per; sec < (c + 1) * per; ++sec)
      marked += discarded[sec];
    if (marked == per || (marked && report.role[c] != WRITE_DATA)) {
      fprintf (stderr, "  %s: host cluster %" PRIu64 " is referenced (%u) "
               "but %" PRIu64 " of its sectors were discarded\n", what, c,
               report.refs[c], marked);
      bad = true;
    }
  }
  image_report_free (&report);
  return bad;
}

void
check_crash_states (const struct mem_io *m, uint64_t seed, const char *ctx)
{
  const uint64_t sectors = m->size / 512;
  uint8_t *prefix_discarded = xcalloc (1, sectors);
  uint8_t *discarded = xmalloc (sectors);
  unsigned failures = 0;
  size_t applied = 0;
  struct mem_replay replay;

  mem_replay_init (&replay, m);
  for (size_t f = 0; f <= m->nops && failures < 3; ++f) {
    size_t next = f;
    if (f > 0 && !m->ops[f - 1].flush)
      continue;                         /* states start after a flush */
    while (next < m->nops && !m->ops[next].flush)
      next++;
    for (; applied < f; ++applied)
      note_op (prefix_discarded, &m->ops[applied]);
    for (unsigned trial = 0; trial < 4 && failures < 3; ++trial) {
      const uint8_t *state = mem_replay_to (&replay, f);
      char what[300];

      memcpy (discarded, prefix_discarded, sectors);
      /* trial 0: nothing after the flush; 1: all of it; else a subset.
       * A discard that reached the storage left garbage.
       */
      for (size_t i = f; i < next && trial > 0; ++i)
        if (trial == 1 || rng (&seed) % 2) {
          mem_replay_apply (&replay, &m->ops[i]);
          note_op (discarded, &m->ops[i]);
        }
      snprintf (what, sizeof what, "%s: crash after op %zu (trial %u)",
                ctx, f, trial);
      if (!check_file (state, m->size, false, what))
        failures++;
      else if (references_discarded (state, m->size, discarded, what)) {
        CHECK (!"a crash state refers to a discarded cluster");
        failures++;
      }
    }
  }
  mem_replay_free (&replay);
  free (discarded);
  free (prefix_discarded);
}

uint64_t
check_discards (const struct mem_io *m, const char *ctx)
{
  uint64_t bytes = 0;
  unsigned bad = 0;
  struct mem_replay replay;

  mem_replay_init (&replay, m);
  for (size_t i = 0; i < m->nops; ++i) {
    const struct mem_op *op = &m->ops[i];
    struct image_report report;
    size_t j = i;

    if (!op->discard)
      continue;
    bytes += op->len;
    while (j > 0 && m->ops[j - 1].discard)
      j--;
    if (j == 0 || !m->ops[j - 1].flush) {
      if (bad++ == 0)
        fprintf (stderr, "  %s: discard (op %zu) not right after a flush\n",
                 ctx, i);
      continue;
    }
    /* J, where this run of discards begins, never goes back. */
    check_image (mem_replay_to (&replay, j), m->size, false, &report);
    for (uint64_t c = op->offset / report.cluster_size;
         c < (op->offset + op->len) / report.cluster_size &&
           c < report.host_clusters; ++c)
      if ((report.refcount[c] || report.refs[c]) && bad++ == 0)
        fprintf (stderr, "  %s: discard (op %zu) of host cluster %" PRIu64
                 ", whose refcount is %" PRIu64 " and references %u\n",
                 ctx, i, c, report.refcount[c], report.refs[c]);
    if (op->offset % report.cluster_size || op->len % report.cluster_size)
      if (bad++ == 0)
        fprintf (stderr, "  %s: discard (op %zu) not of whole clusters\n",
                 ctx, i);
    image_report_free (&report);
  }
  mem_replay_free (&replay);
  CHECK_EQ (bad, 0);
  return bytes;
}

unsigned
flushes_between (const struct mem_io *m, size_t start, size_t end)
{
  unsigned n = 0;

  for (size_t i = start; i < end; ++i)
    n += m->ops[i].flush;
  return n;
}
