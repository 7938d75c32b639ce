/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the commit protocol (see paths/commit.h). */

#include <config.h>

#include <errno.h>

#include "paths/commit.h"
#include "meta/map.h"
#include "base/inflight.h"
#include "base/check.h"
#include "format/endian.h"
#include "format/entries.h"
#include "meta/alloc.h"
#include "meta/corrupt.h"
#include "meta/first-change.h"
#include "meta/l2table.h"
#include "meta/log.h"
#include "meta/pack.h"
#include "meta/refcount.h"
#include "meta/regions.h"
#include "meta/release.h"
#include "meta/writeback.h"
#include "base/lockorder.h"

void
commit_init (struct commit *commit, struct qcow2_image *img,
             struct qcow2_io *io, uint64_t first, size_t n,
             struct commit_cluster *c, uint64_t *entries, uint64_t *bitmaps,
             uint8_t *l2buf)
{
  QCOW2_ASSERT (n > 0 && n <= QCOW2_COMMIT_MAX);
  QCOW2_ASSERT (first >> img->header.l2_bits ==
                (first + n - 1) >> img->header.l2_bits);
  *commit = (struct commit) {
    .img = img, .io = io, .first = first, .n = n, .c = c,
    .entries = entries, .bitmaps = bitmaps, .l2buf = l2buf,
  };
}

/* Queue the release of what MAP held, for after the next writeback.
 * The data clusters of an external data file are counted by no refcount
 * (qemu places each at its guest offset there): nothing to release.
 */
static int
release_old (struct qcow2_image *img, const struct cluster_map *map)
{
  uint64_t start, len;

  if (img->data_file)
    return 0;
  switch (map->kind) {
  case CLUSTER_UNALLOCATED:
    return 0;
  case CLUSTER_ZERO:
    if (map->host_offset == 0)
      return 0;
    /* A zero cluster that kept its allocation releases it like a
     * normal one.
     */
    __attribute__ ((fallthrough));
  case CLUSTER_NORMAL:
    return qcow2_free_later (img, map->host_offset, img->header.cluster_size,
                             0);
  case CLUSTER_COMPRESSED:
    qcow2_compressed_span (map, &start, &len);
    return qcow2_free_later (img, start, len, map->l2_entry);
  }
  return 0;
}

/* Does the new ENTRY still name the host cluster that OLD held (a zero
 * entry that keeps it)?  Then nothing is released.
 */
static bool
keeps_host (const struct cluster_map *old, uint64_t entry)
{
  return !(entry & L2E_COMPRESSED) && old->kind != CLUSTER_COMPRESSED &&
    old->host_offset && (entry & L2E_OFFSET_MASK) == old->host_offset;
}

static enum commit_step
failed (struct commit *commit, int r)
{
  commit->error = r;
  return COMMIT_STEP_FAILED;
}

/* An allocation answered R: no room that a writeback makes stops the
 * commit here, anything else fails it.
 */
static enum commit_step
no_room (struct commit *commit, int r)
{
  if (r == -ENOSPC && qcow2_alloc_room_after_writeback (commit->img)) {
    commit->needs_room = true;
    return COMMIT_STEP_STOP;
  }
  return failed (commit, r);
}

/* The host bytes MAP names must be guest data: an entry that names
 * metadata is damage, and a change where it leads would write there, or
 * release it.  The image is marked corrupt then (meta/corrupt.h), before
 * anything of the commit is written.  GUEST_CLUSTER: for the message.
 */
static enum commit_step
check_data (struct commit *commit, const struct cluster_map *map,
            uint64_t guest_cluster)
{
  struct qcow2_image *img = commit->img;
  enum qcow2_region other;
  uint64_t start, len, where;

  switch (map->kind) {
  case CLUSTER_UNALLOCATED:
    return COMMIT_STEP_NEXT;
  case CLUSTER_ZERO:
  case CLUSTER_NORMAL:
    /* Host offsets into an external data file, where no metadata is. */
    if (map->host_offset == 0 || img->data_file)
      return COMMIT_STEP_NEXT;
    start = map->host_offset;
    len = img->header.cluster_size;
    break;
  case CLUSTER_COMPRESSED:
    qcow2_compressed_span (map, &start, &len);
    break;
  default:
    return COMMIT_STEP_NEXT;
  }
  other = qcow2_regions_overlap (img, QCOW2_REGION_NONE, start, len, &where);
  if (other == QCOW2_REGION_NONE)
    return COMMIT_STEP_NEXT;
  return failed (commit,
                 qcow2_corrupt_overlap (img, commit->io, QCOW2_REGION_NONE,
                                        other, where, start, len,
                                        guest_cluster <<
                                        img->header.cluster_bits));
}

