#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What a user can get wrong on the command line is refused at start-up,
# before anything is opened or formatted, with the same message in the
# filter and the plugin form: -r with qcow2-create (however nbdkit's
# command line spells -r), qcow2-force-share without -r, a compression
# level out of the range of the type to be created, a bad cluster size,
# qcow2-backing with qcow2-create, a level with qcow2-compress=false,
# a bad qcow2-locking, an empty qcow2-snapshot=, and in the plugin form
# a missing file (unless creating).  The device (and the file) is left
# as it was, and no file is made.
# Then the image itself, in both forms (the filter right over nbdkit's
# file plugin with file=): nbdkit exits non-zero before serving (its
# --run command never runs), with the message, for a file that is not
# qcow2 or is empty, an unknown incompatible feature, the corrupt bit
# (for writing; served with -r), a level out of
# the image's type's range, a wrong or missing passphrase, a snapshot
# that is not there, a backing file missing two levels down or outside
# the image's directory, an image another server writes (with and
# without -r), and qcow2-create over a file whose first cluster is not
# all zeros.  With dir=, or a filter between it and the file plugin,
# the filter starts and checks the image at the first client.
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
requires qemu-img
qemu-img create -q -f qcow2 -o compression_type=zlib zlib.qcow2 16M

# ------------------------------------------------------------ the image
# What the engine checks when it opens an image is checked at start-up
# where the file is known then: the plugin form's file, and the filter
# right over nbdkit's file plugin with file=.
#
# image_refused WHAT PATTERN FILE [NBDKIT-OPTIONS --] PARAMS...: both
# forms exit non-zero before serving (their --run command never runs),
# with PATTERN in the message, and FILE is left as it was.
image_refused ()
{
    local what=$1 pattern=$2 file=$3 file_before form
    shift 3
    local opts=()
    if [[ " $* " == *" -- "* ]]; then
        while [ "$1" != -- ]; do opts+=("$1"); shift; done
        shift
    fi
    file_before=$(sha256sum < "$file")
    for form in filter plugin; do
        local args
        if [ $form = filter ]; then
            args=(--filter="$FILTER" file "$file")
        else
            args=("$PLUGIN" "$file")
        fi
        rm -f ran
        if NBDKIT_TIMEOUT=120 run_nbdkit -U - "${opts[@]}" "${args[@]}" "$@" \
            --run 'touch ran' 2> err.out; then
            fail "$form, $what: started"
        fi
        [ ! -e ran ] || fail "$form, $what: served (--run ran)"
        grep -q -- "$pattern" err.out || { cat err.out; fail "$form, $what: no '$pattern'"; }
        [ "$(sha256sum < "$file")" = "$file_before" ] || fail "$form, $what: $file changed"
    done
    echo "$what: both forms, before serving: $(grep -o "error: .*" err.out | head -1 | sed "s|$PWD/||g")"
}
# A file that is not qcow2, found at start-up (not at the first client).
head -c 1M /dev/urandom > random.img
image_refused "a file that is not qcow2" \
    "random.img: invalid or unsupported qcow2 image: magic: not a qcow2 image" random.img
: > empty.img
image_refused "an empty file without qcow2-create" \
    "empty.img: the file is empty, not a qcow2 image (qcow2-create=SIZE makes one in it)" empty.img
# Features refused: an unknown incompatible bit; the corrupt bit for
# writing (read with -r).
set_incompatible () # FILE BYTE: OR BYTE into the last byte of incompatible_features
{
    local old
    old=$(od -An -tu1 -j79 -N1 "$1")
    printf "\\$(printf '%03o' $(( old | $2 )))" |
        dd of="$1" bs=1 seek=79 conv=notrunc status=none
}
qemu-img create -q -f qcow2 unknown.qcow2 16M
set_incompatible unknown.qcow2 0x20
image_refused "an unknown incompatible feature" \
    "unknown.qcow2: invalid or unsupported qcow2 image: incompatible_features: unknown incompatible feature bits 0x20" \
    unknown.qcow2
qemu-img create -q -f qcow2 corrupt.qcow2 16M
set_incompatible corrupt.qcow2 0x02
image_refused "the corrupt bit, for writing" \
    "corrupt.qcow2: incompatible_features: the image is marked corrupt and cannot be written" \
    corrupt.qcow2
for form in filter plugin; do
    if [ $form = filter ]; then args=(--filter="$FILTER" file); else args=("$PLUGIN"); fi
    NBDKIT_TIMEOUT=120 run_nbdkit -U - -r "${args[@]}" corrupt.qcow2 --run 'nbdinfo "$uri" > /dev/null' \
        2> err.out || { cat err.out; fail "$form: the corrupt bit with -r: not served"; }
