#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Corrupt images: every field the filter validates, broken one at a time in
# a copy of a good image made by qemu.
#
# Header-level damage must stop nbdkit at start-up with an error naming
# the field (the filter right over the file plugin with file=, before it
# serves anyone or runs --run), and where the filter learns the file
# only when a client names it (dir=) make every connection fail at open
# with that error, while the server stays up.  Damage to one
# cluster (L1/L2 entries, compressed data) must fail reads of that cluster
# with EIO and a message saying why, while the rest of the disk still
# reads correctly on the same connection.  In every case the image file
# must be left unchanged and nothing may crash.
source "${top_srcdir:-.}/tests/functions.sh"

requires nbdinfo nbdcopy qemu-io python3 cksum

CORRUPT="${top_srcdir:-.}/tests/corrupt-image.py"
[ -f "$CORRUPT" ] || fail "missing $CORRUPT"

requires_nbd_python
NBD_PY=$PYTHON

T=$TMPDIR_TEST
MiB=$((1024 * 1024))

# ------------------------------------------------------------ the client
# check.py URI RAW BAD GOOD: BAD and GOOD are "off:len,off:len" lists (or
# "-").  Every BAD read must fail with EIO and every GOOD read must match
# RAW; both are done twice, interleaved, on one connection.
cat > "$T/check.py" <<'EOF'
import errno
import sys

import nbd

uri, raw, bad, good = sys.argv[1:5]


def ranges(spec):
    if spec == "-":
        return []
    out = []
    for item in spec.split(","):
        off, n = item.split(":")
        out.append((int(off, 0), int(n, 0)))
    return out


def fail(msg):
    print("check.py: " + msg, file=sys.stderr)
    sys.exit(1)


with open(raw, "rb") as f:
    data = f.read()
h = nbd.NBD()
h.connect_uri(uri)
if h.get_size() != len(data):
    fail("export size %d, expected %d" % (h.get_size(), len(data)))
for _ in range(2):
    for off, n in ranges(bad):
        try:
            h.pread(n, off)
        except nbd.Error as e:
            if e.errnum is not None and e.errnum != errno.EIO:
                fail("read of %d bytes at 0x%x failed with %s, not EIO"
                     % (n, off, e.errno))
            continue
        fail("read of %d bytes at 0x%x of a corrupt cluster succeeded"
             % (n, off))
    for off, n in ranges(good):
        try:
            got = h.pread(n, off)
        except nbd.Error as e:
            fail("read of %d bytes at 0x%x of good data failed: %s"
                 % (n, off, e))
        if got != data[off:off + n]:
            fail("read of %d bytes at 0x%x returned wrong data" % (n, off))
h.shutdown()
EOF

# ------------------------------------------------------------ helpers
# copy_image BASE NAME: a fresh copy of $T/BASE.qcow2 as $T/NAME.qcow2.
copy_image ()
{
    cp "$T/$1.qcow2" "$T/$2.qcow2"
    echo "$T/$2.qcow2"
}

# patch IMAGE ACTION ARGS...: corrupt-image.py, quietly unless it fails.
patch ()
{
    python3 "$CORRUPT" "$@" >"$T/patch.out" 2>&1 || {
        cat "$T/patch.out" >&2
        fail "corrupt-image.py $* failed"
    }
}

# The log must not show that anything crashed or tripped a check.
check_no_crash ()
{
    if grep -E 'Assertion|AddressSanitizer|runtime error|Segmentation|LeakSanitizer|core dumped' "$1" >&2
    then
        fail "$2: the server log shows a crash (see above)"
    fi
}

# count_in_log PATTERN LOG: lines of LOG matching the extended regex.
count_in_log ()
{
    grep -c -E -- "$1" "$2" || true
}

