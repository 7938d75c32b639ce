#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Stall benchmark: does a guest's trim, or an L2 cache smaller than the
# disk's tables, hold up the other requests for device round trips?
#
#   bench/bench-stalls.sh                 full run (3 runs of 20 s per job)
#   BENCH_QUICK=1 bench/bench-stalls.sh   smoke run (1 run of 8 s)
#
# On a slow device (nbdkit's delay filter: every read, write and trim
# answered after $BENCH_STALL_DELAY), a fully allocated plain qcow2 of
# random data with 16 KiB clusters (so that a small disk has many L2
# tables: one per 32 MiB), served writable with discards passed down
# (the filter's qcow2-discard=unmap, qemu-nbd's --discard=unmap).  Its
# layout (BENCH_STALL_LAYOUT): "runs", as qemu-img convert writes it
# (each table's clusters consecutive in the file, so each table is one
# run, which the filter keeps in 8 bytes once read), or "scattered",
# written by fio in random order of clusters through qemu-nbd, each
# cluster once (no table is a run: every table must be read again
# once the cache has let it go).  The
# measured job: 4 KiB random reads and writes, 50/50, QD16, one
# connection, fio --ioengine=nbd, time based, no flush.  Three ways:
#   plain     the job alone
#   trims     the job, and beside it (same fio run, second connection) a
#             trim of 1 MiB at a random place every 100 ms
#   small-l2  the job alone, with an L2 cache of an eighth of the disk's
#             L2 tables (qcow2-l2-cache-size=, qemu's l2-cache-size=)
# for the filter (nbdkit --filter=qcow2zstd nbd socket=DEVICE),
# optionally a second build of it (BENCH_FILTER2), and qemu-nbd (qcow2
# over its nbd driver), each over the delayed device served apart
# (nbdkit --filter=delay file IMG, the qcow2 bytes).  Each run starts from a
# fresh copy of the image and a fresh server.  Printed: the job's IOPS
# (reads and writes, the trims apart), medians, and for each contender
# trims/plain and small-l2/plain; qemu-img check must be clean after
# every run.
#
# Knobs: BENCH_RUNS (3, quick 1), BENCH_STALL_LAYOUT (runs or scattered),
# BENCH_STALL_SIZE (512M),
# BENCH_STALL_RUNTIME (20, quick 8), BENCH_STALL_DELAY (1ms),
# BENCH_FILTER2=PATH (another build of the filter, one more contender),
# BENCH_DIR, FILTER (see common.sh).

runs=${BENCH_RUNS:-}
source "$(dirname "${BASH_SOURCE[0]}")/common-write.sh"

if [ "$BENCH_QUICK" = 1 ]; then
    : "${BENCH_STALL_SIZE:=512M}"
    : "${BENCH_STALL_RUNTIME:=8}"
    BENCH_RUNS=${runs:-1}
else
    : "${BENCH_STALL_SIZE:=512M}"
    : "${BENCH_STALL_RUNTIME:=20}"
    BENCH_RUNS=${runs:-3}
fi
: "${BENCH_STALL_DELAY:=1ms}"
: "${BENCH_STALL_LAYOUT:=runs}"
case $BENCH_STALL_LAYOUT in
    runs|scattered) ;;
    *) die "BENCH_STALL_LAYOUT=$BENCH_STALL_LAYOUT: runs or scattered" ;;
esac
FILTER2=${BENCH_FILTER2:-}
need_cmds nbdkit qemu-nbd qemu-img fio nbdinfo
bench_setup stalls

SIZE=$(to_bytes "$BENCH_STALL_SIZE")
CLUSTER=16384
# One L2 table maps CLUSTER / 8 entries of CLUSTER bytes each.
L2_TABLES=$(( (SIZE + CLUSTER * (CLUSTER / 8) - 1) / (CLUSTER * (CLUSTER / 8)) ))
SMALL_L2=$(( L2_TABLES / 8 * CLUSTER ))
[ "$SMALL_L2" -ge $((2 * CLUSTER)) ] ||
    die "BENCH_STALL_SIZE=$BENCH_STALL_SIZE is too small: an eighth of its $L2_TABLES L2 tables is under two (qemu's least L2 cache)"