/* Before a decision that changes cluster I's metadata or writes its
 * data: what it held is guest data, the lock is held exclusively, the
 * image's first change is made, and the L2 table is ready for change
 * (made, if the L1 entry has none).
 */
static enum commit_step
prepare (struct commit *commit, size_t i, bool needs_table)
{
  struct qcow2_image *img = commit->img;
  enum commit_step step = check_data (commit, &commit->c[i].old,
                                      commit->first + i);
  int r;

  if (step != COMMIT_STEP_NEXT)
    return step;
  /* The first change is made before the lock is taken (commit_run);
   * armed again meanwhile (a clean close), it is made first again.
   */
  if (!commit->exclusive || atomic_load (&img->first_change_pending))
    return COMMIT_STEP_EXCLUSIVE;
  r = 0;
  if (needs_table && commit->table == NULL)
    r = qcow2_l2_for_write (img, commit->io,
                            commit->first >> img->header.l2_bits, true,
                            &commit->table);
  if (r < 0)
    return no_room (commit, r);
  return COMMIT_STEP_NEXT;
}

/* Entry I of the table becomes ENTRY, and with extended L2 entries its
 * bitmap the cluster's new one.
 */
static void
put_entry (struct commit *commit, struct meta_table *t, size_t i,
           uint64_t entry)
{
  const struct qcow2_header *h = &commit->img->header;
  const uint64_t l2_mask = (UINT64_C (1) << h->l2_bits) - 1;
  uint8_t *at = t->data + ((commit->first + i) & l2_mask) * h->l2_entry_size;

  put_be64 (at, entry);
  if (h->extended_l2)
    put_be64 (at + 8, commit->c[i].bitmap);
  t->dirty = true;
}

enum commit_step
commit_prepare (struct commit *commit, size_t i)
{
  return prepare (commit, i, true);
}

enum commit_step
commit_keep (struct commit *commit, size_t i)
{
  commit->c[i].action = COMMIT_KEEP;
  return COMMIT_STEP_NEXT;
}

enum commit_step
commit_set_entry (struct commit *commit, size_t i, uint64_t entry)
{
  enum commit_step step = prepare (commit, i, true);
  int r;

  if (step != COMMIT_STEP_NEXT)
    return step;
  put_entry (commit, commit->table, i, entry);
  commit->c[i].action = COMMIT_SET;
  r = keeps_host (&commit->c[i].old, entry) ? 0
    : release_old (commit->img, &commit->c[i].old);
  return r < 0 ? failed (commit, r) : COMMIT_STEP_NEXT;
}

enum commit_step
commit_in_place (struct commit *commit, size_t i)
{
  enum commit_step step = check_data (commit, &commit->c[i].old,
                                      commit->first + i);

  if (step != COMMIT_STEP_NEXT)
    return step;
  if (!commit->exclusive &&
      atomic_load (&commit->img->first_change_pending))
    return COMMIT_STEP_EXCLUSIVE;
  if (commit->exclusive) {
    step = prepare (commit, i, false);
    if (step != COMMIT_STEP_NEXT)
      return step;
  }
  commit->c[i].action = COMMIT_IN_PLACE;
  return COMMIT_STEP_NEXT;
}

enum commit_step
commit_new_cluster (struct commit *commit, size_t i)
{
  enum commit_step step = prepare (commit, i, true);
  int r;

  if (step != COMMIT_STEP_NEXT)
    return step;
  /* In an external data file, qemu places a cluster at its guest offset,
   * which no other guest cluster can take: nothing to allocate.
   */
  if (commit->img->data_file)
    commit->c[i].host = (commit->first + i)
      << commit->img->header.cluster_bits;
  else {
    r = qcow2_alloc_clusters (commit->img, commit->io, 1,
                              &commit->c[i].host);
    if (r < 0)
      return no_room (commit, r);
  }
  commit->c[i].action = COMMIT_NEW;
  return COMMIT_STEP_NEXT;
}

enum commit_step
commit_reuse_kept (struct commit *commit, size_t i)
{
  enum commit_step step = prepare (commit, i, true);

  if (step != COMMIT_STEP_NEXT)
    return step;
  commit->c[i].host = commit->c[i].old.host_offset;
  commit->c[i].action = COMMIT_REUSE;
  return COMMIT_STEP_NEXT;
}

