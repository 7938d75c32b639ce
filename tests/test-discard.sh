#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Space comes back: clusters released by trims, zeroes and rewrites of
# compressed clusters are discarded in the storage (qcow2-discard=unmap,
# the default): under the filter, nbdkit's file plugin punches holes;
# the plugin form punches holes in its own file and cuts its free tail.
# Side by side with qemu-nbd --discard=unmap on the same image.  With
# qcow2-discard=ignore the file keeps its blocks; a plugin that cannot
# trim gets no trim.  qcow2-detect-zeroes=off|on|unmap takes as many
# clusters for zeros written as qemu-nbd --detect-zeroes does, and judges
# each cluster of a write across clusters by its own bytes.  A
# compressed cluster freed and its host cluster reused with the same L2
# entry reads the new data, not a cached copy of the old (both forms).
# Every image ends clean in qemu-img check and reads back as written.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-img qemu-io qemu-nbd nbdcopy
requires_nbd_python

cd "$TMPDIR_TEST"
M=$((1 << 20))

blocks () { echo $(( $(stat -c %b "$1") * 512 )); }

# free_holes IMAGE: "CLUSTER USED FREE FREE_WITH_DATA SIZE IMAGE_END".
free_holes () { "$PYTHON" "$top_srcdir/tests/free-holes.py" "$1"; }

# nbd_do URI PYTHON: run PYTHON with h connected to URI.
nbd_do ()
{
    "$PYTHON" - "$1" "$2" <<'EOF'
import sys
import nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
exec(sys.argv[2])
h.flush()
h.shutdown()
EOF
}

# check_clean IMAGE RAW WHAT: qemu-img check clean, reads as RAW.
check_clean ()
{
    qemu-img check "$1" > check.out 2>&1 || { cat check.out; fail "$3: qemu-img check"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "$3: check found problems"; }
    qemu-img compare -q -f qcow2 -F raw "$1" "$2" || fail "$3: does not read as written"
}

# start_qemu SOCKET IMAGE ARGS...: qemu-nbd writing IMAGE.
start_qemu ()
{
    local sock=$1 img=$2
    shift 2
    rm -f "$sock.pid"
    qemu-nbd -t -f qcow2 --fork --pid-file="$sock.pid" -k "$sock" "$@" "$img" \
        2>"$sock.log" || { cat "$sock.log"; fail "qemu-nbd did not start"; }
    _pids+=("$(cat "$sock.pid")")
}
# stop_qemu SOCKET: SIGTERM, then wait for its exit (the image is read
# next).  A daemon is not our child: its status is not ours to judge.
stop_qemu ()
{
    local pid i
    pid=$(cat "$1.pid")
    kill "$pid" 2>/dev/null || true
    for (( i = 0; i < 10 * STOP_TIMEOUT; i++ )); do
        _alive "$pid" || return 0
        sleep 0.1
    done
    fail "qemu-nbd (pid $pid) did not exit within $STOP_TIMEOUT s of SIGTERM"
}

# ------------------------------------------------------------ trims
# 32 MiB of data in a 64 MiB disk; trim half of it.
head -c $((32 * M)) /dev/urandom > data.raw
qemu-img create -q -f qcow2 base.qcow2 64M
qemu-img convert -n -f raw -O qcow2 data.raw base.qcow2
cp data.raw expect.raw
truncate -s 64M expect.raw
dd if=/dev/zero of=expect.raw bs=1M seek=8 count=16 conv=notrunc status=none

cp base.qcow2 ours.qcow2
before=$(blocks ours.qcow2)
start_server "$PWD/s1" -v -D qcow2zstd.map=1 file ours.qcow2
nbd_do "$(nbd_uri "$PWD/s1")" "h.trim(16 << 20, 8 << 20)"
stop_server
grep -q "qcow2zstd: discarded 16777216 bytes of released clusters" "$PWD/s1.log" ||
    fail "trim: no debug line for the discard"
check_clean ours.qcow2 expect.raw "trim, filter"
ours=$(blocks ours.qcow2)

cp base.qcow2 qemu.qcow2
start_qemu "$PWD/q1" qemu.qcow2 --discard=unmap
nbd_do "$(nbd_uri "$PWD/q1")" "h.trim(16 << 20, 8 << 20)"
stop_qemu "$PWD/q1"
qemu=$(blocks qemu.qcow2)
read -r cs used free free_data size end < <(free_holes ours.qcow2)
[ "$free_data" = 0 ] || fail "trim: $free_data free clusters still hold data"
[ "$ours" -le $((qemu + cs)) ] ||
    fail "trim: $ours bytes allocated after the trim; qemu-nbd --discard=unmap leaves $qemu"
# The L2 table and refcount block, written whole, may take a few blocks
# more than they did.
[ "$ours" -le $((before - 15 * M)) ] ||
    fail "trim: $ours bytes allocated, $before before the trim of 16 MiB"
