#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Extended L2 entries (subclusters, incompatible bit 4): read support.
# Images made by qemu with writes and zeroes smaller than a cluster (so
# clusters are part allocated, part zero, part unallocated), compressed
# clusters, with and without a backing file, at several cluster sizes;
# read through the filter and compared with what qemu reads, and the map
# compared with qemu-nbd's.  They are served writable (writing them is
# test-subcluster-writes.sh).
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy qemu-io nbdinfo qemu-nbd

cd "$TMPDIR_TEST"
head -c 2M /dev/urandom > base.raw

# Normalised map: merged ranges "start length type".
map_of ()
{
    nbdinfo --map "$1" | awk '
        { s = $1; l = $2; t = $3 }
        n && t == pt && s == ps + pl { pl += l; next }
        n { print ps, pl, pt }
        { ps = s; pl = l; pt = t; n = 1 }
        END { if (n) print ps, pl, pt }'
}

for cs in 16384 65536 2097152; do
    for backing in none raw; do
        img=ext-$cs-$backing.qcow2
        opts="extended_l2=on,cluster_size=$cs"
        if [ $backing = raw ]; then
            qemu-img create -q -f qcow2 -o "$opts" -b "$PWD/base.raw" -F raw "$img" 4M
        else
            qemu-img create -q -f qcow2 -o "$opts" "$img" 4M
        fi
        qemu-io -f qcow2 \
            -c "write -P 0x61 0 2048" \
            -c "write -P 0x62 70000 3000" \
            -c "write -z 100000 4096" \
            -c "write -P 0x63 1048576 524288" \
            -c "write -z 1310720 8192" \
            -c "discard 1376256 16384" \
            -c "write -c -P 0x64 2097152 $cs" \
            -c "write -P 0x65 3000000 777" \
            "$img" > io.out 2>&1 || { cat io.out; fail "qemu-io on $img"; }
        qemu-img info "$img" | grep -q "extended l2: true" || fail "$img: not extended L2"

        start_server "$PWD/sock" -r file "$img"
        nbdcopy "$(nbd_uri "$PWD/sock")" ours.raw
        ours_map=$(map_of "$(nbd_uri "$PWD/sock")")
        stop_server
        qemu-img convert -O raw "$img" qemu.raw
        cmp ours.raw qemu.raw || fail "$img: the filter reads other data than qemu"

        if [ $backing = none ]; then
            rm -f "$PWD/qsock"
            qemu-nbd -r -t -f qcow2 -k "$PWD/qsock" "$img" 2> qemu-nbd.err & qpid=$!
            _pids+=("$qpid")
            for (( i = 0; i < 300; i++ )); do
                [ ! -S "$PWD/qsock" ] || break
                _alive "$qpid" || { cat qemu-nbd.err; fail "qemu-nbd exited at startup"; }
                sleep 0.1
            done
            [ -S "$PWD/qsock" ] || fail "qemu-nbd did not listen on $PWD/qsock within 30 s"
            # qemu-nbd says "data" or "zero": compare hole/zero status only.
            qemu_map=$(map_of "nbd+unix:///?socket=$PWD/qsock" | awk '{ print $1, $2, ($3 == 2 ? 0 : $3) }' |
                awk '{ s = $1; l = $2; t = $3 }
                     n && t == pt && s == ps + pl { pl += l; next }
                     n { print ps, pl, pt }
                     { ps = s; pl = l; pt = t; n = 1 }
                     END { if (n) print ps, pl, pt }')
            kill "$qpid"
            status=0
            { wait "$qpid"; } 2>/dev/null || status=$?
            # qemu-nbd ends with SIGTERM's status (143).
            [ "$status" = 143 ] || [ "$status" = 0 ] ||
                { cat qemu-nbd.err; fail "qemu-nbd ended with status $status"; }
            [ "$ours_map" = "$qemu_map" ] || {
                echo "ours:"; echo "$ours_map"; echo "qemu-nbd:"; echo "$qemu_map"
                fail "$img: the map differs from qemu-nbd's"
            }
        fi
        echo "extended L2, cluster $cs, backing $backing: reads as qemu reads it; map checked: $([ $backing = none ] && echo yes || echo no)"
    done
done

# Tables in one run (common/meta/map.h: kept beside the L1 entry once
# read, and answering every later lookup): every cluster allocated (the
# bitmaps all allocated), every cluster zero (offset 0, all zero), and
# preallocated metadata (offsets, no subcluster allocated), each read
# with an L2 cache of two tables, then one subcluster of the table
# written through the filter: the table then answers as changed.
cat base.raw base.raw > full.raw
qemu-img convert -O qcow2 -o extended_l2=on full.raw run-alloc.qcow2
qemu-img create -q -f qcow2 -o extended_l2=on run-zero.qcow2 4M
qemu-io -f qcow2 -c "write -z 0 4M" run-zero.qcow2 > io.out ||
    { cat io.out; fail "qemu-io on run-zero.qcow2"; }
qemu-img create -q -f qcow2 -o extended_l2=on,preallocation=metadata run-prealloc.qcow2 4M
for kind in alloc zero prealloc; do
    img=run-$kind.qcow2
    qemu-img convert -O raw "$img" qemu.raw
    truncate -s +1M "$img"          # room for the filter to allocate in
    start_server "$PWD/sock" file "$img" qcow2-l2-cache-size=128K
    nbdcopy "$(nbd_uri "$PWD/sock")" ours.raw
    cmp ours.raw qemu.raw || fail "$img: the filter reads other data than qemu"
    qemu-io -f raw -c "write -P 0x66 1050000 3000" "$(nbd_uri "$PWD/sock")" > io.out ||
        { cat io.out; fail "$img: the write through the filter failed"; }
    nbdcopy "$(nbd_uri "$PWD/sock")" ours.raw
    stop_server
    qemu-img check -q "$img" || fail "$img: qemu-img check failed after the write"
    qemu-img convert -O raw "$img" qemu.raw
    cmp ours.raw qemu.raw || fail "$img: after a write the filter reads other data than qemu"
    cmp -s ours.raw full.raw && [ $kind != alloc ] && fail "$img: the write left no trace"
    echo "extended L2, one run ($kind): reads as qemu reads it, before and after a write"
done

# Writable (writing them is test-subcluster-writes.sh): served without
# -r, at start-up with file= and at open with dir=, and a client sees a
# writable export.
start_server "$PWD/sock" file ext-65536-none.qcow2
nbdinfo --json "$(nbd_uri "$PWD/sock")" | grep -q '"is_read_only": false' ||
    fail "an extended L2 image is not served writable"
stop_server
echo "extended L2 images: served writable"

# Bad subcluster bitmaps are refused on read, naming what is wrong, and
# nothing is written: subcluster 0 of cluster 0 both allocated and zero,
# and an allocated subcluster in cluster 40, which has no host cluster
# (qemu calls both corrupt too).
set_bitmap ()
{
    python3 - "$1" "$2" "$3" "$4" <<'PY'
import struct, sys
path, index, entry, bitmap = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4], 0)
with open(path, "r+b") as f:
    f.seek(40)
    l1 = struct.unpack(">Q", f.read(8))[0]
    f.seek(l1)
    l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
    f.seek(l2 + 16 * index)
    old = struct.unpack(">Q", f.read(8))[0]
    f.seek(l2 + 16 * index)
    f.write(struct.pack(">QQ", old if entry == "keep" else int(entry, 0), bitmap))
PY
}
for bad in "0 keep 0x100000001 subclusters both allocated and zero" \
           "40 0 0x1 allocated subclusters in a cluster without a host offset"; do
    read -r index entry bitmap message <<<"$bad"
    cp ext-65536-none.qcow2 bad.qcow2
    set_bitmap bad.qcow2 "$index" "$entry" "$bitmap"
    sum=$(sha256sum < bad.qcow2)
    start_server "$PWD/sock" file -r bad.qcow2
    nbdcopy "$(nbd_uri "$PWD/sock")" out.raw 2> copy.err &&
        fail "bad bitmap ($message): the read succeeded"
    stop_server
    grep -q "$message" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "no '$message' in the log"; }
    [ "$(sha256sum < bad.qcow2)" = "$sum" ] || fail "bad bitmap ($message): the image changed"
    qemu-img convert -O raw bad.qcow2 qemu.raw 2> /dev/null &&
        fail "bad bitmap ($message): qemu read the image"
    echo "bad bitmap: $(grep -o "L2 entry for guest offset.*" "$PWD/sock.log" | head -1); the image unchanged"
done
