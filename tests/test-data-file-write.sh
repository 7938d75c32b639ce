#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writing images with an external data file (issue 28 part 3;
# test-data-file.sh covers reading).  Images made by qemu-img with
# data_file= and data_file_raw=on and off, every cluster size of the read
# matrix, through the filter and the plugin: random writes, zeroes and
# trims from several connections, after which qemu-img check is clean
# (no leaks: the data clusters are counted by no refcount), qemu reads
# what a raw mirror holds, every data cluster lies at its guest offset in
# the data file as qemu places it, and with data_file_raw=on the data
# file itself equals the guest disk and autoclear bit 1 is kept.  Also:
# a data file image over a backing file (copy-on-write from it), one
# LUKS-encrypted, the lazy refcounts mode with a kill -9 (repaired by
# the next open), the data file locked for writing while served and
# between clients, and the refusals: compression, data_file_raw over a backing file, a
# missing data file, a data file shorter than the tables say (nothing
# written in any of them).
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-img qemu-io nbdcopy nbdinfo
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
M=$((1 << 20))
mixed_disk base.raw $((8 * M)) 9

serve ()
{
    local form=$1 img=$2
    shift 2
    if [ "$form" = filter ]; then
        start_server "$PWD/sock" "$@" file "$img"
    else
        start_nbdkit "$PWD/sock" "$@" "$PLUGIN" "$img"
    fi
}
# placed IMAGE: every data extent qemu maps lies at its guest offset.
placed ()
{
    qemu-img map --output=json "$1" | "${PYTHON:-/usr/bin/python3}" -c '
import json, sys
bad = [e for e in json.load(sys.stdin) if e["data"] and e.get("offset") != e["start"]]
for e in bad: print(e)
sys.exit(1 if bad else 0)'
}
# written LABEL IMAGE MIRROR: what the image holds after writes.
written ()
{
    local label=$1 img=$2 mirror=$3
    qemu-img check "$img" > check.out 2>&1 || { cat check.out; fail "$label: qemu-img check"; }
    grep -qi leak check.out && { cat check.out; fail "$label: leaked clusters"; }
    qemu-img compare -q -f qcow2 -F raw "$img" "$mirror" || fail "$label: qemu reads other data than the mirror"
    placed "$img" || fail "$label: a data cluster away from its guest offset"
}

if section matrix; then
    for raw in on off; do
        for cs in 512 4096 65536 2097152; do
            for form in filter plugin; do
                label="data_file_raw=$raw, cluster $cs, $form"
                data_file_image img.qcow2 data.raw $raw $cs
                qemu-img convert -O raw img.qcow2 want.raw
                serve $form img.qcow2 -r
                nbdcopy "$(nbd_uri "$PWD/sock")" got.raw || { cat "$PWD/sock.log"; fail "$label: not served"; }
                stop_server
                cmp -s got.raw want.raw || fail "$label: reads other data than qemu"

                # Random writes, zeroes and trims, mirrored.
                [ $form = filter ] && truncate -s +8M img.qcow2
                cp want.raw mirror.raw
                serve $form img.qcow2
                $PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
                    mirror.raw 11 3 200 "$cs" > workload.out ||
                    { cat workload.out "$PWD/sock.log"; fail "$label: the workload failed"; }
                stop_server
                written "$label" img.qcow2 mirror.raw
                if [ $raw = on ]; then
                    cmp -s data.raw mirror.raw || fail "$label: the raw data file is not the guest disk"
                    [ $(( $(header_u64 img.qcow2 88) & 2 )) = 2 ] || fail "$label: autoclear bit 1 (data_file_raw) cleared"
                fi
                echo "$label: read as qemu reads it; 3 x 200 writes: check clean, no leaks, the mirror's data, every cluster at its guest offset$([ $raw = on ] && echo ", the data file equal to the disk")"
            done
        done
    done
fi

