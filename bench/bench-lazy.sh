#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Lazy refcounts: allocating writes with and without them, through the
# filter and through qemu-nbd, in one run.
#
#   bench/bench-lazy.sh                 full run (5 runs)
#   BENCH_QUICK=1 bench/bench-lazy.sh   smoke run (3 runs, fewer writes)
#
# Every run starts from a fresh, empty plain qcow2 of BENCH_LAZY_SIZE (64
# KiB clusters, given room with truncate) and fresh servers, on a device
# that answers reads and writes in BENCH_SLOW_DELAY: nbdkit's delay
# filter over the file plugin, a server of its own, which the filter
# (over nbdkit's nbd plugin) and qemu-nbd open over NBD alike.  (The
# delay filter in the filter's own stack would refuse the writes of its
# last close: it ends its sleeps once the connection closes.)  The job: fio
# --ioengine=nbd, one connection, 4 KiB random writes at QD16, each block
# at most once over the whole disk (so nearly every write allocates a
# cluster), BENCH_LAZY_WRITES of them, with a flush after every
# BENCH_LAZY_FSYNC writes (the flushes are where the refcounts cost: each
# writes the changed refcount blocks and flushes once more before the L2
# tables) and one at the end, all inside fio's timing.  Contenders:
#   filter        nbdkit --filter=qcow2zstd nbd socket=DEVICE
#   filter-lazy   the same with qcow2-lazy-refcounts=on
#   qemu          qemu-nbd -f qcow2 --cache=writeback over the device
#   qemu-lazy     the same, the image made with -o lazy_refcounts=on
# They alternate, and which goes first turns with every repetition.
# fio reads every block back after its final flush and checks it
# (verify=crc32c; the reads are not in the write rate), and after every
# run qemu-img check must be clean and the dirty bit clear.  (fio's
# block order is not a data check here: with flushes among the writes,
# which blocks a run writes varies from server to server.)
#
# Knobs (environment): BENCH_RUNS, BENCH_DIR, BENCH_QUICK (common.sh);
#   BENCH_LAZY_SIZE=SIZE     the disk (default 4G)
#   BENCH_LAZY_WRITES=N      4 KiB writes per run (8192, quick 2048)
#   BENCH_LAZY_FSYNC=N       a flush after every N writes (default 64)
#   BENCH_SLOW_DELAY=1ms     the device's answer time

source "$(dirname "${BASH_SOURCE[0]}")/common-write.sh"

: "${BENCH_LAZY_SIZE:=4G}"
if [ "$BENCH_QUICK" = 1 ]; then
    : "${BENCH_LAZY_WRITES:=2048}"
else
    : "${BENCH_LAZY_WRITES:=8192}"
fi
: "${BENCH_LAZY_FSYNC:=64}"
: "${BENCH_SLOW_DELAY:=1ms}"

need_cmds nbdkit qemu-nbd qemu-img nbdinfo fio python3 numfmt
bench_setup lazy

CONTENDERS=(filter filter-lazy qemu qemu-lazy)
declare -A LABEL=([filter]="qcow2zstd filter" [filter-lazy]="qcow2zstd, qcow2-lazy-refcounts=on"
                  [qemu]="qemu-nbd" [qemu-lazy]="qemu-nbd, lazy_refcounts=on")
SIZE=$(to_bytes "$BENCH_LAZY_SIZE")
DELAY=("delay-read=$BENCH_SLOW_DELAY" "delay-write=$BENCH_SLOW_DELAY")
FAILED=0

# fio_args URI OUTPUT: the job, the same for every contender.
fio_args ()
{
    FIO=(fio --name=alloc --ioengine=nbd --uri="$1" --rw=randwrite --bs=4k
         --iodepth=16 --size="$SIZE" --number_ios="$BENCH_LAZY_WRITES"
         --randrepeat=1 --fsync="$BENCH_LAZY_FSYNC" --end_fsync=1
         --verify=crc32c --do_verify=1 --verify_fatal=1
         --verify_state_save=0 --output-format=json
         --output="$2")
}

