#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What a user can get wrong on the command line is refused at start-up,
# before anything is opened or formatted, with the same message in the
# filter and the plugin form: -r with qcow2-create (however nbdkit's
# command line spells -r), qcow2-force-share without -r, a compression
# level out of the range of the type to be created, a bad cluster size,
# qcow2-backing with qcow2-create, a level with qcow2-compress=false,
# a bad qcow2-locking, an empty qcow2-snapshot=, and in the plugin form
# a missing file (unless creating), a file that is not qcow2 or empty,
# and qcow2-create over a file whose first cluster is not all zeros.
# The device (and the file) is left as it was, and no file is made.
source "${top_srcdir:-.}/tests/functions.sh"
requires sha256sum
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
truncate -s 8M device.img
before=$(sha256sum < device.img)

# refused WHAT PATTERN NBDKIT-OPTIONS -- PARAMS: both forms refuse to
# start, with the same message, which holds PATTERN.
refused ()
{
    local what=$1 pattern=$2
    shift 2
    local opts=() form msg first=""
    while [ "$1" != -- ]; do opts+=("$1"); shift; done
    shift
    for form in filter plugin; do
        rm -f new.qcow2
        local args
        if [ $form = filter ]; then
            args=(--filter="$FILTER" file device.img)
        else
            args=("$PLUGIN" new.qcow2)
        fi
        if NBDKIT_TIMEOUT=120 run_nbdkit -U - "${opts[@]}" "${args[@]}" "$@" \
            --run true 2> err.out; then
            fail "$what ($form): nbdkit started"
        fi
        grep -q -- "$pattern" err.out || { cat err.out; fail "$what ($form): no '$pattern'"; }
        msg=$(grep -o "error: .*" err.out | head -1)
        if [ -z "$first" ]; then
            first=$msg
        elif [ "$msg" != "$first" ]; then
            fail "$what: the forms say different things: '$first' and '$msg'"
        fi
        [ "$(sha256sum < device.img)" = "$before" ] || fail "$what ($form): the device changed"
        [ ! -e new.qcow2 ] || fail "$what ($form): a file was made"
    done
    echo "$what: $first"
}

# started WHAT NBDKIT-OPTIONS -- PARAMS: both forms start.
started ()
{
    local what=$1
    shift
    local opts=() form
    while [ "$1" != -- ]; do opts+=("$1"); shift; done
    shift
    for form in filter plugin; do
        local args
        if [ $form = filter ]; then
            args=(--filter="$FILTER" file device.img)
        else
            args=("$PLUGIN" new.qcow2)
        fi
        rm -f new.qcow2
        NBDKIT_TIMEOUT=120 run_nbdkit -U - "${opts[@]}" "${args[@]}" "$@" \
            --run true 2> err.out || { cat err.out; fail "$what ($form): refused"; }
    done
    echo "$what: started"
}

R="qcow2-create: cannot create an image read-only (nbdkit -r)"
refused "-r with qcow2-create" "$R" -r -- qcow2-create=1M
refused "--readonly with qcow2-create" "$R" --readonly -- qcow2-create=1M
refused "--read-only with qcow2-create" "$R" --read-only -- qcow2-create=1M
refused "--read (abbreviated) with qcow2-create" "$R" --read -- qcow2-create=1M
refused "-vr (grouped) with qcow2-create" "$R" -vr -- qcow2-create=1M
refused "-r after the plugin with qcow2-create" "$R" -- qcow2-create=1M -r
# -r as the value of an option is not -r.
started "-e -r (an export named -r) with qcow2-create" -e -r -- qcow2-create=1M
started "-D qcow2zstd.image=1 (no r) with qcow2-create" -D qcow2zstd.image=1 -- qcow2-create=1M

refused "qcow2-force-share without -r" "qcow2-force-share: only applies with -r" -- \
    qcow2-create=1M qcow2-force-share=true
refused "zlib level 15" "qcow2-compression-level: 15 is out of range for zlib (1 to 9)" -- \
    qcow2-create=1M qcow2-compression-type=zlib qcow2-compression-level=15
refused "zstd level 23" "qcow2-compression-level" -- \
    qcow2-create=1M qcow2-compression-level=23
refused "cluster size not a power of 2" "qcow2-cluster-size: 3000 is not a power of 2" -- \
    qcow2-create=1M qcow2-cluster-size=3000
refused "cluster size without qcow2-create" "only apply with qcow2-create" -- qcow2-cluster-size=4K
refused "qcow2-backing with qcow2-create" "qcow2-backing: an image made by qcow2-create has no backing file" -- \
    qcow2-create=1M qcow2-backing=device.img
refused "a level with qcow2-compress=false" "qcow2-compression-level: only applies to compressed writes" -- \
    qcow2-create=1M qcow2-compress=false qcow2-compression-level=5
refused "qcow2-locking=maybe" "qcow2-locking: 'maybe' is not on, auto or off" -- \
    qcow2-create=1M qcow2-locking=maybe
refused "qcow2-snapshot= (empty)" "qcow2-snapshot: empty: give a snapshot's ID or name" -- \
    qcow2-snapshot=