if section backing; then
    # Over a backing file: partial writes copy the rest from it.
    for form in filter plugin; do
        rm -f img.qcow2 data.raw
        qemu-img create -q -f qcow2 -o data_file=data.raw,cluster_size=65536 \
            -b base.raw -F raw img.qcow2 8M
        [ $form = filter ] && truncate -s +8M img.qcow2
        cp base.raw mirror.raw
        serve $form img.qcow2
        $PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
            mirror.raw 12 3 200 65536 > workload.out ||
            { cat workload.out "$PWD/sock.log"; fail "backing, $form: the workload failed"; }
        stop_server
        written "backing, $form" img.qcow2 mirror.raw
        echo "data file over a backing file, $form: 3 x 200 writes: check clean, the mirror's data"
    done
fi

if section luks; then
    # LUKS-encrypted, as qemu allows: ciphertext into the data file.
    echo -n "data file secret" > pass.txt
    SECRET=(--object "secret,id=s0,file=$PWD/pass.txt")
    OPTS="driver=qcow2,file.filename=img.qcow2,encrypt.key-secret=s0"
    rm -f img.qcow2 data.raw
    qemu_img_luks create -q -f qcow2 "${SECRET[@]}" \
        -o data_file=data.raw,encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 img.qcow2 8M
    truncate -s +8M img.qcow2
    rm -f mirror.raw && truncate -s 8M mirror.raw
    start_server "$PWD/sock" file img.qcow2 qcow2-passphrase=+pass.txt
    $PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
        mirror.raw 13 3 150 65536 > workload.out ||
        { cat workload.out "$PWD/sock.log"; fail "luks: the workload failed"; }
    stop_server
    qemu-img check "${SECRET[@]}" --image-opts "$OPTS" > check.out 2>&1 || { cat check.out; fail "luks: qemu-img check"; }
    qemu-img compare -q "${SECRET[@]}" --image-opts "$OPTS" "driver=raw,file.filename=mirror.raw" ||
        fail "luks: qemu reads other data than the mirror"
    cmp -s data.raw mirror.raw && fail "luks: plaintext in the data file"
    echo "LUKS-encrypted with a data file: 3 x 150 writes: check clean, qemu decrypts the mirror's data"
fi

if section lazy; then
    # qcow2-lazy-refcounts=on, killed after a flushed write: the next
    # open repairs the image (no refcount counts the data file's
    # clusters) and the write is there.
    data_file_image img.qcow2 data.raw off 65536
    truncate -s +8M img.qcow2
    start_server "$PWD/sock" file img.qcow2 qcow2-lazy-refcounts=on
    # Killed with the client connected: its disconnect would close the
    # image cleanly first.
    "$PYTHON" -c '
import nbd, os, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"w" * (256 << 10), 5 << 20)
h.flush()
h.pwrite(b"x" * 5000, 7 << 20)
os.kill(int(sys.argv[2]), 9)' "$(nbd_uri "$PWD/sock")" "$SERVER_PID"
    server_killed
    image_dirty img.qcow2 || fail "lazy: the dirty bit is not set after the kill"
    start_server "$PWD/sock" file img.qcow2
    nbdcopy "$(nbd_uri "$PWD/sock")" got.raw
    stop_server
    image_dirty img.qcow2 && fail "lazy: the image is still dirty after the repairing open"
    qemu-img check img.qcow2 > check.out 2>&1 || { cat check.out; fail "lazy: qemu-img check after the repair"; }
    grep -qi leak check.out && { cat check.out; fail "lazy: leaked clusters after the repair"; }
    cmp -s <(head -c $((256 * 1024)) /dev/zero | tr '\0' w) \
        <(dd if=got.raw bs=64k skip=80 count=4 status=none) || fail "lazy: the flushed write is lost"
    echo "lazy refcounts: killed dirty, repaired by the next open, check clean, the flushed write kept"
fi

