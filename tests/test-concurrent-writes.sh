#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Several connections write overlapping ranges of the same few clusters
# at once, over storage slow enough that they overlap: writes of whole
# and partial clusters, zeroes, trims, FUA requests and flushes, plain
# and compressed, over a backing file, through a small L2 cache,
# encrypted, and with a snapshot sharing every cluster.  The final disk,
# read by qemu, must be what some order of the requests makes
# (tests/concurrent-writes.py says precisely what is checked), and
# qemu-img check must be clean.
# CONCURRENT_WRITES_OPS sets the requests per connection.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-img
requires_nbd_python

cd "$TMPDIR_TEST"
OPS=${CONCURRENT_WRITES_OPS:-400}
CONNECTIONS=4
QEMU_OPEN=()
script=$top_srcdir/tests/concurrent-writes.py

# one_run NAME CLUSTER_SIZE CLUSTERS IMAGE [FILTER ARGS...]: the
# workload against IMAGE (made from initial-NAME.raw), then the checks.
one_run ()
{
    local name=$1 cs=$2 clusters=$3 img=$4 pids=() logs=() i
    shift 4
    # Storage that takes a moment to answer (nbdkit's delay filter under
    # ours) keeps requests in flight together, so that they overlap.
    start_server "$PWD/sock-$name" --filter=delay file "$img" \
        delay-read=2ms delay-write=2ms qcow2-threads=2 "$@"
    local uri
    uri=$(nbd_uri "$PWD/sock-$name")
    for i in $(seq "$CONNECTIONS"); do
        $PYTHON "$script" run "$uri" "log-$name.$i" 15 "$i" "$OPS" "$cs" \
            $((cs * clusters)) > "out-$name.$i" 2>&1 & pids+=($!)
        logs+=("log-$name.$i")
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { cat "out-$name.$((i + 1))"; fail "$name: connection $((i + 1)) failed"; }
    done
    cat "out-$name".*
    kill -0 "$SERVER_PID" || fail "$name: the server died"
    stop_server
    if grep -E "AddressSanitizer|runtime error|Assertion" "$PWD/sock-$name.log"; then
        fail "$name: the server log shows a crash"
    fi
    # QEMU_OPEN: how qemu opens the image, when the name is not enough.
    local open=("$img")
    [ "${#QEMU_OPEN[@]}" = 0 ] || open=("${QEMU_OPEN[@]}")
    qemu-img check "${open[@]}" > check.out 2>&1 || { cat check.out; fail "$name: qemu-img check failed"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "$name: qemu-img check found problems"; }
    qemu-img convert -O raw "${open[@]}" "final-$name.raw"
    $PYTHON "$script" check "final-$name.raw" "initial-$name.raw" "$cs" "${logs[@]}" ||
        fail "$name: the final disk is not what an order of the requests makes"
    echo "$name: $CONNECTIONS connections x $OPS requests: check clean, explained"
}

# Plain, 64 KiB clusters, over a backing file that holds the initial
# content: every partial write copies the rest from the backing file.
$PYTHON "$script" initial initial-backing.raw 65536 $((12 * 65536))
qemu-img convert -q -O qcow2 initial-backing.raw base.qcow2
qemu-img create -q -f qcow2 -b "$PWD/base.qcow2" -F qcow2 top.qcow2
truncate -s +64M top.qcow2
one_run backing 65536 12 top.qcow2

# Compressed, 4 KiB clusters, from a compressed image: partial writes
# decompress the old cluster, whole ones are compressed and packed.
$PYTHON "$script" initial initial-compressed.raw 4096 $((48 * 4096))
qemu-img convert -q -c -O qcow2 -o cluster_size=4096,compression_type=zstd \
    initial-compressed.raw compressed.qcow2
truncate -s +16M compressed.qcow2
one_run compressed 4096 48 compressed.qcow2 qcow2-compress=true

# Plain, 4 KiB clusters, no L2 cache: every lookup of a table that is
# not being changed reads it, while writebacks write and retire tables.
$PYTHON "$script" initial initial-plain.raw 4096 $((48 * 4096))
qemu-img convert -q -O qcow2 -o cluster_size=4096 initial-plain.raw plain.qcow2
truncate -s +16M plain.qcow2
one_run plain 4096 48 plain.qcow2 qcow2-l2-cache-size=0

# Encrypted (LUKS), 4 KiB clusters: every write in place claims its
# clusters, copies decrypt the old content, zeroes are encrypted too.
$PYTHON "$script" initial initial-luks.raw 4096 $((48 * 4096))
printf '%s' "concurrent secret" > pass.txt
QEMU_OPEN=(--object "secret,id=s0,file=$PWD/pass.txt" --image-opts
           "driver=qcow2,file.filename=$PWD/luks.qcow2,encrypt.key-secret=s0")
qemu_img_luks convert -q -O qcow2 --object "secret,id=s0,file=$PWD/pass.txt" \
    -o cluster_size=4096,encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 \
    initial-luks.raw luks.qcow2
truncate -s +16M luks.qcow2
one_run luks 4096 48 luks.qcow2 qcow2-passphrase=+pass.txt
QEMU_OPEN=()

# With a snapshot of the initial content: every cluster and L2 table is
# shared at first, so writes copy them, and the snapshot stays as it was.
$PYTHON "$script" initial initial-snap.raw 4096 $((48 * 4096))
qemu-img convert -q -O qcow2 -o cluster_size=4096 initial-snap.raw snap.qcow2
qemu-img snapshot -c before snap.qcow2
truncate -s +16M snap.qcow2
one_run snap 4096 48 snap.qcow2
qemu-img convert -O raw -l snapshot.name=before snap.qcow2 snap-before.raw
cmp snap-before.raw initial-snap.raw || fail "snap: the snapshot changed"
echo "snap: the snapshot still holds the initial content"
