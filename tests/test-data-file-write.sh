#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writing images with an external data file (issue 28 part 3; not in
# TESTS until the engine writes them: test-data-file.sh covers reading).
# Images made by qemu-img with data_file= and data_file_raw=on and off,
# every cluster size of the read matrix, through the filter and the
# plugin: random writes from several connections, after which qemu-img
# check is clean, qemu reads what a raw mirror holds and, with
# data_file_raw=on, the data file itself equals the guest disk (and
# qemu keeps autoclear bit 1).
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-img qemu-io nbdcopy nbdinfo
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
M=$((1 << 20))
mixed_disk base.raw $((6 * M)) 9

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

            # Random writes, mirrored.
            [ $form = filter ] && truncate -s +8M img.qcow2
            cp want.raw mirror.raw
            serve $form img.qcow2
            $PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
                mirror.raw 11 3 200 "$cs" > workload.out ||
                { cat workload.out "$PWD/sock.log"; fail "$label: the workload failed"; }
            stop_server
            qemu-img check img.qcow2 > check.out 2>&1 || { cat check.out; fail "$label: qemu-img check"; }
            grep -qi leak check.out && { cat check.out; fail "$label: leaked clusters"; }
            qemu-img compare -q -f qcow2 -F raw img.qcow2 mirror.raw || fail "$label: qemu reads other data than the mirror"
            if [ $raw = on ]; then
                cmp -s data.raw mirror.raw || fail "$label: the raw data file is not the guest disk"
                [ $(( $(header_u64 img.qcow2 88) & 2 )) = 2 ] || fail "$label: autoclear bit 1 (data_file_raw) cleared"
            fi
            echo "$label: read as qemu reads it; 3 x 200 writes: check clean, the mirror's data$([ $raw = on ] && echo ", the data file equal to the disk")"
        done
    done
done
