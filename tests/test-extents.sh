#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Compare the extents (base:allocation) the filter reports with those of
# qemu-nbd serving the same image, for images with data, holes, zero
# clusters and compressed clusters (64k, 4k, 512 and 2M clusters;
# uncompressed, zlib, zstd; v3 and v2), a backing chain of three and a
# sparse disk of 256 TiB.
#
# The filter's semantics: unallocated and zero clusters are "hole,zero"
# (type 3); normal and compressed clusters are "data" (type 0).
#
# qemu-nbd agrees with that, with one legitimate difference: when qemu's
# qcow2 driver believes the image was created with preallocation=metadata
# (a heuristic comparing the referenced clusters with the space the image
# file really occupies), it also asks the host file system whether each
# data cluster is sparse in the image file, and reports such clusters as
# "zero" (type 2, data+zero).  The filter never looks at host sparseness,
# and the ZERO bit is only a hint in NBD, so both answers are right.  We
# therefore compare qemu's type 2 as type 0 and count such ranges; the
# preallocation=metadata case below shows the difference on purpose.  The
# filter itself must only ever report types 0 and 3.
#
# Every map must cover the whole disk with contiguous ranges.  Then seeded
# unaligned NBD_CMD_BLOCK_STATUS requests (with and without REQ_ONE) are
# checked against the map.

source "${top_srcdir:-.}/tests/functions.sh"

requires qemu-io qemu-nbd nbdinfo nbdsh awk diff dd truncate

requires_nbdsh

W=$TMPDIR_TEST
nserver=0

# ------------------------------------------------------------- sources

head -c $((10 << 20)) /dev/urandom > "$W/rnd"
awk 'BEGIN {
    for (i = 0; i < 120000; i++)
        printf "%06d extents of a qcow2 image, cluster %d, line %d\n",
               i, i % 977, i * 31;
}' > "$W/text"

put ()
{
    dd if="$3" of="$1" bs=64K iflag=skip_bytes,count_bytes,fullblock \
       skip="$4" count="$5" oflag=seek_bytes seek="$2" conv=notrunc \
       status=none
}

# make_raw FILE SIZE HOLE: random bytes, text, written zeros, a hole of
# HOLE bytes, alternating small pieces and gaps, random bytes at the end.
make_raw ()
{
    local f=$1 size=$2 hole=$3 off len i
    rm -f "$f"
    truncate -s "$size" "$f"
    put "$f" 0 "$W/rnd" 0 $((size / 7 + 3))
    off=$((size / 7 + 3))
    put "$f" "$off" "$W/text" 0 $((size / 7 + 999))
    off=$((off + size / 7 + 999))
    put "$f" "$off" /dev/zero 0 $((size / 9))
    off=$((off + size / 9 + hole))
    i=0
    while [ $off -lt $((size * 9 / 10)) ]; do
        len=$((200 + (i * 6151) % 20000))
        if [ $((i % 2)) -eq 0 ]; then
            put "$f" "$off" "$W/rnd" $((i * 333)) "$len"
        else
            put "$f" "$off" "$W/text" $((i * 333)) "$len"
        fi
        off=$((off + len + (i * 48611) % 70000))
        i=$((i + 1))
    done
    put "$f" $((size - 2000)) "$W/rnd" 5 2000
}

# ------------------------------------------------------------- helpers

# normalise SIZE: read `nbdinfo --map` output, merge adjacent ranges of the
# same type, print "offset length type".  Fails unless the ranges are
# contiguous from 0 and cover exactly SIZE bytes.
normalise ()
{
    awk -v size="$1" '
        NF < 3 { print "bad line: " $0 > "/dev/stderr"; bad = 1; next }
        {
            if ($1 != end) {
                print "not contiguous at " $1 " (expected " end ")" > "/dev/stderr"
                bad = 1
            }
            end = $1 + $2
            if (n > 0 && $3 == t) { len += $2; next }
            if (n > 0) print off, len, t
            off = $1; len = $2; t = $3; n++
        }
        END {
            if (n > 0) print off, len, t
            if (end != size) {
                print "map covers " end " bytes, disk has " size > "/dev/stderr"
                bad = 1
            }
            exit bad
        }'
}

virtual_size ()
{
    qemu-img info -f qcow2 --output=json "$1" |
        sed -n 's/.*"virtual-size": \([0-9]*\).*/\1/p'
}

