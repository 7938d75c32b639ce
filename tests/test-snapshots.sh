#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Internal snapshots, qemu as the oracle:
# - every snapshot of an image qemu-img snapshot -c made (around a resize,
#   one named like another's ID) served with qcow2-snapshot by name, by ID
#   and in qemu's snapshot.id=/snapshot.name= form equals qemu-img convert
#   -l's reading, in both forms, and a bare selector is an ID before it is
#   a name, as in qemu; a missing one is refused listing those
#   there are (at start-up in both forms; at the first client where the
#   filter learns the file only then, with dir=); the image debug output
#   lists them;
# - random writes, zeroes and trims to the active layer of such images
#   (64 KiB and 4 KiB clusters, v3 and v2, an encrypted one): qemu-img
#   check clean, the active disk equal to a raw mirror, and every snapshot
#   read by qemu exactly as before; qemu can then delete a snapshot and go
#   back to another with the image still clean.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io nbdcopy nbdinfo
requires_nbd_python

cd "$TMPDIR_TEST"

# make_image IMG OPTIONS: an image with four snapshots around changes and
# a resize (v3; qemu resizes no v2 image with snapshots): "base" (ID 1),
# "2" (ID 2), "mid" (ID 3), "a, b" (ID 4).
make_image ()
{
    local img=$1 opts=$2 size=3M
    case $opts in *compat=0.10*) size=5M ;; esac
    qemu-img create -q -f qcow2 -o "$opts" "$img" $size
    qemu-io -c 'write -P 0x11 0 3M' "$img" > /dev/null
    qemu-img snapshot -c base "$img"
    qemu-io -c 'write -P 0x22 64k 512k' -c 'write -z 1M 256k' "$img" > /dev/null
    qemu-img snapshot -c 2 "$img"
    [ $size = 5M ] || qemu-img resize -q "$img" 5M
    qemu-io -c 'write -P 0x33 2500k 2M' -c 'discard 0 64k' "$img" > /dev/null
    qemu-img snapshot -c mid "$img"
    qemu-io -c 'write -P 0x44 300k 100k' -c 'write -P 0x45 4M 1M' "$img" > /dev/null
    qemu-img snapshot -c "a, b" "$img"
    qemu-io -c 'write -P 0x55 1500k 1500k' "$img" > /dev/null
}

# qemu_snapshot IMG SELECTOR OUT: the snapshot as qemu-img convert -l reads it.
qemu_snapshot ()
{
    rm -f "$3"
    qemu-img convert -U -l "$2" -O raw "$1" "$3" || fail "qemu-img convert -l '$2' failed"
}

# ours IMG SELECTOR OUT [FORM]: the snapshot through the filter (or the
# plugin with FORM=plugin).
ours ()
{
    rm -f "$3"
    if [ "${4:-filter}" = plugin ]; then
        NBDKIT_TIMEOUT=120 run_nbdkit -U - -r "$PLUGIN" "$1" "qcow2-snapshot=$2" \
            --run "nbdcopy \"\$uri\" $3" || fail "plugin: snapshot '$2' not served"
    else
        NBDKIT_TIMEOUT=120 run_nbdkit -U - -r --filter="$FILTER" file "$1" \
            "qcow2-snapshot=$2" --run "nbdcopy \"\$uri\" $3" ||
            fail "filter: snapshot '$2' not served"
    fi
}

SELECTORS=("base" "1" "2" "mid" "3" "a, b" "4"
           "snapshot.id=2" "snapshot.name=2" "snapshot.id=4,snapshot.name=a,, b")

# ------------------------------------------------ serving snapshots
make_image snap.qcow2 cluster_size=65536
for sel in "${SELECTORS[@]}"; do
    qemu_snapshot snap.qcow2 "$sel" want.raw
    ours snap.qcow2 "$sel" got.raw
    cmp want.raw got.raw || fail "snapshot '$sel': differs from qemu-img convert -l"
done
ours snap.qcow2 mid got.raw plugin
qemu_snapshot snap.qcow2 mid want.raw
cmp want.raw got.raw || fail "plugin: snapshot mid differs"
# "2" is an ID first (snapshot 2), qemu's rule; by name it is the same
# snapshot here, and "base" (ID 1) is another.
qemu_snapshot snap.qcow2 1 one.raw
qemu_snapshot snap.qcow2 2 two.raw
cmp -s one.raw two.raw && fail "snapshots 1 and 2 read the same: the test image is wrong"
echo "10 selectors (names, IDs, snapshot.id=/snapshot.name=): each served as qemu-img convert -l reads it; the plugin too"

