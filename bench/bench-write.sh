#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Write benchmark: 4 KiB random writes and 1 MiB sequential writes through
# the qcow2zstd filter (nbdkit file) against qemu-nbd, both serving a
# fresh writable copy of the same zstd-compressed qcow2 image (64k
# clusters, the read benchmark's image from make-image.sh).
#
#   bench/bench-write.sh                 full run (2 GiB image, 5 runs)
#   BENCH_QUICK=1 bench/bench-write.sh   smoke run (256 MiB image, 3 runs)
#
# Workloads (fio, --ioengine=nbd, one connection, over the first
# $BENCH_REGION of the disk; every run ends with a flush, --end_fsync=1,
# and fio's runtime and rates include it, so both contenders pay for
# durability):
#   rand4k-qd1    randwrite bs=4k iodepth=1,  $BENCH_RAND_QD1_SIZE written
#   rand4k-qd16   randwrite bs=4k iodepth=16, $BENCH_RAND_QD16_SIZE written
#   seq1m-qd4     write     bs=1M iodepth=4,  $BENCH_SEQ_SIZE written
# The random runs write a fixed amount (each 4 KiB block at most once, in
# fio's repeatable random order), so both contenders do exactly the same
# work: the same copy-on-write of compressed clusters, the same
# allocations.  A run time cap ($BENCH_FIO_RUNTIME) only guards against a
# pathological contender; a capped run is flagged in the output.
#
# Each written block holds its own offset (fio verify_pattern=%o, with no
# read-back phase), so the content written depends only on where it goes.
# That makes the data check exact: after a run, the image must equal a raw
# copy of the disk to which the same fio job (same order, same number of
# writes) was applied through nbdkit's file plugin (qemu-img compare).
#
# Knobs (environment):
#   BENCH_RUNS=N              repetitions (default 5, quick 3)
#   BENCH_DIR=DIR             work dir, images cached there
#   BENCH_QUICK=1             small image and short runs
#   BENCH_REGION=SIZE         region written (1G, quick 128M; at most the disk)
#   BENCH_RAND_QD1_SIZE=SIZE  bytes written by rand4k-qd1 (128M, quick 16M)
#   BENCH_RAND_QD16_SIZE=SIZE bytes written by rand4k-qd16 (512M, quick 64M)
#   BENCH_SEQ_SIZE=SIZE       bytes written by seq1m-qd4 (the region)
#   BENCH_FIO_RUNTIME=S       cap on one fio run (default 120)
#   BENCH_ONLY="rand4k-qd1 rand4k-qd16 seq1m-qd4 slow"   workloads to run
#   BENCH_VERIFY=first|all|0  data check (qemu-img compare with the
#                             reference) on the first run of each contender
#                             and workload (default), on every run, or never.
#                             qemu-img check runs after every run regardless.
#   BENCH_FILTER_ARGS="..."   extra filter parameters (e.g. qcow2-threads=1)
#   BENCH_OVERLAY=OPTIONS     each run writes into a new, empty overlay
#                             over zstd.qcow2 made with qemu-img create -o
#                             OPTIONS (say extended_l2=on,cluster_size=64k,
#                             subclusters), instead of into a copy of it
#   BENCH_SLOW_DELAY=1ms      the slow device's answer time (delay-read and
#                             delay-write of nbdkit's delay filter)
#   BENCH_SLOW_SIZE=SIZE      the slow section's disk (1G, quick 256M)
#   BENCH_SLOW_RUNTIME=S      seconds per fio run there (20, quick 8)
#   BENCH_SLOW_RUNS=N         repetitions in the slow section (default 1)
#   BENCH_SLOW_DEVICES="slow fast"  the devices of the slow section
#   BENCH_ALLOC_VSIZE=SIZE    alloc-randwrite's disk (64G, quick 8G)
#   BENCH_ALLOC_WRITES=N      alloc-randwrite's writes (200000, quick
#                             40000)
#   BENCH_FILTER2=PATH        a second build of the filter (say, main's),
#                             measured as one more contender, next to this
#                             one, in every workload and in the slow
#                             section, with the ratio of the two
#   BENCH_KEEP=1              keep the run directory (images, logs)
#   FILTER=PATH               the filter .so (default: this build tree)
#
# The slow section (BENCH_ONLY=slow alone runs only it): 4 KiB randread,
# randwrite and randrw 50/50 at QD16 (fio's nbd engine, time based, no
# flush), on a fully allocated plain qcow2 of BENCH_SLOW_SIZE (every
# cluster holds data, so every write goes in place) and on the raw disk
# it was made from, first on a slow device, then on the fast local file:
#   slow device: nbdkit --filter=qcow2zstd --filter=delay file IMG
#                delay-read=D delay-write=D; for qemu the same delayed
#                device (nbdkit --filter=delay file IMG, the raw qcow2
#                bytes) opened by qemu-nbd -f qcow2 nbd+unix:///?socket=S;
#                the raw disk: nbdkit --filter=delay file RAW
#   fast local:  nbdkit --filter=qcow2zstd file IMG; qemu-nbd -f qcow2 IMG;
#                nbdkit file RAW
# and on the fast local file one more job, alloc-randwrite: 4 KiB random
# writes at QD16 into a new, empty qcow2 of $BENCH_ALLOC_VSIZE (64k
# clusters; for the filter given room with truncate, qemu-nbd grows its
# file) and into a sparse raw file of that size, $BENCH_ALLOC_WRITES
# writes each, so that most of them allocate a cluster.
# Printed as ratios against the raw disk and against qemu-nbd, all from
# the same run.
#
# Every run starts from a fresh copy of zstd.qcow2, given room with
# truncate (the filter cannot grow its file), and a fresh server, so no
# run profits from the previous one.  Contenders alternate, and which one
# goes first alternates between repetitions.  Medians are printed, with
# ratios filter/qemu-nbd and PASS/MISS against parity.  Exits non-zero on
# a failed run, a qemu-img check that is not clean, or wrong data.