# expect_open_failure NAME IMAGE PATTERN: with file=, nbdkit refuses to
# start with an error matching PATTERN (START_ERROR instead, if set);
# with dir=, connections to the image fail at open with that error, the
# server staying up.
expect_open_failure ()
{
    local name=$1 img=$2 pattern=$3
    local sock="$T/$name.sock" uri sum n

    sum=$(cksum < "$img")
    rm -f "$T/ran"
    if run_nbdkit -U - --filter="$FILTER" file "$img" --run "touch $T/ran" \
        2> "$sock.start"; then
        fail "$name: nbdkit started"
    fi
    [ ! -e "$T/ran" ] || fail "$name: nbdkit served the image (--run ran)"
    n=$(count_in_log "qcow2zstd: .*${START_ERROR:-${OPEN_ERROR_PREFIX-invalid or unsupported qcow2 image: }.*$pattern}" "$sock.start")
    if [ "$n" -lt 1 ]; then
        cat "$sock.start" >&2
        fail "$name: no error at start-up matching '${START_ERROR:-$pattern}'"
    fi
    check_no_crash "$sock.start" "$name"

    start_server "$sock" file dir="$(dirname "$img")" || fail "$name: nbdkit did not start"
    uri="nbd+unix:///$(basename "$img")?socket=$sock"

    if nbdinfo "$uri" >"$sock.client1" 2>&1; then
        fail "$name: nbdinfo succeeded on a corrupt image"
    fi
    # A clean refusal, not a dropped connection.
    grep -q 'server replied with error' "$sock.client1" || {
        cat "$sock.client1" >&2
        fail "$name: the server did not refuse the connection cleanly"
    }
    kill -0 "$SERVER_PID" 2>/dev/null ||
        fail "$name: the server died after the first connection"

    if nbdcopy "$uri" null: >"$sock.client2" 2>&1; then
        fail "$name: nbdcopy succeeded on a corrupt image"
    fi
    kill -0 "$SERVER_PID" 2>/dev/null ||
        fail "$name: the server died after the second connection"

    n=$(count_in_log "qcow2zstd: ${OPEN_ERROR_PREFIX-invalid or unsupported qcow2 image: }.*$pattern" "$sock.log")
    if [ "$n" -lt 2 ]; then
        cat "$sock.log" >&2
        fail "$name: expected an error matching '$pattern' for each of two connections, found $n"
    fi
    check_no_crash "$sock.log" "$name"
    stop_server
    [ "$(cksum < "$img")" = "$sum" ] || fail "$name: the image was modified"
    echo "ok: $name (refused at start-up, and at open with dir=: $pattern)"
}

# expect_read_failure NAME IMAGE RAW PATTERN BAD GOOD: the connection
# opens; reads of BAD ranges fail with EIO and log PATTERN, reads of GOOD
# ranges match RAW.  Two connections, one after the other.
expect_read_failure ()
{
    local name=$1 img=$2 raw=$3 pattern=$4 bad=$5 good=$6
    local sock="$T/$name.sock" uri sum n i

    sum=$(cksum < "$img")
    start_server "$sock" file "$img" || fail "$name: nbdkit did not start"
    uri=$(nbd_uri "$sock")
    for i in 1 2; do
        "$NBD_PY" "$T/check.py" "$uri" "$raw" "$bad" "$good" || {
            cat "$sock.log" >&2
            fail "$name: connection $i"
        }
        kill -0 "$SERVER_PID" 2>/dev/null ||
            fail "$name: the server died during connection $i"
    done
    if [ "$bad" != - ]; then
        n=$(count_in_log "qcow2zstd: .*$pattern" "$sock.log")
        if [ "$n" -lt 2 ]; then
            cat "$sock.log" >&2
            fail "$name: expected errors matching '$pattern', found $n"
        fi
    fi
    check_no_crash "$sock.log" "$name"
    stop_server
    [ "$(cksum < "$img")" = "$sum" ] || fail "$name: the image was modified"
    if [ "$bad" != - ]; then
        echo "ok: $name (read fails: $pattern)"
    else
        echo "ok: $name (reads correctly)"
    fi
}