# A snapshot named like another's ID: "1" is snapshot 3's name and
# snapshot 1's ID.  A bare selector is an ID first (qemu's rule), so "1"
# is snapshot 1 ("base"), and only snapshot.name=1 is snapshot 3.
if section id-before-name; then
    qemu-img create -q -f qcow2 ids.qcow2 2M
    qemu-io -c 'write -P 0x61 0 1M' ids.qcow2 > /dev/null
    qemu-img snapshot -c base ids.qcow2
    qemu-io -c 'write -P 0x62 0 1M' ids.qcow2 > /dev/null
    qemu-img snapshot -c x ids.qcow2
    qemu-io -c 'write -P 0x63 0 1M' ids.qcow2 > /dev/null
    qemu-img snapshot -c 1 ids.qcow2
    qemu-io -c 'write -P 0x64 0 1M' ids.qcow2 > /dev/null
    qemu_snapshot ids.qcow2 1 id1.raw
    qemu_snapshot ids.qcow2 snapshot.name=1 name1.raw
    cmp -s id1.raw name1.raw && fail "id-before-name: qemu reads snapshot 1 and the one named 1 alike: the test image is wrong"
    for form in filter plugin; do
        for sel in 1 3 snapshot.id=1 snapshot.name=1; do
            qemu_snapshot ids.qcow2 "$sel" want.raw
            ours ids.qcow2 "$sel" got.raw "$form"
            cmp want.raw got.raw || fail "id-before-name, $form: snapshot '$sel' differs from qemu-img convert -l"
        done
    done
    echo "a snapshot named like another's ID: '1' is the ID (as qemu reads it), snapshot.name=1 the name, in both forms"
fi

# The snapshot's disk is served at the active disk's size, as qemu does.
size=$(run_nbdkit -U - -r --filter="$FILTER" file snap.qcow2 qcow2-snapshot=base \
       --run 'nbdinfo --size "$uri"')
[ "$size" = $((5 * 1024 * 1024)) ] || fail "snapshot base: size $size, not the active 5 MiB"

# A missing snapshot, and the debug listing.  With dir=, the filter
# learns the file when a client names the export.
start_server "$PWD/sock" -r file dir="$PWD" qcow2-snapshot=nope
nbdinfo "nbd+unix:///snap.qcow2?socket=$PWD/sock" > /dev/null 2>&1 && fail "a missing snapshot was served"
grep -q 'qcow2-snapshot: .*nope.*ID 1 name "base"' "$PWD/sock.log" ||
    { cat "$PWD/sock.log"; fail "a missing snapshot: no message listing the snapshots"; }
stop_server
start_server "$PWD/sock" -r -v -D qcow2zstd.image=1 file snap.qcow2 qcow2-snapshot=3
nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null || fail "nbdinfo failed"
stop_server
for line in 'snapshot id 1 name "base"' 'snapshot id 2 name "2"' \
            'snapshot id 3 name "mid"' 'snapshot id 4 name "a, b"' \
            'serving snapshot id 3 name "mid"'; do
    grep -q "$line" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "debug: no '$line'"; }
done
for form in filter plugin; do
    if [ $form = filter ]; then args=(--filter="$FILTER" file); else args=("$PLUGIN"); fi
    if run_nbdkit -U - -r "${args[@]}" snap.qcow2 qcow2-snapshot=nope --run 'touch ran' > start.out 2>&1; then
        fail "$form: started with a missing snapshot"
    fi
    [ ! -e ran ] || fail "$form: a missing snapshot: --run ran"
    grep -q 'qcow2-snapshot: .*nope.*ID 1 name "base"' start.out ||
        { cat start.out; fail "$form: no message for a missing snapshot"; }
done
echo "a missing snapshot refused listing the image's (at start-up in both forms, at the first client with dir=); -D qcow2zstd.image=1 lists all four and the one served"

# ------------------------------------------------ writing the active layer
# write_active NAME IMG CLUSTER_SIZE [NBDKIT ARGS...]: a random workload
# on the active disk; then check, the mirror, and every snapshot as before.
write_active ()
{
    local name=$1 img=$2 cs=$3 i sel
    shift 3
    for i in 1 2 3 4; do
        qemu-img convert -U "${QEMU_OPTS[@]}" -l "snapshot.id=$i" -O raw \
            "${QEMU_IMG[@]:-$img}" before-$i.raw || fail "$name: snapshot $i unreadable"
    done
    qemu-img convert -U "${QEMU_OPTS[@]}" -O raw "${QEMU_IMG[@]:-$img}" mirror.raw
    truncate -s +8M "$img"
    start_server "$PWD/sock" file "$img" "$@"
    $PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
        mirror.raw "$SEED" 3 400 "$cs" > workload.out ||
        { cat workload.out "$PWD/sock.log"; fail "$name: the workload failed"; }
    stop_server
    SEED=$((SEED + 1))
    qemu-img check "${QEMU_OPTS[@]}" "${QEMU_IMG[@]:-$img}" > check.out 2>&1 ||
        { cat check.out; fail "$name: qemu-img check failed"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "$name: check found errors"; }
    if grep -qi leak check.out; then cat check.out; fail "$name: leaked clusters"; fi
    qemu-img convert -U "${QEMU_OPTS[@]}" -O raw "${QEMU_IMG[@]:-$img}" active.raw
    cmp active.raw mirror.raw || fail "$name: the active disk differs from the mirror"
    for i in 1 2 3 4; do
        qemu-img convert -U "${QEMU_OPTS[@]}" -l "snapshot.id=$i" -O raw \
            "${QEMU_IMG[@]:-$img}" after.raw
        cmp before-$i.raw after.raw || fail "$name: snapshot $i changed"
    done
    echo "$name: 3 x 400 writes, zeroes and trims to the active layer: check clean, active equals the mirror, all 4 snapshots unchanged"
}

