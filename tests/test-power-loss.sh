#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Power loss: every write and flush that reaches the storage is logged
# (tests/record-plugin under the filter, tests/record-shim inside nbdkit
# for the plugin form), and crash states rebuilt from the log must pass
# qemu-img check without corruption and keep what every returned flush
# made durable (tests/power-loss-check.py says how they are made).  For
# both forms: qcow2-create and the first writes into the image it made,
# first writes into a new image, copy-on-write of compressed clusters,
# compressed writes, refcount table growth, the reuse of freed
# clusters in a file that is full, and released clusters discarded in
# the storage (trims to the recording plugin, holes punched and the file
# cut by the plugin form), after which no crash state may refer to a
# discarded range; writes to a LUKS-encrypted image, and writes to an
# image with internal snapshots (which every state must still hold as
# they were), the repair of an image qemu left dirty (in place, and
# rebuilt: each state still dirty is repaired by the filter's own open
# first), and writes, zeroes and trims to an image with persistent
# bitmaps (no state in which qemu finds a bitmap consistent may miss a
# write that reached the disk, the disabled one never changes, and after
# the clean close each enabled one marks exactly what was written).
source "${top_srcdir:-.}/tests/functions.sh"
source "$top_srcdir/tests/power-loss-functions.sh"
requires qemu-img qemu-io qemu-nbd nbdinfo
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
STATES=${POWER_LOSS_STATES:-90}
M=$((1 << 20))

header_u64 ()
{
    od -An -tu8 --endian=big -j "$2" -N 8 "$1" | tr -d ' '
}
header_u32 ()
{
    od -An -tu4 --endian=big -j "$2" -N 4 "$1" | tr -d ' '
}

# An 8 MiB disk of text and random sectors (write id 0) with holes, for
# the compressed image whose clusters are copied on write.
$PYTHON - "$top_srcdir/tests" <<'EOF'
import random, sys
sys.path.insert(0, sys.argv[1])
from powerloss import write_data
rng = random.Random(7)
out = bytearray()
for c in range(128):
    kind = rng.randrange(4)
    if kind == 0:
        out += bytes(65536)
    else:
        out += write_data(0, c * 65536, 65536, kind != 3)
open("base.raw", "wb").write(out)
EOF

printf 'power loss' > pass.txt
SECRET="secret,id=s0,file=$PWD/pass.txt"
# qemu-img's PBKDF benchmark now and then fails on a busy machine
# ("Unable to get accurate CPU usage"): try again.
qemu_img_luks ()
{
    local i
    for i in 1 2 3 4 5; do
        qemu-img "$@" 2> luks.err && return 0
        grep -q "accurate CPU usage" luks.err || { cat luks.err; return 1; }
    done
    return 1
}

