#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Randomized write workloads (fixed seeds): writes of random sizes and
# offsets, zeroes, trims and flushes from several connections at once,
# over compressed images of every cluster size, both compression types
# and refcount widths 1, 16 and 64.  Afterwards the image must pass
# qemu-img check with no error and no leak, and qemu-img compare must find
# it identical to a raw file that received the same operations.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io
requires_nbd_python

cd "$TMPDIR_TEST"

# Source disk: random, text and zero regions; a size that is not a
# multiple of any cluster size.
mixed_disk base.raw $((6 * 1024 * 1024 + 3 * 512)) 3

seed=1
for cs in 512 4096 65536 2097152; do
    for comp in zlib zstd; do
        for rb in 1 16 64; do
            # Fewer operations where every partial write rewrites 2 MiB.
            ops=600
            [ "$cs" = 2097152 ] && ops=150
            [ "$cs" = 512 ] && ops=400
            img=img.qcow2
            rm -f "$img"
            qemu-img convert -c -O qcow2 \
                -o "cluster_size=$cs,compression_type=$comp,refcount_bits=$rb" \
                base.raw "$img"
            # Room to allocate: a filter cannot grow the file.
            truncate -s +24M "$img"
            cp base.raw mirror.raw
            start_server "$PWD/sock" file "$img"
            $PYTHON "$top_srcdir/tests/write-workload.py" \
                "$(nbd_uri "$PWD/sock")" mirror.raw "$seed" 3 "$ops" "$cs" \
                > workload.out || { cat workload.out "$PWD/sock.log"; fail "workload failed ($cs $comp $rb)"; }
            stop_server
            if ! qemu-img check "$img" > check.out 2>&1; then
                cat check.out
                fail "qemu-img check failed (cluster $cs, $comp, refcount_bits $rb)"
            fi
            grep -q "No errors were found" check.out ||
                { cat check.out; fail "qemu-img check found problems ($cs $comp $rb)"; }
            if grep -qi "leak" check.out; then
                cat check.out; fail "leaked clusters ($cs $comp $rb)"
            fi
            qemu-img compare -q -f qcow2 -F raw "$img" mirror.raw ||
                fail "image differs from the mirror (cluster $cs, $comp, refcount_bits $rb)"
            echo "cluster $cs $comp refcount_bits $rb: 3 connections x $ops ops: check clean, identical"
            seed=$((seed + 1))
        done
    done
done

# A stream of writes with no flush from the client: the filter flushes
# the plugin itself after each 64 MiB written (so that the final flush
# does not wait for all of it).  The log filter under it sees the
# flushes while the client is still connected and has not flushed.
# Then 80 MiB more in 4 KiB writes scattered over the disk: small writes
# never flush early (a flush per 64 MiB of them halved the rate of 4 KiB
# random writes into a local file).
if ! nbdkit --filter=log null --dump-plugin >/dev/null 2>&1; then
    skip_section "early flush: nbdkit has no log filter"
    exit 0
fi
rm -f stream.qcow2 stream.log
truncate -s 256M stream.qcow2
start_server "$PWD/sock" --filter=log file stream.qcow2 logfile="$PWD/stream.log" \
    qcow2-create=200M qcow2-compress=false
$PYTHON - "$(nbd_uri "$PWD/sock")" stream.log <<'EOF' || fail "early flush: see above"
import nbd, os, sys

def flushes():
    # Requests only ("Flush id=N ..."), not the "...Flush id=N return" lines.
    return sum(" Flush id=" in line for line in open(sys.argv[2]))

h = nbd.NBD()
h.connect_uri(sys.argv[1])
before = flushes()              # those of qcow2-create
chunk = os.urandom(4 << 20)
for off in range(0, 200 << 20, 4 << 20):
    h.pwrite(chunk, off)
n = flushes() - before
print("early flush: %d flushes of the plugin during 200 MiB of writes" % n)
if n < 2:
    sys.exit("expected at least 2 flushes (one per 64 MiB written), saw %d" % n)
before = flushes()
small = os.urandom(4096)
for i in range(20480):
    h.pwrite(small, (i * 7919 % 51200) * 4096)
n = flushes() - before
print("early flush: %d flushes of the plugin during 80 MiB of 4 KiB writes" % n)
if n != 0:
    sys.exit("4 KiB writes flushed the plugin early %d times" % n)
h.shutdown()
EOF
stop_server
qemu-img check stream.qcow2 > check.out 2>&1 || { cat check.out; fail "early flush: qemu-img check failed"; }