DELAYS=("delay-read=$BENCH_STALL_DELAY" "delay-write=$BENCH_STALL_DELAY"
        "delay-trim=$BENCH_STALL_DELAY")

dir=$BENCH_DIR/stalls-$BENCH_STALL_SIZE
mkdir -p "$dir"
if [ "$BENCH_STALL_LAYOUT" = runs ]; then
    IMAGE=$dir/plain16k.qcow2
else
    IMAGE=$dir/plain16k-scattered.qcow2
fi
if [ ! -s "$IMAGE" ] && [ "$BENCH_STALL_LAYOUT" = runs ]; then
    msg "making $BENCH_STALL_SIZE of random data and a plain qcow2 of it (16k clusters)"
    head -c "$SIZE" /dev/urandom > "$dir/raw.tmp"
    qemu-img convert -O qcow2 -o cluster_size=16k "$dir/raw.tmp" "$IMAGE.tmp"
    rm -f "$dir/raw.tmp"
    mv "$IMAGE.tmp" "$IMAGE"
elif [ ! -s "$IMAGE" ]; then
    msg "writing a plain qcow2 of $BENCH_STALL_SIZE (16k clusters) in random order of clusters"
    qemu-img create -q -f qcow2 -o cluster_size=16k "$IMAGE.tmp" "$SIZE"
    start_command layout qemu-nbd -f qcow2 --cache=writeback --persistent \
        -k SOCK "$IMAGE.tmp"
    (cd "$RUN_DIR" && exec fio --ioengine=nbd --uri="$SERVER_URI" \
        --size="$SIZE" --name=layout --rw=randwrite --bs=16k --iodepth=1 \
        --randrepeat=1 --refill_buffers) >"$RUN_DIR/layout.log" 2>&1 ||
        { cat "$RUN_DIR/layout.log"; die "fio could not write the scattered image"; }
    stop_server
    mv "$IMAGE.tmp" "$IMAGE"
fi
WORK=$RUN_DIR/work.qcow2

CONTENDERS=(filter qemu)
[ -z "$FILTER2" ] || CONTENDERS=(filter filter2 qemu)
declare -A LABEL=([filter]="qcow2zstd" [filter2]="qcow2zstd (2)" [qemu]="qemu-nbd")
JOBS=(plain trims small-l2)

DEV_PID=
# serve KIND JOB: the working copy on the slow device, a server of its
# own (so that its sleeps cannot cut the writes a server makes as it
# closes), and KIND over it.
serve ()
{
    local kind=$1 job=$2 so=$FILTER l2=() dev_sock opts
    [ "$kind" = filter2 ] && so=$FILTER2
    start_command device nbdkit -f -U SOCK --filter=delay file "$WORK" \
        "${DELAYS[@]}"
    DEV_PID=$SERVER_PID
    dev_sock=$SERVER_SOCK
    case $kind in
        filter|filter2)
            [ "$job" = small-l2 ] && l2=("qcow2-l2-cache-size=$SMALL_L2")
            start_command "$kind" nbdkit -f -U SOCK --filter="$so" \
                nbd socket="$dev_sock" qcow2-discard=unmap "${l2[@]}" ;;
        qemu)
            opts="driver=qcow2,file.driver=nbd,file.server.type=unix,file.server.path=$dev_sock"
            [ "$job" = small-l2 ] && opts+=",l2-cache-size=$SMALL_L2"
            start_command qemu qemu-nbd --image-opts --cache=writeback \
                --discard=unmap --persistent -k SOCK "$opts" ;;
    esac
}