echo "trim of 16 MiB: allocated $before -> $ours bytes (qemu-nbd --discard=unmap: $qemu); $free free clusters, all holes"

# qcow2-discard=ignore: the clusters are free in the image, the file
# keeps its blocks (for the image to reuse).
cp base.qcow2 ignore.qcow2
start_server "$PWD/s2" file ignore.qcow2 qcow2-discard=ignore
nbd_do "$(nbd_uri "$PWD/s2")" "h.trim(16 << 20, 8 << 20)"
stop_server
check_clean ignore.qcow2 expect.raw "trim, qcow2-discard=ignore"
read -r cs used free free_data size end < <(free_holes ignore.qcow2)
[ "$free" -ge 256 ] && [ "$free_data" -ge 256 ] ||
    fail "qcow2-discard=ignore: $free free clusters, $free_data with data (expected 256 or more of each)"
echo "qcow2-discard=ignore: $free_data free clusters keep their blocks ($(blocks ignore.qcow2) bytes allocated)"

# ------------------------------------------------- zeroes and rewrites
# A compressed image: zero requests release clusters, rewrites of parts
# of compressed clusters release the compressed data; after the flush no
# free cluster of the file holds data.
head -c $((8 * M)) /dev/urandom > rnd.raw
"$PYTHON" -c "import sys; sys.stdout.buffer.write(b'space comes back ' * 2000000)" |
    head -c $((24 * M)) > text.raw
cat text.raw rnd.raw > mixed.raw
qemu-img convert -q -c -f raw -O qcow2 -o cluster_size=65536 mixed.raw comp.qcow2
truncate -s +16M comp.qcow2
cp mixed.raw expect.raw
start_server "$PWD/s3" file comp.qcow2
nbd_do "$(nbd_uri "$PWD/s3")" "
h.zero(4 << 20, 2 << 20)
for i in range(64):
    h.pwrite(b'%d rewritten ' % i * 100, (8 << 20) + i * 65536 + 1000)
h.zero(4 << 20, 26 << 20)
"
stop_server
"$PYTHON" - expect.raw <<'EOF'
import sys
f = open(sys.argv[1], "r+b")
f.seek(2 << 20); f.write(bytes(4 << 20))
for i in range(64):
    f.seek((8 << 20) + i * 65536 + 1000); f.write(b"%d rewritten " % i * 100)
f.seek(26 << 20); f.write(bytes(4 << 20))
EOF
check_clean comp.qcow2 expect.raw "zeroes and rewrites of compressed clusters"
read -r cs used free free_data size end < <(free_holes comp.qcow2)
[ "$free_data" = 0 ] || fail "zeroes and rewrites: $free_data free clusters still hold data"
echo "zeroes and rewrites of compressed clusters: $used clusters in use, $free free, all holes"

# ------------------------------------------------------------ the plugin
# The plugin form punches holes in its own file, and cuts it when its
# tail is free (qemu never cuts a file).
cp base.qcow2 plug.qcow2
start_nbdkit "$PWD/s4" "$PLUGIN" plug.qcow2
nbd_do "$(nbd_uri "$PWD/s4")" "h.trim(8 << 20, 4 << 20)"
stop_server
read -r cs used free free_data size end < <(free_holes plug.qcow2)
[ "$free_data" = 0 ] && [ "$free" -ge 128 ] ||
    fail "plugin: $free free clusters, $free_data with data"
size_before=$(stat -c %s plug.qcow2)
start_nbdkit "$PWD/s4" -v -D qcow2zstd.map=1 "$PLUGIN" plug.qcow2
nbd_do "$(nbd_uri "$PWD/s4")" "h.trim(20 << 20, 12 << 20)"
stop_server
grep -q "qcow2zstd: the file is cut to [0-9]* bytes" "$PWD/s4.log" ||
    fail "plugin: no debug line for the cut"
cp data.raw expect.raw
truncate -s 64M expect.raw
dd if=/dev/zero of=expect.raw bs=1M seek=4 count=28 conv=notrunc status=none
check_clean plug.qcow2 expect.raw "plugin, trims"
read -r cs used free free_data size end < <(free_holes plug.qcow2)
[ "$size" -le "$end" ] ||
    fail "plugin: the file is $size bytes, its last cluster in use ends at $end"
[ "$size" -lt "$size_before" ] || fail "plugin: the file was not cut ($size bytes)"
echo "plugin: holes for the clusters freed inside, the file cut from $size_before to $size bytes when its tail was freed"

