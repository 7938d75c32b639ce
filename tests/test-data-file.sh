#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Reading images with an external data file (issue 28 part 3; writing
# them is test-data-file-write.sh).  Images made by qemu-img
# with data_file= and data_file_raw=on and off, at 512 B, 4 KiB, 64 KiB
# and 2 MiB clusters, written by qemu-io (patterns, zeroes, a discard):
# read through the filter and the plugin (-r) as qemu reads them, and
# mapped as qemu maps them.  The data file is locked while served, as
# qemu locks it.  qcow2-data-file= names it where the header's relative
# name leads nowhere, as qemu's data-file option does; without it such
# an image is refused naming the data file.  A data file shorter than
# the L2 tables say is a read error naming the data file; a header that
# names a data file outside the directories files may be opened from is
# refused, and so is qcow2-data-file= for an image without one.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-img qemu-io nbdcopy nbdinfo
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"

# nbdkit_args FORM IMAGE: the server's arguments for FORM.
nbdkit_args ()
{
    if [ "$1" = filter ]; then
        ARGS=(--filter="$FILTER" file "$2")
    else
        ARGS=("$PLUGIN" "$2")
    fi
}
# qemu_map ARGS...: qemu-img map of ARGS as "start length zero data"
# lines, neighbours alike merged.
qemu_map ()
{
    qemu-img map --output=json "$@" | "${PYTHON:-/usr/bin/python3}" -c '
import json, sys
out = []
for e in json.load(sys.stdin):
    k = (e["zero"], e["data"])
    if out and out[-1][2:] == list(k):
        out[-1][1] += e["length"]
    else:
        out.append([e["start"], e["length"], *k])
for o in out: print(*o)'
}

for raw in on off; do
    for cs in 512 4096 65536 2097152; do
        for form in filter plugin; do
            label="data_file_raw=$raw, cluster $cs, $form"
            section "read-$raw-$cs-$form" || continue
            data_file_image img.qcow2 data.raw $raw $cs
            qemu-img convert -O raw img.qcow2 want.raw
            sums=$(sha256sum img.qcow2 data.raw)
            nbdkit_args $form img.qcow2
            start_nbdkit "$PWD/sock" -r "${ARGS[@]}"
            nbdcopy "$(nbd_uri "$PWD/sock")" got.raw || { cat "$PWD/sock.log"; fail "$label: not served"; }
            qemu_map --image-opts "driver=nbd,path=$PWD/sock" > got.map
            stop_server
            cmp -s got.raw want.raw || fail "$label: reads other data than qemu"
            qemu_map -f qcow2 img.qcow2 > want.map
            cmp -s got.map want.map || { diff want.map got.map; fail "$label: mapped otherwise than qemu maps it"; }
            [ "$(sha256sum img.qcow2 data.raw)" = "$sums" ] || fail "$label: reading changed a file"
            echo "$label: read and mapped as qemu reads and maps it"
        done
    done
done

if section refusals; then
    # A header naming a file outside the directories files may be opened
    # from (the server's files stay out of reach).
    mkdir -p secret
    head -c 8M /dev/urandom > secret/private.raw
    rm -f evil.qcow2
    qemu-img create -q -f qcow2 -o "data_file=$PWD/secret/private.raw,data_file_raw=on" evil.qcow2 8M
    mkdir -p served
    mv evil.qcow2 served/
    nbdkit_refuses "data file outside" "is outside the directories data files may be opened from" \
        -r --filter="$FILTER" file served/evil.qcow2
    echo "a data file outside the image's directory: $(grep -o 'the data file .*' refused.out | head -c 160)..."

    # qcow2-data-file= for an image without one.
    qemu-img create -q -f qcow2 plain.qcow2 8M
    nbdkit_refuses "qcow2-data-file, no data file" "'data-file' can only be set for images with an external data file" \
        -r --filter="$FILTER" file plain.qcow2 qcow2-data-file="$PWD/data.raw"
    echo "qcow2-data-file= for an image without a data file: refused"
fi

if section lock; then
    # Locked as qemu locks it: qemu-io cannot write the data file while
    # it is served.
    data_file_image img.qcow2 data.raw on 65536
    for form in filter plugin; do
        nbdkit_args $form img.qcow2
        start_nbdkit "$PWD/sock" -r "${ARGS[@]}"
        qemu-io -f raw -c "write 0 512" data.raw > lock.out 2>&1 && fail "$form: qemu-io wrote the data file while it was served"
        grep -q "lock" lock.out || { cat lock.out; fail "$form: no lock error from qemu-io"; }
        cp lock.out locked.out
        stop_server
    done
    qemu-io -f raw -c "write 0 512" data.raw > lock.out 2>&1 || { cat lock.out; fail "the data file stayed locked after the server stopped"; }
    echo "the data file is locked while served: $(grep -o 'Failed to get .* lock' locked.out | head -n 1)"
fi

if section override; then
    # qcow2-data-file= where the header's (relative) name is wrong here.
    data_file_image img.qcow2 data.raw off 65536
    mkdir -p elsewhere
    mv data.raw elsewhere/moved.raw
    nbdkit_refuses "missing data file" "cannot open the data file" -r --filter="$FILTER" file img.qcow2
    echo "missing data file: $(grep -o 'cannot open the data file.*' refused.out)"
    for form in filter plugin; do
        nbdkit_args $form img.qcow2
        start_nbdkit "$PWD/sock" -r "${ARGS[@]}" qcow2-data-file="$PWD/elsewhere/moved.raw"
        nbdcopy "$(nbd_uri "$PWD/sock")" got.raw
        stop_server
        qemu-img convert -O raw --image-opts "driver=qcow2,file.filename=img.qcow2,data-file.filename=$PWD/elsewhere/moved.raw" want.raw
        cmp -s got.raw want.raw || fail "$form, qcow2-data-file: reads other data than qemu with data-file="
    done
    echo "qcow2-data-file=: reads as qemu with data-file= reads it"
fi

if section short; then
    # A data file shorter than the L2 tables say.
    data_file_image img.qcow2 data.raw off 65536
    truncate -s 1M data.raw
    sums=$(sha256sum img.qcow2 data.raw)
    start_nbdkit "$PWD/sock" -r --filter="$FILTER" file img.qcow2
    nbdcopy "$(nbd_uri "$PWD/sock")" got.raw 2> copy.err && fail "read past the end of the data file"
    stop_server
    grep -q "past the end of the data file" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "short data file: no message naming it"; }
    [ "$(sha256sum img.qcow2 data.raw)" = "$sums" ] || fail "short data file: something was written"
    echo "data file shorter than the L2 tables say: $(grep -o "L2 entry.*data file.*" "$PWD/sock.log" | head -n 1); nothing written"
fi