# start_qemu_nbd SOCKET IMAGE: qemu-nbd serving IMAGE read-only; --fork
# returns once it accepts connections.  Its pid is in $QEMU_NBD_PID.
start_qemu_nbd ()
{
    rm -f "$1.pid"
    qemu-nbd -r -t -f qcow2 --fork --pid-file="$1.pid" -k "$1" "$2" \
        2>"$1.log" || { cat "$1.log" >&2; fail "qemu-nbd did not start"; }
    QEMU_NBD_PID=$(cat "$1.pid")
    _pids+=("$QEMU_NBD_PID")    # killed at exit by functions.sh too
}

# Each case uses its own socket, so there is no need to wait the second
# or so qemu-nbd takes to exit: the exit trap waits for it.
stop_qemu_nbd ()
{
    kill "$QEMU_NBD_PID" 2>/dev/null || true
}

# Python run by nbdsh --base-allocation: seeded unaligned block status
# requests, each answer checked against the merged map in $MAP.
read -r -d '' BLOCK_STATUS <<'EOF' || true
import os, random, sys, nbd
ref = [tuple(int(x) for x in l.split()) for l in open(os.environ["MAP"])]
size = h.get_size()
if not h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION):
    print("no base:allocation"); sys.exit(1)
def types_over(a, b):
    return {t for (o, n, t) in ref if o < b and a < o + n}
rng = random.Random(1)
q = []
if size > 0:
    q.append((0, size))
    for _ in range(15):
        o, n, t = rng.choice(ref)
        q.append((max(0, o + n - rng.randrange(1, 3000)), rng.randrange(1, 200000)))
    for _ in range(25):
        off = rng.randrange(0, size)
        q.append((off, rng.choice([1, 511, 4097, 65535, 1000000, size])))
errors = []
for off, cnt in q:
    cnt = max(1, min(cnt, size - off, 1 << 30))
    for flags in (0, nbd.CMD_FLAG_REQ_ONE):
        got = []
        def cb(ctx, offset, entries, err):
            if ctx == nbd.CONTEXT_BASE_ALLOCATION:
                got.extend(entries)
            return 0
        h.block_status(cnt, off, cb, flags)
        pairs = list(zip(got[0::2], got[1::2]))
        what = "block_status(%d, %d, flags=%d)" % (cnt, off, flags)
        if not pairs:
            errors.append(what + ": no extent"); continue
        if flags and (len(pairs) != 1 or pairs[0][0] > cnt):
            errors.append(what + ": REQ_ONE answered %r" % pairs); continue
        pos = off
        for n, fl in pairs:
            if n == 0 or pos + n > size:
                errors.append(what + ": bad extent length %d at %d" % (n, pos))
                break
            ts = types_over(pos, pos + n)
            if ts != {fl}:
                errors.append(what + ": [%d, +%d) type %d, map says %r"
                              % (pos, n, fl, sorted(ts)))
                break
            pos += n
for e in errors[:10]:
    print(e)
if errors:
    sys.exit(1)
print(2 * len(q))
EOF

# check_map NAME IMAGE [FILTER PARAMETERS...]: compare the filter's map
# with qemu-nbd's, then check block status requests against it.
check_map ()
{
    local name=$1 img=$2 size sock qsock uri ndata nzero nq2 nbs
    shift 2
    nserver=$((nserver + 1))
    sock=$W/s$nserver.sock
    qsock=$W/q$nserver.sock
    size=$(virtual_size "$img")
    [ -n "$size" ] || fail "$name: no virtual size"

    start_server "$sock" file "$img" "$@"
    uri=$(nbd_uri "$sock")
    [ "$(nbdinfo --size "$uri")" -eq "$size" ] || fail "$name: wrong size"
    nbdinfo --map "$uri" > "$W/ours.raw" || fail "$name: nbdinfo --map failed"
    normalise "$size" < "$W/ours.raw" > "$W/ours.map" ||
        fail "$name: the filter's map does not cover the disk"
    if awk '$3 != 0 && $3 != 3 { exit 1 }' "$W/ours.map"; then :; else
        cat "$W/ours.map" >&2
        fail "$name: the filter reported a type other than 0 and 3"
    fi

    nbs=$(MAP=$W/ours.map "${NBDSH[@]}" --base-allocation -u "$uri" \
              -c "$BLOCK_STATUS") ||
        fail "$name: block status: $nbs"
    # Our writable server locks the image until it exits, as qemu-nbd
    # would: qemu-nbd serves it after.
    stop_server
    if grep -qi error "$sock.log"; then
        cat "$sock.log" >&2
        fail "$name: the server logged an error"
    fi

    start_qemu_nbd "$qsock" "$img"
    nbdinfo --map "$(nbd_uri "$qsock")" > "$W/qemu.raw" ||
        fail "$name: nbdinfo --map on qemu-nbd failed"
    stop_qemu_nbd
    normalise "$size" < "$W/qemu.raw" > "$W/qemu.map" ||
        fail "$name: qemu-nbd's map does not cover the disk"
    nq2=$(awk '$3 == 2' "$W/qemu.map" | wc -l)
    # See the top of the file: qemu's data+zero is compared as data.
    awk '{ print $1, $2, ($3 == 2 ? 0 : $3) }' "$W/qemu.map" |
        normalise "$size" > "$W/qemu.cmp"
    if ! diff -u "$W/qemu.cmp" "$W/ours.map" >&2; then
        fail "$name: maps differ (- qemu-nbd, + filter)"
    fi

    ndata=$(awk '$3 == 0' "$W/ours.map" | wc -l)
    nzero=$(awk '$3 == 3' "$W/ours.map" | wc -l)
    if [ "$size" -gt 0 ] && { [ "$ndata" -eq 0 ] || [ "$nzero" -eq 0 ]; }; then
        fail "$name: expected both data and zero ranges ($ndata, $nzero)"
    fi
    echo "ok: $name: size $size, $ndata data + $nzero hole,zero ranges" \
         "match qemu-nbd ($nq2 data,zero from qemu), $nbs block status checks"
}

