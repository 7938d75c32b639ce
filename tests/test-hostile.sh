#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Hostile images: 1000 mutations of qemu-made images (bit flips,
# truncation, header fields set to hostile values, L1 and L2 pointers to
# the header, to themselves, past the end, shared L2 tables, reserved
# bits, compressed descriptors past EOF or into metadata, refcount table
# and blocks damaged or overlapping other structures, huge sizes, bogus
# snapshot tables).  Each is read through a read-only server and written
# through a read-write one.  The servers must never die or hang, and
# writes must never turn an image that qemu-img check found clean into
# one it finds corrupt.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io
requires_nbd_python
COUNT=${HOSTILE_COUNT:-1000}

cd "$TMPDIR_TEST"
mkdir seeds ro rw

# Small seeds of every kind, so that each mutation is cheap to serve.
$PYTHON -c "
import random
r = random.Random(9)
open('src.raw', 'wb').write(r.randbytes(60000) + b'hostile ' * 20000 + bytes(50000) + r.randbytes(30000))
"
n=0
for cs in 512 4096 65536; do
    for opts in "compat=0.10" "compat=1.1,compression_type=zlib" "compat=1.1,compression_type=zstd"; do
        n=$((n + 1))
        qemu-img convert -c -O qcow2 -o "cluster_size=$cs,$opts" src.raw "seeds/c$cs-$n.qcow2"
        qemu-io -f qcow2 -c "write -P 7 200000 70000" -c "write -z 100000 9000" \
            "seeds/c$cs-$n.qcow2" > /dev/null
        truncate -s +256K "seeds/c$cs-$n.qcow2"
    done
done

$PYTHON "$top_srcdir/tests/hostile.py" make seeds ro "$COUNT" 20261130
cp ro/* rw/
ls ro > names.txt

# nbdkit's file plugin with dir= serves every file as an export of that
# name; the filter keeps one image per export.
start_server "$PWD/ro.sock" -r file dir="$PWD/ro"
ro_pid=$SERVER_PID
start_server "$PWD/rw.sock" file dir="$PWD/rw"
rw_pid=$SERVER_PID

rc=0
xargs -a names.txt $PYTHON "$top_srcdir/tests/hostile.py" run \
    "$PWD/ro.sock" "$PWD/rw.sock" "$PWD/rw" > results.txt || rc=$?

kill -0 "$ro_pid" || fail "the read-only server died"
kill -0 "$rw_pid" || fail "the read-write server died"
if grep -E "Assertion|AddressSanitizer|runtime error|Segmentation|LeakSanitizer" \
        "$PWD/ro.sock.log" "$PWD/rw.sock.log"; then
    fail "a server log shows a crash or a sanitizer report"
fi
grep -E "HANG|CORRUPTED-BY-WRITES" results.txt && fail "see the lines above"
[ "$rc" = 0 ] || { tail -5 results.txt; fail "the client failed (exit $rc)"; }
[ "$(wc -l < results.txt)" = "$COUNT" ] || fail "only $(wc -l < results.txt) of $COUNT images ran"
# Every image was tried; the results must include both images refused at
# open and images served, or the mutations are not exercising anything.
served=$(grep -c "read-errors=" results.txt || true)
refused=$(grep -c " refused " results.txt || true)
valid=$(grep -c "check-before=0" results.txt || true)
[ "$served" -gt 0 ] && [ "$refused" -gt 0 ] || fail "served $served, refused $refused"
echo "$COUNT hostile images: $served served for reading, $refused refused at open,"
echo "$valid valid before writing and none corrupted by writes; servers alive"
for kind in $(sed -E 's/^[0-9]+-([a-z0-9-]+)-c[0-9]+-.*/\1/' names.txt | sort -u); do
    echo "  $kind: $(grep -c -- "-$kind-c" names.txt)"
done
