#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Read benchmark: the qcow2zstd filter against qemu-nbd and against the
# raw image through nbdkit's file plugin (the transport floor), on a
# compressed ext4 image built from files on this machine.
#
#   bench/bench-read.sh                 full run (2 GiB image, 5 runs)
#   BENCH_QUICK=1 bench/bench-read.sh   smoke run (256 MiB image, 3 runs)
#
# Knobs (environment):
#   BENCH_RUNS=N         repetitions of every measurement (default 5, quick 3)
#   BENCH_DIR=DIR        work dir, images cached there (/var/tmp/qcow2zstd-bench)
#   BENCH_QUICK=1        small image and short runs
#   BENCH_CACHE=warm     page cache: warm (default; files read into the page
#                        cache before each image's measurements) or cold
#                        (drop_caches before every measurement, needs root)
#   BENCH_VERIFY=0       skip the data check (nbdcopy to md5sum vs raw.img)
#   BENCH_THREADS="1 2"  qcow2-threads values for the scaling run
#                        (default 1..max(nproc, 4))
#   BENCH_FIO_SIZE=SIZE  bytes read by the 4 KiB QD1 run (512M, quick 64M)
#   BENCH_FILTER_ARGS="qcow2-cluster-cache-size=..."
#                        extra parameters for the filter contender
#   BENCH_ONLY="copy fio threads"   which workloads to run
#   BENCH_QUIET_WAIT=SECS  before each measurement, wait up to SECS (default
#                        10) for the machine to be idle (<10% busy for
#                        half a second; after 3 timeouts in a row, one look
#                        only until it is idle again); 0 = do not wait
#   BENCH_NICE=N         run the benchmark (servers and clients) at nice N,
#                        e.g. -10 on a machine shared with builds (default 0)
#   FILTER=PATH          the filter .so (default: this build tree)
#
# Each measurement also records the CPU that other processes used
# meanwhile (/proc/stat busy time minus ours): the "other" columns.  On a
# shared machine that is what explains noisy wall times.
#
# Every measurement starts a fresh server, so no contender gains from
# what the previous run left in its own caches, and its CPU time and peak
# RSS are its own.  Within a repetition the contenders alternate
# (raw, qemu-nbd, filter, raw, qemu-nbd, filter, ...); medians are printed.
# Prints PASS/MISS against the project's targets; exits 0 unless something
# broke (a server crash, a failed copy, or wrong data).

source "$(dirname "${BASH_SOURCE[0]}")/make-image.sh"

: "${BENCH_CACHE:=warm}"
: "${BENCH_VERIFY:=1}"
: "${BENCH_ONLY:=copy fio threads}"
: "${BENCH_FILTER_ARGS:=}"
: "${BENCH_QUIET_WAIT:=10}"
: "${BENCH_NICE:=0}"
if [ "$BENCH_QUICK" = 1 ]; then
    : "${BENCH_FIO_SIZE:=64M}"
else
    : "${BENCH_FIO_SIZE:=512M}"
fi
# A cap so that a pathological contender cannot stall the run; the fixed
# size is normally what ends each fio run.
: "${BENCH_FIO_RUNTIME:=120}"
if [ -z "${BENCH_THREADS:-}" ]; then
    _tmax=$((NPROC > 4 ? NPROC : 4))
    BENCH_THREADS=$(seq -s ' ' 1 "$_tmax")
fi
# shellcheck disable=SC2206
FILTER_ARGS=($BENCH_FILTER_ARGS)

CONTENDERS=(raw qemu filter)
declare -A LABEL=([raw]="raw (nbdkit file)" [qemu]="qemu-nbd" [filter]="qcow2zstd filter")
declare -A MULTI_CONN=()
BENCH_FAILED=0

need_cmds nbdkit qemu-nbd qemu-img nbdcopy nbdinfo fio python3 md5sum
ensure_gnu_time
[ -f "$FILTER" ] || die "the filter is not built: $FILTER"

RUN_DIR=$BENCH_DIR/run
RES_DIR=$BENCH_DIR/results/$(date +%Y%m%d-%H%M%S)-$BENCH_VARIANT
mkdir -p "$RUN_DIR" "$RES_DIR"