source "$(dirname "${BASH_SOURCE[0]}")/common-write.sh"

if [ "$BENCH_QUICK" = 1 ]; then
    : "${BENCH_REGION:=128M}"
    : "${BENCH_RAND_QD1_SIZE:=16M}"
    : "${BENCH_RAND_QD16_SIZE:=64M}"
else
    : "${BENCH_REGION:=1G}"
    : "${BENCH_RAND_QD1_SIZE:=128M}"
    : "${BENCH_RAND_QD16_SIZE:=512M}"
fi
: "${BENCH_SEQ_SIZE:=$BENCH_REGION}"
: "${BENCH_FIO_RUNTIME:=120}"
: "${BENCH_ONLY:=rand4k-qd1 rand4k-qd16 seq1m-qd4 slow}"
: "${BENCH_VERIFY:=first}"
: "${BENCH_FILTER_ARGS:=}"
: "${BENCH_OVERLAY:=}"
# shellcheck disable=SC2206
FILTER_ARGS=($BENCH_FILTER_ARGS)

need_cmds nbdkit qemu-nbd qemu-img nbdinfo fio python3 numfmt
ensure_gnu_time
bench_setup write
# The filter opens a backing file named in a header only from the
# image's directory or one it is given.
[ -z "$BENCH_OVERLAY" ] || FILTER_ARGS+=("qcow2-backing-dir=$IMG_DIR")

WORKLOADS=(rand4k-qd1 rand4k-qd16 seq1m-qd4)
declare -A W_RW=([rand4k-qd1]=randwrite [rand4k-qd16]=randwrite [seq1m-qd4]=write)
declare -A W_BS=([rand4k-qd1]=4k [rand4k-qd16]=4k [seq1m-qd4]=1M)
declare -A W_QD=([rand4k-qd1]=1 [rand4k-qd16]=16 [seq1m-qd4]=4)
declare -A W_SIZE=([rand4k-qd1]=$BENCH_RAND_QD1_SIZE [rand4k-qd16]=$BENCH_RAND_QD16_SIZE
                   [seq1m-qd4]=$BENCH_SEQ_SIZE)
declare -A W_TITLE=([rand4k-qd1]="4 KiB random writes, QD1"
                    [rand4k-qd16]="4 KiB random writes, QD16"
                    [seq1m-qd4]="1 MiB sequential writes, QD4")
CONTENDERS=(filter qemu)
declare -A LABEL=([filter]="qcow2zstd filter" [filter2]="qcow2zstd (2)" [qemu]="qemu-nbd")
: "${BENCH_FILTER2:=}"
if [ -n "$BENCH_FILTER2" ]; then
    [ -f "$BENCH_FILTER2" ] || die "BENCH_FILTER2: no such file: $BENCH_FILTER2"
    cp -f "$BENCH_FILTER2" "$RUN_DIR/filter2.so"
    FILTER2=$RUN_DIR/filter2.so
    CONTENDERS=(filter filter2 qemu)
fi
BENCH_FAILED=0
CAPPED_RUNS=0

wants () { [[ " $BENCH_ONLY " == *" $1 "* ]]; }

# ---------------------------------------------------------------------

# fio_cmd WORKLOAD URI OUTPUT [EXTRA...]: the fio command line, in FIO_CMD.
fio_cmd ()
{
    local w=$1 uri=$2 out=$3
    shift 3
    FIO_CMD=(fio --name="$w" --ioengine=nbd --uri="$uri"
             --rw="${W_RW[$w]}" --bs="${W_BS[$w]}" --iodepth="${W_QD[$w]}"
             --offset=0 --size="$REGION" --io_size="${W_SIZE[$w]}"
             --randrepeat=1 --end_fsync=1
             --verify=pattern --verify_pattern=%o --do_verify=0 --verify_state_save=0
             --output-format=json --output="$out" "$@")
}

# The file a contender serves in a run, prepared from the cached image.
prepare_image () # PATH
{
    if [ -n "$BENCH_OVERLAY" ]; then
        rm -f "$1"
        qemu-img create -q -f qcow2 -o "$BENCH_OVERLAY" \
            -b "$IMG_DIR/zstd.qcow2" -F qcow2 "$1"
    else
        cp --sparse=always "$IMG_DIR/zstd.qcow2" "$1"
    fi
    truncate -s "+$ROOM" "$1"
    # Our copy's dirty pages must not be written back during the run.
    sync "$1"
}

