#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Subcluster writes (extended L2 entries, issue 28 part 2).  Overlays
# with extended_l2=on over a raw and a qcow2 backing file, at 16 KiB,
# 64 KiB and 2 MiB clusters: the same writes of every size (one byte to
# several clusters, aligned and not to the subclusters), zeroes and
# discards through the filter and through qemu-io on copies; qemu-img
# check is clean, qemu reads both alike, and qemu-img map reports the
# same allocation, subcluster by subcluster.  A 4 KiB write into a fresh
# overlay allocates exactly what qemu's does (qemu-img map's bytes at
# depth 0: 4096 with 64 KiB clusters, one 64 KiB subcluster with 2 MiB
# ones).  Compressed clusters on such an image are rewritten as qemu
# rewrites them.  The plugin form too.  Then random writes, zeroes and
# trims from three connections mirrored into a raw file (check clean,
# qemu reads the mirror's data): over a qcow2 backing file, with
# qcow2-compress=on, LUKS-encrypted, and with a snapshot that must not
# change.  A fast zero that would write data is refused with ENOTSUP.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-img qemu-io nbdcopy
requires_nbd_python

cd "$TMPDIR_TEST"
M=$((1 << 20))
mixed_disk base.raw $((16 * M)) 5
qemu-img convert -q -f raw -O qcow2 base.raw base.qcow2

# ops SEED CLUSTER: "w OFF LEN PAT", "z OFF LEN", "t OFF LEN", one a line.
ops ()
{
    "$PYTHON" - "$1" "$2" <<'EOF'
import random, sys
rng = random.Random(int(sys.argv[1]))
cs = int(sys.argv[2])
sub = cs // 32
size = 16 << 20
sizes = [1, 511, 512, sub - 1, sub, sub + 1, 4096, 3 * sub + 7, cs - sub,
         cs, cs + sub, 3 * cs + 1000]
for i in range(60):
    n = rng.choice(sizes)
    off = rng.randrange(0, size - n)
    if rng.randrange(3) == 0:
        off -= off % sub
    kind = rng.choice("wwwwzt")
    print(kind, off, n, rng.randrange(1, 255) if kind == "w" else "")
EOF
}
# allocated IMAGE: the bytes qemu-img map says the image itself holds.
allocated ()
{
    qemu-img map --output=json "$1" | "$PYTHON" -c '
import json, sys
print(sum(e["length"] for e in json.load(sys.stdin) if e["depth"] == 0 and e["data"]))'
}
# map_of IMAGE: qemu-img map without host offsets, neighbours alike
# merged (where the host clusters lie is the allocator's business).
map_of ()
{
    qemu-img map --output=json "$1" | "$PYTHON" -c '
import json, sys
out = []
for e in json.load(sys.stdin):
    k = (e["depth"], e["present"], e["zero"], e["data"])
    if out and out[-1][2:] == list(k):
        out[-1][1] += e["length"]
    else:
        out.append([e["start"], e["length"], *k])
for o in out: print(*o)'
}
same_as_qemu ()
{
    local label=$1 ours=$2 theirs=$3
    qemu-img check "$ours" > check.out 2>&1 || { cat check.out; fail "$label: qemu-img check"; }
    grep -qi leak check.out && { cat check.out; fail "$label: leaked clusters"; }
    qemu-img compare -q "$ours" "$theirs" || fail "$label: qemu reads other data than after qemu-io"
    map_of "$ours" > ours.map
    map_of "$theirs" > theirs.map
    cmp -s ours.map theirs.map || { diff ours.map theirs.map | head; fail "$label: the allocation differs from qemu's"; }
}