# Benchmark a private copy of the filter: the build tree may be rebuilt
# while a long run is going, and one run must not mix two builds.
FILTER_ORIG=$FILTER
FILTER_BUILT=$(date -u -r "$FILTER_ORIG" '+%Y-%m-%d %H:%M:%S UTC')
cp -f "$FILTER_ORIG" "$RUN_DIR/filter.so.tmp"
mv -f "$RUN_DIR/filter.so.tmp" "$RUN_DIR/filter.so"
FILTER=$RUN_DIR/filter.so
FILTER_SHA=$(sha256sum "$FILTER" | cut -c1-12)

wants () { [[ " $BENCH_ONLY " == *" $1 "* ]]; }

image_of () # KIND IMG -> path of the file the contender serves
{
    if [ "$1" = raw ]; then echo "$RAW_IMG"; else echo "$IMG_DIR/$2.qcow2"; fi
}

# start NAME KIND IMG [FILTER ARGS...]: start the contender's server.
start_contender ()
{
    local name=$1 kind=$2 img=$3
    shift 3
    if [ "$kind" = filter ]; then
        start_server "$name" filter "$(image_of "$kind" "$img")" "$@"
    else
        start_server "$name" "$kind" "$(image_of "$kind" "$img")"
    fi
}

before_measurement ()
{
    if [ "$BENCH_CACHE" = cold ]; then
        drop_caches
    fi
    wait_quiet
}

reproducer () # KIND IMG -> the command that serves this contender
{
    case $1 in
        raw)    echo "nbdkit -f -U SOCK file $RAW_IMG" ;;
        qemu)   echo "qemu-nbd -r -f qcow2 --persistent -e 8 -k SOCK $IMG_DIR/$2.qcow2" ;;
        filter) echo "nbdkit -f -U SOCK --filter=$FILTER_ORIG file $IMG_DIR/$2.qcow2 ${*:3}  (build sha256 $FILTER_SHA...)" ;;
    esac
}

# ---------------------------------------------------------------------
# Workload 1: full copy, nbdcopy URI null:.
# Appends "wall server_cpu client_cpu total_cpu peak_rss_kib other_cpu"
# to OUT.

measure_copy () # OUT NAME KIND IMG [FILTER ARGS...]
{
    local out=$1 name=$2 kind=$3 img=$4 tfile cpu0 cpu1 t0 t1 hwm b0 b1 rc=0
    shift 4
    tfile=$RUN_DIR/$name.time
    start_contender "$name" "$kind" "$img" "$@"
    before_measurement
    b0=$(sys_busy)
    cpu0=$(proc_cpu "$SERVER_PID")
    t0=$(now)
    /usr/bin/time -f '%U %S' -o "$tfile" \
        nbdcopy "$SERVER_URI" null: 2>>"$RUN_DIR/nbdcopy.log" || rc=$?
    t1=$(now)
    server_alive
    if [ "$rc" -ne 0 ]; then
        tail -n 5 "$RUN_DIR/nbdcopy.log" >&2 || true
        die "nbdcopy failed (status $rc) against $name; reproducer:
  $(reproducer "$kind" "$img" "$@") &
  nbdcopy 'nbd+unix:///?socket=SOCK' null:"
    fi
    cpu1=$(proc_cpu "$SERVER_PID")
    b1=$(sys_busy)
    hwm=$(proc_hwm_kb "$SERVER_PID")
    stop_server
    awk -v w="$(calc "$t1 - $t0")" -v s="$(calc "$cpu1 - $cpu0")" -v h="$hwm" \
            -v b0="$b0" -v b1="$b1" '
        END { c = $(NF-1) + $NF; o = b1 - b0 - s - c; if (o < 0) o = 0
              printf "%.4f %.2f %.2f %.2f %d %.2f\n", w, s, c, s + c, h, o }' \
        "$tfile" >> "$out"
    tail -n 1 "$out" | awk '{ print $1, $6 }' >> "$RES_DIR/load"
}

# ---------------------------------------------------------------------
# Workload 2: 4 KiB sequential reads, queue depth 1, fio's nbd engine,
# over the first $BENCH_FIO_SIZE of the disk.
# Appends "MiB/s mean_latency_us server_cpu client_cpu other_cpu" to OUT.

