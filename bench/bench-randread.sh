#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Random read benchmark: 4 KiB random reads at QD16 of the compressed
# benchmark images (make-image.sh's zstd.qcow2 and zlib.qcow2, 64 KiB
# clusters), through the filter and through qemu-nbd, with the raw disk
# through nbdkit's file plugin as the reference.
#
#   bench/bench-randread.sh                 full run (3 runs of 20 s per job)
#   BENCH_QUICK=1 bench/bench-randread.sh   smoke run (quick image, 1 run of 5 s)
#
# Every 4 KiB read of a compressed cluster costs both servers the
# decoding of the whole 64 KiB cluster, unless it is cached: qemu keeps
# the one cluster it decoded last, the filter a cache of decoded clusters
# (qcow2-cluster-cache-size, 64M).  Jobs:
#   zstd, zlib  reads anywhere on the 2 GiB disk (the cache holds a few
#               percent of it)
#   zstd-hot    reads within the first $BENCH_HOT of the disk, which fits
#               in the filter's cache (after the 2 s ramp, nearly every
#               read hits it)
#   zstd-zipf   reads anywhere, some places far more often than others
#               (fio's zipf distribution, theta $BENCH_ZIPF): what the
#               cache keeps decides the rate
# Each job is one fio --ioengine=nbd run, time based, one connection,
# the same seed for every contender (so the same offsets), servers
# read-only and started afresh for each run, contenders in turn (which
# goes first changes with every run).  Printed: IOPS medians, the
# filter's against qemu-nbd's and against the raw disk's.
#
# Knobs: BENCH_RUNS (3, quick 1), BENCH_RANDREAD_RUNTIME (20, quick 5),
# BENCH_HOT (48M), BENCH_ZIPF (1.2), BENCH_JOBS (all four),
# BENCH_FILTER2=PATH (another build of the filter, one more contender),
# BENCH_DIR, FILTER (see common.sh).

runs=${BENCH_RUNS:-}
source "$(dirname "${BASH_SOURCE[0]}")/common-write.sh"

if [ "$BENCH_QUICK" = 1 ]; then
    : "${BENCH_RANDREAD_RUNTIME:=5}"
    BENCH_RUNS=${runs:-1}
else
    : "${BENCH_RANDREAD_RUNTIME:=20}"
    BENCH_RUNS=${runs:-3}
fi
: "${BENCH_HOT:=48M}"
: "${BENCH_ZIPF:=1.2}"
FILTER2=${BENCH_FILTER2:-}
need_cmds nbdkit qemu-nbd fio python3
bench_setup randread
ensure_images
HOT=$(to_bytes "$BENCH_HOT")

CONTENDERS=(filter qemu raw)
[ -z "$FILTER2" ] || CONTENDERS=(filter filter2 qemu raw)
declare -A LABEL=([filter]="qcow2zstd" [filter2]="qcow2zstd (2)"
                  [qemu]="qemu-nbd" [raw]="raw (file plugin)")
read -r -a JOBS <<<"${BENCH_JOBS:-zstd zlib zstd-hot zstd-zipf}"
declare -A IMAGE=([zstd]=$IMG_DIR/zstd.qcow2 [zlib]=$IMG_DIR/zlib.qcow2
                  [zstd-hot]=$IMG_DIR/zstd.qcow2
                  [zstd-zipf]=$IMG_DIR/zstd.qcow2)
for job in "${JOBS[@]}"; do
    [ -n "${IMAGE[$job]:-}" ] || die "BENCH_JOBS: no job named '$job'"
done
warm_files "$RAW_IMG" "$IMG_DIR/zstd.qcow2" "$IMG_DIR/zlib.qcow2"

# serve KIND JOB
serve ()
{
    local kind=$1 job=$2 so=$FILTER
    [ "$kind" = filter2 ] && so=$FILTER2
    case $kind in
        filter|filter2)
            start_command "$kind" nbdkit -f -r -U SOCK --filter="$so" \
                file "${IMAGE[$job]}" ;;
        qemu)
            start_command qemu qemu-nbd -r -t -f qcow2 --cache=writeback \
                -k SOCK "${IMAGE[$job]}" ;;
        raw)
            start_command raw nbdkit -f -r -U SOCK file "$RAW_IMG" ;;
    esac
}

# measure KIND JOB: one run; appends the job's read IOPS to
# $RES_DIR/JOB.KIND.
measure ()
{
    local kind=$1 job=$2 json=$RUN_DIR/$1-$2.json rc=0 where=()
    [ "$job" = zstd-hot ] && where=(--size="$HOT")
    [ "$job" = zstd-zipf ] && where=(--random_distribution="zipf:$BENCH_ZIPF")
    serve "$kind" "$job"
    (cd "$RUN_DIR" && exec fio --ioengine=nbd --uri="$SERVER_URI" \
        "${where[@]}" --time_based --runtime="$BENCH_RANDREAD_RUNTIME" \
        --ramp_time=2 --randrepeat=1 --norandommap \
        --output-format=json --output="$json" \
        --name=randread --rw=randread --bs=4k --iodepth=16) \
        >>"$RUN_DIR/fio.log" 2>&1 || rc=$?
    server_alive
    stop_server
    [ "$rc" -eq 0 ] || die "fio failed (status $rc) against ${LABEL[$kind]} ($job)"
    fio_read_iops "$json" >> "$RES_DIR/$job.$kind" ||
        die "no result from fio (${LABEL[$kind]}, $job)"
}

print_machine "Random read benchmark"
echo "Images: $IMG_DIR/{zstd,zlib}.qcow2 (qemu-img convert -c, 64k clusters) and raw.img; job: randread 4k QD16, ${BENCH_RANDREAD_RUNTIME} s (after 2 s ramp), $BENCH_RUNS run(s); zstd-hot: the first $BENCH_HOT; zstd-zipf: zipf:$BENCH_ZIPF"
[ -z "$FILTER2" ] || echo "Filter (2): $FILTER2 (sha256 $(sha256sum "$FILTER2" | cut -c1-12)...)"
rounds

echo
echo "Read IOPS, median of $BENCH_RUNS:"
printf '  %-20s' contender
job_cells
echo
for kind in "${CONTENDERS[@]}"; do
    printf '  %-20s' "${LABEL[$kind]}"
    job_cells "$kind"
    echo
done
echo
for job in "${JOBS[@]}"; do
    f=$(median < "$RES_DIR/$job.filter")
    printf '  %-10s filter/qemu-nbd %sx, filter/raw %sx\n' "$job" \
        "$(fmt 2 "$(ratio "$f" "$(median < "$RES_DIR/$job.qemu")")")" \
        "$(fmt 2 "$(ratio "$f" "$(median < "$RES_DIR/$job.raw")")")"
done
echo
if [ -s "$RES_DIR/zstd.filter" ]; then
    target "zstd randread 4k QD16: filter/qemu-nbd" \
        "$(ratio "$(median < "$RES_DIR/zstd.filter")" "$(median < "$RES_DIR/zstd.qemu")")" ">=" 2
fi