# ------------------------------------------------- a plugin without trim
# nbdkit's eval plugin without a trim script cannot trim: nothing is
# sent to it, and all works as with qcow2-discard=ignore.
# (The scripts' commands run without the sanitizers' preloaded runtime.)
cp base.qcow2 eval.qcow2
F=$PWD/eval.qcow2
E="env -u LD_PRELOAD"
start_server "$PWD/s5" eval \
    get_size="$E stat -c %s $F" \
    pread="$E dd if=$F skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none" \
    pwrite="$E dd of=$F seek=\$4 oflag=seek_bytes conv=notrunc status=none" \
    flush="sync $F" \
    can_write="exit 0" can_flush="exit 0"
nbd_do "$(nbd_uri "$PWD/s5")" "h.trim(16 << 20, 8 << 20)"
stop_server
if grep -Ei "error|trim" "$PWD/s5.log"; then
    fail "a plugin that cannot trim: the server logged the above"
fi
cp data.raw expect.raw
truncate -s 64M expect.raw
dd if=/dev/zero of=expect.raw bs=1M seek=8 count=16 conv=notrunc status=none
check_clean eval.qcow2 expect.raw "a plugin that cannot trim"
echo "a plugin that cannot trim: no trim sent, image clean"

# ------------------------------------------------------- written zeros
# 1 MiB of zeros (a write, not a zero request) into clusters never
# written, and 1 MiB of zeros over data: the clusters each takes, ours
# against qemu-nbd's with the same detect-zeroes mode.
allocated ()
{
    qemu-img map --output=json "$1" |
        "$PYTHON" -c 'import json, sys; print(sum(e["length"] for e in json.load(sys.stdin) if e["data"] or "offset" in e) >> 16)'
}
for mode in off on unmap; do
    qemu-img create -q -f qcow2 z.qcow2 64M
    qemu-io -f qcow2 -c "write -P 0x55 4M 1M" z.qcow2 >/dev/null
    cp z.qcow2 zq.qcow2
    truncate -s +4M z.qcow2
    start_server "$PWD/s6" file z.qcow2 qcow2-detect-zeroes=$mode
    nbd_do "$(nbd_uri "$PWD/s6")" "h.pwrite(bytes(1 << 20), 0); h.pwrite(bytes(1 << 20), 4 << 20)"
    stop_server
    start_qemu "$PWD/q6" zq.qcow2 --discard=unmap --detect-zeroes=$mode
    nbd_do "$(nbd_uri "$PWD/q6")" "h.pwrite(bytes(1 << 20), 0); h.pwrite(bytes(1 << 20), 4 << 20)"
    stop_qemu "$PWD/q6"
    truncate -s 64M zeros.raw
    check_clean z.qcow2 zeros.raw "detect-zeroes=$mode"
    ours=$(allocated z.qcow2) theirs=$(allocated zq.qcow2)
    [ "$ours" = "$theirs" ] ||
        fail "detect-zeroes=$mode: $ours clusters hold data or keep a host cluster; qemu-nbd: $theirs"
    echo "qcow2-detect-zeroes=$mode: 2 MiB of zeros written leave $ours clusters allocated (qemu-nbd --detect-zeroes=$mode: $theirs)"
done

# One write over several clusters, some of them all zeros, from a
# cluster boundary and from inside a cluster: each cluster is judged by
# its own bytes.  With qcow2-detect-zeroes=unmap the clusters of zeros
# take no host cluster and the others keep their data, in both forms.
if section detect-zeroes-multi; then
    C=65536
    for form in filter plugin; do
        rm -f dz.qcow2
        qemu-img create -q -f qcow2 dz.qcow2 8M
        if [ $form = filter ]; then
            truncate -s +4M dz.qcow2
            start_server "$PWD/s8" file dz.qcow2 qcow2-detect-zeroes=unmap
        else
            start_nbdkit "$PWD/s8" "$PLUGIN" dz.qcow2 qcow2-detect-zeroes=unmap
        fi
        # Clusters 16-21: zeros, data, zeros, data, data, zeros; then 40-44
        # written from 1000 bytes into cluster 40: part, zeros, data, zeros,
        # part.
        "$PYTHON" - "$(nbd_uri "$PWD/s8")" dz-expect.raw <<'EOF' ||
import sys
import nbd
C = 65536
def data(k):
    return (b"cluster %d of a multi-cluster write " % k * 2000)[:C]
disk = bytearray(8 << 20)
h = nbd.NBD()
h.connect_uri(sys.argv[1])
kinds = "ZDZDDZ"
buf = b"".join(bytes(C) if k == "Z" else data(16 + i) for i, k in enumerate(kinds))
h.pwrite(buf, 16 * C)
disk[16 * C:22 * C] = buf
buf2 = data(40)[1000:] + bytes(C) + data(42) + bytes(C) + data(44)[:3000]
h.pwrite(buf2, 40 * C + 1000)
disk[40 * C + 1000:40 * C + 1000 + len(buf2)] = buf2
h.flush()
if h.pread(len(disk), 0) != disk:
    sys.exit("the disk does not read back as written")