reproducer () # KIND WORKLOAD
{
    local srv
    if [ "$1" = filter ]; then
        srv="nbdkit -f -U SOCK --filter=$FILTER_ORIG file img.qcow2 ${FILTER_ARGS[*]}"
    elif [ "$1" = filter2 ]; then
        srv="nbdkit -f -U SOCK --filter=$BENCH_FILTER2 file img.qcow2 ${FILTER_ARGS[*]}"
    else
        srv="qemu-nbd -f qcow2 --cache=writeback --persistent -k SOCK img.qcow2"
    fi
    fio_cmd "$2" 'nbd+unix:///?socket=SOCK' fio.json
    if [ -n "$BENCH_OVERLAY" ]; then
        printf '  qemu-img create -f qcow2 -o %s -b %s -F qcow2 img.qcow2; truncate -s +%s img.qcow2\n' \
            "$BENCH_OVERLAY" "$IMG_DIR/zstd.qcow2" "$ROOM"
    else
        printf '  cp --sparse=always %s img.qcow2; truncate -s +%s img.qcow2\n' \
            "$IMG_DIR/zstd.qcow2" "$ROOM"
    fi
    printf '  %s &\n  %s\n' "$srv" "${FIO_CMD[*]}"
}

# truth WORKLOAD N: sets TRUTH_PATH to a raw image equal to raw.img with
# the first N writes of the workload applied (built once per workload and
# N; not in a subshell, so that the cache and the server stay ours).
declare -A TRUTH=()
truth ()
{
    local w=$1 n=$2 path=$RUN_DIR/truth.$1.$2.raw rc=0
    if [ "${TRUTH[$w]:-}" != "$path" ]; then
        [ -z "${TRUTH[$w]:-}" ] || rm -f "${TRUTH[$w]}"
        msg "  building the reference for $w ($n writes, raw image through nbdkit file)"
        cp --sparse=always "$RAW_IMG" "$path"
        start_server "truth-$w" raw "$path"
        fio_cmd "$w" "$SERVER_URI" "$RUN_DIR/truth.fio.json" --number_ios="$n"
        (cd "$RUN_DIR" && exec "${FIO_CMD[@]}") >>"$RUN_DIR/fio.log" 2>&1 || rc=$?
        [ "$rc" -eq 0 ] || die "fio failed (status $rc) building the reference for $w"
        server_alive
        stop_server
        local got
        got=$(fio_json_write "$RUN_DIR/truth.fio.json" | awk '{ print $5 }')
        [ "$got" = "$n" ] || die "reference for $w: fio did $got writes, wanted $n"
        TRUTH[$w]=$path
    fi
    TRUTH_PATH=$path
}

# measure OUT WORKLOAD KIND REP
# Appends "iops MiB/s mean_lat_us p99_lat_us total_ios runtime_s srv_cpu
# growth_MiB end_offset_MiB" to OUT.
measure ()
{
    local out=$1 w=$2 kind=$3 rep=$4 name img json cpu0 cpu1 rc=0 res a0 a1 end n
    name=$kind-$w
    img=$RUN_DIR/$kind.qcow2
    json=$RUN_DIR/$name.fio.json
    prepare_image "$img"
    # The previous run's dirty pages and this copy's go to disk first:
    # written back during a run, they slow whoever runs then (with three
    # contenders in turn, one follows qemu-nbd twice as often as another).
    sync
    a0=$(alloc_bytes "$img")
    if [ "$kind" = filter ]; then
        start_server "$name" filter "$img" "${FILTER_ARGS[@]}"
    elif [ "$kind" = filter2 ]; then
        FILTER=$FILTER2 start_server "$name" filter "$img" "${FILTER_ARGS[@]}"
    else
        start_qemu_rw "$name" "$img"
    fi
    fio_cmd "$w" "$SERVER_URI" "$json" --runtime="$BENCH_FIO_RUNTIME"
    cpu0=$(proc_cpu "$SERVER_PID")
    (cd "$RUN_DIR" && exec "${FIO_CMD[@]}") >>"$RUN_DIR/fio.log" 2>&1 || rc=$?
    cpu1=$(proc_cpu "$SERVER_PID")
    server_alive
    if [ "$rc" -ne 0 ] || ! res=$(fio_json_write "$json" 2>>"$RUN_DIR/fio.log"); then
        tail -n 8 "$RUN_DIR/fio.log" >&2 || true
        tail -n 8 "$SERVER_LOG" >&2 || true
        die "fio failed (status $rc) against ${LABEL[$kind]} ($w); reproducer:
$(reproducer "$kind" "$w")"
    fi
    stop_server
    if [ -s "$SERVER_LOG" ] && grep -qi 'error' "$SERVER_LOG"; then
        msg "  WARNING: ${LABEL[$kind]} logged errors ($SERVER_LOG):"
        grep -i error "$SERVER_LOG" | tail -n 5 >&2
    fi

    # Outside the timing: the image must be clean and hold the right data.
    rc=0
    end=$(qcow2_check "$img" "$RUN_DIR/check.log") || rc=$?
    if [ "$rc" -ne 0 ]; then
        tail -n 15 "$RUN_DIR/check.log" >&2
        msg "  FAILED: qemu-img check of ${LABEL[$kind]}'s image after $w (status $rc); reproducer:"
        reproducer "$kind" "$w" >&2
        BENCH_FAILED=1
        CHECK_RESULT[$kind-$w]="NOT CLEAN (status $rc)"
    elif [ -z "${CHECK_RESULT[$kind-$w]:-}" ]; then
        CHECK_RESULT[$kind-$w]=clean
    fi
    n=$(awk '{ print $5 }' <<<"$res")
    if [ "$n" != "$(W_COUNT "$w")" ]; then
        CAPPED_RUNS=$((CAPPED_RUNS + 1))
        msg "  NOTE: ${LABEL[$kind]} $w stopped at the ${BENCH_FIO_RUNTIME}s cap after $n of $(W_COUNT "$w") writes"
    fi
    if [ "$BENCH_VERIFY" = all ] ||
           { [ "$BENCH_VERIFY" = first ] && [ -z "${COMPARE_RESULT[$kind-$w]:-}" ]; }; then
        local crc=0 cmpout
        truth "$w" "$n"
        cmpout=$(qemu-img compare -f raw -F qcow2 "$TRUTH_PATH" "$img" 2>&1) || crc=$?
        if [ "$crc" -eq 0 ]; then
            [ "${COMPARE_RESULT[$kind-$w]:-}" = "" ] && COMPARE_RESULT[$kind-$w]="identical"
            COMPARE_COUNT[$kind-$w]=$(( ${COMPARE_COUNT[$kind-$w]:-0} + 1 ))
        else
            msg "  FAILED: ${LABEL[$kind]}'s image after $w differs from the reference: $cmpout"
            msg "  reproducer:"
            reproducer "$kind" "$w" >&2
            COMPARE_RESULT[$kind-$w]="DIFFERENT ($cmpout)"
            BENCH_FAILED=1
        fi
    fi
    a1=$(alloc_bytes "$img")
    rm -f "$img"
    printf '%s %s %s %s\n' "$res" "$(calc "$cpu1 - $cpu0")" \
        "$(calc "($a1 - $a0) / 1048576")" "$(calc "${end:-0} / 1048576")" >> "$out"
}
declare -A CHECK_RESULT=() COMPARE_RESULT=() COMPARE_COUNT=()