done
echo "the corrupt bit with -r: served read-only in both forms"
# A level outside the range of the image's compression type (in its
# header).
image_refused "level 15 for a zlib image" \
    "qcow2-compression-level: 15 is out of range for zlib (1 to 9)" \
    zlib.qcow2 qcow2-compress=true qcow2-compression-level=15
# The passphrase: wrong, missing (qemu's LUKS image).
qemu_img_luks create -q -f qcow2 --object secret,id=s0,data=right \
    -o encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 luks.qcow2 16M ||
    fail "qemu-img could not make a LUKS image"
image_refused "a wrong passphrase" \
    "luks.qcow2: qcow2-passphrase: wrong passphrase: it unlocks none of the image's 1 active LUKS key slot" \
    luks.qcow2 qcow2-passphrase=wrong
image_refused "no passphrase" "luks.qcow2: .*give its passphrase with qcow2-passphrase" luks.qcow2
# A snapshot the image does not have.
qemu-img create -q -f qcow2 snap.qcow2 16M
qemu-img snapshot -c first snap.qcow2
image_refused "a snapshot that is not there" \
    "snap.qcow2: qcow2-snapshot: no snapshot has the ID or the name \"second\"; the image has: ID 1 name \"first\"" \
    snap.qcow2 -r -- qcow2-snapshot=second
# The backing chain: a missing file two levels down, a file outside the
# directories backing files may come from.
mkdir -p images other
qemu-img create -q -f qcow2 images/base.qcow2 16M
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 images/mid.qcow2
qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 images/top.qcow2
rm images/base.qcow2
image_refused "a backing file missing at depth 2" \
    "images/top.qcow2: cannot open the backing file .*images/base.qcow2 (named 'base.qcow2' in the image): No such file or directory" \
    images/top.qcow2
qemu-img create -q -f qcow2 other/base.qcow2 16M
qemu-img create -q -f qcow2 -b "$PWD/other/base.qcow2" -F qcow2 images/far.qcow2
image_refused "a backing file outside the image's directory" \
    "images/far.qcow2: the backing file .*other/base.qcow2 (named '.*other/base.qcow2' in the image) is outside the directories backing files may be opened from" \
    images/far.qcow2
# The lock: the image written by another server.
qemu-img create -q -f qcow2 held.qcow2 16M
start_nbdkit "$PWD/holder.sock" "$PLUGIN" held.qcow2 ||
    fail "the server holding held.qcow2 did not start"
image_refused "an image another server writes" \
    "Failed to get \"write\" lock: .*held.qcow2 is open elsewhere" held.qcow2
image_refused "an image another server writes, -r" \
    "Failed to get shared \"write\" lock: .*held.qcow2 is open elsewhere" held.qcow2 -r --
stop_server
# qcow2-create over a file that holds something (its first cluster not
# all zeros, the engine's rule): refused, where qemu-img create would
# overwrite it.  A qcow2 image (the command line run a second time), and
# other data.
NC="is not empty: its first cluster is not all zeros (it may hold an image or a filesystem); refusing to format it, which would destroy what it holds (qemu-img create would overwrite it)"
image_refused "qcow2-create over a qcow2 image" "zlib.qcow2 $NC" zlib.qcow2 qcow2-create=1M
image_refused "qcow2-create over a file of data" "random.img $NC" random.img qcow2-create=1M
{ head -c 4096 /dev/zero; echo data; } > late.img
image_refused "qcow2-create over zeros, then data at 4K (64K clusters)" "late.img $NC" \
    late.img qcow2-create=1M

# Where the filter does not know the file at start-up (dir=, whose
# exports are named by the clients; a filter between it and the file
# plugin), it starts, and checks the image when a client connects: the
# client is refused and nbdkit logs the message.
for stack in "file dir=$PWD" "--filter=noextents file $PWD/random.img"; do
    rm -f ran
    # shellcheck disable=SC2086
    if NBDKIT_TIMEOUT=120 run_nbdkit -U - --filter="$FILTER" $stack \
        --run 'touch ran; nbdinfo "nbd+unix:///random.img?socket=$unixsocket"' \
        > /dev/null 2> err.out; then
        fail "$stack: a client was served a file that is not qcow2"
    fi
    [ -e ran ] || { cat err.out; fail "$stack: nbdkit did not start"; }
    grep -q "invalid or unsupported qcow2 image: magic: not a qcow2 image" err.out ||
        { cat err.out; fail "$stack: no message at the first client"; }
done
echo "the filter with dir=, and with a filter between it and the file plugin: started, the image checked at the first client"

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