SEED=1
QEMU_OPTS=() QEMU_IMG=()
for cs in 65536 4096; do
    make_image w$cs.qcow2 cluster_size=$cs
    write_active "$cs-byte clusters" w$cs.qcow2 $cs
    # Twice: the tables copied the first time are now the image's own.
    write_active "$cs-byte clusters, again" w$cs.qcow2 $cs
    # qemu deletes a snapshot and reverts to another: still clean.
    qemu-img snapshot -d 2 w$cs.qcow2
    qemu-img snapshot -a mid w$cs.qcow2
    qemu-img check w$cs.qcow2 > check.out 2>&1 || { cat check.out; fail "$cs: check after qemu's snapshot -d/-a failed"; }
    qemu-img convert -O raw w$cs.qcow2 active.raw
    cmp active.raw before-3.raw || fail "$cs: snapshot mid applied by qemu differs"
    echo "$cs-byte clusters: qemu deletes snapshot 2 and applies mid afterwards, check clean"
done

make_image v2.qcow2 compat=0.10,cluster_size=65536
write_active "v2 image" v2.qcow2 65536

# The plugin form, which grows the file.
make_image plugin.qcow2 cluster_size=65536
for i in 1 2 3 4; do
    qemu-img convert -U -l "snapshot.id=$i" -O raw plugin.qcow2 before-$i.raw
done
qemu-img convert -U -O raw plugin.qcow2 mirror.raw
start_nbdkit "$PWD/sock" "$PLUGIN" plugin.qcow2
$PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
    mirror.raw 77 2 300 65536 > workload.out ||
    { cat workload.out "$PWD/sock.log"; fail "plugin: the workload failed"; }
stop_server
qemu-img check plugin.qcow2 > check.out 2>&1 && grep -q "No errors were found" check.out &&
    ! grep -qi leak check.out || { cat check.out; fail "plugin: check not clean"; }
qemu-img compare -q -f qcow2 -F raw plugin.qcow2 mirror.raw || fail "plugin: active differs"
for i in 1 2 3 4; do
    qemu-img convert -U -l "snapshot.id=$i" -O raw plugin.qcow2 after.raw
    cmp before-$i.raw after.raw || fail "plugin: snapshot $i changed"
done
echo "plugin form: writes to the active layer, check clean, snapshots unchanged"

# An encrypted image with snapshots: both at once.
printf 'snap pass' > pass.txt
qemu_img_luks create -q -f qcow2 --object "secret,id=s0,file=$PWD/pass.txt" \
    -o encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 enc.qcow2 3M
EIMG="driver=qcow2,file.filename=$PWD/enc.qcow2,encrypt.key-secret=s0"
QIO=(qemu-io --object "secret,id=s0,file=$PWD/pass.txt" --image-opts "$EIMG")
"${QIO[@]}" -c 'write -P 0x61 0 3M' > /dev/null
for n in one two three four; do
    qemu-img snapshot --object "secret,id=s0,file=$PWD/pass.txt" --image-opts -c $n "$EIMG"
    "${QIO[@]}" -c "write -P 0x6$((RANDOM % 9)) $((RANDOM % 2048))k 300k" > /dev/null
done
QEMU_OPTS=(--object "secret,id=s0,file=$PWD/pass.txt" --image-opts) QEMU_IMG=("$EIMG")
for i in 1 2 3 4; do
    qemu-img convert -U "${QEMU_OPTS[@]}" -l "snapshot.id=$i" -O raw "$EIMG" want.raw
    rm -f got.raw
    NBDKIT_TIMEOUT=120 run_nbdkit -U - -r --filter="$FILTER" file enc.qcow2 \
        qcow2-passphrase=+pass.txt qcow2-snapshot=$i --run 'nbdcopy "$uri" got.raw' ||
        fail "encrypted snapshot $i: not served"
    cmp want.raw got.raw || fail "encrypted snapshot $i differs"
done
write_active "encrypted, with snapshots" enc.qcow2 65536 qcow2-passphrase=+pass.txt

echo "test-snapshots: all cases passed"
