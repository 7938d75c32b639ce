#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Read a matrix of qcow2 images through the filter and compare every byte
# with what qemu-img convert -O raw makes of the same image.
#
# Images, all generated here with qemu-img and qemu-io:
#   - qemu-img convert of a raw source mixing random bytes, text, written
#     zero runs and holes, for cluster sizes 512, 4k, 64k, 2M x compat
#     0.10 / 1.1 x no compression / zlib / zstd (zstd needs compat 1.1);
#   - images written with qemu-io 'write -c' (compressed writes, the file
#     ends mid-sector), mixed with normal writes;
#   - zero clusters (write -z, plain and allocated), discards, and rewrites
#     of compressed clusters (partial overwrite, write -z, discard);
#   - images of virtual size 0;
#   - a few images again with qcow2-threads=1, with both caches disabled
#     and with qcow2-request-size=4096;
#   - extended L2 entries (subclusters allocated, zero and unallocated),
#     also through the plugin.
# Each image is copied with nbdcopy (with and without extents) and read
# with a seeded set of unaligned nbdsh preads.

source "${top_srcdir:-.}/tests/functions.sh"

requires qemu-io nbdcopy nbdinfo nbdsh cmp dd truncate

requires_nbdsh

W=$TMPDIR_TEST
nserver=0

# ---------------------------------------------------------------- sources

# Pools the raw sources take their bytes from.
head -c $((15 << 20)) /dev/urandom > "$W/rnd"
{
    cat /usr/share/common-licenses/GPL-3 2>/dev/null || true
    awk 'BEGIN {
        split("qcow2 cluster sector zstd zlib deflate table entry refcount " \
              "header offset guest host image nbdkit filter read the of a", w, " ");
        for (i = 0; i < 160000; i++) {
            printf "%07d", i;
            for (j = 0; j < 1 + (i * 7) % 11; j++)
                printf " %s", w[1 + (i * 13 + j * 5) % 20];
            printf ".\n";
        }
    }'
} > "$W/text"
[ "$(stat -c %s "$W/text")" -gt $((4 << 20)) ] || fail "text pool too small"

# put DST OFFSET SRC SRCOFFSET LEN: copy LEN bytes of SRC (from SRCOFFSET)
# into DST at OFFSET, in place.
put ()
{
    dd if="$3" of="$1" bs=64K iflag=skip_bytes,count_bytes,fullblock \
       skip="$4" count="$5" oflag=seek_bytes seek="$2" conv=notrunc \
       status=none
}

# make_raw FILE SIZE HOLE: a sparse raw file of SIZE bytes: random bytes,
# text, a written run of zeros, a hole of HOLE bytes, a stretch of small
# random/text/zero pieces separated by small holes, then text and random
# bytes up to the end.  No boundary is aligned on anything.
make_raw ()
{
    local f=$1 size=$2 hole=$3 off len i src
    rm -f "$f"
    truncate -s "$size" "$f"
    len=$((size / 8 + 7))
    put "$f" 0 "$W/rnd" 0 "$len"
    off=$len
    len=$((size / 8 + 333))
    put "$f" "$off" "$W/text" 1000 "$len"
    off=$((off + len))
    len=$((size / 10 + 91))
    put "$f" "$off" /dev/zero 0 "$len"
    off=$((off + len + hole))
    i=0
    while [ $off -lt $((size * 8 / 10)) ]; do
        len=$((300 + (i * 7919) % 9000))
        case $((i % 3)) in
            0) src=$W/rnd ;;
            1) src=$W/text ;;
            2) src=/dev/zero ;;
        esac
        put "$f" "$off" "$src" $((i * 4099)) "$len"
        off=$((off + len + (i * 104729) % 6000))
        i=$((i + 1))
    done
    len=$((size / 20 + 13))
    put "$f" $((size * 85 / 100)) "$W/text" 77777 "$len"
    put "$f" $((size - 4321)) "$W/rnd" 123 4321
    [ "$(stat -c %s "$f")" -eq "$size" ] || fail "make_raw: wrong size"
}

# ------------------------------------------------------------ assertions

# Number of compressed ranges in qemu-img map (data, but no host offset).
count_compressed ()
{
    qemu-img map -f qcow2 --output=json "$1" |
        grep '"data": true' | grep -vc '"offset"' || true
}