seed=${QCOW2ZSTD_SEED:-1}
section same-as-qemu &&
for cs in 16384 65536 2097152; do
    for backing in raw qcow2; do
        for form in filter plugin; do
            label="cluster $cs over $backing, $form"
            rm -f ours.qcow2 theirs.qcow2
            qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=$cs \
                -b "$PWD/base.$backing" -F $backing theirs.qcow2 16M
            # Compressed clusters too, which writes must rewrite as qemu.
            qemu-io -c "write -c -P 0x44 $((2 * cs)) $cs" theirs.qcow2 > /dev/null
            cp theirs.qcow2 ours.qcow2
            [ $form = filter ] && truncate -s +48M ours.qcow2
            ops $seed $cs > ops.txt
            seed=$((seed + 1))
            if [ $form = filter ]; then
                start_server "$PWD/sock" file ours.qcow2
            else
                start_nbdkit "$PWD/sock" "$PLUGIN" ours.qcow2
            fi
            apply_ops_nbd "$(nbd_uri "$PWD/sock")" < ops.txt
            stop_server
            apply_ops_qemu_io theirs.qcow2 -u < ops.txt
            same_as_qemu "$label" ours.qcow2 theirs.qcow2
            echo "$label: $(wc -l < ops.txt) operations: check clean, data and map as qemu's"
        done
    done
done

# A 4 KiB write into a fresh overlay: what the image holds is what
# qemu's holds (the two subclusters written, no copy of the rest).
section 4k &&
for cs in 65536 2097152; do
    rm -f ours.qcow2 theirs.qcow2
    qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=$cs \
        -b "$PWD/base.raw" -F raw theirs.qcow2 16M
    cp theirs.qcow2 ours.qcow2
    truncate -s +8M ours.qcow2
    echo "w 1052672 4096 85" > ops.txt
    start_server "$PWD/sock" file ours.qcow2
    apply_ops_nbd "$(nbd_uri "$PWD/sock")" < ops.txt
    stop_server
    apply_ops_qemu_io theirs.qcow2 -u < ops.txt
    same_as_qemu "4 KiB write, cluster $cs" ours.qcow2 theirs.qcow2
    a=$(allocated ours.qcow2) b=$(allocated theirs.qcow2)
    [ "$a" = "$b" ] || fail "cluster $cs: a 4 KiB write allocated $a bytes, qemu's $b"
    # 64 KiB clusters have 2 KiB subclusters: exactly the two written.
    [ $cs != 65536 ] || [ "$a" = 4096 ] || fail "cluster $cs: a 4 KiB write allocated $a bytes, not 4096"
    echo "4 KiB write, cluster $cs: the image holds $a bytes of data, qemu's $b"
done

# workload LABEL IMAGE MIRROR SEED NBDKIT-ARGS...: three connections of
# random writes, zeroes and trims through nbdkit serving IMAGE, mirrored
# into MIRROR; then check clean and qemu reading the mirror's data
# (QEMU_OPTS: qemu's --image-opts for IMAGE instead, with SECRET).
workload ()
{
    local label=$1 img=$2 mirror=$3 seed=$4
    shift 4
    start_nbdkit "$PWD/sock" "$@"
    $PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
        "$mirror" "$seed" 3 200 65536 > workload.out ||
        { cat workload.out "$PWD/sock.log"; fail "$label: the workload failed"; }
    stop_server
    if [ -n "${QEMU_OPTS:-}" ]; then
        qemu-img check "${SECRET[@]}" --image-opts "$QEMU_OPTS" > check.out 2>&1 ||
            { cat check.out; fail "$label: qemu-img check"; }
        qemu-img compare -q "${SECRET[@]}" --image-opts "$QEMU_OPTS" \
            "driver=raw,file.filename=$mirror" || fail "$label: qemu reads other data than the mirror"
    else
        qemu-img check "$img" > check.out 2>&1 || { cat check.out; fail "$label: qemu-img check"; }
        qemu-img compare -q -f qcow2 -F raw "$img" "$mirror" || fail "$label: qemu reads other data than the mirror"
    fi
    grep -qi leak check.out && { cat check.out; fail "$label: leaked clusters"; }
    echo "$label: 3 x 200 operations: check clean, the mirror's data"
}