# Number of writes a workload does when not capped.
W_COUNT () { echo $(( $(to_bytes "${W_SIZE[$1]}") / $(to_bytes "${W_BS[$1]}") )); }

report () # WORKLOAD
{
    local w=$1 d=$RES_DIR/$1 k q f
    printf '\n%s over the first %s (%s written, %s writes, fio nbd engine + final flush), median of %s\n' \
        "${W_TITLE[$w]}" "$BENCH_REGION" "${W_SIZE[$w]}" "$(W_COUNT "$w")" "$BENCH_RUNS"
    printf '  %-17s %9s %15s %9s %11s %11s %9s %9s %10s\n' contender IOPS "(min-max)" "MiB/s" \
        "mean lat us" "p99 lat us" "srv CPU s" "grew MiB" "end MiB"
    echo "  (grew = allocated bytes the run added to the image file; end = qemu-img check's image end offset)"
    for k in "${CONTENDERS[@]}"; do
        printf '  %-17s %9s %15s %9s %11s %11s %9s %9s %10s\n' "${LABEL[$k]}" \
            "$(fmt 0 "$(col_median "$d.$k" 1)")" "$(col_range "$d.$k" 1 0)" \
            "$(fmt 1 "$(col_median "$d.$k" 2)")" \
            "$(fmt 1 "$(col_median "$d.$k" 3)")" "$(fmt 1 "$(col_median "$d.$k" 4)")" \
            "$(fmt 2 "$(col_median "$d.$k" 7)")" "$(fmt 1 "$(col_median "$d.$k" 8)")" \
            "$(fmt 1 "$(col_median "$d.$k" 9)")"
    done
    q=$(col_median "$d.qemu" 1); f=$(col_median "$d.filter" 1)
    printf '  ratio filter/qemu-nbd: IOPS %s, server CPU %s, file growth %s\n' "$(fmt 2 "$(ratio "$f" "$q")")" \
        "$(fmt 2 "$(ratio "$(col_median "$d.filter" 7)" "$(col_median "$d.qemu" 7)")")" \
        "$(fmt 2 "$(ratio "$(col_median "$d.filter" 8)" "$(col_median "$d.qemu" 8)")")"
    if [ -n "$BENCH_FILTER2" ]; then
        printf '  ratio filter/filter (2): IOPS %s, server CPU %s\n' \
            "$(fmt 3 "$(ratio "$f" "$(col_median "$d.filter2" 1)")")" \
            "$(fmt 3 "$(ratio "$(col_median "$d.filter" 7)" "$(col_median "$d.filter2" 7)")")"
    fi
    for k in "${CONTENDERS[@]}"; do
        printf '  checks, %s: qemu-img check after every run %s; data vs reference %s\n' "${LABEL[$k]}" \
            "${CHECK_RESULT[$k-$w]:-not run}" \
            "${COMPARE_RESULT[$k-$w]:-not checked}${COMPARE_COUNT[$k-$w]:+ (${COMPARE_COUNT[$k-$w]} runs)}"
    done
    SUMMARY+=("$(printf '%-30s %11s %10s %8s %14s %14s' "${W_TITLE[$w]}" \
        "$(fmt 0 "$f")" "$(fmt 0 "$q")" "$(fmt 2 "$(ratio "$f" "$q")")" \
        "$(fmt 1 "$(col_median "$d.filter" 2)")/$(fmt 1 "$(col_median "$d.qemu" 2)")" \
        "$(fmt 1 "$(col_median "$d.filter" 8)")/$(fmt 1 "$(col_median "$d.qemu" 8)")")")
    target "${W_TITLE[$w]}: filter/qemu-nbd IOPS" "$(ratio "$f" "$q")" ">=" 1.0
    [ -z "$BENCH_FILTER2" ] ||
        target "${W_TITLE[$w]}: filter/filter (2) IOPS" \
            "$(ratio "$f" "$(col_median "$d.filter2" 1)")" ">=" 0.97
}
SUMMARY=()