# --------------------------------------------------------------- images

make_raw "$W/small.raw" $(((1 << 20) + 4321)) 60000
make_raw "$W/mid.raw" $(((3 << 20) + 12345)) 400000
make_raw "$W/large.raw" $(((9 << 20) + 54321)) $((4 << 20))

# 64k clusters, no compression, v3: data, partial clusters, written zeros,
# compressed writes, zero clusters (allocated and plain), discards, and a
# partial last cluster.
img=$W/a.qcow2
qemu-img create -q -f qcow2 -o compat=1.1,cluster_size=65536 "$img" \
    $(((4 << 20) + 1536))
qemu-io -f qcow2 \
    -c "write -P 0x11 0 192k" \
    -c "write -P 0x12 300000 1000" \
    -c "write -P 0 400k 128k" \
    -c "write -c -P 0x13 1M 64k" \
    -c "write -c -s $W/text 1088k 64k" \
    -c "write -c -P 0x16 1152k 64k" \
    -c "write -P 0x14 1536k 256k" \
    -c "write -z 1600k 64k" \
    -c "write -z -u 1664k 64k" \
    -c "discard 1728k 64k" \
    -c "write -z 2M 128k" \
    -c "write -z 1M 64k" \
    -c "discard 1152k 64k" \
    -c "write -z 2600000 1000" \
    -c "write -P 0x15 4M 1536" \
    "$img" >/dev/null
check_map "64k uncompressed+write -c, write -z/-z -u/discard, compat=1.1" "$img"

# 4k clusters, zlib: compressed convert, then zero clusters, a discard and a
# partial overwrite of compressed clusters.
img=$W/b.qcow2
qemu-img convert -f raw -O qcow2 -c \
    -o compat=1.1,cluster_size=4096,compression_type=zlib "$W/mid.raw" "$img"
qemu-io -f qcow2 \
    -c "write -z 8192 16384" \
    -c "write -z -u 65536 4096" \
    -c "discard 102400 8192" \
    -c "write -P 0x21 204900 100" \
    -c "write -z 3000000 12288" \
    "$img" >/dev/null
check_map "4k zlib, write -z and discard on compressed clusters" "$img"

# 512-byte clusters, zstd.
img=$W/c.qcow2
qemu-img convert -f raw -O qcow2 -c \
    -o compat=1.1,cluster_size=512,compression_type=zstd "$W/small.raw" "$img"
qemu-io -f qcow2 \
    -c "write -z 1024 2048" \
    -c "write -z -u 51200 512" \
    -c "discard 80384 1536" \
    -c "write -P 0x31 100001 3000" \
    "$img" >/dev/null
check_map "512 zstd, write -z and discard" "$img"

# 2M clusters, zstd, with a fully unallocated cluster and a zero cluster;
# served without L2 cache.
img=$W/d.qcow2
qemu-img convert -f raw -O qcow2 -c \
    -o compat=1.1,cluster_size=2M,compression_type=zstd "$W/large.raw" "$img"
qemu-io -f qcow2 -c "write -z 0 2M" "$img" >/dev/null
check_map "2M zstd, write -z, qcow2-l2-cache-size=0" "$img" qcow2-l2-cache-size=0

