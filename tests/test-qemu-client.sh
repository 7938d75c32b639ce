#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# qemu as the NBD client of the filter: qemu-img convert and compare read
# the export (qemu's NBD driver, with its block status and request
# sizes), qemu-img convert -n writes a whole disk into it (with write
# zeroes for the zero parts), qemu-io writes, zeroes, discards and reads
# back over NBD.  Afterwards the qcow2 file must pass qemu-img check and
# qemu reading the file directly must see every change.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io cmp
requires_nbd_python

cd "$TMPDIR_TEST"

# A disk of 8 MiB + 7.5 KiB (the last 64k cluster is partial): random
# data, text, written zeros and holes.
$PYTHON - <<'EOF'
import random
rng = random.Random(11)
size = 8 * 1024 * 1024 + 7680
words = [b"qemu", b"nbd", b"client", b"cluster", b"zstd", b"guest", b"\n"]
out = bytearray()
while len(out) < size:
    k = rng.randrange(3)
    n = rng.randrange(1, 300000)
    if k == 0:
        out += rng.randbytes(n)
    elif k == 1:
        out += b" ".join(rng.choice(words) for _ in range(n // 6))
    else:
        out += bytes(n)
out = out[:size]
out[-300:] = b"tail" * 75
open("src.raw", "wb").write(out)
# A second disk, written into the export by qemu-img convert -n.
rng = random.Random(12)
out = bytearray(size)
for _ in range(40):
    off = rng.randrange(size)
    n = min(rng.randrange(1, 200000), size - off)
    out[off:off + n] = rng.randbytes(n) if rng.randrange(2) else b"x" * n
open("new.raw", "wb").write(out)
EOF

qemu-img convert -f raw -O qcow2 -c -o compression_type=zstd src.raw img.qcow2
# The reference is what qemu itself reads from the image.
qemu-img convert -f qcow2 -O raw img.qcow2 ref.raw
cmp ref.raw src.raw || fail "qemu-img does not read back its own image"
truncate -s +32M img.qcow2
sock=$PWD/sock
uri=$(nbd_uri "$sock")

check_clean ()
{
    qemu-img check "$1" > check.out 2>&1 || { cat check.out; fail "$2: qemu-img check failed"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "$2: qemu-img check found problems"; }
}

# 1. Read-only export: qemu-img convert, convert to qcow2, compare.
start_server "$sock" -r file img.qcow2
qemu-img convert -f raw -O raw "$uri" out.raw || fail "qemu-img convert from $uri failed"
cmp out.raw ref.raw || fail "qemu-img convert from the export differs from qemu's own read of the image"
echo "qemu-img convert -f raw $uri -> raw: identical to qemu-img convert of the qcow2"

qemu-img compare -q -f raw -F qcow2 "$uri" img.qcow2 || fail "qemu-img compare export vs qcow2 reported a difference"
# qemu-img compare must be able to fail: a disk with one byte changed.
cp ref.raw off-by-one.raw
printf '\x5a' | dd of=off-by-one.raw bs=1 seek=4000000 conv=notrunc status=none
if qemu-img compare -q -f raw -F raw "$uri" off-by-one.raw; then
    fail "qemu-img compare did not notice a changed byte"
fi
echo "qemu-img compare -q -f raw -F qcow2 $uri img.qcow2: identical (and a changed byte is noticed)"

qemu-img convert -f raw "$uri" -O qcow2 copy.qcow2 || fail "qemu-img convert to qcow2 failed"
qemu-img compare -q -f qcow2 -F raw copy.qcow2 ref.raw || fail "the qcow2 made from the export differs"
echo "qemu-img convert -f raw $uri -O qcow2: identical"
stop_server

# 2. Writable export: qemu-io writes a pattern and reads it back over
# NBD; the same commands applied to a raw mirror give the expected disk.
start_server "$sock" file img.qcow2
cp ref.raw expect.raw
ops=(-c 'write -P 0xab 12345 100000' -c 'read -P 0xab 12345 100000')
qemu-io -f raw "$uri" "${ops[@]}" > io.out 2>&1 || { cat io.out; fail "qemu-io write/read over NBD failed"; }
grep -q "Pattern verification failed" io.out && { cat io.out; fail "qemu-io read back a different pattern"; }
qemu-io -f raw expect.raw -c 'write -P 0xab 12345 100000' > /dev/null
echo "qemu-io over NBD: write -P 0xab 12345 100000, read -P 0xab: pattern verified"

# More qemu-io requests: an aligned cluster write, an unaligned write
# across a cluster boundary, write zeroes (with and without unmap),
# discard of whole and partial clusters, a write into the partial last
# cluster, and a flush.
more=(-c 'write -P 0x11 131072 65536'
      -c 'write -P 0x22 196000 70000'
      -c 'write -z 1048576 196608'
      -c 'write -z -u 2097152 131072'
      -c 'write -z 3000000 5000'
      -c 'write -P 0x33 8387584 7680'
      -c 'flush')
qemu-io -f raw "$uri" "${more[@]}" > io2.out 2>&1 || { cat io2.out; fail "qemu-io requests over NBD failed"; }
qemu-io -f raw expect.raw "${more[@]}" > /dev/null
# Discard: whole clusters read as zeros afterwards (what qemu does for a
# qcow2 v3 image), so discard only whole clusters here and model it.
qemu-io -f raw "$uri" -c 'discard 4194304 262144' > io3.out 2>&1 || { cat io3.out; fail "qemu-io discard over NBD failed"; }
dd if=/dev/zero of=expect.raw bs=65536 seek=64 count=4 conv=notrunc status=none
qemu-io -f raw "$uri" -r -c 'read -P 0 4194304 262144' -c 'read -P 0x33 8387584 7680' \
    -c 'read -P 0x22 196000 70000' > io4.out 2>&1 || { cat io4.out; fail "qemu-io read-back over NBD failed"; }
qemu-img compare -q -f raw -F raw "$uri" expect.raw || fail "export differs from the expected disk after qemu-io"
echo "qemu-io over NBD: aligned and unaligned writes, write -z, write -z -u, discard, flush: export as expected"

# qemu-img convert -n writes a whole new disk into the export.
qemu-img convert -n -f raw -O raw new.raw "$uri" || fail "qemu-img convert -n into the export failed"
cp new.raw expect.raw
qemu-img compare -q -f raw -F raw "$uri" new.raw || fail "export differs from the disk qemu-img convert -n wrote"
qemu-io -f raw "$uri" -c 'write -P 0xab 12345 100000' > /dev/null || fail "qemu-io write failed"
qemu-io -f raw expect.raw -c 'write -P 0xab 12345 100000' > /dev/null
echo "qemu-img convert -n -O raw new.raw $uri: identical"
stop_server

# 3. The file: qemu-img check clean, qemu reads the pattern and the
# whole expected disk directly from the qcow2.
check_clean img.qcow2 "after qemu writes"
qemu-io -f qcow2 -r -c 'read -P 0xab 12345 100000' img.qcow2 > io5.out 2>&1 ||
    { cat io5.out; fail "qemu reading the qcow2 directly does not see the pattern"; }
qemu-img compare -q -f qcow2 -F raw img.qcow2 expect.raw || fail "qemu reads a different disk from the qcow2"
echo "after stop: qemu-img check clean; qemu-io -f qcow2 -r reads the 0xab pattern; whole disk as expected"
