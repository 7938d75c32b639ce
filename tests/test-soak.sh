#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Soak: several connections doing mixed reads, writes, zeroes, trims and
# flushes for a bounded time (SOAK_SECONDS, default 40) against one server
# with small caches.  Every read is checked against a mirror, memory must
# stay flat once the caches are full, and the final image must pass
# qemu-img check and compare identical to the mirror.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io
requires_nbd_python
SECONDS_TOTAL=${SOAK_SECONDS:-40}

cd "$TMPDIR_TEST"
$PYTHON -c "
import random
r = random.Random(8)
open('base.raw', 'wb').write(b''.join(r.randbytes(30000) + b'soak test ' * 7000 + bytes(20000) for _ in range(100)))
"
qemu-img convert -c -O qcow2 -o cluster_size=4096,compression_type=zstd base.raw soak.qcow2
truncate -s +200M soak.qcow2
cp base.raw mirror.raw

start_server "$PWD/sock" file soak.qcow2 qcow2-l2-cache-size=256K \
    qcow2-cluster-cache-size=1M qcow2-threads=3
uri=$(nbd_uri "$PWD/sock")

rss () { awk '/^VmRSS/ {print $2}' "/proc/$SERVER_PID/status"; }

round=0
samples=()
start=$(date +%s)
while [ $(( $(date +%s) - start )) -lt "$SECONDS_TOTAL" ]; do
    round=$((round + 1))
    $PYTHON "$top_srcdir/tests/write-workload.py" "$uri" mirror.raw "$((1000 + round))" \
        4 300 4096 > round.out 2>&1 || { cat round.out; fail "round $round failed"; }
    samples+=("$(rss)")
done
kill -0 "$SERVER_PID" || fail "the server died"
stop_server

# Memory: after the first quarter of the rounds the caches are full; from
# then on the server may not keep growing.
n=${#samples[@]}
[ "$n" -ge 4 ] || fail "only $n rounds ran"
early=${samples[$((n / 4))]}
late=${samples[$((n - 1))]}
max=$early
for s in "${samples[@]:$((n / 4))}"; do [ "$s" -gt "$max" ] && max=$s; done
echo "rounds: $round; server RSS (KiB) after the first quarter $early, at the end $late, peak since $max"
[ "$max" -le $((early + 32768)) ] || fail "server memory grew by $((max - early)) KiB after warm-up"

qemu-img check soak.qcow2 > check.out 2>&1 || { cat check.out; fail "qemu-img check failed"; }
grep -q "No errors were found" check.out || { cat check.out; fail "qemu-img check found problems"; }
qemu-img compare -q -f qcow2 -F raw soak.qcow2 mirror.raw || fail "the image differs from the mirror"
echo "soak: $round rounds x 4 connections x 300 operations: check clean, identical"