# The plugin's own file.
for args in "missing.qcow2" "missing.qcow2 qcow2-compress=true"; do
    # shellcheck disable=SC2086
    if NBDKIT_TIMEOUT=120 run_nbdkit -U - "$PLUGIN" $args --run true 2> err.out; then
        fail "plugin $args: started"
    fi
    grep -q "missing.qcow2: No such file or directory" err.out || { cat err.out; fail "plugin $args: no message"; }
done
echo "plugin, missing file: $(grep -o "error: .*" err.out | head -1)"
if NBDKIT_TIMEOUT=120 run_nbdkit -U - "$PLUGIN" nodir/new.qcow2 qcow2-create=1M --run true 2> err.out; then
    fail "plugin: qcow2-create in a missing directory started"
fi
grep -q "qcow2-create: cannot create .*nodir/new.qcow2" err.out || { cat err.out; fail "plugin: no message for a missing directory"; }
echo "plugin, qcow2-create in a missing directory: $(grep -o "error: .*" err.out | head -1)"
mkdir -p adir
if NBDKIT_TIMEOUT=120 run_nbdkit -U - "$PLUGIN" adir --run true 2> err.out; then
    fail "plugin: a directory as the image started"
fi
grep -q "adir: not a regular file or block device" err.out || { cat err.out; fail "plugin: no message for a directory"; }
echo "plugin, a directory: $(grep -o "error: .*" err.out | head -1)"
# An existing image's type: the plugin reads it from the header at
# start-up (the filter can only when a client connects).
requires qemu-img
qemu-img create -q -f qcow2 -o compression_type=zlib zlib.qcow2 16M
zlib_before=$(sha256sum < zlib.qcow2)
if NBDKIT_TIMEOUT=120 run_nbdkit -U - "$PLUGIN" zlib.qcow2 qcow2-compress=true \
    qcow2-compression-level=15 --run true 2> err.out; then
    fail "plugin: level 15 for a zlib image started"
fi
grep -q "qcow2-compression-level: 15 is out of range for zlib (1 to 9)" err.out ||
    { cat err.out; fail "plugin: no message for level 15 on a zlib image"; }
[ "$(sha256sum < zlib.qcow2)" = "$zlib_before" ] || fail "the zlib image changed"
echo "plugin, level 15 for an existing zlib image: $(grep -o "error: .*" err.out | head -1)"

# plugin_refused WHAT PATTERN FILE PARAMS...: the plugin form exits
# non-zero before serving (its --run command never runs), with PATTERN
# in its message, and FILE is left as it was.
plugin_refused ()
{
    local what=$1 pattern=$2 file=$3 file_before
    shift 3
    file_before=$(sha256sum < "$file")
    rm -f ran
    if NBDKIT_TIMEOUT=120 run_nbdkit -U - "$PLUGIN" "$file" "$@" --run 'touch ran' \
        2> err.out; then
        fail "plugin, $what: started"
    fi
    [ ! -e ran ] || fail "plugin, $what: served (--run ran)"
    grep -q -- "$pattern" err.out || { cat err.out; fail "plugin, $what: no '$pattern'"; }
    [ "$(sha256sum < "$file")" = "$file_before" ] || fail "plugin, $what: $file changed"
    echo "plugin, $what: $(grep -o "error: .*" err.out | head -1 | sed "s|$PWD/||")"
}
# A file that is not qcow2, found at start-up (not at the first client).
head -c 1M /dev/urandom > random.img
plugin_refused "a file that is not qcow2" \
    "random.img: invalid or unsupported qcow2 image: magic: not a qcow2 image" random.img
: > empty.img
plugin_refused "an empty file without qcow2-create" \
    "empty.img: the file is empty, not a qcow2 image (qcow2-create=SIZE makes one in it)" empty.img
# qcow2-create over a file that holds something (its first cluster not
# all zeros, the engine's rule): refused, where qemu-img create would
# overwrite it.  A qcow2 image (the command line run a second time), and
# other data.
NC="is not empty: its first cluster is not all zeros (it may hold an image or a filesystem); refusing to format it, which would destroy what it holds (qemu-img create would overwrite it)"
plugin_refused "qcow2-create over a qcow2 image" "zlib.qcow2 $NC" zlib.qcow2 qcow2-create=1M
plugin_refused "qcow2-create over a file of data" "random.img $NC" random.img qcow2-create=1M
{ head -c 4096 /dev/zero; echo data; } > late.img
plugin_refused "qcow2-create over zeros, then data at 4K (64K clusters)" "late.img $NC" \
    late.img qcow2-create=1M
# ... but into an empty file, or one truncate made (holes only), it creates.
for made in empty sparse; do
    rm -f made.qcow2
    if [ $made = empty ]; then : > made.qcow2; else truncate -s 8M made.qcow2; fi
    NBDKIT_TIMEOUT=120 run_nbdkit -U - "$PLUGIN" made.qcow2 qcow2-create=1M \
        --run 'nbdinfo "$uri" > /dev/null' 2> err.out ||
        { cat err.out; fail "plugin: qcow2-create into the $made file refused"; }
    qemu-img check made.qcow2 > check.out 2>&1 || { cat check.out; fail "plugin: qcow2-create into the $made file: check"; }
done
echo "plugin: qcow2-create into an empty file and into a sparse file: created, check clean"
[ "$(sha256sum < device.img)" = "$before" ] || fail "the device changed"
