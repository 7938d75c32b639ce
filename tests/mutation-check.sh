#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The mutation check: do the tests catch the breaks they claim to?
#
#     bash tests/mutation-check.sh [BREAK...]
#
# Every break rebuilds the tree and runs its tests, so by hand it takes
# a while.  It copies the source tree (the files git knows, with their
# uncommitted changes) to a scratch directory, builds it once, runs every
# test named below on the unbroken tree (the baseline: none may fail),
# then applies each break in turn, rebuilds, runs the tests that claim to
# cover it and restores the file.  It prints a table: break, the tests
# that failed of those run, how long they took, where the break was
# applied.  A break no test catches, or that cannot be applied any more
# (the function it names is gone or no longer has the line it changes),
# makes the exit status 1.
#
# A test is named as a make check target would be (test-backing, or
# test-engine-write for a unit test), or as TEST:GLOB to run only the
# parts of the test whose section name matches GLOB (QCOW2ZSTD_SECTIONS,
# tests/functions.sh): a break is then caught by the part written for it,
# without the rest of a long test.  Each row lists its tests cheapest
# first, for MUTATION_FIRST below.
#
# Breaks find their target by the name of the function, wherever it is
# defined under common/, nbdkit-glue/, filters/ or plugins/ (so they
# survive files being split, renamed or moved), and change its body: a statement
# inserted at the start, or the lines matching a pattern replaced.
# Functions defined twice (the filter's and the plugin's callbacks of the
# same name) are told apart by the form: the file that registers a
# filter (NBDKIT_REGISTER_FILTER) or a plugin (NBDKIT_REGISTER_PLUGIN).
#
# Environment: MUTATION_DIR (scratch directory, default a new one under
# $TMPDIR; kept with KEEP=1), MUTATION_JOBS (make -j, default 2).
# MUTATION_BUILD=DIR: no copy; DIR is a configured build of this very
# tree, which must have no uncommitted change under the folders the
# breaks patch: the breaks are applied to it in place, and every file is
# restored as git has it, at the end of each break and on any exit.
# CI (.ci/run) runs every row this way, after its sanitizer stage ran the
# whole suite on the same tree, with two settings that keep the stage in
# minutes: MUTATION_BASELINE=no (no baseline run here: that stage was
# it, and CI runs this stage only when it passed) and MUTATION_FIRST=1
# (a row's tests run one at a time, in the order listed, until one
# fails: the table then names the test that caught the break and how
# many of the row's tests ran).
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
jobs=${MUTATION_JOBS:-2}

