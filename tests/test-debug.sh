#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Debug flags: -D qcow2zstd.image=1 (opening), .map=1 (each request),
# .pool=1 (each batch of the pool), .stats=1 (counters at close), for the
# filter and the plugin.  Each must print its lines, and only when set.
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy

cd "$TMPDIR_TEST"
{ for _ in $(seq 60); do cat "$top_srcdir/tests/functions.sh"; done; head -c 1M /dev/urandom; } > src.raw
qemu-img convert -c -O qcow2 -o compression_type=zstd src.raw img.qcow2

# On a miss, show what the server did print, so that a failure in CI says
# which line was absent and why.
expect_line ()
{
    local form="$1" what="$2" pattern="$3"
    if ! grep -q "$pattern" debug.log; then
        grep "qcow2zstd\|nbdcopy\|error" debug.log | tail -n 60 >&2
        fail "$form: no $what line"
    fi
}

for form in filter plugin; do
    if [ $form = filter ]; then stack=(--filter="$FILTER" file img.qcow2)
    else stack=("$PLUGIN" img.qcow2); fi

    run_nbdkit -f -v -r -U - -D qcow2zstd.image=1 -D qcow2zstd.map=1 \
        -D qcow2zstd.pool=1 -D qcow2zstd.stats=1 "${stack[@]}" qcow2-threads=2 \
        --run 'nbdcopy "$uri" null:' 2> debug.log
    expect_line $form image "qcow2zstd: qcow2 v3, cluster size 65536"
    expect_line $form map "qcow2zstd: read 0x0+[0-9]*: .* compressed"
    expect_line $form pool \
        "qcow2zstd: pool: [0-9]* clusters in [0-9]* jobs, [0-9]* run by the calling thread"
    expect_line $form stats "qcow2zstd: stats for .*clusters decompressed.*% hits"

    run_nbdkit -f -v -r -U - "${stack[@]}" --run 'nbdcopy "$uri" null:' 2> quiet.log
    if grep -q "qcow2zstd: \(qcow2 v3\|read 0x\|pool:\|stats for\)" quiet.log; then
        fail "$form: debug lines without the flags"
    fi
    echo "$form: image, map, pool and stats debug lines appear with their flags only"
done