if section parallel; then
    for form in filter plugin; do
        rm -f img.qcow2
        qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=65536 \
            -b "$PWD/base.qcow2" -F qcow2 img.qcow2 16M
        cp base.raw mirror.raw
        if [ $form = filter ]; then
            truncate -s +48M img.qcow2
            workload "parallel, $form" img.qcow2 mirror.raw 31 --filter="$FILTER" file img.qcow2
        else
            workload "parallel, $form" img.qcow2 mirror.raw 31 "$PLUGIN" img.qcow2
        fi
    done
fi

if section compress; then
    rm -f img.qcow2
    qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=65536 \
        -b "$PWD/base.raw" -F raw img.qcow2 16M
    truncate -s +48M img.qcow2
    cp base.raw mirror.raw
    workload "qcow2-compress=on" img.qcow2 mirror.raw 32 --filter="$FILTER" \
        file img.qcow2 qcow2-compress=on
fi

if section luks; then
    echo -n "subcluster secret" > pass.txt
    SECRET=(--object "secret,id=s0,file=$PWD/pass.txt")
    rm -f img.qcow2 mirror.raw
    qemu_img_luks create -q -f qcow2 "${SECRET[@]}" \
        -o extended_l2=on,cluster_size=65536,encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 \
        img.qcow2 16M
    truncate -s +48M img.qcow2
    truncate -s 16M mirror.raw
    QEMU_OPTS="driver=qcow2,file.filename=img.qcow2,encrypt.key-secret=s0" \
        workload "LUKS" img.qcow2 mirror.raw 33 --filter="$FILTER" \
        file img.qcow2 qcow2-passphrase=+pass.txt
    SECRET=()
fi

if section snapshot; then
    # Clusters a snapshot shares are copied with their allocated
    # subclusters; the snapshot reads as before.
    rm -f img.qcow2
    qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=65536 img.qcow2 16M
    qemu-io -c "write -P 0x71 0 3M" -c "write -P 0x72 5M 5000" -c "write -z 6M 2k" img.qcow2 > /dev/null
    qemu-img snapshot -c one img.qcow2
    qemu-img convert -O raw img.qcow2 mirror.raw
    cp mirror.raw snap.raw
    truncate -s +48M img.qcow2
    workload "snapshot" img.qcow2 mirror.raw 34 --filter="$FILTER" file img.qcow2
    qemu-img convert -l snapshot.name=one -O raw img.qcow2 got-snap.raw
    cmp -s got-snap.raw snap.raw || fail "snapshot: the snapshot changed"
    echo "snapshot: reads as before the writes"
fi

if section fast-zero; then
    # A fast zero that would write data (part of a subcluster over the
    # backing file's data) fails with ENOTSUP and changes nothing; one of
    # whole subclusters is done.
    rm -f img.qcow2
    qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=65536 \
        -b "$PWD/base.raw" -F raw img.qcow2 16M
    truncate -s +16M img.qcow2
    start_server "$PWD/sock" file img.qcow2
    out=$("$PYTHON" -c '
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for off, n in ((1000, 3000), (4096, 2048)):
    try:
        h.zero(n, off, nbd.CMD_FLAG_FAST_ZERO)
        print("ok", end=" ")
    except nbd.Error as e:
        print(e.errno, end=" ")
h.shutdown()' "$(nbd_uri "$PWD/sock")")
    stop_server
    [ "$out" = "ENOTSUP ok " ] || fail "fast zero: got '$out', not 'ENOTSUP ok '"
    cp base.raw mirror.raw
    head -c 2048 /dev/zero | dd of=mirror.raw bs=1 seek=4096 conv=notrunc status=none
    qemu-img compare -q -f qcow2 -F raw img.qcow2 mirror.raw || fail "fast zero: the image reads other data"
    [ "$(allocated img.qcow2)" = 0 ] || fail "fast zero: data was written"
    echo "fast zero: of part of a subcluster refused (ENOTSUP), of a whole one done as zero bits"
fi
