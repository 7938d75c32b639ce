#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writing: refcount table growth, a full container (ENOSPC with the
# message, image still valid), refusals at open (the corrupt bit) with
# nbdkit -r still serving those images, the dirty bit repaired at open
# (test-lazy-refcounts.sh has the rest), a snapshot served read-only
# without -r, autoclear bits cleared, and v2 images.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io nbdcopy nbdinfo
requires_nbd_python

cd "$TMPDIR_TEST"

check_clean ()
{
    local img=$1 what=$2
    qemu-img check "$img" > check.out 2>&1 || { cat check.out; fail "$what: qemu-img check failed"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "$what: qemu-img check found problems"; }
}

header_u64 () { $PYTHON -c "import struct,sys; print(struct.unpack('>Q', open(sys.argv[1],'rb').read()[$2:$2+8])[0])" "$1"; }
header_u32 () { $PYTHON -c "import struct,sys; print(struct.unpack('>I', open(sys.argv[1],'rb').read()[$2:$2+4])[0])" "$1"; }

# 1. Refcount table growth: 512-byte clusters, where one table cluster
# covers only 8 MiB of file.  Filling a 20 MiB disk must move the table.
head -c 20M /dev/urandom > fill.raw
qemu-img create -q -f qcow2 -o cluster_size=512 grow.qcow2 20M
truncate -s 64M grow.qcow2
old_rt=$(header_u64 grow.qcow2 48)
start_server "$PWD/sock" file grow.qcow2
nbdcopy fill.raw "$(nbd_uri "$PWD/sock")"
stop_server
new_rt=$(header_u64 grow.qcow2 48)
new_clusters=$(header_u32 grow.qcow2 56)
[ "$new_rt" != "$old_rt" ] || fail "the refcount table did not move (offset $old_rt)"
[ "$new_clusters" -gt 1 ] || fail "the refcount table did not grow ($new_clusters clusters)"
check_clean grow.qcow2 "table growth"
qemu-img compare -q -f qcow2 -F raw grow.qcow2 fill.raw || fail "table growth: data differs"
echo "refcount table grew from 1 cluster at $old_rt to $new_clusters at $new_rt: check clean, identical"

# 2. ENOSPC: a container with no room.  The write fails with ENOSPC and a
# message saying how much room is needed and how to add it; the image
# stays valid and holds what was written before.
head -c 4M /dev/urandom > small.raw
truncate -s 5M small.raw        # the last MiB stays unallocated
qemu-img convert -c -O qcow2 -o cluster_size=65536 small.raw full.qcow2
sum_before=$(md5sum < full.qcow2)
start_server "$PWD/sock" file full.qcow2
write_errno "$(nbd_uri "$PWD/sock")" 0x400000 65536 0x78 > enospc.out
stop_server
grep -q "errno ENOSPC" enospc.out || { cat enospc.out; fail "a full container did not give ENOSPC"; }
grep -q "no room in the image file" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "no ENOSPC message"; }
grep -q "give the image room and reconnect (truncate -s +SIZE $PWD/full.qcow2)" "$PWD/sock.log" ||
    { cat "$PWD/sock.log"; fail "the ENOSPC message does not say how to add room to the file"; }
grep -q "65536 bytes" "$PWD/sock.log" || fail "the ENOSPC message does not say how much room is needed"
check_clean full.qcow2 "ENOSPC"
qemu-img compare -q -f qcow2 -F raw full.qcow2 small.raw || fail "ENOSPC: the image changed its content"
echo "full container: ENOSPC with a message naming the file and the truncate that gives it room, image valid and unchanged"

# Storage that is no file (nbdkit's memory plugin): ENOSPC, and the
# message does not tell to truncate anything.
start_server "$PWD/sock" memory 1M qcow2-create=16M
write_errno "$(nbd_uri "$PWD/sock")" 0 0x200000 random > enospc.out
stop_server
grep -q "errno ENOSPC" enospc.out || { cat enospc.out; fail "memory: a full container did not give ENOSPC"; }
no_room_names_no_file "$PWD/sock.log" memory
echo "full container in memory: ENOSPC, and the message names no file to truncate"

