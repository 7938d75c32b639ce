#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Soak: several connections doing mixed reads, writes, zeroes, trims and
# flushes for a bounded time (SOAK_SECONDS, default 40, and at least 80
# rounds) against one server with small caches.  Every read is checked
# against a mirror, memory must stay flat once the caches are full, and
# the final image must pass qemu-img check and compare identical to the
# mirror.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io
requires_nbd_python
SECONDS_TOTAL=${SOAK_SECONDS:-40}
# Memory is judged in rounds, not in time: the caches fill within a few
# rounds, but under the sanitizers their runtime's own state (TSan's
# shadow of every heap address the allocator has handed out) grows for
# the first ~40 rounds before it levels off, and a slow machine runs
# fewer rounds in the same time.  Measured here over 80 s: the gcc build
# stayed between 9 and 22 MiB for 520 rounds; the TSan build grew from
# 77 to 163 MiB by round 40 and by 10 MiB over the next 40.  So the run
# lasts at least WARMUP_ROUNDS + MEASURED_ROUNDS rounds, whatever the
# clock says, and growth is counted from the end of the warm-up.
WARMUP_ROUNDS=40
MEASURED_ROUNDS=40

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
while [ $(( $(date +%s) - start )) -lt "$SECONDS_TOTAL" ] ||
      [ "$round" -lt $((WARMUP_ROUNDS + MEASURED_ROUNDS)) ]; do
    round=$((round + 1))
    $PYTHON "$top_srcdir/tests/write-workload.py" "$uri" mirror.raw "$((1000 + round))" \
        4 300 4096 > round.out 2>&1 || { cat round.out; fail "round $round failed"; }
    samples+=("$(rss)")
done
kill -0 "$SERVER_PID" || fail "the server died"
stop_server

# Memory: after the warm-up (or the first quarter of a longer run) the
# server may not keep growing.
n=${#samples[@]}
[ "$n" -ge $((WARMUP_ROUNDS + MEASURED_ROUNDS)) ] || fail "only $n rounds ran"
from=$((n / 4 > WARMUP_ROUNDS ? n / 4 : WARMUP_ROUNDS))
early=${samples[$from]}
late=${samples[$((n - 1))]}
max=$early
for s in "${samples[@]:$from}"; do [ "$s" -gt "$max" ] && max=$s; done
echo "rounds: $round; server RSS (KiB) after round $((from + 1)) $early, at the end $late, peak since $max"
[ "$max" -le $((early + 32768)) ] || fail "server memory grew by $((max - early)) KiB after warm-up"

qemu-img check soak.qcow2 > check.out 2>&1 || { cat check.out; fail "qemu-img check failed"; }
grep -q "No errors were found" check.out || { cat check.out; fail "qemu-img check found problems"; }
qemu-img compare -q -f qcow2 -F raw soak.qcow2 mirror.raw || fail "the image differs from the mirror"
echo "soak: $round rounds x 4 connections x 300 operations: check clean, identical"
