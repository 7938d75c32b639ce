#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Backing files: raw and qcow2 backing files and a chain of three, named
# in the header (absolute and relative) or given with qcow2-backing=PATH;
# reads compared with qemu's, also of backing files that end inside a
# cluster, smaller than the disk (both forms); partial writes, zeroes and trims over
# unallocated clusters, on v3 and v2, checked with qemu-img check and
# compared with qemu's reading of the result.
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy qemu-io
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
$PYTHON -c "
import random
r = random.Random(12)
open('base.raw', 'wb').write(b''.join(r.randbytes(9000) + b'backing ' * 3000 for _ in range(100)))
"
base_size=$(stat -c %s base.raw)

# served_equals_qemu IMAGE [PARAMS]: the filter reads IMAGE as qemu does.
served_equals_qemu ()
{
    local img=$1 what=$2
    shift 2
    start_server "$PWD/sock" -r file "$img" "$@"
    nbdcopy "$(nbd_uri "$PWD/sock")" served.raw
    stop_server
    qemu-img convert -U -O raw "$img" qemu.raw
    cmp served.raw qemu.raw || fail "$what: the filter and qemu read different data"
}

# 1. A raw backing file, named by an absolute path.
qemu-img create -q -f qcow2 -b "$PWD/base.raw" -F raw top-raw.qcow2 $((base_size + 100000))
qemu-io -f qcow2 -c "write -P 0x11 100000 50000" -c "write -z 400000 70000" top-raw.qcow2 > /dev/null
served_equals_qemu top-raw.qcow2 "raw backing"
echo "raw backing file, larger disk than the backing file: reads as qemu reads it"

# 2. A chain: compressed zstd base <- zlib middle <- top, relative names.
mkdir chain
qemu-img convert -c -O qcow2 -o compression_type=zstd base.raw chain/base.qcow2
(cd chain &&
 qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 -o compression_type=zlib mid.qcow2 &&
 qemu-io -f qcow2 -c "write -c -P 0x22 65536 65536" -c "write -P 0x23 300000 5000" mid.qcow2 > /dev/null &&
 qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 top.qcow2 &&
 qemu-io -f qcow2 -c "write -P 0x33 70000 1000" -c "write -z 600000 65536" \
     -c "write -z 786432 131072" top.qcow2 > /dev/null)
served_equals_qemu chain/top.qcow2 "chain"
echo "chain of three (zstd base, zlib middle), relative names: reads as qemu reads it"

# 3. qcow2-backing=PATH overrides a name that does not resolve.
qemu-img create -q -f qcow2 -b "$PWD/chain/base.qcow2" -F qcow2 moved.qcow2
qemu-io -f qcow2 -c "write -P 0x44 1000 3000" moved.qcow2 > /dev/null
qemu-img rebase -u -b /nonexistent/base.qcow2 -F qcow2 moved.qcow2
start_server "$PWD/sock" -r file moved.qcow2 qcow2-backing="$PWD/chain/base.qcow2"
nbdcopy "$(nbd_uri "$PWD/sock")" served.raw
stop_server
cp moved.qcow2 rebased.qcow2
qemu-img rebase -u -b "$PWD/chain/base.qcow2" -F qcow2 rebased.qcow2
qemu-img convert -O raw rebased.qcow2 qemu.raw
cmp served.raw qemu.raw || fail "qcow2-backing: wrong data"
echo "qcow2-backing=PATH in place of a name that does not resolve: reads right"

# 4. Writing over a backing file (v3 and v2): partial writes copy the
# backing data into the new cluster, zeroes hide it, and a trim does
# what qemu's discard does.  The expected disk is computed here, from
# qemu's reading of the new image and the operations.
for compat in 1.1 0.10; do
    qemu-img create -q -f qcow2 -o compat=$compat -b "$PWD/chain/base.qcow2" -F qcow2 w.qcow2
    truncate -s +4M w.qcow2
    qemu-img convert -O raw w.qcow2 expect.raw
    start_server "$PWD/sock" file w.qcow2
    $PYTHON - "$(nbd_uri "$PWD/sock")" "$compat" <<'EOF'
import nbd, os, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
compat = sys.argv[2]
fd = os.open("expect.raw", os.O_RDWR)
def write(data, off):
    h.pwrite(data, off); os.pwrite(fd, data, off)
def zero(n, off):
    h.zero(n, off); os.pwrite(fd, bytes(n), off)
write(b"partial" * 100, 70000)          # inside one unallocated cluster
write(b"x" * 65536, 131072)             # a whole cluster
zero(1000, 200000)                      # part of a cluster
zero(131072, 262144)                    # whole clusters
zero(65536 + 3000, 458752 - 1000)       # parts and a whole one
# Trims of whole clusters over a backing file, as qemu 7.2 discards
# them: a v3 image marks them zero (they read zeros); a v2 image has no
# zero flag, and qemu leaves them as they are (reading the backing file,
# or what was written).  Of a cluster unallocated before, and of two
# this session allocated.
h.trim(65536, 589824)
write(b"y" * 65536 * 2, 720896)
h.trim(65536 * 2, 720896)
if compat == "1.1":
    os.pwrite(fd, bytes(65536), 589824)
    os.pwrite(fd, bytes(65536 * 2), 720896)