# 64k clusters, uncompressed convert (v3): data and unallocated only.
img=$W/e.qcow2
qemu-img convert -f raw -O qcow2 -o compat=1.1,cluster_size=65536 \
    "$W/mid.raw" "$img"
check_map "64k uncompressed convert, compat=1.1" "$img"

# v2 (compat=0.10), 64k, zlib: no zero flag, so write -z and discard give
# unallocated clusters (or written zeros).
img=$W/f.qcow2
qemu-img convert -f raw -O qcow2 -c \
    -o compat=0.10,cluster_size=65536,compression_type=zlib "$W/mid.raw" "$img"
qemu-io -f qcow2 -c "discard 0 128k" -c "write -z 256k 64k" "$img" >/dev/null
check_map "64k zlib compat=0.10, discard and write -z" "$img"

# 4k zstd written by qemu-io write -c: the file ends mid-sector.
img=$W/g.qcow2
qemu-img create -q -f qcow2 -o compat=1.1,cluster_size=4096,compression_type=zstd \
    "$img" 1001472
qemu-io -f qcow2 -c "write -c -P 0x41 0 4096" -c "write -c -s $W/text 40960 8192" \
    -c "write -z 12288 4096" "$img" >/dev/null
qemu-io -f qcow2 -c "write -c -P 0x42 999424 2048" "$img" >/dev/null
[ $(( $(stat -c %s "$img") % 512 )) -ne 0 ] ||
    fail "g.qcow2 was expected to end mid-sector"
check_map "4k zstd written by qemu-io write -c (file ends mid-sector)" "$img"

# preallocation=metadata: every cluster is allocated but most are sparse
# in the image file.  The filter says data, qemu says data+zero (see top).
img=$W/h.qcow2
qemu-img create -q -f qcow2 -o compat=1.1,cluster_size=65536,preallocation=metadata \
    "$img" $(((2 << 20) + 512))
qemu-io -f qcow2 -c "write -P 0x51 64k 64k" -c "write -z 512k 128k" \
    "$img" >/dev/null
check_map "64k preallocation=metadata (qemu: data,zero from host sparseness)" "$img"

# A chain of three: a raw file with holes under a qcow2 image (data, zero
# clusters, compressed clusters, discards) under a larger qcow2 overlay.
# What the overlay does not allocate reports what the chain below reports
# for it, hole and zero where no layer has data (past the end of the
# shorter images too), as qemu-nbd reports the chain.
truncate -s 6M "$W/chain-base.raw"
put "$W/chain-base.raw" 196608 "$W/rnd" 0 327680
put "$W/chain-base.raw" 4096000 "$W/text" 0 12288
put "$W/chain-base.raw" 5242880 "$W/rnd" 7 100000
qemu-img create -q -f qcow2 -o cluster_size=65536 -b chain-base.raw -F raw \
    "$W/chain-mid.qcow2" 8M
qemu-io -f qcow2 \
    -c "write -P 0x61 1M 256k" \
    -c "write -z 3M 128k" \
    -c "write -c -s $W/text 4M 64k" \
    -c "write -P 0x62 5M 100k" \
    -c "discard 1216k 64k" \
    "$W/chain-mid.qcow2" >/dev/null
qemu-img create -q -f qcow2 -o cluster_size=65536 -b chain-mid.qcow2 \
    -F qcow2 "$W/chain-top.qcow2" 12M
qemu-io -f qcow2 \
    -c "write -P 0x63 0 64k" \
    -c "write -z 1M 64k" \
    -c "write -P 0x64 7M 2M" \
    -c "write -z 5M 64k" \
    "$W/chain-top.qcow2" >/dev/null
check_map "a chain of three: raw with holes, qcow2, qcow2 overlay" \
    "$W/chain-top.qcow2"

# 256 TiB with a few hundred clusters written far apart: the map costs
# what is allocated, not the size of the disk (nothing times it here;
# bench/bench-map.sh does).
qemu-img create -q -f qcow2 "$W/huge.qcow2" 256T
args=()
for i in $(seq 0 199); do
    args+=(-c "write -P $((i % 200 + 1)) $((i * 1310 * (1 << 30) + i * 65536)) 64k")
done
qemu-io -f qcow2 "${args[@]}" "$W/huge.qcow2" >/dev/null
check_map "256 TiB, 200 clusters written" "$W/huge.qcow2"

# Virtual size 0: empty maps.
img=$W/empty.qcow2
qemu-img create -q -f qcow2 -o compression_type=zstd "$img" 0
check_map "virtual size 0" "$img"

echo "test-extents: all cases passed"