for form in filter plugin; do
    # 1. qcow2-create, then the first writes into the image it made.
    name=$form-create
    rm -f dev.img
    [ $form = filter ] && truncate -s 24M dev.img
    power_loss_run $name $form dev.img random 65536 1 0 \
        qcow2-create=8M qcow2-cluster-size=64K
    power_loss_check $name $((8 * M)) --states "$STATES" --seed 1 \
        --create 65536 --keep-unformatted unformatted.img
    # An unformatted state is one qcow2-create takes again.
    [ -f unformatted.img ] || fail "$name: no state before the header"
    if [ $form = filter ]; then
        start_server "$PWD/sock" file unformatted.img qcow2-create=8M
    else
        start_nbdkit "$PWD/sock" "$PLUGIN" unformatted.img qcow2-create=8M
    fi
    nbdcopy base.raw "$(nbd_uri "$PWD/sock")" || fail "$name: qcow2-create again"
    stop_server
    qemu-img compare -q -f qcow2 -F raw unformatted.img base.raw ||
        fail "$name: the image created again reads other data"
    echo "$name: qcow2-create ran again on the last state before the header: check clean, data right"

    # 2. The first writes into a new image (qemu-img create).
    name=$form-first-writes
    rm -f img.qcow2
    qemu-img create -q -f qcow2 -o cluster_size=4096 img.qcow2 8M
    [ $form = filter ] && truncate -s +12M img.qcow2
    power_loss_run $name $form img.qcow2 random 4096 2 0
    power_loss_check $name $((8 * M)) --states "$STATES" --seed 2

    # 3. Copy-on-write of compressed clusters.
    name=$form-cow-compressed
    rm -f img.qcow2
    qemu-img convert -c -O qcow2 -o cluster_size=65536 base.raw img.qcow2
    [ $form = filter ] && truncate -s +12M img.qcow2
    power_loss_run $name $form img.qcow2 cow 65536 3 0
    power_loss_check $name $((8 * M)) --states "$STATES" --seed 3 --initial-raw base.raw

    # 4. Compressed writes, packed and overwritten.
    name=$form-compressed-writes
    rm -f img.qcow2
    qemu-img create -q -f qcow2 -o cluster_size=4096 img.qcow2 8M
    [ $form = filter ] && truncate -s +12M img.qcow2
    power_loss_run $name $form img.qcow2 compress 4096 4 0 qcow2-compress=true
    power_loss_check $name $((8 * M)) --states "$STATES" --seed 4

    # 5. Refcount table growth: with 512-byte clusters one table cluster
    # covers 8 MiB of file; 9 MiB of data needs a larger table.
    name=$form-refcount-growth
    rm -f img.qcow2
    qemu-img create -q -f qcow2 -o cluster_size=512 img.qcow2 12M
    [ $form = filter ] && truncate -s 12M img.qcow2
    table_before=$(header_u64 img.qcow2 48)
    power_loss_run $name $form img.qcow2 sequential 512 5 $((9 * M))
    [ "$(header_u64 img.qcow2 48)" != "$table_before" ] &&
        [ "$(header_u32 img.qcow2 56)" -gt 1 ] ||
        fail "$name: the refcount table did not grow"
    power_loss_check $name $((12 * M)) --states "$STATES" --seed 5

    # 6. Freed clusters reused: the filter's file has room for the span
    # and 4 clusters more, so every round after the first lives on what
    # the trim before it freed.  (The plugin form grows its file instead
    # of failing, but reuses the freed clusters first.)
    name=$form-reuse-freed
    rm -f img.qcow2
    qemu-img create -q -f qcow2 -o cluster_size=65536 img.qcow2 16M
    span=$((2 * M))
    size_before=$(stat -c %s img.qcow2)
    [ $form = filter ] && truncate -s $((size_before + span + 4 * 65536)) img.qcow2
    power_loss_run $name $form img.qcow2 reuse 65536 6 $span
    size_after=$(stat -c %s img.qcow2)
    [ "$size_after" -le $((size_before + span + 4 * 65536)) ] ||
        fail "$name: the file grew to $size_after bytes: freed clusters were not reused"
    power_loss_check $name $((16 * M)) --states "$STATES" --seed 6

    # 7. Released clusters discarded: trims, zero requests and rewrites
    # of parts of (compressed) clusters, then the whole disk trimmed (the
    # plugin form cuts its file) and written again.  A discard is data
    # lost: the checker rebuilds it as garbage and refuses any state
    # that refers to it.
    for compress in false true; do
        name=$form-discard-$compress
        rm -f img.qcow2
        qemu-img create -q -f qcow2 -o cluster_size=65536 img.qcow2 8M
        [ $form = filter ] && truncate -s +12M img.qcow2
        power_loss_run $name $form img.qcow2 discard 65536 7 0 \
            qcow2-compress=$compress
        extra=(--expect-discards)
        [ $form = plugin ] && extra+=(--expect-cut)
        power_loss_check $name $((8 * M)) --states "$STATES" --seed 7 "${extra[@]}"
    done
    # 8. A LUKS-encrypted image: every write's data encrypted on its way
    # to the storage, parts of clusters decrypted and encrypted again.
    name=$form-encrypted
    rm -f img.qcow2
    qemu_img_luks convert -O qcow2 --object "$SECRET" \
        -o cluster_size=65536,encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 \
        base.raw img.qcow2 || fail "$name: qemu-img convert failed"
    [ $form = filter ] && truncate -s +12M img.qcow2
    power_loss_run $name $form img.qcow2 random 65536 7 0 \
        "qcow2-passphrase=+$PWD/pass.txt"
    power_loss_check $name $((8 * M)) --states "$STATES" --seed 7 \
        --initial-raw base.raw --secret "$PWD/pass.txt"

    # 9. An image with two snapshots: clusters they share are copied
    # (whole or in part), and so are the L2 tables; zeroes drop only the
    # active layer's references; no state may change a snapshot.
    name=$form-snapshots
    rm -f img.qcow2
    qemu-img convert -O qcow2 -o cluster_size=65536 base.raw img.qcow2
    qemu-img snapshot -c one img.qcow2
    qemu-io -c 'write -P 0x5a 1M 2M' img.qcow2 > /dev/null
    qemu-img snapshot -c two img.qcow2
    for i in 1 2; do
        qemu-img convert -l snapshot.id=$i -O raw img.qcow2 snap$i.raw
    done
    qemu-img convert -O raw img.qcow2 active.raw
    [ $form = filter ] && truncate -s +12M img.qcow2
    power_loss_run $name $form img.qcow2 random 65536 8 0
    power_loss_check $name $((8 * M)) --states "$STATES" --seed 8 \
        --initial-raw active.raw --snapshot 1=snap1.raw --snapshot 2=snap2.raw

    # 10. Persistent bitmaps: two enabled ones (64 KiB and 4 KiB
    # granules) with bits set before, and a disabled one.
    name=$form-bitmaps
    rm -f img.qcow2
    qemu-img convert -O qcow2 -o cluster_size=65536 base.raw img.qcow2
    qemu-img bitmap --add img.qcow2 daily
    qemu-img bitmap --add -g 4096 img.qcow2 fine
    qemu-img bitmap --add img.qcow2 frozen
    qemu-io -c 'write -P 0x5c 1M 100k' img.qcow2 > /dev/null
    qemu-img bitmap --disable img.qcow2 frozen
    qemu-img convert -O raw img.qcow2 bitmaps.raw
    for b in daily fine frozen; do
        nbdinfo --map=qemu:dirty-bitmap:$b -- [ qemu-nbd -r -B $b -f qcow2 img.qcow2 ] > $b.map
    done
    [ $form = filter ] && truncate -s +12M img.qcow2
    power_loss_run $name $form img.qcow2 bitmaps 65536 9 0
    power_loss_check $name $((8 * M)) --states "$STATES" --seed 9 \
        --initial-raw bitmaps.raw --bitmap daily=daily.map --bitmap fine=fine.map \
        --frozen-bitmap frozen=frozen.map

    # 11. An image qemu left dirty (lazy refcounts, killed before it
    # closed the image): the open repairs it; the filter with refcount
    # table entry 0 lost (the table and blocks rebuilt in free clusters,
    # then the header switched), the plugin in place.  Every state still
    # dirty must be repaired by the same form's own open before it is
    # checked.
    env_args=()
    for e in "${NBDKIT_ENV[@]}"; do env_args+=("--nbdkit-env=$e"); done
    repair=in-place so=$PLUGIN
    [ $form = filter ] && repair=rebuilt so=$FILTER
    name=$form-dirty-$repair
    rm -f img.qcow2
    qemu-img convert -O qcow2 -o cluster_size=65536,lazy_refcounts=on base.raw img.qcow2
    qemu-io -c 'write -P 0x61 1M 64k' -c 'write -P 0x62 5M 300k' \
        -c 'write -P 0x63 7M 8k' -c 'sigraise 9' img.qcow2 > /dev/null 2>&1 || true
    [ $(( $(header_u64 img.qcow2 72) & 1 )) = 1 ] || fail "$name: qemu-io left no dirty bit"
    qemu-img check img.qcow2 > precheck.out 2>&1 && fail "$name: no refcount error to repair"
    [ $repair = rebuilt ] &&
        printf '\0\0\0\0\0\0\0\0' | dd of=img.qcow2 bs=1 seek="$(header_u64 img.qcow2 48)" conv=notrunc status=none
    qemu-img convert -O raw img.qcow2 dirty.raw
    [ $form = filter ] && truncate -s +12M img.qcow2
    power_loss_run $name $form img.qcow2 random 65536 10 0
    power_loss_check $name $((8 * M)) --states "$STATES" --seed 10 \
        --initial-raw dirty.raw --repair-dirty "$form=$so" "${env_args[@]}"
done