# The compression type in the header, as qemu reads it.
compression_type_of ()
{
    qemu-img info -f qcow2 --output=json "$1" |
        sed -n 's/.*"compression-type": "\([a-z]*\)".*/\1/p'
}

# expect_compressed IMG TYPE: the image really holds TYPE-compressed
# clusters (otherwise the case would not test what it claims).
expect_compressed ()
{
    local t
    t=$(compression_type_of "$1")
    [ "$2" = zlib ] && [ -z "$t" ] && t=zlib   # v2 images: no field
    [ "$t" = "$2" ] || fail "$1: compression type is '$t', expected $2"
    [ "$(count_compressed "$1")" -gt 0 ] ||
        fail "$1: qemu-img map shows no compressed cluster"
}

# ------------------------------------------------------------ the check

# Python run by nbdsh: seeded unaligned preads compared with the reference.
read -r -d '' ODD_READS <<'EOF' || true
import os, random, sys
ref = open(os.environ["REF"], "rb").read()
size = len(ref)
cs = int(os.environ["CS"])
if h.get_size() != size:
    print("size %d, expected %d" % (h.get_size(), size)); sys.exit(1)
rng = random.Random(int(os.environ["SEED"]))
cases = []
if size > 0:
    nclus = (size + cs - 1) // cs
    big = 32 << 20
    # Crossing a cluster boundary, starting and ending unaligned.
    for _ in range(12):
        b = rng.randrange(1, nclus) * cs if nclus > 1 else size
        off = max(0, b - rng.randrange(1, min(cs, 5000) + 1))
        cases.append((off, (b - off) + rng.randrange(1, 5000)))
    # Spanning many clusters.
    for _ in range(8):
        off = rng.randrange(0, size) | 1
        cases.append((off, rng.randrange(2 * cs + 1, 40 * cs) + 3))
    # Small reads anywhere.
    for _ in range(20):
        off = rng.randrange(0, size)
        cases.append((off, rng.randrange(1, 3000)))
    # First byte, last byte, the last cluster from an odd offset, nearly all.
    last = (size - 1) // cs * cs
    cases += [(0, 1), (size - 1, 1), (max(0, last - 7), size),
              (1, size - 2 if size > 2 else 1)]
bad = 0
for off, n in cases:
    off = min(off, size - 1)
    n = max(1, min(n, size - off, big))
    got = h.pread(n, off)
    want = ref[off:off + n]
    if got != want:
        i = next(i for i in range(n) if got[i] != want[i])
        print("pread(%d, %d): first difference at %d" % (n, off, off + i))
        bad += 1
if bad:
    sys.exit(1)
print(len(cases))
EOF

# check_image NAME IMAGE [FILTER PARAMETERS...]: serve IMAGE through the
# filter, copy it with nbdcopy (using extents, then --no-extents), read it
# with unaligned preads, and compare everything with qemu-img convert -O
# raw of the same image.  CHECK_READ_ONLY=1 serves it read-only.
check_image ()
{
    local name=$1 img=$2 sock uri size cs nreads
    shift 2
    local ref=$W/ref.raw out=$W/out.raw out2=$W/out2.raw
    nserver=$((nserver + 1))
    sock=$W/s$nserver.sock
    rm -f "$ref" "$out" "$out2"
    qemu-img convert -f qcow2 -O raw "$img" "$ref"
    cs=$(qemu-img info -f qcow2 --output=json "$img" |
             sed -n 's/.*"cluster-size": \([0-9]*\).*/\1/p')
    [ -n "$cs" ] || fail "$name: no cluster size"
    start_server "$sock" ${CHECK_READ_ONLY:+-r} file "$img" "$@"
    uri=$(nbd_uri "$sock")
    size=$(nbdinfo --size "$uri")
    [ "$size" -eq "$(stat -c %s "$ref")" ] ||
        fail "$name: size $size, qemu says $(stat -c %s "$ref")"
    nbdcopy "$uri" "$out" || fail "$name: nbdcopy failed"
    cmp "$ref" "$out" || fail "$name: nbdcopy output differs from qemu-img"
    nbdcopy --no-extents "$uri" "$out2" ||
        fail "$name: nbdcopy --no-extents failed"
    cmp "$ref" "$out2" ||
        fail "$name: nbdcopy --no-extents output differs from qemu-img"
    nreads=$(REF=$ref CS=$cs SEED=1 "${NBDSH[@]}" -u "$uri" -c "$ODD_READS") ||
        fail "$name: unaligned reads differ: $nreads"
    stop_server
    if grep -qi error "$sock.log"; then
        cat "$sock.log" >&2
        fail "$name: the server logged an error"
    fi
    echo "ok: $name (size $size, cluster $cs${*:+, $*}, $nreads unaligned reads)"
}