# ------------------------------------------------------------ images
# Data with different compressibility: a pattern cluster, a half random
# cluster (compresses to about 32 KiB), a random cluster (stays normal
# even in compressed images), zero clusters in between, a partial cluster
# and the last cluster of the disk.
python3 - "$T" <<'EOF'
import random
import sys
rng = random.Random(20240611)
d = sys.argv[1]
with open(d + "/half", "wb") as f:
    f.write(bytes(rng.randrange(256) for _ in range(32768)))
with open(d + "/full", "wb") as f:
    f.write(bytes(rng.randrange(256) for _ in range(65536)))
EOF
write_data ()
{
    qemu-io -f qcow2 \
        -c 'write -q -P 0x11 0 64k' \
        -c "write -q -s $T/half 64k 32k" \
        -c "write -q -s $T/full 192k 64k" \
        -c 'write -q -P 0x22 1M 128k' \
        -c "write -q -s $T/half 2M 32k" \
        -c 'write -q -P 0x33 2080k 4k' \
        -c 'write -q -P 0x44 4032k 64k' \
        "$1" >/dev/null
}

qemu-img create -q -f qcow2 -o cluster_size=65536 "$T/norm.qcow2" 4M
write_data "$T/norm.qcow2"
qemu-img create -q -f qcow2 -o compat=0.10,cluster_size=65536 "$T/v2.qcow2" 4M
write_data "$T/v2.qcow2"
for c in zlib zstd; do
    qemu-img convert -c -O qcow2 -o compression_type=$c \
        "$T/norm.qcow2" "$T/$c.qcow2"
done
# 4 KiB clusters: one L2 table covers 2 MiB, so an 8 MiB disk has four
# L1 entries and one can be damaged while the others still work.
qemu-img create -q -f qcow2 -o cluster_size=4096 "$T/small.qcow2" 8M
qemu-io -f qcow2 -c 'write -q -P 0x55 0 64k' -c "write -q -s $T/half 2M 32k" \
    -c 'write -q -P 0x66 4M 8k' -c 'write -q -P 0x77 8188k 4k' \
    "$T/small.qcow2" >/dev/null
qemu-img convert -O raw "$T/norm.qcow2" "$T/norm.raw"
qemu-img convert -O raw "$T/small.qcow2" "$T/small.raw"
RAW=$T/norm.raw

# Make sure of the layout the cases rely on: the L2 entry's flag bits.
l2_flags ()
{
    local e
    e=$(python3 "$CORRUPT" "$1" show "$2" | sed -n 's/.* L2 0x\([0-9a-f]*\)$/\1/p')
    [ -n "$e" ] || fail "setup: no L2 entry for $2 in $1"
    echo $(( (0x$e >> 62) & 3 ))
}
for c in zlib zstd; do
    [ $(( $(l2_flags "$T/$c.qcow2" 0x10000) & 1 )) = 1 ] ||
        fail "setup: guest cluster 0x10000 of $c.qcow2 is not compressed"
done
[ "$(l2_flags "$T/norm.qcow2" 0)" = 2 ] ||
    fail "setup: guest cluster 0 of norm.qcow2 is not a normal cluster"
[ "$(l2_flags "$T/v2.qcow2" 0)" = 2 ] ||
    fail "setup: guest cluster 0 of v2.qcow2 is not a normal cluster"

# Ranges for the cluster-level cases (disk of 4 MiB, 64 KiB clusters).
# Bad: the whole cluster, part of it, a read straddling it, the whole disk.
BAD_C0="0:0x10000,0x100:0x200,0xf000:0x2000,0:0x400000"
GOOD_C0="0x10000:0x3f0000,0x10000:0x100,0x100000:0x1000,0x200000:0x10000,0x3f0001:0xffff"
BAD_C1="0x10000:0x10000,0x10100:0x200,0xf000:0x2000,0:0x400000"
GOOD_C1="0:0x10000,0x20000:0x3e0000,0x100064:5000,0x207000:0x2000,0x3f0001:0xffff,0x30000:0x10000,0x0:0x100"
# small.qcow2: the first L1 entry (guest 0 .. 2 MiB) is damaged.
BAD_L1="0:0x1000,0x1ff000:0x2000,0:0x800000,0x10:0x20"
GOOD_L1="0x200000:0x600000,0x400000:0x1000,0x7ff000:0x1000,0x200100:0x10"