enum commit_step
commit_pack (struct commit *commit, size_t i, uint64_t len)
{
  enum commit_step step = prepare (commit, i, true);
  uint64_t host;
  int r;

  if (step != COMMIT_STEP_NEXT)
    return step;
  r = qcow2_pack_reserve (commit->img, commit->io, len, &host);
  if (r < 0)
    return no_room (commit, r);
  commit->c[i].host = host;
  commit->c[i].bitmap = 0;
  commit->c[i].entry = qcow2_compressed_entry (host, len,
                                               commit->img->header.cluster_bits);
  commit->c[i].action = COMMIT_LINK;
  return COMMIT_STEP_NEXT;
}

enum commit_step
commit_link_entry (struct commit *commit, size_t i, uint64_t entry)
{
  enum commit_step step = prepare (commit, i, true);
  struct cluster_map shared;
  int r;

  if (step != COMMIT_STEP_NEXT)
    return step;
  /* What it is to share must be guest data too. */
  r = qcow2_classify (commit->img, commit->first + i, entry, &shared);
  if (r < 0)
    return failed (commit, r);
  step = check_data (commit, &shared, commit->first + i);
  if (step != COMMIT_STEP_NEXT)
    return step;
  commit->c[i].host = 0;
  commit->c[i].entry = entry;
  commit->c[i].bitmap = 0;
  commit->c[i].action = COMMIT_LINK;
  return COMMIT_STEP_NEXT;
}

/* ------------------------------------------------------------ the run */

static bool
links (const struct commit_cluster *c)
{
  return c->action == COMMIT_NEW || c->action == COMMIT_REUSE ||
    c->action == COMMIT_LINK;
}

/* Step 1's lookup: every cluster's entry into commit->c[i].old. */
static int
look_up (struct commit *commit)
{
  struct qcow2_image *img = commit->img;
  size_t n = commit->n, i;
  int r;

  r = qcow2_l2_entries (img, commit->io, commit->first, &n, commit->entries,
                        commit->bitmaps, commit->l2buf);
  QCOW2_ASSERT (r < 0 || n == commit->n);
  for (i = 0; r == 0 && i < commit->n; ++i) {
    r = qcow2_classify_fetched (img, commit->first, i, commit->entries,
                                commit->bitmaps, &commit->c[i].old);
    commit->c[i].action = COMMIT_KEEP;
    commit->c[i].host = commit->c[i].entry = 0;
    commit->c[i].old_bitmap = commit->c[i].bitmap = commit->bitmaps[i];
  }
  return r;
}

/* Step 4, with the image lock held exclusively: point the entries at
 * what was written (WRITTEN), or give back what was reserved.
 */
static int
link (struct commit *commit, const struct commit_policy *policy,
      void *opaque, bool written)
{
  struct qcow2_image *img = commit->img;
  struct meta_table *t = NULL;
  struct cluster_map map;
  size_t i;
  int r = 0;

  if (written) {
    r = qcow2_l2_for_write (img, commit->io,
                            commit->first >> img->header.l2_bits, false, &t);
    if (r == 0 && t == NULL) {
      /* Made in step 1, and only the writeback lets a table go, once it
       * is written and clean, to load it again from disk.
       */
      QCOW2_ASSERT (t != NULL);
      qcow2_error (img, "internal error: the L2 table of guest cluster %"
                   PRIu64 " went away", commit->first);
      r = -EIO;
    }
  }
  for (i = 0; i < commit->n; ++i) {
    struct commit_cluster *c = &commit->c[i];
    bool ok = written && r == 0;

    if (!links (c))
      continue;
    if (ok) {
      put_entry (commit, t, i, c->action == COMMIT_LINK ? c->entry
                 : c->host | L2E_COPIED);
      if (c->action != COMMIT_REUSE)
        r = release_old (img, &c->old);
    }
    else if (c->action == COMMIT_NEW && !img->data_file)
      qcow2_free_later (img, c->host, img->header.cluster_size, 0);
    else if (c->action == COMMIT_LINK &&
             qcow2_classify (img, commit->first + i, c->entry, &map) == 0)
      /* Nothing points at what was packed or referenced for it. */
      release_old (img, &map);
    if (policy->linked)
      policy->linked (commit, i, ok, opaque);
  }
  return r;
}

