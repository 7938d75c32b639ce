#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Durability of the plugin form (nbdkit qcow2zstd FILE): what a flush
# or a FUA request acknowledged survives the server's death.  The crash
# workload (tests/crash-workload.py) writes and zeroes through the
# plugin; the server is killed with SIGKILL after the K-th flush or FUA
# request, at various points.  The image must then pass qemu-img check
# without corruption (leaks allowed), and qemu must read every durable
# operation, and old data wherever nothing was written.  Rounds with
# flushes (and some FUA requests), and rounds where every request has
# FUA and nothing is flushed.  (This kills the process: the page cache
# survives.  Power loss, where it does not, is test-power-loss.sh.)
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"

source "$top_srcdir/tests/crash-functions.sh"
make_base_raw 16 17 "plugin durability "

round=0
for mode in mixed fua; do
    for spec in "zlib 4096 3" "zstd 65536 17" "zstd 4096 40"; do
        read -r comp cs k <<<"$spec"
        round=$((round + 1))
        img=durable-$comp-$cs.qcow2
        rm -f "$img"
        qemu-img convert -c -O qcow2 -o cluster_size=$cs,compression_type=$comp base.raw "$img"
        # No room added: the plugin grows the file as it writes.
        start_nbdkit "$PWD/sock" "$PLUGIN" "$img" qcow2-threads=2
        kill_round "$round" "$k" "$mode" "0.0$(( round % 4 ))"
        [ "$WHEN" = mid-workload ] || fail "round $round: the workload ended before the kill"
        check_after_kill "$img" "$mode $comp cluster $cs"
        echo "plugin, $mode, $comp cluster $cs, killed after $k durable points: $RESULT"
    done
done