h.shutdown()
open(sys.argv[2], "wb").write(disk)
EOF
            fail "detect-zeroes across clusters, $form: the data is wrong"
        stop_server
        check_clean dz.qcow2 dz-expect.raw "detect-zeroes across clusters, $form"
        # Allocated: 17, 19, 20 and 40, 42, 44 (parts of clusters are data).
        got=$(qemu-img map --output=json dz.qcow2 |
            "$PYTHON" -c 'import json, sys; print(" ".join(str(c) for e in json.load(sys.stdin) if e["data"] for c in range(e["start"] >> 16, (e["start"] + e["length"]) >> 16)))')
        [ "$got" = "17 19 20 40 42 44" ] ||
            fail "detect-zeroes across clusters, $form: clusters '$got' hold data, not 17 19 20 40 42 44"
        echo "$form: a write across clusters, from a boundary and from inside one: clusters of zeros take no host cluster (unmap), the others hold their data"
    done
fi

# ------------------------------------------------------- freed, then reused
# A compressed cluster read in part (so its decompressed copy is in the
# cluster cache), trimmed, flushed (its host cluster is free), then
# written with other data that compresses to as many sectors: it lands
# in the same host cluster with the same L2 entry, the cache's key.  The
# next read in part must be the new data: the copy of the old one went
# with the free.  Three rounds, each ending with a trim (all three reuse
# the entry today); at least one must (the entries are read from the
# file), or the case tests nothing.
for form in filter plugin; do
    section reuse-cache-$form || continue
    rm -f r.qcow2
    qemu-img create -q -f qcow2 r.qcow2 8M
    if [ $form = filter ]; then
        truncate -s +4M r.qcow2
        start_server "$PWD/s7" file r.qcow2 qcow2-compress=true
    else
        start_nbdkit "$PWD/s7" "$PLUGIN" r.qcow2 qcow2-compress=true
    fi
    "$PYTHON" - "$(nbd_uri "$PWD/s7")" "$PWD/r.qcow2" last-b.bin > reuse.out <<'EOF' ||
import struct, sys
import nbd

def l2_entry(path, guest):
    with open(path, "rb") as f:
        head = f.read(48)
        bits = struct.unpack(">I", head[20:24])[0]
        l1_offset = struct.unpack(">Q", head[40:48])[0]
        per_l2 = 1 << (bits - 3)
        idx = guest >> bits
        f.seek(l1_offset + 8 * (idx // per_l2))
        l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
        if not l2:
            return 0
        f.seek(l2 + 8 * (idx % per_l2))
        return struct.unpack(">Q", f.read(8))[0]

h = nbd.NBD()
h.connect_uri(sys.argv[1])
C, off, same, wrong = 65536, 3 << 20, 0, []
for rnd in range(3):
    a = (b"round %d, the old data A, " % rnd * 4000)[:C]
    b = (b"round %d, the new data B, " % rnd * 4000)[:C]
    h.pwrite(a, off)
    h.flush()
    entry_a = l2_entry(sys.argv[2], off)
    if h.pread(4096, off) != a[:4096]:
        wrong.append(f"round {rnd}: A does not read back")
    h.trim(C, off)
    h.flush()
    h.pwrite(b, off)
    h.flush()
    entry_b = l2_entry(sys.argv[2], off)
    same += entry_a == entry_b and entry_a & (1 << 62) != 0
    got = h.pread(4096, off)
    if got != b[:4096]:
        wrong.append(f"round {rnd}: read {got[:32]!r}..., not B"
                     + (" (A's bytes: the cached copy of the freed cluster)"
                        if got == a[:4096] else ""))
    if h.pread(C, off) != b:
        wrong.append(f"round {rnd}: the whole cluster is not B")
    if rnd < 2:
        # The next round's A then lands where this one's did.
        h.trim(C, off)
        h.flush()
h.shutdown()
open(sys.argv[3], "wb").write(b)
print(f"{same} of 3 rounds reused the L2 entry")
if wrong:
    sys.exit("; ".join(wrong))
if same == 0:
    sys.exit("no round wrote B with A's L2 entry: the case no longer tests "
             "what it is for")
EOF
        { cat reuse.out; fail "$form: a compressed cluster freed and reused"; }
    stop_server
    qemu-img convert -O raw r.qcow2 r.raw
    cmp -s -i 3M:0 -n 64K r.raw last-b.bin ||
        fail "$form: qemu does not read B after the reuse"
    qemu-img check -q r.qcow2 || fail "$form: qemu-img check after the reuse"
    echo "$form: a compressed cluster read, trimmed, flushed and written again into its host cluster reads the new data ($(cat reuse.out))"
done

echo "test-discard: all cases passed"