# Giving room with truncate then lets the write through.
truncate -s +1M full.qcow2
start_server "$PWD/sock" file full.qcow2
nbdcopy small.raw "$(nbd_uri "$PWD/sock")"
head -c 65536 /dev/zero | tr '\0' 'y' > y.raw
$PYTHON -c "
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(open('y.raw','rb').read(), 4 << 20); h.flush()
" "$(nbd_uri "$PWD/sock")"
stop_server
check_clean full.qcow2 "after truncate"
cp small.raw expect.raw
dd if=y.raw of=expect.raw bs=1M seek=4 conv=notrunc status=none
qemu-img compare -q -f qcow2 -F raw full.qcow2 expect.raw || fail "after truncate: data differs"
echo "after truncate -s +1M: the write succeeds, check clean"

# Space released by overwrites is reused when the container runs out,
# without the client flushing: compressed rewrites of the whole disk,
# five times over, in a container with room for little more than two.
# Half noise, half zeros in every cluster: each compresses to about half.
$PYTHON -c "
import random
r = random.Random(6)
open('text.raw', 'wb').write(b''.join(r.randbytes(32768) + bytes(32768) for _ in range(64)))
"
qemu-img convert -c -O qcow2 -o cluster_size=65536 text.raw reuse.qcow2
truncate -s +$(( $(stat -c %s reuse.qcow2) * 3 / 2 ))  reuse.qcow2
start_server "$PWD/sock" file reuse.qcow2 qcow2-compress=true
$PYTHON - "$(nbd_uri "$PWD/sock")" <<'EOF'
import nbd, random, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
size = h.get_size()
for k in range(5):
    r = random.Random(k)
    data = b"".join(r.randbytes(32768) + bytes(32768) for _ in range(size // 65536))
    for off in range(0, size, 1 << 20):
        h.pwrite(data[off:off + (1 << 20)], off)
open("last.raw", "wb").write(data)
h.flush()
EOF
stop_server
check_clean reuse.qcow2 "reuse"
qemu-img compare -q -f qcow2 -F raw reuse.qcow2 last.raw || fail "reuse: data differs"
echo "five compressed rewrites in a container with room for about two: no ENOSPC, check clean"

# 3. Refusals at open for writing, and nbdkit -r still serves.
refuse ()
{
    local img=$1 field=$2 what=$3
    local before
    before=$(md5sum < "$img")
    # Over the file plugin with file=: at start-up, before serving.
    if run_nbdkit -U - --filter="$FILTER" file "$img" --run true 2> start.err; then
        fail "$what: nbdkit started to write it"
    fi
    grep -q "$field" start.err || { cat start.err; fail "$what: no error at start-up naming $field"; }
    grep -q "nbdkit -r" start.err || fail "$what: the error at start-up does not suggest nbdkit -r"
    # With dir=, when a client names it.
    start_server "$PWD/sock" file dir="$PWD"
    if nbdinfo "nbd+unix:///$img?socket=$PWD/sock" > /dev/null 2>&1; then
        fail "$what: a writable connection was allowed"
    fi
    kill -0 "$SERVER_PID" || fail "$what: the server died"
    grep -q "$field" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "$what: no error naming $field"; }
    grep -q "nbdkit -r" "$PWD/sock.log" || fail "$what: the error does not suggest nbdkit -r"
    stop_server
    [ "$(md5sum < "$img")" = "$before" ] || fail "$what: the image was modified"
    start_server "$PWD/sock" -r file "$img"
    nbdcopy "$(nbd_uri "$PWD/sock")" served.raw || fail "$what: nbdkit -r did not serve it"
    stop_server
    qemu-img convert -U -O raw "$img" expect.raw
    cmp served.raw expect.raw || fail "$what: nbdkit -r served wrong data"
    echo "$what: writing refused naming $field (at start-up with file=, at the first client with dir=); nbdkit -r serves it"
}

# Images with internal snapshots are written (test-snapshot.sh); a
# snapshot itself is served read-only even without -r.
qemu-img convert -O qcow2 small.raw snap.qcow2
qemu-img snapshot -c snap1 snap.qcow2
before=$(md5sum < snap.qcow2)
start_server "$PWD/sock" file snap.qcow2 qcow2-snapshot=snap1
nbdinfo "$(nbd_uri "$PWD/sock")" > info.out || fail "snapshot: nbdinfo failed"
grep -q "is_read_only: true" info.out || { cat info.out; fail "snapshot: served writable"; }
stop_server
[ "$(md5sum < snap.qcow2)" = "$before" ] || fail "snapshot: the image was modified"
echo "qcow2-snapshot without -r: served read-only, image unchanged"

set_incompat_bit ()
{
    $PYTHON - "$1" "$2" <<'EOF'
import struct, sys
path, bit = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(72)
    v = struct.unpack(">Q", f.read(8))[0] | (1 << bit)
    f.seek(72)
    f.write(struct.pack(">Q", v))
EOF
}
# write_1000 IMAGE CHAR: give IMAGE room, and write 1000 CHARs at 5000
# through the filter.
write_1000 ()
{
    truncate -s +1M "$1"
    start_server "$PWD/sock" file "$1"
    $PYTHON -c "
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(sys.argv[2].encode() * 1000, 5000); h.flush()
" "$(nbd_uri "$PWD/sock")" "$2"
    stop_server
}
qemu-img convert -O qcow2 small.raw corrupt.qcow2
set_incompat_bit corrupt.qcow2 1
refuse corrupt.qcow2 "marked corrupt" "corrupt bit"
# The dirty bit alone (refcounts right): the open repairs the image, which
# is then written, and clean.
qemu-img convert -O qcow2 -o lazy_refcounts=on small.raw dirty.qcow2
set_incompat_bit dirty.qcow2 0
write_1000 dirty.qcow2 d
[ $(( $(header_u64 dirty.qcow2 72) & 1 )) = 0 ] || fail "dirty bit: not cleared"
check_clean dirty.qcow2 "dirty bit"
echo "dirty bit: repaired at open, written, check clean"

# 4. Autoclear bits are cleared before the first write, as qemu does.
qemu-img convert -O qcow2 small.raw autoclear.qcow2
$PYTHON - autoclear.qcow2 <<'EOF'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(88)
    f.write(struct.pack(">Q", 1 << 5))
EOF
write_1000 autoclear.qcow2 z
[ "$(header_u64 autoclear.qcow2 88)" = 0 ] || fail "autoclear bits were not cleared"
check_clean autoclear.qcow2 "autoclear"
echo "autoclear bits cleared before writing"

# 5. A v2 image (no zero flag): zeroes and trims of whole clusters leave
# them unallocated; the result passes check and reads back right.
qemu-img convert -O qcow2 -o compat=0.10 small.raw v2.qcow2
truncate -s +2M v2.qcow2
cp small.raw v2.raw
start_server "$PWD/sock" file v2.qcow2
$PYTHON - "$(nbd_uri "$PWD/sock")" <<'EOF'
import nbd, os, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
fd = os.open("v2.raw", os.O_RDWR)
for off, n in [(0, 65536), (100000, 300000), (1 << 20, 1000)]:
    h.zero(n, off)
    os.pwrite(fd, bytes(n), off)
h.trim(131072, 2 << 20)
os.pwrite(fd, bytes(131072), 2 << 20)
h.pwrite(b"v2" * 5000, 3 << 20)
os.pwrite(fd, b"v2" * 5000, 3 << 20)
h.flush()
EOF
stop_server
check_clean v2.qcow2 "v2"
qemu-img compare -q -f qcow2 -F raw v2.qcow2 v2.raw || fail "v2: data differs"
echo "v2 image: zero, trim and write: check clean, identical"

# New clusters in a hole (paths/cluster.c: new_cluster_zeroed): a 4 KiB
# write into a cluster that read as zeros writes only its 4 KiB where
# the file says the new host cluster is a hole, as qemu does; where the
# room holds old bytes, or the engine discarded the host cluster itself
# (a discard promises nothing), the rest of the cluster is written as
# zeros.  Each case writes 4 KiB of 0x5a into 128 clusters spread over
# the disk (and, for the reused clusters, into clusters whose host
# clusters were freed and punched out), and must read back as the raw
# disk written alike: zeros around each piece.
# hole_writes SOCK RAW FIRST: the 128 writes, at cluster FIRST + 3k and
# 1 KiB into it, through the server and into RAW.
hole_writes ()
{
    $PYTHON - "$(nbd_uri "$1")" "$2" "$3" <<'EOF'
import nbd, os, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
fd = os.open(sys.argv[2], os.O_RDWR)
for k in range(128):
    off = (int(sys.argv[3]) + 3 * k) * 65536 + 1024
    h.pwrite(b"\x5a" * 4096, off)
    os.pwrite(fd, b"\x5a" * 4096, off)
h.flush()
EOF
}
blocks () { echo $(( $(stat -c %b "$1") * 512 )); }

if section holes-truncated; then
    qemu-img create -q -f qcow2 -o cluster_size=64k holes.qcow2 64M
    truncate -s 128M holes.qcow2
    truncate -s 64M holes.raw
    before=$(blocks holes.qcow2)
    start_server "$PWD/sock" file holes.qcow2
    hole_writes "$PWD/sock" holes.raw 0
    stop_server
    grown=$(( $(blocks holes.qcow2) - before ))
    check_clean holes.qcow2 "new clusters in a hole"
    qemu-img compare -q -f qcow2 -F raw holes.qcow2 holes.raw ||
        fail "new clusters in a hole: data differs"
    # 128 pieces of 4 KiB and a few metadata clusters; whole clusters
    # would be 8 MiB.
    [ "$grown" -lt $(( 2 * 1024 * 1024 )) ] ||
        fail "new clusters in a hole: the file grew by $grown bytes for 512 KiB written"
    echo "new clusters in a hole: 128 writes of 4 KiB grew the file by $grown bytes; check clean, identical"
fi

if section holes-old-bytes; then
    qemu-img create -q -f qcow2 -o cluster_size=64k old.qcow2 64M
    # Room that holds old bytes, as a reused disk or a partition would.
    $PYTHON -c "
import sys
with open(sys.argv[1], 'ab') as f:
    f.write(b'\xaa' * (64 << 20))
" old.qcow2
    truncate -s 64M old.raw
    start_server "$PWD/sock" file old.qcow2
    hole_writes "$PWD/sock" old.raw 0
    stop_server
    check_clean old.qcow2 "new clusters over old bytes"
    qemu-img compare -q -f qcow2 -F raw old.qcow2 old.raw ||
        fail "new clusters over old bytes: the old bytes show through"
    echo "new clusters over old bytes: the rest of each cluster written as zeros; check clean, identical"
fi

if section holes-reused; then
    qemu-img create -q -f qcow2 -o cluster_size=64k reused.qcow2 64M
    truncate -s 128M reused.qcow2
    truncate -s 64M reused.raw
    start_server "$PWD/sock" file reused.qcow2
    # 24 MiB of data, trimmed again: their host clusters are freed and
    # punched out, and the writes after the flush take them.
    $PYTHON - "$(nbd_uri "$PWD/sock")" <<'EOF'
import nbd, os, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(os.urandom(24 << 20), 0)
h.flush()
h.trim(24 << 20, 0)
h.flush()
EOF
    hole_writes "$PWD/sock" reused.raw 512
    stop_server
    check_clean reused.qcow2 "new clusters in freed clusters"
    qemu-img compare -q -f qcow2 -F raw reused.qcow2 reused.raw ||
        fail "new clusters in freed clusters: data differs"
    echo "new clusters in freed, discarded clusters: written whole; check clean, identical"
fi