# ---------------------------------------------------------------------
# The slow device section.

if [ "$BENCH_QUICK" = 1 ]; then
    : "${BENCH_SLOW_SIZE:=256M}"
    : "${BENCH_SLOW_RUNTIME:=8}"
else
    : "${BENCH_SLOW_SIZE:=1G}"
    : "${BENCH_SLOW_RUNTIME:=20}"
fi
: "${BENCH_SLOW_DELAY:=1ms}"
: "${BENCH_SLOW_DEVICES:=slow fast}"
if [ "$BENCH_QUICK" = 1 ]; then
    : "${BENCH_ALLOC_VSIZE:=8G}"
    : "${BENCH_ALLOC_WRITES:=40000}"
else
    : "${BENCH_ALLOC_VSIZE:=64G}"
    : "${BENCH_ALLOC_WRITES:=200000}"
fi
SLOW_JOBS=(randread randwrite randrw)
# The jobs of each device: allocating writes only on the fast file (on
# the slow one, a fixed number of them would take minutes).
declare -A DEV_JOBS=([slow]="randread randwrite randrw"
                     [fast]="randread randwrite randrw alloc-randwrite")
SLOW_KINDS=(raw filter qemu)
declare -A SLOW_LABEL=([raw]="raw disk" [filter]="qcow2zstd" [filter2]="qcow2zstd (2)"
                       [qemu]="qemu-nbd")

# slow_images: SLOW_RAW (random data: every cluster allocated) and
# SLOW_QCOW2, a plain qcow2 made from it, cached in $BENCH_DIR.
slow_images ()
{
    local dir=$BENCH_DIR/slow-$BENCH_SLOW_SIZE
    SLOW_RAW=$dir/raw.img
    SLOW_QCOW2=$dir/plain.qcow2
    mkdir -p "$dir"
    if [ ! -s "$SLOW_QCOW2" ]; then
        msg "making the slow section's disks: $BENCH_SLOW_SIZE of random data, and a plain qcow2 of it"
        head -c "$(to_bytes "$BENCH_SLOW_SIZE")" /dev/urandom > "$SLOW_RAW.tmp"
        mv "$SLOW_RAW.tmp" "$SLOW_RAW"
        qemu-img convert -O qcow2 -o cluster_size=64k "$SLOW_RAW" "$SLOW_QCOW2.tmp"
        mv "$SLOW_QCOW2.tmp" "$SLOW_QCOW2"
    fi
}

# _spawn NAME CMD...: start a server in the background on $RUN_DIR/NAME.sock
# (which CMD must use) and wait until it answers; sets SERVER_PID and
# SERVER_URI and registers it for stop_server and the exit trap.
_spawn ()
{
    local name=$1 i
    shift
    SERVER_SOCK=$RUN_DIR/$name.sock
    SERVER_LOG=$RUN_DIR/$name.log
    SERVER_URI="nbd+unix:///?socket=$SERVER_SOCK"
    rm -f "$SERVER_SOCK"
    "$@" 2>>"$SERVER_LOG" </dev/null &
    SERVER_PID=$!
    _server_pids+=("$SERVER_PID")
    for i in $(seq 300); do
        if [ -S "$SERVER_SOCK" ] && nbdinfo --size "$SERVER_URI" >/dev/null 2>&1; then
            return 0
        fi
        kill -0 "$SERVER_PID" 2>/dev/null || die "$name exited at startup; log: $SERVER_LOG"
        sleep 0.05
    done
    die "$name did not come up in 15 s; log: $SERVER_LOG"
}