measure_fio () # OUT NAME KIND IMG [FILTER ARGS...]
{
    local out=$1 name=$2 kind=$3 img=$4 json tfile cpu0 cpu1 b0 b1 t0 t1 cli rc=0
    shift 4
    json=$RUN_DIR/$name.fio.json
    tfile=$RUN_DIR/$name.fio.time
    start_contender "$name" "$kind" "$img" "$@"
    before_measurement
    b0=$(sys_busy)
    cpu0=$(proc_cpu "$SERVER_PID")
    t0=$(now)
    /usr/bin/time -f '%U %S' -o "$tfile" \
    fio --name=seq --ioengine=nbd --uri="$SERVER_URI" --rw=read --bs=4k \
        --iodepth=1 --size="$BENCH_FIO_SIZE" --runtime="$BENCH_FIO_RUNTIME" \
        --output-format=json --output="$json" \
        >>"$RUN_DIR/fio.log" 2>&1 || rc=$?
    t1=$(now)
    server_alive
    if [ "$rc" -ne 0 ]; then
        tail -n 5 "$RUN_DIR/fio.log" >&2 || true
        die "fio failed (status $rc) against $name"
    fi
    cpu1=$(proc_cpu "$SERVER_PID")
    b1=$(sys_busy)
    stop_server
    cli=$(awk 'END { printf "%.2f", $(NF-1) + $NF }' "$tfile")
    python3 - "$json" "$(calc "$cpu1 - $cpu0")" "$cli" \
            "$(bg_cpu "$b0" "$b1" "$(calc "$cpu1 - $cpu0")" "$cli")" >> "$out" <<'EOF'
import json, sys
with open(sys.argv[1]) as f:
    text = f.read()
# fio may print notes before the JSON document.
j = json.loads(text[text.index("{"):])
r = j["jobs"][0]["read"]
if r.get("short_ios") or j["jobs"][0].get("error"):
    sys.exit("fio: short or failed reads")
print("%.3f %.2f %s %s %s" % (r["bw_bytes"] / 1048576.0,
                              r["lat_ns"]["mean"] / 1000.0,
                              sys.argv[2], sys.argv[3], sys.argv[4]))
EOF
    printf '%s %s\n' "$(calc "$t1 - $t0")" "$(tail -n 1 "$out" | awk '{ print $5 }')" \
        >> "$RES_DIR/load"
}

# ---------------------------------------------------------------------
# Data check: nbdcopy each contender to md5sum and compare with raw.img.

verify_contender () # NAME KIND IMG
{
    local name=$1 kind=$2 img=$3 sum want bad
    want=$(cat "$IMG_DIR/raw.md5")
    start_contender "$name" "$kind" "$img" "${FILTER_ARGS[@]}"
    MULTI_CONN[$kind-$img]=$(multi_conn "$SERVER_URI")
    if [ "$kind" = raw ]; then
        MULTI_CONN[raw-zlib]=${MULTI_CONN[raw-raw]}
        MULTI_CONN[raw-zstd]=${MULTI_CONN[raw-raw]}
    fi
    sum=$(nbdcopy "$SERVER_URI" - | md5sum | cut -d' ' -f1)
    server_alive
    if [ "$sum" = "$want" ]; then
        printf '  %-18s %-5s md5 %s  OK   (multi-conn: %s)\n' \
            "${LABEL[$kind]}" "$img" "$sum" "${MULTI_CONN[$kind-$img]}"
    else
        bad=$RUN_DIR/bad-$name.img
        nbdcopy "$SERVER_URI" "$bad" || true
        printf '  %-18s %-5s md5 %s  WRONG DATA (raw.img is %s)\n' \
            "${LABEL[$kind]}" "$img" "$sum" "$want"
        printf '    first differences (offset, raw, served; cmp -l, octal):\n'
        cmp -l "$RAW_IMG" "$bad" 2>&1 | head -n 5 | sed 's/^/      /'
        printf '    reproducer:\n      %s &\n      nbdcopy "nbd+unix:///?socket=SOCK" out.img && cmp %s out.img\n' \
            "$(reproducer "$kind" "$img" "${FILTER_ARGS[@]}")" "$RAW_IMG"
        BENCH_FAILED=1
    fi
    stop_server
}

# ---------------------------------------------------------------------
# Report helpers.