# ------------------------------------------------------------ controls
# The undamaged images read correctly with the same client, so that the
# failures below come from the damage.
for base in norm zlib zstd v2; do
    expect_read_failure "good-$base" "$T/$base.qcow2" "$RAW" '' - "0:0x400000,$GOOD_C1"
done
expect_read_failure good-small "$T/small.qcow2" "$T/small.raw" '' - "0:0x800000,$GOOD_L1"

# ------------------------------------------------------------ header
img=$(copy_image norm bad-magic); patch "$img" be32 0 0x514649fc
expect_open_failure bad-magic "$img" 'magic'

for v in 1 4; do
    img=$(copy_image norm version-$v); patch "$img" be32 4 $v
    expect_open_failure version-$v "$img" "version: .*version $v"
done
img=$(copy_image v2 v2-version-0); patch "$img" be32 4 0
expect_open_failure v2-version-0 "$img" 'version: .*version 0'

for b in 8 22 64; do
    img=$(copy_image norm cluster-bits-$b); patch "$img" be32 20 $b
    expect_open_failure cluster-bits-$b "$img" "cluster_bits: $b "
done

# L1 table beyond the end of the file (cluster aligned, so that only its
# position is wrong).
img=$(copy_image norm l1-offset-past-eof)
size=$(stat -c %s "$img")
patch "$img" be64 40 $(( (size + 2 * MiB) & ~0xffff ))
expect_open_failure l1-offset-past-eof "$img" 'l1_table_offset, l1_size: .*outside the file'

# L1 table starting inside the file but running past its end.
img=$(copy_image norm l1-size-past-eof); patch "$img" be32 36 1048576
expect_open_failure l1-size-past-eof "$img" 'L1 table .*1048576 entries.* outside the file'

img=$(copy_image norm l1-offset-unaligned); patch "$img" be64 40 0x40200
expect_open_failure l1-offset-unaligned "$img" 'l1_table_offset: .*not cluster aligned'

img=$(copy_image norm l1-offset-zero); patch "$img" be64 40 0
expect_open_failure l1-offset-zero "$img" 'l1_table_offset: .*overlaps the header'

img=$(copy_image norm l1-size-over-limit); patch "$img" be32 36 0x500000
expect_open_failure l1-size-over-limit "$img" 'l1_size: .*32 MiB'

# L1 table too small for the virtual size, both ways.
img=$(copy_image norm size-too-big-for-l1); patch "$img" be64 24 $((1024 * 1024 * MiB))
expect_open_failure size-too-big-for-l1 "$img" 'l1_size: 1 entries are too few'
img=$(copy_image norm l1-size-zero); patch "$img" be32 36 0
expect_open_failure l1-size-zero "$img" 'l1_size: 0 entries are too few'
img=$(copy_image small l1-size-short); patch "$img" be32 36 3
expect_open_failure l1-size-short "$img" 'l1_size: 3 entries are too few'

img=$(copy_image norm size-huge); patch "$img" be64 24 0x7fffffffffffffff
expect_open_failure size-huge "$img" 'size: virtual size .*too large'

img=$(copy_image norm incompat-bit-10); patch "$img" incompat-set 10
expect_open_failure incompat-bit-10 "$img" 'incompatible_features: unknown .*0x400'
img=$(copy_image norm incompat-bit-63); patch "$img" incompat-set 63
expect_open_failure incompat-bit-63 "$img" 'incompatible_features: unknown .*0x8000000000000000'