if section lock; then
    # Written, the data file is locked for writing while served, and
    # (the filter: between clients too) until nbdkit exits.
    data_file_image img.qcow2 data.raw on 65536
    for form in filter plugin; do
        [ $form = filter ] && truncate -s +8M img.qcow2
        serve $form img.qcow2
        nbdinfo --size "$(nbd_uri "$PWD/sock")" > /dev/null
        # A reader that does not share writing (qemu-img convert's
        # source) is refused by a writer's lock, not by a reader's.
        qemu-img convert -f raw -O raw data.raw copy.raw > lock.out 2>&1 &&
            fail "$form: qemu-img convert read the data file while it was written (between clients)"
        grep -q 'shared "write" lock' lock.out || { cat lock.out; fail "$form: no lock error from qemu-img"; }
        qemu-io -f raw -c "write 0 512" data.raw > lock2.out 2>&1 && fail "$form: qemu-io wrote the data file while it was served"
        cp lock.out locked.out
        stop_server
        qemu-io -f raw -c "write 0 512" data.raw > lock.out 2>&1 || { cat lock.out; fail "$form: the data file stayed locked after the server stopped"; }
        data_file_image img.qcow2 data.raw on 65536
    done
    echo "the written data file is locked for writing while served: $(grep -o 'Failed to get .* lock' locked.out | head -n 1)"
fi

if section refusals; then
    data_file_image img.qcow2 data.raw on 65536
    sums=$(sha256sum img.qcow2 data.raw)
    nbdkit_refuses "compress" "an image with an external data file cannot hold compressed clusters" \
        --filter="$FILTER" file img.qcow2 qcow2-compress=on
    [ "$(sha256sum img.qcow2 data.raw)" = "$sums" ] || fail "compress: a refused open changed a file"
    echo "qcow2-compress=on: $(grep -o 'an image with an external data file cannot.*' refused.out)"

    # qemu-img makes no data_file_raw image over a backing file: one is
    # made by setting autoclear bit 1 of one that has both.
    rm -f img.qcow2 data.raw
    qemu-img create -q -f qcow2 -o data_file=data.raw -b base.raw -F raw img.qcow2 8M
    printf '\002' | dd of=img.qcow2 bs=1 seek=95 conv=notrunc status=none
    sums=$(sha256sum img.qcow2 data.raw)
    for form in filter plugin; do
        if [ $form = filter ]; then args=(--filter="$FILTER" file img.qcow2); else args=("$PLUGIN" img.qcow2); fi
        nbdkit_refuses "raw over backing, $form" "Backing file and data-file-raw cannot be used at the same time" "${args[@]}"
    done
    [ "$(sha256sum img.qcow2 data.raw)" = "$sums" ] || fail "raw over backing: a refused open changed a file"
    echo "data_file_raw over a backing file: refused, $(grep -o 'Backing file and.*' refused.out)"

    # A missing data file.
    data_file_image img.qcow2 data.raw off 65536
    mv data.raw gone.raw
    sums=$(sha256sum img.qcow2)
    nbdkit_refuses "missing data file" "cannot open the data file" --filter="$FILTER" file img.qcow2
    [ "$(sha256sum img.qcow2)" = "$sums" ] || fail "missing data file: the image changed"
    [ -e data.raw ] && fail "missing data file: it was created"
    echo "missing data file, writable: $(grep -o 'cannot open the data file.*' refused.out)"

    # A data file shorter than the L2 tables say: a write into a cluster
    # mapped past its end fails naming it; nothing is written.
    mv gone.raw data.raw
    truncate -s 1M data.raw
    truncate -s +8M img.qcow2
    sums=$(sha256sum img.qcow2 data.raw)
    start_server "$PWD/sock" file img.qcow2
    out=$(write_errno "$(nbd_uri "$PWD/sock")" $((M + 4096)) 4096 0x44)
    stop_server
    [ "$out" != ok ] || fail "short data file: a write into a cluster past its end succeeded"
    grep -q "past the end of the data file" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "short data file: no message naming it"; }
    [ "$(sha256sum img.qcow2 data.raw)" = "$sums" ] || fail "short data file: something was written"
    echo "data file shorter than the tables say: the write fails ($out), $(grep -o "L2 entry.*data file.*" "$PWD/sock.log" | head -n 1); nothing written"
fi