# start_slow KIND DEVICE: serve the working copy of the disk for KIND
# (raw, filter, filter2, qemu) on DEVICE (slow or fast).  For qemu on
# the slow device, the delayed device is a server of its own (DEV_PID).
DEV_PID=
start_slow ()
{
    local kind=$1 dev=$2 file=${SERVE_QCOW2:-$SLOW_WORK_QCOW2} delay=() dargs=() so=$FILTER
    [ "$kind" = raw ] && file=${SERVE_RAW:-$SLOW_WORK_RAW}
    [ "$kind" = filter2 ] && so=$FILTER2
    if [ "$dev" = slow ]; then
        delay=(--filter=delay)
        dargs=("delay-read=$BENCH_SLOW_DELAY" "delay-write=$BENCH_SLOW_DELAY")
    fi
    case $kind in
        raw)
            _spawn "$kind-$dev" nbdkit -f -U "$RUN_DIR/$kind-$dev.sock" \
                "${delay[@]}" file "$file" "${dargs[@]}" ;;
        filter|filter2)
            _spawn "$kind-$dev" nbdkit -f -U "$RUN_DIR/$kind-$dev.sock" \
                --filter="$so" "${delay[@]}" file "$file" "${dargs[@]}" \
                "${FILTER_ARGS[@]}" ;;
        qemu)
            if [ "$dev" = slow ]; then
                _spawn "device-$dev" nbdkit -f -U "$RUN_DIR/device-$dev.sock" \
                    --filter=delay file "$file" "${dargs[@]}"
                DEV_PID=$SERVER_PID
                _spawn "$kind-$dev" qemu-nbd -f qcow2 --cache=writeback --persistent \
                    -k "$RUN_DIR/$kind-$dev.sock" "$SERVER_URI"
            else
                _spawn "$kind-$dev" qemu-nbd -f qcow2 --cache=writeback --persistent \
                    -k "$RUN_DIR/$kind-$dev.sock" "$file"
            fi ;;
    esac
}

stop_slow ()
{
    stop_server
    if [ -n "$DEV_PID" ]; then
        SERVER_PID=$DEV_PID
        stop_server
        DEV_PID=
    fi
}

# slow_measure KIND DEVICE JOB: one fio run; appends the IOPS (reads and
# writes together) to $RES_DIR/slow.DEVICE.JOB.KIND.
slow_measure ()
{
    local kind=$1 dev=$2 job=$3 json=$RUN_DIR/slow-$1-$2-$3.json rc=0 iops
    local amount=(--size="$(to_bytes "$BENCH_SLOW_SIZE")" --time_based
                  --runtime="$BENCH_SLOW_RUNTIME" --ramp_time=2)
    local rw=$job alloc_raw=$RUN_DIR/alloc-raw.img alloc_qcow2=$RUN_DIR/alloc.qcow2
    if [ "$job" = alloc-randwrite ]; then
        # A new disk for every run: the writes allocate as they go.
        rm -f "$alloc_raw" "$alloc_qcow2"
        truncate -s "$BENCH_ALLOC_VSIZE" "$alloc_raw"
        qemu-img create -q -f qcow2 -o cluster_size=64k "$alloc_qcow2" "$BENCH_ALLOC_VSIZE"
        case $kind in filter|filter2) truncate -s "+$BENCH_ALLOC_VSIZE" "$alloc_qcow2" ;; esac
        SERVE_RAW=$alloc_raw SERVE_QCOW2=$alloc_qcow2
        amount=(--size="$(to_bytes "$BENCH_ALLOC_VSIZE")" --number_ios="$BENCH_ALLOC_WRITES")
        rw=randwrite
    else
        # On the fast local file the page cache is the device: every
        # contender starts from the disk.
        [ "$dev" = slow ] || drop_pages "$SLOW_WORK_RAW" "$SLOW_WORK_QCOW2"
    fi
    start_slow "$kind" "$dev"
    (cd "$RUN_DIR" && exec fio --name="$job" --ioengine=nbd --uri="$SERVER_URI" \
        --rw="$rw" --rwmixread=50 --bs=4k --iodepth=16 "${amount[@]}" \
        --randrepeat=1 --norandommap --output-format=json --output="$json") \
        >>"$RUN_DIR/fio.log" 2>&1 || rc=$?
    server_alive
    stop_slow
    SERVE_RAW= SERVE_QCOW2=
    if [ "$job" = alloc-randwrite ]; then
        [ "$kind" = raw ] || qemu-img check -q "$alloc_qcow2" ||
            die "qemu-img check: ${SLOW_LABEL[$kind]}'s image after $job is not clean"
        rm -f "$alloc_raw" "$alloc_qcow2"
    fi
    [ "$rc" -eq 0 ] || die "fio failed (status $rc) against ${SLOW_LABEL[$kind]} ($dev, $job)"
    iops=$(python3 - "$json" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
if job.get("error"):
    sys.exit("fio: job error %s" % job["error"])
print("%.1f" % (job["read"]["iops"] + job["write"]["iops"]))
PY
    ) || die "no result from fio ($kind, $dev, $job)"
    echo "$iops" >> "$RES_DIR/slow.$dev.$job.$kind"
}