img=$(copy_image norm crypt-aes); patch "$img" be32 32 1
expect_open_failure crypt-aes "$img" 'crypt_method'
img=$(copy_image zstd crypt-luks); patch "$img" be32 32 2
expect_open_failure crypt-luks "$img" 'crypt_method'

img=$(copy_image norm external-data-file); patch "$img" incompat-set 2
# The data file bit without the extension that names the file.
expect_open_failure external-data-file "$img" 'an external data file but its header does not name it'

# Extended L2 entries are read and written, but only with clusters of
# 16 KiB or more.
img=$(copy_image small extended-l2-small-clusters)
patch "$img" be32 36 16       # an L1 table big enough for 16-byte entries
patch "$img" incompat-set 4
expect_open_failure extended-l2-small-clusters "$img" 'incompatible_features: .*extended L2'

# A backing file that cannot be opened: refusing the image is the only
# safe answer (serving the unallocated clusters as zeros would be
# silently wrong data).
cp "$T/norm.qcow2" "$T/gone.qcow2"
qemu-img create -q -f qcow2 -b "$T/gone.qcow2" -F qcow2 "$T/backed.qcow2"
qemu-io -f qcow2 -c 'write -q -P 0x99 64k 4k' "$T/backed.qcow2" >/dev/null
rm "$T/gone.qcow2"
OPEN_ERROR_PREFIX="" expect_open_failure backing-file-missing "$T/backed.qcow2" \
    'cannot open the backing file .*gone.qcow2'

# Backing file name outside the header cluster.
img=$(copy_image backed backing-name-outside); patch "$img" be64 8 0xfff0
expect_open_failure backing-name-outside "$img" 'backing_file_offset: .*outside the header cluster'
img=$(copy_image backed backing-name-too-long); patch "$img" be32 16 2000
expect_open_failure backing-name-too-long "$img" 'backing_file_size: 2000'

# compression_type and incompatible bit 3 must agree, both ways.
img=$(copy_image norm ctype-without-bit); patch "$img" u8 104 1
expect_open_failure ctype-without-bit "$img" 'incompatible_features: the compression type bit does not match compression_type 1'
img=$(copy_image zstd zstd-bit-cleared); patch "$img" incompat-clear 3
expect_open_failure zstd-bit-cleared "$img" 'incompatible_features: the compression type bit does not match compression_type 1'
img=$(copy_image zlib bit-without-ctype); patch "$img" incompat-set 3
expect_open_failure bit-without-ctype "$img" 'incompatible_features: the compression type bit does not match compression_type 0'
img=$(copy_image zstd ctype-unknown); patch "$img" u8 104 2
expect_open_failure ctype-unknown "$img" 'compression_type: unknown compression type 2'

img=$(copy_image norm header-length-short); patch "$img" be32 100 72
expect_open_failure header-length-short "$img" 'header_length: 72 is too short'
img=$(copy_image norm header-length-huge); patch "$img" be32 100 0x20000
expect_open_failure header-length-huge "$img" 'header_length: 131072 exceeds the cluster size'
img=$(copy_image norm refcount-order-7); patch "$img" be32 96 7
expect_open_failure refcount-order-7 "$img" 'refcount_order: 7'
img=$(copy_image norm reftable-unaligned); patch "$img" be64 48 0x10200
expect_open_failure reftable-unaligned "$img" 'refcount_table_offset: .*not cluster aligned'
img=$(copy_image norm reftable-empty); patch "$img" be32 56 0
expect_open_failure reftable-empty "$img" 'refcount_table_clusters'

# Files too short to hold a header.
head -c 50 "$T/norm.qcow2" > "$T/truncated.qcow2"
expect_open_failure truncated-header "$T/truncated.qcow2" 'too small for a qcow2 header'
head -c 100 "$T/norm.qcow2" > "$T/truncated-v3.qcow2"
expect_open_failure truncated-v3-header "$T/truncated-v3.qcow2" 'too small for a qcow2 v3 header'
: > "$T/empty.qcow2"
START_ERROR="empty.qcow2: the file is empty, not a qcow2 image" \
    expect_open_failure empty-file "$T/empty.qcow2" 'too small for a qcow2 header'

