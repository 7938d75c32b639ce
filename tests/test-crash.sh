#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Crash safety: kill -9 the server at random points of a write workload
# (tests/crash-workload.py).  Every image afterwards must pass qemu-img
# check without corruption (leaked clusters are allowed) and hold every
# write and zero that a completed flush covered or that had FUA; bytes
# never written keep their old content.  The client must have been
# working when the kill came, and die of it.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io
requires_nbd_python

cd "$TMPDIR_TEST"

source "$top_srcdir/tests/crash-functions.sh"
make_base_raw 32 11 "crash test text "

mid=0
for round in 1 2 3 4 5 6 7 8; do
    for comp in zlib zstd; do
        img=crash-$comp.qcow2
        cs=$(( round % 2 ? 4096 : 65536 ))
        qemu-img convert -c -O qcow2 -o cluster_size=$cs,compression_type=$comp base.raw "$img"
        truncate -s +40M "$img"
        start_server "$PWD/sock" file "$img"
        # The kill point: after the K-th durable point (K from 1 to 40).
        k=$(( 1 + (round * 7919 + ${#comp} * 104729) % 40 ))
        kill_round "$round" "$k" mixed "0.0$(( (round * 31 + ${#comp}) % 50 / 10 ))$(( round % 10 ))"
        if [ "$WHEN" = mid-workload ]; then mid=$((mid + 1)); fi
        check_after_kill "$img" "round $round $comp"
        echo "round $round $comp (cluster $cs): killed $WHEN; $RESULT"
    done
done
# The kills must mostly land inside the workload, or this tests nothing.
[ "$mid" -ge 10 ] || fail "only $mid of 16 kills landed mid-workload"