row_copy () # FILE LABEL MC
{
    local f=$1 w s c t h o wmin wmax
    w=$(col_median "$f" 1); s=$(col_median "$f" 2); c=$(col_median "$f" 3)
    t=$(col_median "$f" 4); h=$(col_median "$f" 5); o=$(col_median "$f" 6)
    wmin=$(awk '{ print $1 }' "$f" | sort -g | head -n 1)
    wmax=$(awk '{ print $1 }' "$f" | sort -g | tail -n 1)
    printf '  %-18s %8s %13s %8s %8s %6s %6s %10s %6s  %s\n' "$2" \
        "$(fmt 3 "$w")" "$(fmt 2 "$wmin")-$(fmt 2 "$wmax")" \
        "$(fmt 1 "$(calc "$VSIZE_MIB / $w")")" \
        "$(fmt 2 "$t")" "$(fmt 2 "$s")" "$(fmt 2 "$c")" \
        "$(fmt 1 "$(calc "$h / 1024")")" "$(fmt 2 "$o")" "$3"
}

report_copy () # IMG
{
    local img=$1 d=$RES_DIR/copy.$1 k wr wq wf cq cf
    printf '\nFull copy, nbdcopy URI null: -- %s image, %s MiB virtual, median of %s\n' \
        "$img" "$(fmt 0 "$VSIZE_MIB")" "$BENCH_RUNS"
    printf '  %-18s %8s %13s %8s %8s %6s %6s %10s %6s  %s\n' contender "wall s" "(min-max)" \
        "MiB/s" "CPU s" "srv" "cli" "srvRSS MiB" "other" "multi-conn"
    for k in "${CONTENDERS[@]}"; do
        row_copy "$d.$k" "${LABEL[$k]}" "${MULTI_CONN[$k-$img]:-?}"
    done
    wr=$(col_median "$d.raw" 1); wq=$(col_median "$d.qemu" 1); wf=$(col_median "$d.filter" 1)
    cq=$(col_median "$d.qemu" 4); cf=$(col_median "$d.filter" 4)
    printf '  filter vs raw:      time ratio filter/raw = %s\n' "$(fmt 2 "$(ratio "$wf" "$wr")")"
    printf '  filter vs qemu-nbd: speedup qemu/filter = %s, CPU ratio filter/qemu = %s\n' \
        "$(fmt 2 "$(ratio "$wq" "$wf")")" "$(fmt 2 "$(ratio "$cf" "$cq")")"
    case $img in
        zstd)
            target "full copy zstd: speedup vs qemu-nbd" "$(ratio "$wq" "$wf")" ">=" 1.8
            target "full copy zstd: CPU (srv+cli) filter/qemu-nbd" "$(ratio "$cf" "$cq")" "<=" 0.7
            ;;
        zlib)
            target "full copy zlib: speedup vs qemu-nbd" "$(ratio "$wq" "$wf")" ">=" 2.4
            ;;
    esac
}

report_fio () # IMG
{
    local img=$1 d=$RES_DIR/fio.$1 k m l s c o br bq bf
    printf '\n4 KiB sequential reads, QD1 (fio nbd engine, first %s) -- %s image, median of %s\n' \
        "$BENCH_FIO_SIZE" "$img" "$BENCH_RUNS"
    printf '  %-18s %9s %13s %10s %10s %7s\n' contender "MiB/s" "mean lat us" "srv CPU s" \
        "fio CPU s" "other"
    for k in "${CONTENDERS[@]}"; do
        m=$(col_median "$d.$k" 1); l=$(col_median "$d.$k" 2); s=$(col_median "$d.$k" 3)
        c=$(col_median "$d.$k" 4); o=$(col_median "$d.$k" 5)
        printf '  %-18s %9s %13s %10s %10s %7s\n' "${LABEL[$k]}" "$(fmt 1 "$m")" "$(fmt 1 "$l")" \
            "$(fmt 2 "$s")" "$(fmt 2 "$c")" "$(fmt 2 "$o")"
    done
    br=$(col_median "$d.raw" 1); bq=$(col_median "$d.qemu" 1); bf=$(col_median "$d.filter" 1)
    printf '  ratios: filter/raw = %s, filter/qemu-nbd = %s\n' \
        "$(fmt 2 "$(ratio "$bf" "$br")")" "$(fmt 2 "$(ratio "$bf" "$bq")")"
    target "4K seq QD1 $img: filter/raw" "$(ratio "$bf" "$br")" ">=" 0.8
    target "4K seq QD1 $img: filter/qemu-nbd" "$(ratio "$bf" "$bq")" ">=" 3
}

