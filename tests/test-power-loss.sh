#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Power loss: every write and flush that reaches the storage is logged
# (tests/record-plugin under the filter, tests/record-shim inside nbdkit
# for the plugin form; for an image with an external data file, which
# the engine opens itself, the shim in both forms, logging the image and
# the data file in one log), and crash states rebuilt from the log must
# pass qemu-img check without corruption and keep what every returned
# flush made durable (tests/power-loss-check.py says how they are made).
# This test is the filter form; test-power-loss-plugin.sh runs it for
# the plugin form (POWER_LOSS_FORMS), so that make check runs both at
# once.  For each form: qcow2-create and the first writes into the
# image it made, first writes into a new image, copy-on-write of
# compressed clusters, compressed writes, refcount table growth, the
# reuse of freed clusters in a file that is full, and released clusters
# discarded in the storage (trims to the recording plugin, holes punched
# and the file cut by the plugin form), after which no crash state may
# refer to a discarded range; writes to a LUKS-encrypted image, and
# writes to an image with internal snapshots (which every state must
# still hold as they were), and to one with extended L2 entries
# (subclusters) and a snapshot; writes, zeroes and trims to images with
# an external data file, data_file_raw off and on (every flush makes
# the data file durable before the image that maps it).  The client
# sends batches of writes, zeroes and trims at once over three
# connections (some with FUA, flushes sent while requests are in
# flight), and the storage serves them in parallel and logs in device
# order: crash states include changes that were in flight.  A self-check
# per form: the checker must find flushed data lost when the replay
# ignores the device's flushes (and per data file section, when it
# ignores only the data file's).  Every workload is a section
# (functions.sh: QCOW2ZSTD_SECTIONS=test-power-loss:filter-create ...;
# test-power-loss-plugin:plugin-create for the plugin form).
# test-power-loss-meta.sh has the persistent bitmaps and the repair of
# images left dirty.
source "${top_srcdir:-.}/tests/functions.sh"
source "$top_srcdir/tests/power-loss-functions.sh"
requires qemu-img qemu-io
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
STATES=${POWER_LOSS_STATES:-90}
M=$((1 << 20))

header_u32 ()
{
    od -An -tu4 --endian=big -j "$2" -N 4 "$1" | tr -d ' '
}

# An 8 MiB disk of text and random sectors (write id 0) with holes, for
# the compressed image whose clusters are copied on write.
power_loss_base_raw base.raw

printf 'power loss' > pass.txt
SECRET="secret,id=s0,file=$PWD/pass.txt"