enum commit_outcome
commit_run (struct commit *commit, const struct commit_policy *policy,
            void *opaque)
{
  struct qcow2_image *img = commit->img;
  const uint64_t l1_index = commit->first >> img->header.l2_bits;
  enum commit_outcome outcome;
  struct qcow2_inflight_op reg;
  struct qcow2_claim claim;
  bool exclusive = policy->exclusive, looked_up = false;
  bool claims, in_place, changes;
  uint64_t ticket;
  size_t s, i, span;
  int r;

 again:
  if (exclusive) {
    /* An L2 table that is not in memory, and the refcount block the
     * allocator will look at first, are read here, with the lock shared,
     * and not below with it held exclusively, where the reads would stop
     * every reader and writer of the image for a device round trip.  (A
     * table let go in between is read again below.)  The first change's
     * writes and flush go out with no image lock held.
     */
    struct refcount_fetch fetched = { .n = 0 };

    qcow2_rwlock_rdlock (&img->lock);
    r = looked_up ? 0 : look_up (commit);
    if (r == 0)
      r = qcow2_alloc_fetch (img, commit->io, &fetched);
    qcow2_rwlock_unlock (&img->lock);
    if (r == 0)
      r = qcow2_first_change (img, commit->io);
    qcow2_rwlock_wrlock (&img->lock);
    qcow2_refcount_adopt (img, &fetched);
    if (r < 0) {
      qcow2_rwlock_unlock (&img->lock);
      commit->error = r;
      return COMMIT_FAILED;
    }
  }
  else
    qcow2_rwlock_rdlock (&img->lock);
  commit->exclusive = exclusive;
  commit->table = NULL;
  commit->needs_room = false;
  commit->done = 0;
  if (qcow2_inflight_claimed (&img->inflight, commit->first,
                              commit->first + commit->n, &ticket)) {
    qcow2_rwlock_unlock (&img->lock);
    qcow2_inflight_wait_claim (&img->inflight, ticket);
    goto again;
  }
  r = look_up (commit);
  looked_up = true;
  if (r < 0) {
    qcow2_rwlock_unlock (&img->lock);
    commit->error = r;
    return COMMIT_FAILED;
  }

  /* 1. Decide. */
  outcome = COMMIT_OK;
  claims = in_place = changes = false;
  span = 0;
  for (s = 0; s < commit->n; ++s) {
    enum commit_step step;

    i = policy->order ? policy->order[s] : s;
    step = policy->decide (commit, i, opaque);
    if (step == COMMIT_STEP_NEXT) {
      const struct commit_cluster *c = &commit->c[i];

      if (c->action != COMMIT_KEEP && i + 1 > span)
        span = i + 1;
      in_place |= c->action == COMMIT_IN_PLACE;
      changes |= c->action != COMMIT_KEEP && c->action != COMMIT_IN_PLACE;
      claims |= links (c) ||
        (policy->claim_in_place && c->action == COMMIT_IN_PLACE);
      continue;
    }
    if (step == COMMIT_STEP_EXCLUSIVE) {
      QCOW2_ASSERT (!exclusive ||
                    atomic_load (&img->first_change_pending));
      if (span == 0) {
        /* Nothing to write yet: decide it all again, exclusively (and
         * after the first change).
         */
        qcow2_rwlock_unlock (&img->lock);
        exclusive = true;
        goto again;
      }
      break;                    /* commit what is decided, then go on */
    }
    if (step == COMMIT_STEP_STOP) {
      outcome = commit->needs_room ? COMMIT_NEEDS_ROOM : COMMIT_STOPPED;
      break;
    }
    QCOW2_ASSERT (step == COMMIT_STEP_FAILED && commit->error < 0);
    link (commit, policy, opaque, false);
    qcow2_rwlock_unlock (&img->lock);
    return COMMIT_FAILED;
  }
  commit->done = s;

  /* 2. Claim, register, let the lock go. */
  if (claims)
    qcow2_inflight_claim (&img->inflight, &claim, commit->first,
                          commit->first + span);
  if (in_place) {
    qcow2_inflight_enter (&img->inflight, &reg);
    if (qcow2_l2_dirty (img, l1_index))
      commit->needs_writeback = true;
  }
  if (changes)
    commit->needs_writeback = true;
  if (!claims && qcow2_too_much_dirty (img))
    commit->too_much_dirty = true;
  commit->table = NULL;
  qcow2_rwlock_unlock (&img->lock);

  /* 3. The data. */
  r = in_place || claims ? policy->write (commit, opaque) : 0;
  if (in_place)
    qcow2_inflight_leave (&img->inflight, &reg);

  /* 4. Link. */
  if (claims) {
    int r2;

    qcow2_rwlock_wrlock (&img->lock);
    r2 = link (commit, policy, opaque, r == 0);
    qcow2_inflight_unclaim (&img->inflight, &claim);
    if (qcow2_too_much_dirty (img))
      commit->too_much_dirty = true;
    qcow2_rwlock_unlock (&img->lock);
    if (r == 0)
      r = r2;
  }
  if (r < 0) {
    commit->error = r;
    return COMMIT_FAILED;
  }
  return outcome;
}