h.flush()
got = h.pread(h.get_size(), 0)
want = os.pread(fd, h.get_size(), 0)
assert got == want, "the filter does not read back what was written"
EOF
    stop_server
    qemu-img check w.qcow2 > check.out 2>&1 || { cat check.out; fail "compat $compat: qemu-img check"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "compat $compat: check found problems"; }
    qemu-img compare -q -f qcow2 -F raw w.qcow2 expect.raw || fail "compat $compat: qemu reads other data"
    echo "compat $compat over a backing file: writes, zeroes, trims: check clean, qemu agrees"
done

# 4b. Backing files that end inside a cluster, under a 4 MiB overlay:
# a qcow2 one made with a size of 1 MiB + 4 bytes (qemu-img rounds it
# to 1 MiB + 512), the same with the header's size set to exactly
# 1 MiB + 4 (qemu reads a size in whole sectors, rounded down), and a
# raw file of 1 MiB + 4 bytes.  The backing data fills every byte, and
# the overlay's cluster over the backing file's end is unallocated, so
# its read is the backing file's last part and then zeros.  Read whole
# through both forms (nbdcopy, as a client reads the disk) and compared
# with qemu's reading of the overlay.
odd=$((1048576 + 4))
for kind in qcow2 qcow2-exact raw; do
    section odd-backing-$kind || continue
    rm -f odd-base.* odd-top.qcow2
    if [ $kind = raw ]; then
        $PYTHON -c "open('odd-base.raw', 'wb').write((b'backing end ' * 90000)[:$odd])"
        qemu-img create -q -f qcow2 -b "$PWD/odd-base.raw" -F raw odd-top.qcow2 4M
    else
        qemu-img create -q -f qcow2 odd-base.qcow2 $odd
        qemu-io -f qcow2 -c "write -P 0x6b 0 $(( (odd + 511) / 512 * 512 ))" odd-base.qcow2 > /dev/null
        if [ $kind = qcow2-exact ]; then
            $PYTHON -c "
import struct
with open('odd-base.qcow2', 'r+b') as f:
    f.seek(24)
    f.write(struct.pack('>Q', $odd))"
        fi
        qemu-img create -q -f qcow2 -b "$PWD/odd-base.qcow2" -F qcow2 odd-top.qcow2 4M
    fi
    qemu-io -f qcow2 -c "write -P 0x71 64k 64k" -c "write -P 0x72 2M 64k" odd-top.qcow2 > /dev/null
    qemu-img convert -O raw odd-top.qcow2 qemu.raw
    for form in filter plugin; do
        rm -f served.raw
        if [ $form = filter ]; then
            start_server "$PWD/sock" -r file odd-top.qcow2
        else
            start_nbdkit "$PWD/sock" -r "$PLUGIN" odd-top.qcow2
        fi
        nbdcopy "$(nbd_uri "$PWD/sock")" served.raw ||
            fail "$kind backing of $odd bytes, $form: nbdcopy failed"
        stop_server
        cmp served.raw qemu.raw ||
            fail "$kind backing of $odd bytes, $form: the disk read differs from qemu's"
    done
    echo "$kind backing file of $odd bytes under a 4 MiB disk: read whole by both forms as qemu reads it"
done

# 5. Extents: zero clusters of the top image are holes that read as
# zeros; unallocated ones show the backing file's data, so they are data.
start_server "$PWD/sock" -r file chain/top.qcow2
nbdinfo --map "$(nbd_uri "$PWD/sock")" > map.txt
stop_server
qemu-img map --output=json chain/top.qcow2 > qemu-map.json
$PYTHON - map.txt qemu-map.json <<'EOF' || { cat map.txt; fail "extents over a backing file"; }
import json, sys
ours = []
for line in open(sys.argv[1]):
    off, length, kind = (int(x) for x in line.split()[:3])
    ours.append((off, off + length, kind))
def ours_at(pos):
    return next(k for a, b, k in ours if a <= pos < b)
holes = 0
for e in json.load(open(sys.argv[2])):
    # Zero at depth 0 without data: a zero cluster of the top image.
    want = 3 if e["depth"] == 0 and e["zero"] and not e["data"] else 0
    holes += want == 3
    for pos in range(e["start"], e["start"] + e["length"], 65536):
        assert ours_at(pos) == want, (pos, ours_at(pos), want)
assert holes > 0, "the image has no zero cluster to check"
EOF
echo "extents over a backing file: zero clusters are holes, the rest data, as qemu maps it"