unserve ()
{
    stop_server
    if [ -n "$DEV_PID" ]; then
        SERVER_PID=$DEV_PID SERVER_SOCK=$RUN_DIR/device.sock
        stop_server
        DEV_PID=
    fi
}

# measure KIND JOB: one run; appends the job's IOPS to $RES_DIR/JOB.KIND.
measure ()
{
    local kind=$1 job=$2 json=$RUN_DIR/$1-$2.json rc=0 trim=() out
    cp "$IMAGE" "$WORK"
    sync        # the copy's pages on disk before the run, not during it
    serve "$kind" "$job"
    if [ "$job" = trims ]; then
        trim=(--name=trim --rw=randtrim --bs=1M --iodepth=1
              --thinktime=100000 --rate_iops=10)
    fi
    (cd "$RUN_DIR" && exec fio --ioengine=nbd --uri="$SERVER_URI" \
        --size="$SIZE" --time_based --runtime="$BENCH_STALL_RUNTIME" \
        --ramp_time=2 --randrepeat=1 --norandommap \
        --output-format=json --output="$json" \
        --name=rw --rw=randrw --rwmixread=50 --bs=4k --iodepth=16 \
        "${trim[@]}") >>"$RUN_DIR/fio.log" 2>&1 || rc=$?
    server_alive
    unserve
    [ "$rc" -eq 0 ] || die "fio failed (status $rc) against ${LABEL[$kind]} ($job)"
    qemu-img check -q "$WORK" >"$RUN_DIR/check.log" 2>&1 ||
        { cat "$RUN_DIR/check.log"; die "qemu-img check is not clean after ${LABEL[$kind]} ($job)"; }
    out=$(python3 - "$json" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
jobs = json.loads(text[text.index("{"):])["jobs"]
for job in jobs:
    if job.get("error"):
        sys.exit("fio: job %s error %s" % (job["jobname"], job["error"]))
rw = jobs[0]
trims = sum(j["trim"]["total_ios"] for j in jobs[1:])
print("%.1f %d" % (rw["read"]["iops"] + rw["write"]["iops"], trims))
EOF
    ) || die "no result from fio (${LABEL[$kind]}, $job)"
    echo "${out% *}" >> "$RES_DIR/$job.$kind"
    [ "$job" != trims ] || echo "${out#* }" >> "$RES_DIR/trims-done.$kind"
}

print_machine "Stall benchmark"
echo "Image: $BENCH_STALL_SIZE of random data, plain qcow2, 16k clusters, every cluster allocated, layout $BENCH_STALL_LAYOUT ($L2_TABLES L2 tables; small-l2: $((SMALL_L2 / 1024)) KiB of L2 cache, $((SMALL_L2 / CLUSTER)) tables)"
echo "Slow device: nbdkit's delay filter, ${DELAYS[*]}; job: randrw 50/50 4k QD16, ${BENCH_STALL_RUNTIME} s (after 2 s ramp), $BENCH_RUNS run(s)"
[ -z "$FILTER2" ] || echo "Filter (2): $FILTER2 (sha256 $(sha256sum "$FILTER2" | cut -c1-12)...)"
rounds

echo
echo "IOPS of the randrw job (reads + writes), median of $BENCH_RUNS:"
printf '  %-16s' contender
job_cells
printf ' %12s %14s %10s\n' trims/plain small-l2/plain "trims sent"
for kind in "${CONTENDERS[@]}"; do
    printf '  %-16s' "${LABEL[$kind]}"
    job_cells "$kind"
    p=$(median < "$RES_DIR/plain.$kind")
    printf ' %11sx %13sx %10s\n' \
        "$(fmt 2 "$(ratio "$(median < "$RES_DIR/trims.$kind")" "$p")")" \
        "$(fmt 2 "$(ratio "$(median < "$RES_DIR/small-l2.$kind")" "$p")")" \
        "$(fmt 0 "$(median < "$RES_DIR/trims-done.$kind")")"
done