# ------------------------------------------------- 1. the convert matrix

# Source sizes: virtual sizes are rounded up to 512 by qemu, so only the
# larger cluster sizes can have a partial last cluster (asserted below).
raw_for_cluster ()
{
    case $1 in
        512) echo "$W/src-small.raw" ;;
        2097152) echo "$W/src-large.raw" ;;
        *) echo "$W/src-mid.raw" ;;
    esac
}
make_raw "$W/src-small.raw" $(((1 << 20) + 12345)) 70000
make_raw "$W/src-mid.raw" $(((3 << 20) + 12345)) 300000
make_raw "$W/src-large.raw" $(((14 << 20) + 12345)) $((4 << 20))

for cs in 512 4096 65536 2097152; do
    raw=$(raw_for_cluster $cs)
    for compat in 0.10 1.1; do
        for comp in none zlib zstd; do
            name="convert cluster=$cs compat=$compat compression=$comp"
            if [ $comp = zstd ] && [ $compat = 0.10 ]; then
                # qemu refuses: zstd needs a v3 header.
                echo "skip: $name (qemu has no zstd for compat=0.10)"
                continue
            fi
            img=$W/m-$cs-$compat-$comp.qcow2
            if [ $comp = none ]; then
                qemu-img convert -f raw -O qcow2 \
                    -o compat=$compat,cluster_size=$cs "$raw" "$img"
            else
                qemu-img convert -f raw -O qcow2 -c \
                    -o compat=$compat,cluster_size=$cs,compression_type=$comp \
                    "$raw" "$img"
                expect_compressed "$img" $comp
            fi
            # The holes must have left unallocated clusters.
            qemu-img map -f qcow2 --output=json "$img" |
                grep -q '"present": false' ||
                fail "$name: no unallocated cluster"
            # The reference must be the source (checks our reading of qemu).
            qemu-img convert -f qcow2 -O raw "$img" "$W/conv.raw"
            cmp -n "$(stat -c %s "$raw")" "$raw" "$W/conv.raw" ||
                fail "$name: qemu-img does not give the source back"
            vsize=$(stat -c %s "$W/conv.raw")
            if [ $cs -gt 512 ] && [ $((vsize % cs)) -eq 0 ]; then
                fail "$name: virtual size $vsize is a multiple of the cluster"
            fi
            check_image "$name" "$img"
        done
    done
done

# Uncompressed, without zero detection: zero runs become data clusters.
img=$W/nosparse.qcow2
qemu-img convert -f raw -O qcow2 -S 0 -o cluster_size=4096 \
    "$W/src-mid.raw" "$img"
check_image "convert -S 0 cluster=4096 compat=1.1" "$img"

# ------------------------------------------ 2. qemu-io compressed writes

mid_sector=0
for cs in 512 4096 65536 2097152; do
    for comp in zlib zstd; do
        img=$W/w-$cs-$comp.qcow2
        size=$((6 * cs + 1536))
        last=$((size / cs * cs))
        rm -f "$img"
        qemu-img create -q -f qcow2 \
            -o compat=1.1,cluster_size=$cs,compression_type=$comp "$img" $size
        # Compressed pattern, compressed text, normal random data, random
        # data asked to be compressed (qemu stores it uncompressed), and a
        # partial normal write into an unallocated cluster.
        qemu-io -f qcow2 \
            -c "write -c -P 0x5a 0 $cs" \
            -c "write -c -s $W/text $cs $cs" \
            -c "write -s $W/rnd $((2 * cs)) $cs" \
            -c "write -c -s $W/rnd $((3 * cs)) $cs" \
            -c "write -P 0xa5 $((4 * cs + 100)) 300" \
            "$img" >/dev/null
        # The partial last cluster, compressed, in a fresh open so that it
        # is appended at the end of the file.
        qemu-io -f qcow2 -c "write -c -P 0x3c $last $((size - last))" \
            "$img" >/dev/null
        expect_compressed "$img" $comp
        fsize=$(stat -c %s "$img")
        [ $((fsize % 512)) -ne 0 ] && mid_sector=$((mid_sector + 1))
        check_image "qemu-io write -c cluster=$cs compression=$comp (file size $fsize)" "$img"
    done