# ------------------------------------------------------------ clusters
img=$(copy_image norm l2-reserved-low); patch "$img" l2-or 0 0x2
expect_read_failure l2-reserved-low "$img" "$RAW" \
    'L2 entry for guest offset 0x0: reserved bits' "$BAD_C0" "$GOOD_C0"
img=$(copy_image norm l2-reserved-high); patch "$img" l2-or 0 0x0100000000000000
expect_read_failure l2-reserved-high "$img" "$RAW" \
    'L2 entry for guest offset 0x0: reserved bits' "$BAD_C0" "$GOOD_C0"

img=$(copy_image norm l2-offset-unaligned); patch "$img" l2-or 0 0x200
expect_read_failure l2-offset-unaligned "$img" "$RAW" \
    'L2 entry for guest offset 0x0: host offset .*not cluster aligned' "$BAD_C0" "$GOOD_C0"

img=$(copy_image norm l2-offset-past-eof)
size=$(stat -c %s "$img")
patch "$img" l2-set 0 $(( (1 << 63) | ((size + 4 * MiB) & ~0xffff) ))
expect_read_failure l2-offset-past-eof "$img" "$RAW" \
    'L2 entry for guest offset 0x0: host offset .*past the end of the file' "$BAD_C0" "$GOOD_C0"

img=$(copy_image v2 v2-zero-flag); patch "$img" l2-or 0 0x1
expect_read_failure v2-zero-flag "$img" "$RAW" \
    'zero flag is set in a version 2 image' "$BAD_C0" "$GOOD_C0"

img=$(copy_image small l1-reserved-high); patch "$img" l1-or 0 0x0100000000000000
expect_read_failure l1-reserved-high "$img" "$T/small.raw" \
    'L1 entry 0: reserved bits' "$BAD_L1" "$GOOD_L1"
img=$(copy_image small l1-reserved-low); patch "$img" l1-or 0 0x2
expect_read_failure l1-reserved-low "$img" "$T/small.raw" \
    'L1 entry 0: reserved bits' "$BAD_L1" "$GOOD_L1"
img=$(copy_image small l1-l2-unaligned); patch "$img" l1-or 0 0x200
expect_read_failure l1-l2-unaligned "$img" "$T/small.raw" \
    'L1 entry 0: L2 table offset .*not cluster aligned' "$BAD_L1" "$GOOD_L1"
img=$(copy_image small l1-l2-past-eof)
size=$(stat -c %s "$img")
patch "$img" l1-set 0 $(( (1 << 63) | ((size + MiB) & ~0xfff) ))
expect_read_failure l1-l2-past-eof "$img" "$T/small.raw" \
    'L1 entry 0: L2 table .*outside the file' "$BAD_L1" "$GOOD_L1"

for c in zlib zstd; do
    # The half random cluster's range is about 32 KiB: a count of 0 leaves
    # under 512 bytes, which cannot hold a whole cluster.
    img=$(copy_image $c $c-short-count); patch "$img" short-count 0x10000
    expect_read_failure $c-short-count "$img" "$RAW" \
        "compressed cluster at guest offset 0x10000 .*$c: compressed data yields [0-9]+ bytes, not a whole cluster" \
        "$BAD_C1" "$GOOD_C1"

    img=$(copy_image $c $c-garbage); patch "$img" garbage 0x10000 256 7
    expect_read_failure $c-garbage "$img" "$RAW" \
        "compressed cluster at guest offset 0x10000 .*$c: " \
        "$BAD_C1" "$GOOD_C1"

    img=$(copy_image $c $c-compressed-past-eof); patch "$img" compressed-past-eof 0x10000
    expect_read_failure $c-compressed-past-eof "$img" "$RAW" \
        'compressed data at host offset .*past the end of the file' \
        "$BAD_C1" "$GOOD_C1"
done

echo "test-corrupt: all cases passed"
