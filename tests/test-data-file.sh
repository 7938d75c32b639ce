#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# External data files (issue 28 part 3; not in TESTS until the engine
# serves them).  Images made by qemu-img with data_file= and
# data_file_raw=on and off: read through the filter and the plugin as
# qemu reads them (patterns, zeroes, discards, every cluster size of the
# read matrix); then random writes from several connections, after
# which qemu-img check is clean, qemu reads what a raw mirror holds and,
# with data_file_raw=on, the data file itself equals the guest disk
# (and qemu keeps autoclear bit 1).  The data file is locked as qemu
# locks it.  qcow2-data-file= names it where the header's name is
# relative to somewhere else, as qemu's data-file option does.  A data
# file that is missing, or shorter than the L2 tables say, is a clear
# error, and nothing is written.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-img qemu-io nbdcopy nbdinfo
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
M=$((1 << 20))
mixed_disk base.raw $((6 * M)) 9

# make IMAGE DATA RAW CLUSTER: a qcow2 image whose data lives in DATA,
# written by qemu-io with patterns, zeroes and a discard.
make_image ()
{
    rm -f "$1" "$2"
    qemu-img create -q -f qcow2 \
        -o "data_file=$2,data_file_raw=$3,cluster_size=$4" "$1" 8M
    qemu-io -c "write -P 0x51 0 100k" -c "write -P 0x52 1M 2M" \
        -c "write -z 1536k 64k" -c "discard 2M 128k" -c "write -P 0x53 7M 3000" \
        "$1" > io.out || { cat io.out; fail "qemu-io on $1"; }
}
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
            make_image img.qcow2 data.raw $raw $cs
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

# Locked as qemu locks it: qemu-io cannot write the data file while the
# filter writes the image.
make_image img.qcow2 data.raw on 65536
truncate -s +1M img.qcow2
serve filter img.qcow2
qemu-io -f raw -c "write 0 512" data.raw > lock.out 2>&1 && fail "qemu-io wrote the data file while it was served"
grep -q "lock" lock.out || { cat lock.out; fail "no lock error from qemu-io"; }
stop_server
echo "the data file is locked while served: $(grep -o "Failed to get .* lock" lock.out | head -n 1)"

# qcow2-data-file= where the header's (relative) name is wrong here.
make_image img.qcow2 data.raw off 65536
mkdir -p elsewhere
mv data.raw elsewhere/moved.raw
sum=$(sha256sum < img.qcow2)
serve filter img.qcow2
nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null 2>&1 && fail "served without its data file"
stop_server
grep -q "data file" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "no message naming the data file"; }
[ "$(sha256sum < img.qcow2)" = "$sum" ] || fail "missing data file: the image changed"
echo "missing data file: refused, nothing written: $(grep -o "data file.*" "$PWD/sock.log" | head -n 1)"
serve filter img.qcow2 -r qcow2-data-file="$PWD/elsewhere/moved.raw"
nbdcopy "$(nbd_uri "$PWD/sock")" got.raw
stop_server
qemu-img convert -O raw --image-opts "driver=qcow2,file.filename=img.qcow2,data-file.filename=$PWD/elsewhere/moved.raw" want.raw
cmp -s got.raw want.raw || fail "qcow2-data-file: reads other data than qemu with data-file="
echo "qcow2-data-file=: reads as qemu with data-file= reads it"

# A data file shorter than the L2 tables say.
make_image img.qcow2 data.raw off 65536
truncate -s 1M data.raw
truncate -s +1M img.qcow2
sum=$(sha256sum < img.qcow2)
dsum=$(sha256sum < data.raw)
serve filter img.qcow2
nbdcopy "$(nbd_uri "$PWD/sock")" got.raw 2> copy.err && fail "read past the end of the data file"
stop_server
grep -q "data file" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "short data file: no message naming it"; }
[ "$(sha256sum < img.qcow2)" = "$sum" ] && [ "$(sha256sum < data.raw)" = "$dsum" ] ||
    fail "short data file: something was written"
echo "data file shorter than the L2 tables say: $(grep -o "data file.*" "$PWD/sock.log" | head -n 1); nothing written"