# measure KIND REP: one run of the job against KIND; appends "IOPS" to
# $RES_DIR/KIND.
measure ()
{
    local kind=$1 rep=$2 img=$RUN_DIR/$1.qcow2 json=$RUN_DIR/$1.json
    local rc=0 res opts=() dev_pid
    [ "$kind" = qemu-lazy ] && opts=(-o lazy_refcounts=on)
    rm -f "$img"
    qemu-img create -q -f qcow2 -o cluster_size=65536 "${opts[@]}" "$img" "$SIZE"
    # Room for every cluster the writes can touch, and metadata (the
    # device, nbdkit's file plugin, cannot grow the file).
    truncate -s +$((BENCH_LAZY_WRITES * 65536 + 64 * 1048576)) "$img"
    start_command "$kind-device" nbdkit -f -U SOCK --filter=delay \
        file "$img" "${DELAY[@]}"
    dev_pid=$SERVER_PID
    case $kind in
        filter|filter-lazy)
            local lazy=()
            [ "$kind" = filter-lazy ] && lazy=(qcow2-lazy-refcounts=on)
            start_command "$kind" nbdkit -f -U SOCK --filter="$FILTER" \
                nbd socket="$SERVER_SOCK" "${lazy[@]}" ;;
        qemu|qemu-lazy)
            start_command "$kind" qemu-nbd -f qcow2 --cache=writeback \
                --persistent -k SOCK "$SERVER_URI" ;;
    esac
    fio_args "$SERVER_URI" "$json"
    (cd "$RUN_DIR" && exec "${FIO[@]}") >>"$RUN_DIR/fio.log" 2>&1 || rc=$?
    server_alive
    stop_server
    SERVER_PID=$dev_pid
    stop_server
    [ "$rc" -eq 0 ] || die "fio failed (status $rc) against ${LABEL[$kind]}"
    res=$(fio_json_write "$json") || die "no result from fio (${LABEL[$kind]})"
    echo "${res%% *}" >> "$RES_DIR/$kind"
    if ! qemu-img check -q "$img" >>"$RUN_DIR/check.log" 2>&1; then
        msg "${LABEL[$kind]}, run $rep: qemu-img check is not clean"
        FAILED=1
    fi
    if [ $(( $(od -An -tu8 --endian=big -j 72 -N 8 "$img" | tr -d ' ') & 1 )) = 1 ]; then
        msg "${LABEL[$kind]}, run $rep: the dirty bit is still set after the close"
        FAILED=1
    fi
    rm -f "$img"
}

print_machine "qcow2zstd lazy refcounts benchmark"
echo "Disk: empty plain qcow2 of $BENCH_LAZY_SIZE, 64k clusters; device: nbdkit --filter=delay file IMG ${DELAY[*]}, opened over NBD by nbdkit --filter=qcow2zstd nbd and by qemu-nbd"
echo "Job: fio --ioengine=nbd, 1 connection, randwrite 4k QD16, $BENCH_LAZY_WRITES writes (each block at most once), a flush every $BENCH_LAZY_FSYNC writes and at the end, inside the timing"
echo "Runs: $BENCH_RUNS, contenders alternating (and which goes first turning)"
for rep in $(seq "$BENCH_RUNS"); do
    turns "$rep" "${CONTENDERS[@]}"
    for k in "${ORDER[@]}"; do
        msg "repetition $rep/$BENCH_RUNS: ${LABEL[$k]}"
        measure "$k" "$rep"
    done
done

echo
printf '  %-40s %12s %14s\n' contender "median IOPS" "range"
for k in "${CONTENDERS[@]}"; do
    printf '  %-40s %12s %14s\n' "${LABEL[$k]}" \
        "$(fmt 0 "$(median < "$RES_DIR/$k")")" "$(sort -g "$RES_DIR/$k" | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.0f-%.0f", lo, hi }')"
done
m () { median < "$RES_DIR/$1"; }
echo
echo "Targets (informational):"
target "filter lazy/filter" "$(ratio "$(m filter-lazy)" "$(m filter)")" ">=" 1.0
target "filter lazy/qemu-nbd lazy" "$(ratio "$(m filter-lazy)" "$(m qemu-lazy)")" ">=" 1.0
target "filter/qemu-nbd" "$(ratio "$(m filter)" "$(m qemu)")" ">=" 1.0
if [ "$FAILED" = 1 ]; then
    echo
    echo "FAILED: a check after a run did not pass (see above)"
    exit 1
fi
