#!/usr/bin/env bash
# Debug flags: -D qcow2zstd.image=1 (opening), .map=1 (each request),
# .pool=1 (each batch of the pool), .stats=1 (counters at close), for the
# filter and the plugin.  Each must print its lines, and only when set.
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy

cd "$TMPDIR_TEST"
{ for _ in $(seq 60); do cat "$top_srcdir/tests/functions.sh"; done; head -c 1M /dev/urandom; } > src.raw
qemu-img convert -c -O qcow2 -o compression_type=zstd src.raw img.qcow2

for form in filter plugin; do
    if [ $form = filter ]; then stack=(--filter="$FILTER" file img.qcow2)
    else stack=("$PLUGIN" img.qcow2); fi

    run_nbdkit -f -v -r -U - -D qcow2zstd.image=1 -D qcow2zstd.map=1 \
        -D qcow2zstd.pool=1 -D qcow2zstd.stats=1 "${stack[@]}" qcow2-threads=2 \
        --run 'nbdcopy "$uri" null:' 2> debug.log
    grep -q "qcow2zstd: qcow2 v3, cluster size 65536" debug.log || fail "$form: no image line"
    grep -q "qcow2zstd: read 0x0+[0-9]*: .* compressed" debug.log || fail "$form: no map line"
    grep -q "qcow2zstd: pool: [0-9]* clusters in [0-9]* jobs, [0-9]* run by the calling thread" debug.log ||
        fail "$form: no pool line"
    grep -q "qcow2zstd: stats for .*clusters decompressed.*% hits" debug.log || fail "$form: no stats line"

    run_nbdkit -f -v -r -U - "${stack[@]}" --run 'nbdcopy "$uri" null:' 2> quiet.log
    if grep -q "qcow2zstd: \(qcow2 v3\|read 0x\|pool:\|stats for\)" quiet.log; then
        fail "$form: debug lines without the flags"
    fi
    echo "$form: image, map, pool and stats debug lines appear with their flags only"
done
