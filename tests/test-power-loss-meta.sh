#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Power loss (the harness of test-power-loss.sh, apart so that each test
# stays within its time limit on a busy machine) for the metadata kept
# beside the guest's, in both forms: writes, zeroes and trims to an image
# with persistent bitmaps (no state in which qemu finds a bitmap
# consistent may miss a write that reached the disk, the disabled one
# never changes, and after the clean close each enabled one marks
# exactly what was written), and the repair of an image qemu left dirty
# (the filter rebuilding a damaged refcount table, the plugin in place:
# each state still dirty is repaired by the same form's own open before
# it is checked).
source "${top_srcdir:-.}/tests/functions.sh"
source "$top_srcdir/tests/power-loss-functions.sh"
requires qemu-img qemu-io qemu-nbd nbdinfo
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
STATES=${POWER_LOSS_STATES:-90}
M=$((1 << 20))
power_loss_base_raw base.raw

for form in filter plugin; do
    # 1. Persistent bitmaps: two enabled ones (64 KiB and 4 KiB
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
    power_loss_run $name $form img.qcow2 mixed 65536 9 0
    power_loss_check $name $((8 * M)) --states "$STATES" --seed 9 \
        --initial-raw bitmaps.raw --bitmap daily=daily.map --bitmap fine=fine.map \
        --frozen-bitmap frozen=frozen.map

    # 2. An image qemu left dirty (lazy refcounts, killed before it
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