for form in ${POWER_LOSS_FORMS:-filter}; do
    # 1. qcow2-create, then the first writes into the image it made.
    name=$form-create
    if section $name; then
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
    fi

    # 2. The first writes into a new image (qemu-img create); and the
    # self-check of the checker on their log.
    name=$form-first-writes
    if section $name; then
        rm -f img.qcow2
        qemu-img create -q -f qcow2 -o cluster_size=4096 img.qcow2 8M
        [ $form = filter ] && truncate -s +12M img.qcow2
        power_loss_run $name $form img.qcow2 random 4096 2 0
        power_loss_self_check $name $((8 * M)) --states 16 --seed 2
        power_loss_check $name $((8 * M)) --states "$STATES" --seed 2
    fi

    # 3. Copy-on-write of compressed clusters.
    name=$form-cow-compressed
    if section $name; then
        rm -f img.qcow2
        qemu-img convert -c -O qcow2 -o cluster_size=65536 base.raw img.qcow2
        [ $form = filter ] && truncate -s +12M img.qcow2
        power_loss_run $name $form img.qcow2 cow 65536 3 0
        power_loss_check $name $((8 * M)) --states "$STATES" --seed 3 --initial-raw base.raw
    fi

    # 4. Compressed writes, packed and overwritten.
    name=$form-compressed-writes
    if section $name; then
        rm -f img.qcow2
        qemu-img create -q -f qcow2 -o cluster_size=4096 img.qcow2 8M
        [ $form = filter ] && truncate -s +12M img.qcow2
        power_loss_run $name $form img.qcow2 compress 4096 4 0 qcow2-compress=true
        power_loss_check $name $((8 * M)) --states "$STATES" --seed 4
    fi

    # 5. Refcount table growth: with 512-byte clusters one table cluster
    # covers 8 MiB of file; 9 MiB of data needs a larger table.
    name=$form-refcount-growth
    if section $name; then
        rm -f img.qcow2
        qemu-img create -q -f qcow2 -o cluster_size=512 img.qcow2 12M
        [ $form = filter ] && truncate -s 12M img.qcow2
        table_before=$(header_u64 img.qcow2 48)
        power_loss_run $name $form img.qcow2 sequential 512 5 $((9 * M))
        [ "$(header_u64 img.qcow2 48)" != "$table_before" ] &&
            [ "$(header_u32 img.qcow2 56)" -gt 1 ] ||
            fail "$name: the refcount table did not grow"
        power_loss_check $name $((12 * M)) --states "$STATES" --seed 5
    fi

    # 6. Freed clusters reused: the filter's file has room for the span
    # and 4 clusters more, so every round after the first lives on what
    # the trim before it freed.  (The plugin form grows its file instead
    # of failing, but reuses the freed clusters first.)
    name=$form-reuse-freed
    if section $name; then
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
    fi

    # 7. Released clusters discarded: trims, zero requests and rewrites
    # of parts of (compressed) clusters, then the whole disk trimmed (the
    # plugin form cuts its file) and written again.  A discard is data
    # lost: the checker rebuilds it as garbage and refuses any state
    # that refers to it.
    for compress in false true; do
        name=$form-discard-$compress
        section $name || continue
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
    if section $name; then
        rm -f img.qcow2
        qemu_img_luks convert -O qcow2 --object "$SECRET" \
            -o cluster_size=65536,encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 \
            base.raw img.qcow2 || fail "$name: qemu-img convert failed"
        [ $form = filter ] && truncate -s +12M img.qcow2
        power_loss_run $name $form img.qcow2 random 65536 7 0 \
            "qcow2-passphrase=+$PWD/pass.txt"
        power_loss_check $name $((8 * M)) --states "$STATES" --seed 7 \
            --initial-raw base.raw --secret "$PWD/pass.txt"
    fi

    # 9. An image with two snapshots: clusters they share are copied
    # (whole or in part), and so are the L2 tables; zeroes drop only the
    # active layer's references; no state may change a snapshot.
    name=$form-snapshots
    if section $name; then
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
    fi

    # 10. Extended L2 entries: writes of parts of clusters allocate the
    # subclusters they touch (copying the rest of those on write), zeroes
    # set zero bits; an image whose clusters are part allocated, part
    # zero, part unallocated to begin with, and one snapshot sharing them.
    name=$form-subclusters
    if section $name; then
        rm -f img.qcow2
        qemu-img create -q -f qcow2 -o cluster_size=65536,extended_l2=on img.qcow2 8M
        qemu-io -c 'write -P 0x61 0 100k' -c 'write -z 300k 64k' \
            -c 'write -P 0x62 1M 3000' -c 'write -P 0x63 2100k 700k' img.qcow2 > /dev/null
        qemu-img snapshot -c one img.qcow2
        qemu-io -c 'write -P 0x64 40k 10k' img.qcow2 > /dev/null
        qemu-img convert -l snapshot.id=1 -O raw img.qcow2 snap1.raw
        qemu-img convert -O raw img.qcow2 active.raw
        [ $form = filter ] && truncate -s +12M img.qcow2
        power_loss_run $name $form img.qcow2 random 4096 9 0
        power_loss_check $name $((8 * M)) --states "$STATES" --seed 9 \
            --initial-raw active.raw --snapshot 1=snap1.raw
    fi

    # 11. An external data file, with data_file_raw off and on: guest data
    # written in place into the data file (which every flush makes
    # durable before the image file, whose tables map it), parts of
    # clusters zeroed with zeros written, whole clusters zeroed or
    # trimmed punched out of it.  Half the disk holds data to begin with
    # (written over in place), half is unallocated (first writes).  The
    # shim logs both files in one device order, in either form (the
    # filter over nbdkit's file plugin); a crash state is the image and
    # its data file, found by the relative name in the image's header.
    # Two self-checks: the replay ignoring every device flush, and only
    # the data file's.
    for raw in off on; do
        name=$form-data-file
        [ $raw = on ] && name=$form-data-file-raw
        section $name || continue
        rm -f img.qcow2 img.data
        qemu-img convert -O qcow2 \
            -o data_file=img.data,data_file_raw=$raw,cluster_size=65536 \
            base.raw img.qcow2
        qemu-io -c 'discard 4M 4M' img.qcow2 > /dev/null
        qemu-img convert -O raw img.qcow2 active.raw
        [ $form = filter ] && truncate -s +12M img.qcow2
        power_loss_run --data-file img.data $name $form img.qcow2 mixed 65536 10 0
        extra=(--expect-discards)
        [ $raw = on ] && extra+=(--data-file-raw)
        power_loss_self_check $name $((8 * M)) --states 16 --seed 10 \
            --initial-raw active.raw
        power_loss_self_check $name $((8 * M)) --states 16 --seed 10 \
            --initial-raw active.raw --self-check data-file
        power_loss_check $name $((8 * M)) --states "$STATES" --seed 10 \
            --initial-raw active.raw "${extra[@]}"
    done
done