report_threads ()
{
    local d=$RES_DIR/threads t w s c base
    printf '\nThread scaling: full copy through the filter, zstd image, qcow2-threads=N, median of %s\n' \
        "$BENCH_RUNS"
    printf '  %-8s %8s %13s %8s %8s %10s %6s %8s\n' threads "wall s" "(min-max)" "MiB/s" "CPU s" \
        "srvRSS MiB" "other" "vs N=1"
    base=$(col_median "$d.${BENCH_THREADS%% *}" 1)
    for t in $BENCH_THREADS; do
        w=$(col_median "$d.$t" 1); c=$(col_median "$d.$t" 4)
        printf '  %-8s %8s %13s %8s %8s %10s %6s %8s\n' "$t" "$(fmt 3 "$w")" \
            "$(fmt 2 "$(awk '{print $1}' "$d.$t" | sort -g | head -n1)")-$(fmt 2 "$(awk '{print $1}' "$d.$t" | sort -g | tail -n1)")" \
            "$(fmt 1 "$(calc "$VSIZE_MIB / $w")")" "$(fmt 2 "$c")" \
            "$(fmt 1 "$(calc "$(col_median "$d.$t" 5) / 1024")")" \
            "$(fmt 2 "$(col_median "$d.$t" 6)")" \
            "$(fmt 2 "$(ratio "$base" "$w")")x"
    done
}

# Share of the fio region that is allocated (not zero) in the zstd image.
fio_region_note ()
{
    local bytes
    bytes=$(numfmt --from=iec "$BENCH_FIO_SIZE")
    qemu-img map --output=json "$IMG_DIR/zstd.qcow2" | python3 -c '
import json, sys
end = int(sys.argv[1])
data = 0
for e in json.load(sys.stdin):
    s, n = e["start"], e["length"]
    if e["data"] and s < end:
        data += min(s + n, end) - s
print("%.0f%%" % (100.0 * data / end))' "$bytes"
}

# ---------------------------------------------------------------------
# Main.