# name | function | form | change | tests
#   form: filter, plugin or any (the name must then be defined once)
#   change: start:STATEMENT       inserted after the opening brace
#           before-last:RE:STMT    inserted before the body's last line matching RE
#           replace:RE:TEXT        every body line matching RE becomes TEXT
# Several rows of the same name make one break (all applied together).
BREAKS=$(cat <<'EOF'
writes-do-nothing   | qcow2_write          | any    | start:return 0;                               | test-qemu-client test-plugin test-engine-write test-backing test-faults test-write-random test-crash test-hostile
writes-fail         | qcow2_write          | any    | start:return -EIO;                            | test-qemu-client test-plugin test-engine-write test-faults test-write-random test-crash test-hostile
compressed-reads-zeros | qcow2_decode_cluster | any | start:memset (out, 0, out_len); return 0;     | test-plugin test-codec test-parallel test-read-matrix test-hostile
flush-noop-filter   | qcow2zstd_flush      | filter | start:return 0;                               | test-shared test-faults test-crash
flush-noop-plugin   | qcow2zstd_flush      | plugin | start:return 0;                               | test-debug test-plugin test-plugin-durability
abort-at-unload     | qcow2zstd_unload     | filter | start:__builtin_abort ();                     | test-debug test-qemu-client test-backing test-mount-kernel test-man-examples test-hostile
abort-at-unload-plugin | qcow2zstd_unload  | plugin | start:__builtin_abort ();                     | test-debug test-plugin test-plugin-durability
abort-at-finalize   | qcow2zstd_finalize   | filter | before-last:^\s*return 0;:__builtin_abort (); | test-qemu-client test-mount test-backing test-write-random
hang-at-unload      | qcow2zstd_unload     | filter | start:{ extern int pause (void); for (;;) pause (); } | test-debug test-qemu-client test-backing
dropped-write-errors | next_pwrite         | any    | replace:^\s*return -\(:      return 0;        | test-faults test-create
trims-do-nothing    | qcow2_trim           | any    | start:return 0;                               | test-qemu-client test-engine-write test-backing test-write-random test-hostile
l2-not-written      | qcow2_dirty_copy_write | any    | start:return 0;                               | test-qemu-client test-plugin test-engine-writeback test-write-random test-crash
fua-ignored         | qcow2_write          | any    | start:fua = false;                            | test-plugin-durability test-stacks test-crash
fua-ignored         | qcow2_zero           | any    | start:fua = false;                            | 
fua-ignored         | qcow2_trim           | any    | start:fua = false;                            | 
discard-too-early   | writeback_serialized | any    | before-last:^\s*/\* 2\. L2 tables:qcow2_rwlock_wrlock (&img->lock); if (releases && qcow2_apply_frees (img, io, &c.frees) == 0 && qcow2_alloc_released (img)) { struct qcow2_release_plan early; if (qcow2_alloc_cut_released (img, io, &early) == 0) { qcow2_rwlock_unlock (&img->lock); qcow2_alloc_discard_released (img, io, &early); qcow2_rwlock_wrlock (&img->lock); qcow2_alloc_reuse_released (img, &early); } } releases = false; qcow2_rwlock_unlock (&img->lock); | test-power-loss:*-reuse-freed test-power-loss:*-discard-*
snapshot-cow-skipped | owned_alone         | any    | start:*alone = map->kind == CLUSTER_NORMAL; return 0; | test-engine-snapshots test-snapshots test-power-loss:*-snapshots
snapshot-l2-in-place | table_shared        | any    | start:*shared = false; *refcount = 1; return 0; | test-engine-snapshots test-snapshots
plaintext-encrypted | qcow2_sectors_encrypt | any    | start:return 0;                               | test-engine-luks test-encrypted test-power-loss:*-encrypted
encrypted-sector-race | qcow2_change_range | any    | replace:^\s*\.claim_in_place = qcow2_image_encrypted:    .claim_in_place = false, | test-engine-luks
overlap-unchecked   | qcow2_regions_overlap | any   | start:return QCOW2_REGION_NONE;               | test-overlap test-fuzz-corpus
corrupt-data-trusted | check_data          | any    | start:return COMMIT_STEP_NEXT;                       | test-overlap
lock-released-at-close | registry_release  | any    | start:locks_release_all ();                   | test-locking:overlap-*
lock-released-when-idle | registry_release | any    | before-last:^\s*img->state = CLOSING;:locks_release_all (); | test-locking:between-*
lock-not-taken      | lock_or_report       | any    | start:return 1;                               | test-locking:overlap-* test-locking:between-*
stale-cluster-cache | qcow2_apply_frees    | any    | replace:^\s*qcow2_cache_drop \(img->cluster_cache, p->cache_key\);:      (void) 0; | test-discard:reuse-cache-*
backing-read-unclamped | inside            | any    | start:return len;                             | test-backing:odd-backing-*
zeroes-first-cluster | qcow2_change_range  | any    | replace:^\s*zero_flags\[i\] = whole && qcow2_all_zero \(buf \+ in_buf, len\);:        (void) in_buf; zero_flags[i] = whole && qcow2_all_zero (buf, len); | test-discard:detect-zeroes-multi test-engine-writeback
zeroes-misaligned   | qcow2_change_range   | any    | replace:^\s*zero_flags\[i\] = whole && qcow2_all_zero \(buf \+ in_buf, len\);:        (void) in_buf; zero_flags[i] = whole && qcow2_all_zero (buf + (i << bits) + part_off, len); | test-discard:detect-zeroes-multi test-engine-writeback
lazy-without-dirty-bit | dirty_bit_wanted  | any    | start:return false;                           | test-lazy-mode
lazy-without-dirty-bit | refcounts_deferred | any   | start:return img->opts.lazy_refcounts;        | 
lazy-close-no-refcounts | qcow2_writeback_clean | any | replace:^\s*r = writeback_serialized \(img, io, true, true\);:    r = writeback_serialized (img, io, true, false); | test-lazy-mode
create-order        | qcow2_create         | any    | replace:^  r = io->flush \(io->opaque\);:  r = 0; | test-engine-writeback test-power-loss:*-create
create-header-unflushed | qcow2_create     | any    | replace:^    r = io->flush \(io->opaque\);:    r = 0; | test-engine-writeback test-power-loss:*-create
claims-not-checked  | commit_run           | any    | replace:^\s*if \(qcow2_inflight_claimed \(&img->inflight, commit->first,:  if (0 && qcow2_inflight_claimed (&img->inflight, commit->first, | test-engine-writeback test-concurrent-writes
grace-skipped       | qcow2_inflight_wait  | any    | start:return;                                 | test-engine-writers
corrupt-bit-overwritten | qcow2_pwrite_dirty_bit | any | replace:^\s*if \(r == 0 && atomic_load \(&img->corrupt\)\) \{:  if (0) { | test-engine-writers
l2-read-exclusive   | commit_run           | any    | replace:^\s*r = looked_up \? 0 . look_up \(commit\);:    r = looked_up ? 0 : 0; | test-engine-writers
refcount-block-exclusive | qcow2_alloc_fetch | any    | start:return 0;                               | test-engine-writers
release-block-exclusive | qcow2_frees_fetch | any     | start:return 0;                               | test-engine-writers
cut-not-held-back   | find_free            | any    | replace:^\s*\? a->cut_from . a->host_clusters;:    ? a->host_clusters : a->host_clusters; | test-fileio
fetch-not-in-background | queue_next     | any    | start:return false;                           | test-engine-read test-http
fetch-failure-retried | fetch_in_background | any  | replace:^\s*fa->background = BACKGROUND_FAILED;:      (void) 0; | test-engine-read
fetch-straddle-refetched | spans_with    | any    | replace:^\s*\*second = other;:    return false; | test-engine-read
new-cluster-zeros-trusted | new_cluster_zeroed | any | replace:^\s*hole && length == cluster_size;:    true; | test-write-edge:holes-old-bytes
new-cluster-zeros-written | new_cluster_zeroed | any | start:return false;                       | test-write-edge:holes-truncated
new-cluster-after-discard | new_cluster_zeroed | any | replace:^\s*host < atomic_load \(&img->discarded_end\)\):      false) | test-power-loss-plugin:plugin-create
cache-admits-everything | qcow2_cache_offer | any | replace:^\s*stored = put_locked \(cache, s, key, hash, src, true\);:  stored = put_locked (cache, s, key, hash, src, false); | test-cache
cache-admits-ties   | put_locked           | any    | replace:^\s*sketch_estimate \(s, hash\) <=:          sketch_estimate (s, hash) < | test-cache
cluster-cache-stores-all | qcow2_image_open  | any    | replace:^\s*img->cluster_cache = qcow2_cache_new_admitting \(img->header.cluster_size,:  img->cluster_cache = qcow2_cache_new (img->header.cluster_size, | test-engine-read
reads-unregistered  | read_range           | any    | replace:^\s*if \(!registered\) \{:    if (0) { | test-engine-writers
copy-full-not-relooked | share_verified    | any    | replace:^\s*\? 0 . QCOW2_DEDUP_NO_SHARE;:      ? QCOW2_DEDUP_NO_SHARE : QCOW2_DEDUP_NO_SHARE; | test-shared
l2-run-kept-on-change | qcow2_l2_for_write  | any    | replace:^\s*qcow2_l2_run_forget \(img, l1_index\);:        (void) 0; | test-engine-write
l2-runs-never-kept  | run_of               | any    | start:return 0;                               | test-engine-write
l2-run-bitmap-lost  | run_entries          | any    | replace:^\s*bitmaps\[i\] = bitmap;:      bitmaps[i] = bitmap & 0; | test-extended-l2
discards-ignore-waiters | qcow2_alloc_discard_released | any | replace:^\s*atomic_load_explicit \(&a->room_wanted, memory_order_relaxed\) == 0;:         1; | test-engine-writers
data-file-unflushed | qcow2_flush_logged   | any    | replace:^\s*if \(img->data_io && img->data_io->flush\) \{:  if (0) { | test-power-loss:*-data-file* test-power-loss-plugin:*-data-file*
EOF
)

scratch=${MUTATION_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/qcow2zstd-mutation.XXXXXX")}
log=$scratch/log
mkdir -p "$scratch" "$log"
patched_dirs=(common nbdkit-glue filters plugins)
if [ -n "${MUTATION_BUILD:-}" ]; then
    tree=$src
    build=$(cd "$MUTATION_BUILD" && pwd)
    [ -f "$build/Makefile" ] || { echo "MUTATION_BUILD=$build: not a configured build"; exit 1; }
    if ! git -C "$tree" diff --quiet HEAD -- "${patched_dirs[@]}"; then
        echo "MUTATION_BUILD: $tree has uncommitted changes under ${patched_dirs[*]}: they would be lost"
        exit 1
    fi
    echo "mutation check: breaks applied in place to $tree, built in $build"
    # Whatever happens, the sources are left as git has them.
    trap 'git -C "$tree" checkout -q HEAD -- "${patched_dirs[@]}"; [ "${KEEP:-0}" = 1 ] || rm -rf "$scratch"' EXIT
    make -C "$build" -j"$jobs" > "$log/build" 2>&1 || { tail -n 30 "$log/build"; exit 1; }
else
    tree=$scratch/tree
    build=$tree/_b
    [ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$scratch"' EXIT
    echo "mutation check: scratch copy in $tree"
    rm -rf "$tree"
    mkdir -p "$tree"
    (cd "$src" && git ls-files -z --cached --others --exclude-standard |
        tar --null -T - -cf -) | tar -xf - -C "$tree"
    (cd "$tree" && autoreconf -fi) > "$log/autoreconf" 2>&1 || { cat "$log/autoreconf"; exit 1; }
    mkdir -p "$build"
    (cd "$build" && ../configure CC=gcc) > "$log/configure" 2>&1 || { tail -n 30 "$log/configure"; exit 1; }
    make -C "$build" -j"$jobs" > "$log/build" 2>&1 || { tail -n 30 "$log/build"; exit 1; }
fi

# patch NAME: apply every row of break NAME to the tree; prints
# "FILE:LINE" of each change, or a line starting "NOT APPLIED".  Saves
# the original files in $scratch/orig.
patch_break ()
{
    rm -rf "$scratch/orig"
    mkdir -p "$scratch/orig"
    /usr/bin/python3 - "$tree" "$scratch/orig" "$1" <<'PY'
import os, re, shutil, sys

tree, orig, name = sys.argv[1:4]
rows = []
for line in os.environ["BREAKS"].splitlines():
    f = [x.strip() for x in line.split("|")]
    if len(f) == 5 and f[0] == name:
        rows.append(f)
if not rows:
    sys.exit(f"NOT APPLIED: no break named {name}")

sources = []
for top in ("common", "nbdkit-glue", "filters", "plugins"):
    for d, _, files in os.walk(os.path.join(tree, top)):
        sources += [os.path.join(d, x) for x in files if x.endswith(".c")]


def form_of(path):
    text = open(path).read()
    if "NBDKIT_REGISTER_FILTER" in text:
        return "filter"
    if "NBDKIT_REGISTER_PLUGIN" in text:
        return "plugin"
    return "engine"


def definitions(func):
    """(path, index of the line with '{', index of the line with '}')."""
    found = []
    head = re.compile(r"^(?:[A-Za-z_][\w \t\*]*[ \t\*])?" + re.escape(func) + r"\s*\(")
    for path in sources:
        lines = open(path).read().split("\n")
        for i, l in enumerate(lines):
            if not head.match(l):
                continue
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith("{") \
                    and not lines[j].rstrip().endswith(";"):
                j += 1
            if j >= len(lines) or lines[j].rstrip().endswith(";"):
                continue            # a declaration
            k = j + 1
            while k < len(lines) and lines[k].rstrip() != "}":
                k += 1
            if k < len(lines):
                found.append((path, j, k))
    return found


changes = []
patched = {}
for _, func, form, change, _ in rows:
    defs = definitions(func)
    if form != "any":
        defs = [d for d in defs if form_of(d[0]) == form]
    if len(defs) != 1:
        sys.exit(f"NOT APPLIED: {func} ({form}) is defined {len(defs)} times")
    path, brace, end = defs[0]
    if path not in patched:
        shutil.copy(path, os.path.join(orig, str(len(patched))))
        patched[path] = open(path).read().split("\n")
    lines = patched[path]
    # The body's extent in the current (maybe patched) lines.
    defs = [d for d in definitions(func) if d[0] == path]
    _, brace, end = defs[0]
    kind, _, arg = change.partition(":")
    rel = os.path.relpath(path, tree)
    if kind == "start":
        lines.insert(brace + 1, "  " + arg + "  /* MUTATION */")
        changes.append(f"{func} in {rel}:{brace + 2}")
    elif kind in ("replace", "before-last"):
        pattern, _, text = arg.partition(":")
        hits = [i for i in range(brace + 1, end) if re.search(pattern, lines[i])]
        if not hits:
            sys.exit(f"NOT APPLIED: no line of {func} ({rel}) matches {pattern}")
        if kind == "replace":
            for i in hits:
                lines[i] = text + "  /* MUTATION */"
            changes.append(f"{func} in {rel}:{hits[0] + 1}")
        else:
            lines.insert(hits[-1], "  " + text + "  /* MUTATION */")
            changes.append(f"{func} in {rel}:{hits[-1] + 1}")
    else:
        sys.exit(f"NOT APPLIED: unknown change {change}")
    with open(path, "w") as f:
        f.write("\n".join(lines))

with open(os.path.join(orig, "paths"), "w") as f:
    for i, p in enumerate(patched):
        print(i, p, file=f)
print(", ".join(changes))
PY
}

restore ()
{
    local i p
    [ -f "$scratch/orig/paths" ] || return 0
    while read -r i p; do
        cp "$scratch/orig/$i" "$p"     # a new mtime: make rebuilds it
    done < "$scratch/orig/paths"
    rm -rf "$scratch/orig"
}

# plan_tests TESTS...: what make check needs to run TESTS (TEST or
# TEST:GLOB, see the top), in TARGETS, SECTIONS (QCOW2ZSTD_SECTIONS) and
# PROGRAMS (make arguments: only the unit tests named are built, all of
# them and the fuzzers when test-fuzz-corpus runs).
plan_tests ()
{
    local t test glob programs=()
    local -A whole=() globs=()
    TARGETS=() SECTIONS=() PROGRAMS=()
    for t in "$@"; do
        test=${t%%:*}
        if [[ $t == *:* ]]; then
            glob=${t#*:}
            globs[$test]+=" $test:$glob"
        else
            whole[$test]=1
        fi
        test=${test%.sh}
        if [ -f "$tree/tests/$test.sh" ]; then
            t=tests/$test.sh
        else
            t=tests/$test
            programs+=("$t")
        fi
        [[ " ${TARGETS[*]} " == *" $t "* ]] || TARGETS+=("$t")
    done
    # A test named whole anywhere runs whole.
    for test in "${!globs[@]}"; do
        # shellcheck disable=SC2206
        [ -n "${whole[$test]:-}" ] || SECTIONS+=(${globs[$test]})
    done
    [[ " ${TARGETS[*]} " == *" tests/test-fuzz-corpus.sh "* ]] ||
        PROGRAMS=("check_PROGRAMS=${programs[*]}")
}

# build NAME: build the tree and what the planned tests need.
build ()
{
    make -C "$build" -j"$jobs" > "$log/$1.build" 2>&1 &&
        make -C "$build" -j"$jobs" check TESTS= "${PROGRAMS[@]}" >> "$log/$1.build" 2>&1
}

# run_tests NAME: make check of the planned tests; prints the failed.
run_tests ()
{
    local name=$1 t fails=()
    QCOW2ZSTD_CALL_TIMEOUT=${QCOW2ZSTD_CALL_TIMEOUT:-60} \
    QCOW2ZSTD_SECTIONS="${SECTIONS[*]}" \
        make -C "$build" -j"$jobs" check TESTS="${TARGETS[*]}" \
            "${PROGRAMS[@]}" > "$log/$name.check" 2>&1 || true
    for t in "${TARGETS[@]}"; do
        local base=$build/${t%.sh}
        if grep -q '^:test-result: \(FAIL\|ERROR\)' "$base.trs" 2>/dev/null ||
           [ ! -f "$base.trs" ]; then
            fails+=("${t#tests/}")
        fi
        [ ! -f "$base.log" ] || cp "$base.log" "$log/$name.${t#tests/}.log"
    done
    echo "${fails[*]}"
}

export BREAKS
# Test names hold globs: no pathname expansion from here on.
set -f
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    mapfile -t names < <(awk -F'|' 'NF == 5 { gsub(/ /, "", $1); if (!seen[$1]++) print $1 }' <<<"$BREAKS")
fi

tests_of ()
{
    awk -F'|' -v n="$1" 'NF == 5 { b = $1; gsub(/ /, "", b); if (b == n) print $5 }' <<<"$BREAKS" | xargs
}

# The baseline: every test named, on the unbroken tree.
all_tests=$(for n in "${names[@]}"; do tests_of "$n"; done | tr ' ' '\n' | sort -u | xargs)
if [ "${MUTATION_BASELINE:-yes}" = no ]; then
    echo "baseline: not run here (MUTATION_BASELINE=no: the caller ran these tests on this tree): $all_tests"
else
    echo "baseline: $all_tests"
    start=$SECONDS
    # shellcheck disable=SC2086
    plan_tests $all_tests
    build baseline || { tail -n 30 "$log/baseline.build"; exit 1; }
    baseline=$(run_tests baseline)
    if [ -n "$baseline" ]; then
        echo "baseline: these tests fail without any break: $baseline (logs in $log)"
        for t in $baseline; do
            echo "===== $t"; tail -n 40 "$log/baseline.$t.log" 2>/dev/null || true
        done
        exit 1
    fi
    echo "baseline: every test passes ($(( SECONDS - start )) s)"
fi

status=0
rows=()
for n in "${names[@]}"; do
    tests=$(tests_of "$n")
    where=$(patch_break "$n" 2>&1) || true
    if [[ $where == NOT\ APPLIED* ]] || [ -z "$where" ]; then
        echo "!!! $n: $where"
        rows+=("$n|${where:-NOT APPLIED}|$tests|-|DOES NOT APPLY|-")
        status=1
        restore
        continue
    fi
    echo "--- $n: $where; building"
    # shellcheck disable=SC2086
    plan_tests $tests
    if ! build "$n"; then
        echo "!!! $n: the broken tree does not build (see $log/$n.build)"
        tail -n 20 "$log/$n.build"
        rows+=("$n|$where|$tests|-|BUILD FAILED|-")
        status=1
        restore
        continue
    fi
    start=$SECONDS
    if [ "${MUTATION_FIRST:-0}" = 1 ]; then
        # One test at a time, until one fails.
        failed='' ran=()
        for t in $tests; do
            ran+=("$t")
            plan_tests "$t"
            t0=$SECONDS
            failed=$(run_tests "$n")
            echo "    $t: ${failed:+failed, }$(( SECONDS - t0 )) s"
            [ -z "$failed" ] || break
        done
    else
        failed=$(run_tests "$n")
        # shellcheck disable=SC2206
        ran=($tests)
    fi
    took=$(( SECONDS - start ))
    restore
    if [ -n "$failed" ]; then
        verdict=caught
    else
        verdict="NOT CAUGHT"
        status=1
    fi
    echo "--- $n: failed: ${failed:-none} (${#ran[@]} of $(wc -w <<<"$tests") tests run, ${took} s)"
    rows+=("$n|$where|${ran[*]}|${failed:-none}|$verdict|$took")
done
# The restored tree builds again (and the last break's files are back).
make -C "$build" -j"$jobs" > "$log/final.build" 2>&1 || true

echo
if [ "${MUTATION_FIRST:-0}" = 1 ]; then
    echo "mutation table: every break, the test that caught it (N/M: the row's first M tests ran, N failed), their time"
else
    echo "mutation table: every break, the tests that caught it of those that claim it, their time"
fi
printf '%-24s %-8s %6s  %-s\n' "break" "caught" "time" "tests that failed (where the break was applied)"
for r in "${rows[@]}"; do
    IFS='|' read -r n where tests failed verdict took <<<"$r"
    nrun=$(wc -w <<<"$tests")
    nfailed=0
    [ "$failed" = none ] || [ "$failed" = - ] || nfailed=$(wc -w <<<"$failed")
    case $verdict in
        caught) mark="$nfailed/$nrun" ;;
        *) mark=$verdict ;;
    esac
    [ "$took" = - ] || took="$took s"
    printf '%-24s %-8s %6s  %s\n' "$n" "$mark" "$took" "${failed//.sh/}"
    printf '%-24s %-8s %6s    (%s)\n' "" "" "" "$where"
done
[ "${KEEP:-0}" = 1 ] && echo "logs: $log"
exit $status