slow_section ()
{
    local dev job kind rep
    slow_images
    [ -z "$BENCH_FILTER2" ] || SLOW_KINDS=(raw filter filter2 qemu)
    # Working copies: the writes go in place, so every contender sees
    # the same fully allocated layout.
    SLOW_WORK_RAW=$RUN_DIR/slow-raw.img
    SLOW_WORK_QCOW2=$RUN_DIR/slow.qcow2
    cp "$SLOW_RAW" "$SLOW_WORK_RAW"
    cp "$SLOW_QCOW2" "$SLOW_WORK_QCOW2"
    echo
    echo "Slow section: $BENCH_SLOW_SIZE fully allocated plain qcow2 (64k clusters) and the raw disk it was made from; fio --ioengine=nbd, 1 connection, 4 KiB, QD16, ${BENCH_SLOW_RUNTIME} s per run (after 2 s ramp), no flush; slow device: nbdkit's delay filter, delay-read=delay-write=$BENCH_SLOW_DELAY"
    echo "Fast local file, alloc-randwrite: $BENCH_ALLOC_WRITES writes of 4 KiB at QD16 into a new, empty $BENCH_ALLOC_VSIZE qcow2 (the filter's given room with truncate) and a sparse raw file, no flush"
    [ -z "$BENCH_FILTER2" ] || echo "qcow2zstd (2): $BENCH_FILTER2 (sha256 $(sha256sum "$FILTER2" | cut -c1-12)...)"
    for rep in $(seq "$BENCH_SLOW_RUNS"); do
        for dev in $BENCH_SLOW_DEVICES; do
            for job in ${DEV_JOBS[$dev]}; do
                # Which contender goes first turns with every job.
                turns "$rep" "${SLOW_KINDS[@]}"
                for kind in "${ORDER[@]}"; do
                    msg "slow section: $dev device, $job, ${SLOW_LABEL[$kind]} (run $rep/$BENCH_SLOW_RUNS)"
                    slow_measure "$kind" "$dev" "$job"
                done
            done
        done
    done
    rm -f "$SLOW_WORK_RAW" "$SLOW_WORK_QCOW2"
}

slow_report ()
{
    local dev job kind f r q v title
    for dev in $BENCH_SLOW_DEVICES; do
        if [ "$dev" = slow ]; then
            title="Slow device ($BENCH_SLOW_DELAY per read and write)"
        else
            title="Fast local file (page cache)"
        fi
        printf '\n%s, IOPS (reads + writes), median of %s:\n' "$title" "$BENCH_SLOW_RUNS"
        printf '  %-15s' job
        for kind in "${SLOW_KINDS[@]}"; do printf ' %14s' "${SLOW_LABEL[$kind]}"; done
        printf ' %12s %14s' "filter/raw" "filter/qemu"
        [ -z "$BENCH_FILTER2" ] || printf ' %12s %14s' "(2)/raw" "(2)/qemu"
        echo
        for job in ${DEV_JOBS[$dev]}; do
            printf '  %-15s' "$job"
            for kind in "${SLOW_KINDS[@]}"; do
                printf ' %14s' "$(fmt 0 "$(median < "$RES_DIR/slow.$dev.$job.$kind")")"
            done
            r=$(median < "$RES_DIR/slow.$dev.$job.raw")
            q=$(median < "$RES_DIR/slow.$dev.$job.qemu")
            f=$(median < "$RES_DIR/slow.$dev.$job.filter")
            printf ' %11sx %13sx' "$(fmt 2 "$(ratio "$f" "$r")")" "$(fmt 2 "$(ratio "$f" "$q")")"
            if [ -n "$BENCH_FILTER2" ]; then
                v=$(median < "$RES_DIR/slow.$dev.$job.filter2")
                printf ' %11sx %13sx' "$(fmt 2 "$(ratio "$v" "$r")")" "$(fmt 2 "$(ratio "$v" "$q")")"
            fi
            echo
        done
    done
    echo
    echo "Targets (issues 15 and 26, informational):"
    if [[ " $BENCH_SLOW_DEVICES " == *" slow "* ]]; then
        for job in randwrite randrw; do
            target "slow $job: filter/raw disk" \
                "$(ratio "$(median < "$RES_DIR/slow.slow.$job.filter")" "$(median < "$RES_DIR/slow.slow.$job.raw")")" ">=" 0.8
            target "slow $job: filter/qemu-nbd" \
                "$(ratio "$(median < "$RES_DIR/slow.slow.$job.filter")" "$(median < "$RES_DIR/slow.slow.$job.qemu")")" ">=" 1.5
        done
        target "slow randread: filter/raw disk" \
            "$(ratio "$(median < "$RES_DIR/slow.slow.randread.filter")" "$(median < "$RES_DIR/slow.slow.randread.raw")")" ">=" 0.9
    fi
    [[ " $BENCH_SLOW_DEVICES " == *" fast "* ]] || return 0
    target "fast randwrite: filter/raw disk" \
        "$(ratio "$(median < "$RES_DIR/slow.fast.randwrite.filter")" "$(median < "$RES_DIR/slow.fast.randwrite.raw")")" ">=" 0.95
    target "fast alloc-randwrite: filter/qemu-nbd" \
        "$(ratio "$(median < "$RES_DIR/slow.fast.alloc-randwrite.filter")" "$(median < "$RES_DIR/slow.fast.alloc-randwrite.qemu")")" ">=" 0.95
    if [ -n "$BENCH_FILTER2" ]; then
        for job in ${DEV_JOBS[fast]}; do
            target "fast $job: filter/filter (2)" \
                "$(ratio "$(median < "$RES_DIR/slow.fast.$job.filter")" "$(median < "$RES_DIR/slow.fast.$job.filter2")")" ">=" 0.95
        done
    fi
}