echo "qcow2zstd read benchmark ($BENCH_VARIANT), $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "Machine: $NPROC CPUs ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), $(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo) RAM, kernel $(uname -r)"
echo "Versions: $(nbdkit --version | head -n1); $(qemu-img --version | head -n1); $(nbdcopy --version | head -n1); $(fio --version)"
echo "Filter: $FILTER_ORIG (built $FILTER_BUILT, sha256 $FILTER_SHA..., run from a copy; tree $(git -C "$BENCH_TOPDIR" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$BENCH_TOPDIR" diff --quiet HEAD -- filters common 2>/dev/null || echo ' + local changes'))"
[ ${#FILTER_ARGS[@]} -eq 0 ] || echo "Filter parameters: ${FILTER_ARGS[*]}"
echo "Runs: $BENCH_RUNS per measurement, contenders alternating within each repetition; results in $RES_DIR"

bench_nice
echo "Load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

probe_drop_caches
if [ "$BENCH_CACHE" = cold ] && [ "$CAN_DROP_CACHES" != 1 ]; then
    echo "Page cache: cold was asked for but drop_caches is not permitted here; using warm"
    BENCH_CACHE=warm
fi
if [ "$BENCH_CACHE" = cold ]; then
    echo "Page cache: cold (sync; echo 3 > /proc/sys/vm/drop_caches before every measurement)"
else
    echo "Page cache: warm (images read into the page cache before each image's measurements, so every contender reads from memory; drop_caches $( [ "$CAN_DROP_CACHES" = 1 ] && echo 'works here: BENCH_CACHE=cold' || echo 'is not permitted here'))"
fi
echo "Servers: nbdkit file (raw), qemu-nbd -r -f qcow2 --persistent -e 8, nbdkit --filter=qcow2zstd file; Unix sockets; one fresh server per measurement"
echo "Client: nbdcopy defaults (multi-conn used when the server offers it); fio --ioengine=nbd, 1 connection"
echo

ensure_images
print_images
VSIZE=$(stat -c %s "$RAW_IMG")
VSIZE_MIB=$(calc "$VSIZE / 1048576")

if [ "$BENCH_VERIFY" = 1 ]; then
    echo
    echo "Data check (nbdcopy URI - | md5sum, against raw.img; outside timing):"
    verify_contender raw raw raw
    for img in zlib zstd; do
        verify_contender "qemu-$img" qemu "$img"
        verify_contender "filter-$img" filter "$img"
    done
    if [ "${MULTI_CONN[qemu-zstd]}" != yes ]; then
        echo "  NOTE: qemu-nbd does not advertise multi-conn here, so nbdcopy uses one connection to it"
    fi
else
    for img in zlib zstd; do
        for k in "${CONTENDERS[@]}"; do
            start_contender "mc-$k" "$k" "$img"
            MULTI_CONN[$k-$img]=$(multi_conn "$SERVER_URI")
            stop_server
        done
    done
fi

if wants copy; then
    for img in zlib zstd; do
        [ "$BENCH_CACHE" = cold ] || warm_files "$RAW_IMG" "$IMG_DIR/$img.qcow2"
        for rep in $(seq "$BENCH_RUNS"); do
            msg "copy $img: repetition $rep/$BENCH_RUNS"
            measure_copy "$RES_DIR/copy.$img.raw" raw raw "$img"
            measure_copy "$RES_DIR/copy.$img.qemu" "qemu-$img" qemu "$img"
            measure_copy "$RES_DIR/copy.$img.filter" "filter-$img" filter "$img" "${FILTER_ARGS[@]}"
        done
    done
    for img in zlib zstd; do report_copy "$img"; done
fi

if wants fio; then
    for img in zlib zstd; do
        [ "$BENCH_CACHE" = cold ] || warm_files "$RAW_IMG" "$IMG_DIR/$img.qcow2"
        for rep in $(seq "$BENCH_RUNS"); do
            msg "fio $img: repetition $rep/$BENCH_RUNS"
            measure_fio "$RES_DIR/fio.$img.raw" raw raw "$img"
            measure_fio "$RES_DIR/fio.$img.qemu" "qemu-$img" qemu "$img"
            measure_fio "$RES_DIR/fio.$img.filter" "filter-$img" filter "$img" "${FILTER_ARGS[@]}"
        done
    done
    printf '\n(The first %s of the disk is %s allocated data in the zstd image; the rest reads as zeros.)\n' \
        "$BENCH_FIO_SIZE" "$(fio_region_note)"
    for img in zlib zstd; do report_fio "$img"; done
fi

if wants threads; then
    [ "$BENCH_CACHE" = cold ] || warm_files "$IMG_DIR/zstd.qcow2"
    for rep in $(seq "$BENCH_RUNS"); do
        msg "threads: repetition $rep/$BENCH_RUNS"
        for t in $BENCH_THREADS; do
            measure_copy "$RES_DIR/threads.$t" "filter-t$t" filter zstd \
                "${FILTER_ARGS[@]}" "qcow2-threads=$t"
        done
    done
    report_threads
fi

# The filter is started without -r, as users run it: make sure it left
# the images alone (a changed image would make later runs meaningless).
for img in zlib zstd; do
    if [ "$(stat -c '%s %Y' "$IMG_DIR/$img.qcow2")" != "$(sed -n "s/^$img //p" "$IMG_DIR/qcow2.stat")" ]; then
        echo
        echo "WARNING: $IMG_DIR/$img.qcow2 changed during the run (size or mtime); it will be rebuilt next time"
        rm -f "$IMG_DIR/stamp"
        BENCH_FAILED=1
    fi
done

echo
if [ -s "$RES_DIR/load" ]; then
    awk -v n="$NPROC" -v tmo="$QUIET_TIMEOUTS" -v qw="$BENCH_QUIET_WAIT" '
        { w += $1; o += $2; if ($2 > 0.1 * $1 * n) busy++ }
        END {
            printf "Other processes during the measurements: %.1f CPU-s over %.1f s of measuring, %.0f%% of the machine; %d of %d measurements had them above 10%%", o, w, 100 * o / (w * n), busy, NR
            if (qw > 0) printf "; %d waits for an idle machine timed out", tmo
            printf "\n"
            if (o > 0.05 * w * n)
                print "WARNING: the machine was busy with other work: wall times (and the speedups) are noisy; CPU seconds and CPU ratios are the sturdier numbers"
        }' "$RES_DIR/load"
fi
echo "Load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "Targets (informational):"
if [ ${#TARGET_SUMMARY[@]} -eq 0 ]; then
    echo "  (no workload measured)"
else
    printf '  %s\n' "${TARGET_SUMMARY[@]}"
fi
if [ "$BENCH_FAILED" = 1 ]; then
    echo
    echo "FAILED: wrong data from a contender, or a modified image (see above)"
    exit 1
fi