done
[ $mid_sector -gt 0 ] ||
    fail "no image written by qemu-io write -c ends mid-sector"
echo "ok: $mid_sector qemu-io images end mid-sector"

# zlib on a v2 image, same idea.
img=$W/w-v2.qcow2
rm -f "$img"
qemu-img create -q -f qcow2 -o compat=0.10,cluster_size=4096 "$img" 100000
qemu-io -f qcow2 -c "write -c -s $W/text 0 4096" -c "write -c -P 7 8192 4096" \
    -c "write -P 8 20000 3000" "$img" >/dev/null
qemu-io -f qcow2 -c "write -c -P 9 98304 $((100352 - 98304))" "$img" >/dev/null
expect_compressed "$img" zlib
check_image "qemu-io write -c cluster=4096 compat=0.10 zlib (file size $(stat -c %s "$img"))" "$img"

# ------------------------- 3. zero clusters, discards, rewritten clusters

# zero_flavours IMG: 1 if qemu-img map shows both plain zero clusters (no
# host offset) and allocated zero clusters (with one).
zero_flavours ()
{
    local map
    map=$(qemu-img map -f qcow2 --output=json "$1")
    grep '"present": true, "zero": true' <<<"$map" | grep -q '"offset"' &&
        grep '"present": true, "zero": true' <<<"$map" | grep -vq '"offset"'
}

for cs in 4096 65536; do
    img=$W/z-$cs.qcow2
    qemu-img convert -f raw -O qcow2 -o compat=1.1,cluster_size=$cs \
        "$W/src-mid.raw" "$img"
    # write -z without -u over data keeps the host cluster ("zero,
    # allocated"); on unallocated clusters and with -u it gives plain zero
    # clusters; a partial write -z writes zeros into a data cluster;
    # discard drops clusters.
    qemu-io -f qcow2 \
        -c "write -z 0 $((4 * cs))" \
        -c "write -z -u $((8 * cs)) $((3 * cs))" \
        -c "write -z $((2 << 20)) $((5 * cs))" \
        -c "write -z $((20 * cs + 1024)) 2048" \
        -c "discard $((30 * cs)) $((2 * cs))" \
        -c "write -P 0x11 $((31 * cs)) 1000" \
        -c "write -z $((1 << 20)) $((cs / 2))" \
        "$img" >/dev/null
    zero_flavours "$img" ||
        fail "z-$cs: expected both plain and allocated zero clusters"
    check_image "zero clusters (write -z, -z -u, discard) cluster=$cs compat=1.1" "$img"
done

# The same operations on a v2 image (no zero flag: qemu writes zeros or
# deallocates).
img=$W/z-v2.qcow2
qemu-img convert -f raw -O qcow2 -o compat=0.10,cluster_size=65536 \
    "$W/src-mid.raw" "$img"
qemu-io -f qcow2 -c "write -z 0 262144" -c "write -z -u 524288 196608" \
    -c "discard 1966080 131072" -c "write -z 1311744 2048" "$img" >/dev/null
check_image "write -z and discard cluster=65536 compat=0.10" "$img"