# ---------------------------------------------------------------------
# Main.

print_machine "qcow2zstd write benchmark"
[ ${#FILTER_ARGS[@]} -eq 0 ] || echo "Filter parameters: ${FILTER_ARGS[*]}"
echo "Results in $RES_DIR"

COMPRESSED=0
for w in "${WORKLOADS[@]}"; do wants "$w" && COMPRESSED=1; done
RAN=()
if [ "$COMPRESSED" = 1 ]; then
    echo "Runs: $BENCH_RUNS per workload, contenders alternating (and which goes first alternating)"
    echo "Servers: nbdkit -U SOCK --filter=qcow2zstd file IMG ${FILTER_ARGS[*]} | qemu-nbd -f qcow2 --cache=writeback --persistent -k SOCK IMG; Unix sockets; one fresh server and image copy per run"
    [ -z "$BENCH_FILTER2" ] || echo "qcow2zstd (2): $BENCH_FILTER2 (sha256 $(sha256sum "$FILTER2" | cut -c1-12)...), the same command with that filter"
    echo "Client: fio --ioengine=nbd, 1 connection, --end_fsync=1 (the flush is inside fio's timing), written data = block offset pattern"
    ensure_images
    VSIZE=$(stat -c %s "$RAW_IMG")
    REGION=$(to_bytes "$BENCH_REGION")
    if [ "$REGION" -gt "$VSIZE" ]; then
        msg "region $BENCH_REGION is larger than the disk; using the whole disk"
        REGION=$VSIZE
        BENCH_REGION=$(numfmt --to=iec "$VSIZE")
    fi
    for w in "${WORKLOADS[@]}"; do
        if [ "${W_RW[$w]}" = randwrite ] &&
               [ "$(to_bytes "${W_SIZE[$w]}")" -gt "$REGION" ]; then
            die "$w writes ${W_SIZE[$w]}, more than the region ($BENCH_REGION): each block is written at most once"
        fi
    done
    # Room: every cluster of the region may be rewritten once (a 4 KiB write
    # to a compressed cluster allocates a whole new cluster), plus metadata.
    ROOM=$((REGION + REGION / 16 + 16 * 1048576))
    ROOM=$(( (ROOM + 1048575) / 1048576 * 1048576 ))
    echo "Image: $IMG_DIR/zstd.qcow2 ($(mib "$(stat -c %s "$IMG_DIR/zstd.qcow2")") MiB file, $(mib "$VSIZE") MiB disk, $(qcow2_info "$IMG_DIR/zstd.qcow2" | awk '{ print $2 ", " $3 / 1024 "k clusters" }')), region: first $BENCH_REGION, room added to each copy: $(mib "$ROOM" 0) MiB"
    echo "First $BENCH_REGION of the disk: $(qemu-img map --output=json "$IMG_DIR/zstd.qcow2" | python3 -c '
import json, sys
end = int(sys.argv[1]); data = 0
for e in json.load(sys.stdin):
    s, n = e["start"], e["length"]
    if e["data"] and s < end:
        data += min(s + n, end) - s
print("%.0f%% allocated (compressed) data" % (100.0 * data / end))' "$REGION")"
    echo "Checks: qemu-img check after every run (outside timing); data compared with a reference (raw.img + the same writes through nbdkit file): $BENCH_VERIFY"

    for w in "${WORKLOADS[@]}"; do
        wants "$w" || continue
        RAN+=("$w")
        for rep in $(seq "$BENCH_RUNS"); do
            msg "$w: repetition $rep/$BENCH_RUNS"
            # Which contender goes first turns with every repetition.
            turns "$rep" "${CONTENDERS[@]}"
            for k in "${ORDER[@]}"; do
                measure "$RES_DIR/$w.$k" "$w" "$k" "$rep"
            done
        done
        [ -z "${TRUTH[$w]:-}" ] || rm -f "${TRUTH[$w]}"
    done
fi
: "${BENCH_SLOW_RUNS:=1}"
if wants slow; then
    slow_section
fi

for w in "${RAN[@]}"; do report "$w"; done

if [ ${#RAN[@]} -gt 0 ]; then
    echo
    echo "Summary (medians; filter/qemu-nbd > 1 means the filter is faster):"
    printf '  %-30s %11s %10s %8s %14s %14s\n' workload "filter IOPS" "qemu IOPS" ratio "MiB/s f/q" "grew MiB f/q"
    printf '  %s\n' "${SUMMARY[@]}"
    [ "$CAPPED_RUNS" = 0 ] || echo "  NOTE: $CAPPED_RUNS run(s) hit the ${BENCH_FIO_RUNTIME}s cap and wrote less than the rest"
fi
if wants slow; then
    slow_report
fi
echo
echo "Targets (informational):"
if [ ${#TARGET_SUMMARY[@]} -eq 0 ]; then
    echo "  (no workload measured)"
else
    printf '  %s\n' "${TARGET_SUMMARY[@]}"
fi
if [ "$BENCH_FAILED" = 1 ]; then
    echo
    echo "FAILED: a qemu-img check was not clean, or an image held wrong data (see above)"
    exit 1
fi