# Rewriting compressed clusters: partial overwrite (qemu decompresses into
# a normal cluster), write -z and discard of compressed clusters, leaving
# freed ranges and shared host clusters behind.
for comp in zlib zstd; do
    for cs in 4096 65536; do
        img=$W/r-$cs-$comp.qcow2
        qemu-img convert -f raw -O qcow2 -c \
            -o compat=1.1,cluster_size=$cs,compression_type=$comp \
            "$W/src-mid.raw" "$img"
        qemu-io -f qcow2 \
            -c "write -P 0x77 $((cs + 33)) 100" \
            -c "write -z $((3 * cs)) $((2 * cs))" \
            -c "write -z -u $((6 * cs)) $cs" \
            -c "discard $((8 * cs)) $((3 * cs))" \
            -c "write -P 0x78 $((9 * cs)) 512" \
            -c "write -s $W/text $((12 * cs - 700)) 1400" \
            "$img" >/dev/null
        expect_compressed "$img" $comp
        check_image "rewritten compressed clusters cluster=$cs compression=$comp" "$img"
    done
done

# ----------------------------------------------------- 4. virtual size 0

for spec in 0.10,zlib 1.1,zlib 1.1,zstd; do
    compat=${spec%,*}
    comp=${spec#*,}
    img=$W/empty-$compat-$comp.qcow2
    rm -f "$img"
    qemu-img create -q -f qcow2 -o "compat=$compat,compression_type=$comp" \
        "$img" 0
    check_image "virtual size 0 compat=$compat compression=$comp" "$img"
    [ -f "$W/out.raw" ] && [ ! -s "$W/out.raw" ] ||
        fail "size 0: nbdcopy output is not an empty file"
done

# ---------------------------------------------------- 5. filter parameters

check_image "convert cluster=65536 zlib, qcow2-threads=1" \
    "$W/m-65536-1.1-zlib.qcow2" qcow2-threads=1
check_image "convert cluster=512 zstd, no caches" \
    "$W/m-512-1.1-zstd.qcow2" qcow2-cluster-cache-size=0 qcow2-l2-cache-size=0
check_image "convert cluster=2M zstd, qcow2-request-size=4096" \
    "$W/m-2097152-1.1-zstd.qcow2" qcow2-request-size=4096
check_image "rewritten cluster=4096 zlib, all three" \
    "$W/r-4096-zlib.qcow2" qcow2-threads=1 qcow2-request-size=4096 \
    qcow2-cluster-cache-size=0 qcow2-l2-cache-size=0
check_image "qemu-io write -c cluster=2M zlib, 4 threads, tiny caches" \
    "$W/w-2097152-zlib.qcow2" qcow2-threads=4 qcow2-cluster-cache-size=1 \
    qcow2-l2-cache-size=1

# ---------------------------------------------------- 6. extended L2 entries
# Subclusters (extended_l2=on): each cluster's bitmap has an allocated
# half and a zero half.  A converted image (whole clusters), then writes
# and zeroes of parts of clusters over it and over unallocated ones, at
# two cluster sizes; read by the filter (as above) and by the plugin.
if section extended-l2; then
    for cs in 16384 65536; do
        img=$W/x-$cs.qcow2
        make_raw "$W/x.raw" $((3 << 20)) $((cs * 3))
        qemu-img convert -O qcow2 -o extended_l2=on,cluster_size=$cs "$W/x.raw" "$img"
        qemu-io -f qcow2 \
            -c "write -P 0x71 $((cs * 2 + 1024)) 1024" \
            -c "write -z $((cs * 5 + cs / 4)) $((cs / 2))" \
            -c "write -P 0x72 $((3 << 20)) 0" \
            -c "write -P 0x73 $(( (2 << 20) + cs / 32 )) $((cs / 8))" \
            -c "write -z $(( (2 << 20) + cs * 3 )) $((cs / 32))" \
            -c "discard $((cs * 9 + cs / 2)) $((cs / 2))" \
            "$img" > /dev/null
        CHECK_READ_ONLY=1 check_image "extended L2 cluster=$cs" "$img"
        qemu-img convert -f qcow2 -O raw "$img" "$W/ref.raw"
        rm -f "$W/out.raw"
        NBDKIT_TIMEOUT=120 run_nbdkit -U - -r "$PLUGIN" "$img" \
            --run "nbdcopy \"\$uri\" $W/out.raw" || fail "extended L2 cluster=$cs: the plugin did not serve it"
        cmp "$W/ref.raw" "$W/out.raw" || fail "extended L2 cluster=$cs: the plugin reads other data than qemu"
        echo "ok: extended L2 cluster=$cs through the plugin"
    done
fi

echo "test-read-matrix: all cases passed"
