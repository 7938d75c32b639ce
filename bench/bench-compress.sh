#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Compression benchmark: the read benchmark's raw image (make-image.sh)
# copied with nbdcopy into the qcow2zstd filter in create mode, against
# qemu-img convert -c on the same input in the same run, for zstd and zlib.
#
#   bench/bench-compress.sh                 full run (2 GiB image, 5 runs)
#   BENCH_QUICK=1 bench/bench-compress.sh   smoke run (256 MiB image, 3 runs)
#
# The two commands compared, each timed whole by GNU time (wall, and
# user+sys CPU of everything it ran):
#
#   filter: truncate -s VSIZE+10% out.qcow2
#           nbdkit -U - --filter=qcow2zstd file out.qcow2 qcow2-create=VSIZE \
#               qcow2-compression-type=T [qcow2-compression-level=L] \
#               --run 'nbdcopy --flush raw.img "$uri"'
#           (nbdkit --run: server start, format, copy, flush, server exit;
#           the CPU time is the server's plus nbdcopy's, also shown apart)
#   qemu:   qemu-img convert -c -O qcow2 -o cluster_size=64k,compression_type=T \
#               raw.img out.qcow2
#           (qemu-img fdatasyncs the output before it exits; nbdcopy --flush
#           makes the filter do the same)
#
# Output size is the allocated size of the file (stat %b, what du counts):
# the filter's file is sparse, pre-sized by truncate.  Every output is
# checked outside the timing: qemu-img check must be clean, qemu-img info
# must show the requested compression type and the input's virtual size,
# and qemu-img compare against the input must say identical (see
# BENCH_VERIFY).
#
# Parts (BENCH_ONLY):
#   headline  default level, both types, BENCH_RUNS runs alternating the
#             contenders (and which goes first); medians, ratios, targets;
#             beside them the encode bound: bench-encode (bench-encode.c,
#             built with the filter's tree) compresses the same non-zero
#             clusters from memory with the engine's encoder, one thread per
#             CPU as the filter's pool, nothing else (BENCH_RUNS runs)
#   curve     size and time of the filter at several levels (one run each)
#             on the whole image, with qemu-img's point (its level is fixed)
#   subset    slow levels (zstd 19) on the first BENCH_SUBSET of the image,
#             with the default level and qemu-img on the same subset
#
# Knobs (environment):
#   BENCH_RUNS=N           headline repetitions (default 5, quick 3)
#   BENCH_QUICK=1          small image, 3 runs
#   BENCH_DIR=DIR          work dir, images cached there
#   BENCH_ONLY="headline curve subset"
#   BENCH_TYPES="zstd zlib"   compression types to run
#   BENCH_ZSTD_LEVELS="1 3 6 9"   BENCH_ZLIB_LEVELS="1 5 6 9"   (curve)
#   BENCH_SUBSET_LEVELS="19"      BENCH_SUBSET=SIZE (256M, quick 32M)
#   BENCH_VERIFY=all|first|0   qemu-img compare with the input for every
#                          output (default all), for the first of each kind,
#                          or never; qemu-img check and info run always
#   BENCH_CLUSTER_SIZE=SIZE  the images' cluster size (default 64k), both sides
#   BENCH_FILTER_ARGS="..."  extra filter parameters (e.g. qcow2-threads=1)
#   BENCH_NBDCOPY_ARGS="..." extra nbdcopy options (e.g. --destination-is-zero)
#   BENCH_KEEP=1           keep the run directory
#   FILTER=PATH            the filter .so (default: this build tree)
#
# Exits non-zero if a copy failed or an output image failed a check.

source "$(dirname "${BASH_SOURCE[0]}")/common-write.sh"

: "${BENCH_ONLY:=headline curve subset}"
: "${BENCH_ZSTD_LEVELS:=1 3 6 9}"
: "${BENCH_ZLIB_LEVELS:=1 5 6 9}"
: "${BENCH_SUBSET_LEVELS:=19}"
if [ "$BENCH_QUICK" = 1 ]; then
    : "${BENCH_SUBSET:=32M}"
else
    : "${BENCH_SUBSET:=256M}"
fi
: "${BENCH_VERIFY:=all}"
: "${BENCH_CLUSTER_SIZE:=64k}"
CLUSTER_BYTES=$(to_bytes "$BENCH_CLUSTER_SIZE")
: "${BENCH_FILTER_ARGS:=}"
: "${BENCH_NBDCOPY_ARGS:=}"
# shellcheck disable=SC2206
FILTER_ARGS=($BENCH_FILTER_ARGS)
# shellcheck disable=SC2206
NBDCOPY_ARGS=($BENCH_NBDCOPY_ARGS)

# The filter's default levels (qemu's are fixed: ZSTD_CLEVEL_DEFAULT, 3,
# and Z_DEFAULT_COMPRESSION, 6).
declare -A DEFAULT_LEVEL=([zstd]=3 [zlib]=6)
read -r -a TYPES <<< "${BENCH_TYPES:-zstd zlib}"
declare -A LABEL=([filter]="qcow2zstd filter" [qemu]="qemu-img convert")
declare -A SPEED=() SIZE=() CPU=() FILE=() BOUND=()

need_cmds nbdkit qemu-img nbdcopy python3 numfmt
ensure_gnu_time
bench_setup compress
BENCH_FAILED=0
wants () { [[ " $BENCH_ONLY " == *" $1 "* ]]; }

# ---------------------------------------------------------------------

reproducer () # KIND TYPE LEVEL INPUT
{
    local kind=$1 type=$2 level=$3 input=$4 isize
    isize=$(stat -c %s "$input")
    if [ "$input" != "$RAW_IMG" ]; then
        printf '  dd if=%s of=%s bs=1M count=%s conv=sparse\n' "$RAW_IMG" "$input" $((isize / 1048576))
    fi
    if [ "$kind" = filter ]; then
        printf '  truncate -s %s out.qcow2\n  nbdkit -U - --filter=%s file out.qcow2 qcow2-create=%s qcow2-cluster-size=%s qcow2-compression-type=%s%s %s --run '\''nbdcopy --flush %s %s "$uri"'\''\n' \
            "$((isize + isize / 10))" "$FILTER_ORIG" "$isize" "$BENCH_CLUSTER_SIZE" "$type" \
            "$( [ "$level" = default ] || echo " qcow2-compression-level=$level")" \
            "${FILTER_ARGS[*]}" "${NBDCOPY_ARGS[*]}" "$input"
    else
        printf '  qemu-img convert -c -O qcow2 -o cluster_size=%s,compression_type=%s %s out.qcow2\n' \
            "$BENCH_CLUSTER_SIZE" "$type" "$input"
    fi
}

# check_output KIND TYPE LEVEL INPUT OUT VERIFY(0/1): qemu-img check, info
# and (if VERIFY) compare.  Records failures; prints nothing on success.
declare -A VERIFIED=()
check_output ()
{
    local kind=$1 type=$2 level=$3 input=$4 out=$5 verify=$6 rc=0 info vsize ctype csize cmp
    qcow2_check "$out" "$RUN_DIR/check.log" >/dev/null || rc=$?
    if [ "$rc" -ne 0 ]; then
        tail -n 12 "$RUN_DIR/check.log" >&2
        msg "  FAILED: qemu-img check of ${LABEL[$kind]}'s $type level $level output (status $rc); reproducer:"
        reproducer "$kind" "$type" "$level" "$input" >&2
        BENCH_FAILED=1
        CHECKS_FAILED+=("$kind $type level $level: qemu-img check status $rc")
    fi
    read -r vsize ctype csize < <(qcow2_info "$out")
    if [ "$ctype" != "$type" ] || [ "$vsize" != "$(stat -c %s "$input")" ] || [ "$csize" != "$CLUSTER_BYTES" ]; then
        msg "  FAILED: qemu-img info of ${LABEL[$kind]}'s $type output: compression type $ctype, virtual size $vsize, cluster size $csize"
        BENCH_FAILED=1
        CHECKS_FAILED+=("$kind $type level $level: qemu-img info says $ctype/$vsize/$csize")
    fi
    CHECKED=$((CHECKED + 1))
    if [ "$verify" = 1 ]; then
        rc=0
        cmp=$(qemu-img compare -f raw -F qcow2 "$input" "$out" 2>&1) || rc=$?
        if [ "$rc" -ne 0 ]; then
            msg "  FAILED: qemu-img compare input vs ${LABEL[$kind]}'s $type level $level output: $cmp; reproducer:"
            reproducer "$kind" "$type" "$level" "$input" >&2
            BENCH_FAILED=1
            CHECKS_FAILED+=("$kind $type level $level: qemu-img compare: $cmp")
        fi
        COMPARED=$((COMPARED + 1))
        [ "$rc" -ne 0 ] || COMPARED_OK=$((COMPARED_OK + 1))
    fi
}
CHECKED=0
COMPARED=0
COMPARED_OK=0
CHECKS_FAILED=()

want_verify () # KEY: sets VERIFY to 0/1, per BENCH_VERIFY
{
    VERIFY=0
    case $BENCH_VERIFY in
        all) VERIFY=1 ;;
        first) if [ -z "${VERIFIED[$1]:-}" ]; then VERIFIED[$1]=1; VERIFY=1; fi ;;
    esac
}

# data_end FILE: the end of FILE's last data extent.
data_end ()
{
    /usr/bin/python3 -c '
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
end = pos = 0
while True:
    try:
        start = os.lseek(fd, pos, os.SEEK_DATA)
    except OSError:
        break
    pos = end = os.lseek(fd, start, os.SEEK_HOLE)
print(end)
' "$1"
}

# measure OUT KIND TYPE LEVEL INPUT [KEEP]
# Appends "wall cpu alloc_bytes data_end client_cpu server_cpu" to OUT
# (client/server split for the filter only; "-" for qemu).  LEVEL
# "default" gives no level parameter.  The output is deleted unless KEEP
# names a path to move it to.
measure ()
{
    local res=$1 kind=$2 type=$3 level=$4 input=$5 keep=${6:-} out tfile cfile rc=0 isize \
          wall u s cw cu cs
    out=$RUN_DIR/$kind-$type.qcow2
    tfile=$RUN_DIR/$kind.time
    cfile=$RUN_DIR/client.time
    isize=$(stat -c %s "$input")
    rm -f "$out" "$tfile" "$cfile"
    if [ "$kind" = filter ]; then
        local largs=()
        [ "$level" = default ] || largs=("qcow2-compression-level=$level")
        truncate -s $((isize + isize / 10)) "$out"
        /usr/bin/time -f '%e %U %S' -o "$tfile" \
            nbdkit -U - --filter="$FILTER" file "$out" "qcow2-create=$isize" \
                "qcow2-cluster-size=$BENCH_CLUSTER_SIZE" \
                "qcow2-compression-type=$type" "${largs[@]}" "${FILTER_ARGS[@]}" \
                --run "/usr/bin/time -f '%e %U %S' -o '$cfile' nbdcopy --flush ${NBDCOPY_ARGS[*]} '$input' \"\$uri\"" \
            </dev/null >>"$RUN_DIR/filter.log" 2>&1 || rc=$?
    else
        /usr/bin/time -f '%e %U %S' -o "$tfile" \
            qemu-img convert -c -O qcow2 -o "cluster_size=$CLUSTER_BYTES,compression_type=$type" \
                "$input" "$out" </dev/null >>"$RUN_DIR/qemu-img.log" 2>&1 || rc=$?
    fi
    if [ "$rc" -ne 0 ]; then
        if [ "$kind" = filter ]; then tail -n 8 "$RUN_DIR/filter.log" >&2 || true
        else tail -n 8 "$RUN_DIR/qemu-img.log" >&2 || true; fi
        die "${LABEL[$kind]} $type level $level failed (status $rc); reproducer:
$(reproducer "$kind" "$type" "$level" "$input")"
    fi
    # GNU time writes "Command exited with non-zero status" lines first on
    # failure; the numbers are the last line.
    read -r wall u s < <(tail -n 1 "$tfile")
    if [ "$kind" = filter ]; then
        read -r cw cu cs < <(tail -n 1 "$cfile")
    fi
    want_verify "$kind-$type-$level-$(basename "$input")"
    check_output "$kind" "$type" "$level" "$input" "$out" "$VERIFY"
    if [ "$kind" = filter ]; then
        printf '%s %s %s %s %s %s\n' "$wall" "$(calc "$u + $s")" "$(alloc_bytes "$out")" \
            "$(data_end "$out")" "$(calc "$cu + $cs")" "$(calc "$u + $s - $cu - $cs")" >> "$res"
    else
        printf '%s %s %s %s - -\n' "$wall" "$(calc "$u + $s")" "$(alloc_bytes "$out")" \
            "$(data_end "$out")" >> "$res"
    fi
    if [ -n "$keep" ]; then mv -f "$out" "$keep"; else rm -f "$out"; fi
}

# ---------------------------------------------------------------------
# Main.

print_machine "qcow2zstd compression benchmark"
[ ${#FILTER_ARGS[@]} -eq 0 ] || echo "Filter parameters: ${FILTER_ARGS[*]}"
[ ${#NBDCOPY_ARGS[@]} -eq 0 ] || echo "nbdcopy options: ${NBDCOPY_ARGS[*]}"
echo "Filter: truncate -s VSIZE+10% out; nbdkit -U - --filter=qcow2zstd file out qcow2-create=VSIZE qcow2-cluster-size=$BENCH_CLUSTER_SIZE qcow2-compression-type=T [qcow2-compression-level=L] --run 'nbdcopy --flush raw.img \$uri'"
echo "qemu:   qemu-img convert -c -O qcow2 -o cluster_size=$BENCH_CLUSTER_SIZE,compression_type=T raw.img out  (fixed levels: zstd 3, zlib 6)"
echo "Timing: GNU time around each whole command (nbdkit --run covers server + nbdcopy); CPU = user + sys of all processes and threads"
echo "Size: allocated bytes of the output file (stat %b); checks after every output, outside timing: qemu-img check, qemu-img info (type, size), qemu-img compare with the input ($BENCH_VERIFY)"
echo "Results in $RES_DIR"

ensure_images
VSIZE=$(stat -c %s "$RAW_IMG")
RAW_ALLOC=$(alloc_bytes "$RAW_IMG")
echo "Input: $RAW_IMG: $(mib "$VSIZE") MiB disk, $(mib "$RAW_ALLOC") MiB allocated, $(cat "$IMG_DIR/data-mib" 2>/dev/null || echo '?') MiB of files in ext4; page cache warm (read before the runs)"
warm_files "$RAW_IMG"

# The encode bound, from the build tree the filter comes from (a private
# copy, as the filter's).
ENCODE=$RUN_DIR/bench-encode
if wants headline; then
    encode_built=$(cd "$(dirname "$FILTER_ORIG")/../../.." && pwd)/bench/bench-encode
    [ -x "$encode_built" ] || die "$encode_built is not built (make)"
    cp -f "$encode_built" "$ENCODE"
    for type in "${TYPES[@]}"; do
        for rep in $(seq "$BENCH_RUNS"); do
            msg "headline $type: encode bound, repetition $rep/$BENCH_RUNS"
            "$ENCODE" "$RAW_IMG" "$type" "${DEFAULT_LEVEL[$type]}" "$CLUSTER_BYTES" \
                >> "$RES_DIR/headline.$type.encode" || die "bench-encode failed"
            msg "headline $type: repetition $rep/$BENCH_RUNS"
            if [ $((rep % 2)) = 1 ]; then order=(filter qemu); else order=(qemu filter); fi
            for k in "${order[@]}"; do
                measure "$RES_DIR/headline.$type.$k" "$k" "$type" default "$RAW_IMG"
            done
        done
    done
fi

if wants curve; then
    for type in "${TYPES[@]}"; do
        if [ "$type" = zstd ]; then levels=$BENCH_ZSTD_LEVELS; else levels=$BENCH_ZLIB_LEVELS; fi
        for l in $levels; do
            msg "curve $type level $l"
            measure "$RES_DIR/curve.$type.$l" filter "$type" "$l" "$RAW_IMG"
        done
        # qemu-img's point, unless the headline measured it already.
        if [ ! -s "$RES_DIR/headline.$type.qemu" ]; then
            msg "curve $type: qemu-img"
            measure "$RES_DIR/curve.$type.qemu" qemu "$type" default "$RAW_IMG"
        fi
    done
fi

if wants subset; then
    SUBSET_BYTES=$(to_bytes "$BENCH_SUBSET")
    [ "$SUBSET_BYTES" -le "$VSIZE" ] || SUBSET_BYTES=$VSIZE
    SUBSET=$RUN_DIR/subset.raw
    # The first part of the disk, holes kept.
    dd if="$RAW_IMG" of="$SUBSET" bs=1M count=$((SUBSET_BYTES / 1048576)) \
        conv=sparse status=none
    truncate -s $((SUBSET_BYTES / 1048576 * 1048576)) "$SUBSET"
    warm_files "$SUBSET"
    msg "subset: zstd default level and qemu-img"
    measure "$RES_DIR/subset.zstd.default" filter zstd default "$SUBSET"
    measure "$RES_DIR/subset.zstd.qemu" qemu zstd default "$SUBSET"
    for l in $BENCH_SUBSET_LEVELS; do
        msg "subset: zstd level $l"
        measure "$RES_DIR/subset.zstd.$l" filter zstd "$l" "$SUBSET"
    done
    rm -f "$SUBSET"
fi

# ---------------------------------------------------------------------
# Report.

# row LABEL FILE INPUT_BYTES [QEMU_FILE]: one line of a size/time table
# (medians of FILE), with ratios against QEMU_FILE if given.
row ()
{
    local label=$1 f=$2 in=$3 q=${4:-} w c a n tr sr cr
    w=$(col_median "$f" 1); c=$(col_median "$f" 2); a=$(col_median "$f" 3)
    n=$(wc -l < "$f")
    tr=-; sr=-; cr=-
    if [ -n "$q" ] && [ -s "$q" ]; then
        tr=$(ratio "$(col_median "$q" 1)" "$w")
        cr=$(ratio "$(col_median "$q" 2)" "$c")
        sr=$(ratio "$a" "$(col_median "$q" 3)")
    fi
    printf '  %-26s %3s %8s %13s %9s %8s %10s %8s %10s %10s %10s\n' "$label" "$n" \
        "$(fmt 2 "$w")" "$(col_range "$f" 1 2)" "$(fmt 1 "$(calc "$in / 1048576 / $w")")" \
        "$(fmt 2 "$c")" "$(mib "$a" 2)" "$(fmt 3 "$(ratio "$in" "$a")")" \
        "$(fmt 2 "$tr")" "$(fmt 2 "$cr")" "$(fmt 4 "$sr")"
}
row_header ()
{
    printf '  %-26s %3s %8s %13s %9s %8s %10s %8s %10s %10s %10s\n' "" runs "wall s" "(min-max)" \
        "in MiB/s" "CPU s" "alloc MiB" "in/out" "speed vs q" "CPU vs q" "size vs q"
}

if wants headline; then
    printf '\nHeadline: default level, whole image (%s MiB), median of %s runs, contenders alternating\n' \
        "$(mib "$VSIZE")" "$BENCH_RUNS"
    echo "  (speed vs q = qemu wall / filter wall; CPU vs q = qemu CPU / filter CPU; size vs q = filter alloc / qemu alloc)"
    row_header
    for type in "${TYPES[@]}"; do
        f=$RES_DIR/headline.$type.filter; q=$RES_DIR/headline.$type.qemu
        row "filter $type (level ${DEFAULT_LEVEL[$type]})" "$f" "$VSIZE" "$q"
        row "qemu-img $type" "$q" "$VSIZE"
        printf '  %-26s     filter CPU split: server %s s + nbdcopy %s s\n' "" \
            "$(fmt 2 "$(col_median "$f" 6)")" "$(fmt 2 "$(col_median "$f" 5)")"
        e=$RES_DIR/headline.$type.encode
        read -r _ eclusters _ eout ethreads < "$e"
        printf '  %-26s     encode bound: %s s (%s) for %s clusters on %s threads, %s MiB out; filter wall %sx of it\n' "" \
            "$(fmt 2 "$(col_median "$e" 1)")" "$(col_range "$e" 1 2)" "$eclusters" "$ethreads" \
            "$(mib "$eout" 2)" "$(fmt 2 "$(ratio "$(col_median "$f" 1)" "$(col_median "$e" 1)")")"
    done
    echo
    echo "Targets (headline):"
    for type in "${TYPES[@]}"; do
        f=$RES_DIR/headline.$type.filter; q=$RES_DIR/headline.$type.qemu
        SPEED[$type]=$(ratio "$(col_median "$q" 1)" "$(col_median "$f" 1)")
        SIZE[$type]=$(ratio "$(col_median "$f" 3)" "$(col_median "$q" 3)")
        CPU[$type]=$(ratio "$(col_median "$q" 2)" "$(col_median "$f" 2)")
        FILE[$type]=$(ratio "$(col_median "$f" 4)" "$(col_median "$q" 4)")
        BOUND[$type]=$(ratio "$(col_median "$f" 1)" "$(col_median "$RES_DIR/headline.$type.encode" 1)")
    done
    for type in "${TYPES[@]}"; do
        target "$type: speed vs qemu-img convert -c (wall)" "${SPEED[$type]}" ">=" 2.5
        target "$type: wall vs the encode bound ($(fmt 2 "${BOUND[$type]}"))" "${BOUND[$type]}" "<=" 1.15
        target "$type: allocated size vs qemu-img ($(fmt 4 "${SIZE[$type]}"))" "${SIZE[$type]}" "<=" 1.00
        target "$type: file up to its last data vs qemu-img ($(fmt 4 "${FILE[$type]}"))" "${FILE[$type]}" "<=" 1.00
    done
fi

if wants curve; then
    printf '\nLevel curve: filter at each level, whole image, one run each (qemu-img: median of its runs above)\n'
    row_header
    for type in "${TYPES[@]}"; do
        if [ "$type" = zstd ]; then levels=$BENCH_ZSTD_LEVELS; else levels=$BENCH_ZLIB_LEVELS; fi
        q=$RES_DIR/headline.$type.qemu
        [ -s "$q" ] || q=$RES_DIR/curve.$type.qemu
        for l in $levels; do
            row "filter $type level $l" "$RES_DIR/curve.$type.$l" "$VSIZE" "$q"
        done
        row "qemu-img $type" "$q" "$VSIZE"
    done
fi

if wants subset; then
    printf '\nSlow levels on the first %s MiB of the image, one run each\n' "$(mib "$SUBSET_BYTES" 0)"
    row_header
    q=$RES_DIR/subset.zstd.qemu
    row "filter zstd level 3" "$RES_DIR/subset.zstd.default" "$SUBSET_BYTES" "$q"
    for l in $BENCH_SUBSET_LEVELS; do
        row "filter zstd level $l" "$RES_DIR/subset.zstd.$l" "$SUBSET_BYTES" "$q"
    done
    row "qemu-img zstd" "$q" "$SUBSET_BYTES"
fi

echo
printf 'Checks: %s outputs checked with qemu-img check + info (type, virtual size, %s clusters); %s of %s compared with qemu-img compare identical to their input' \
    "$CHECKED" "$BENCH_CLUSTER_SIZE" "$COMPARED_OK" "$COMPARED"
if [ ${#CHECKS_FAILED[@]} -eq 0 ]; then
    echo "; no failures"
else
    echo "; FAILURES:"
    printf '  %s\n' "${CHECKS_FAILED[@]}"
fi

if wants headline; then
    echo
    echo "Summary (medians, default levels; whole image):"
    printf '  %-6s %14s %14s %12s %12s %12s\n' type "filter wall s" "qemu wall s" "speed f vs q" "CPU q/f" "size f/q"
    for type in "${TYPES[@]}"; do
        printf '  %-6s %14s %14s %11sx %11sx %12s\n' "$type" \
            "$(fmt 2 "$(col_median "$RES_DIR/headline.$type.filter" 1)")" \
            "$(fmt 2 "$(col_median "$RES_DIR/headline.$type.qemu" 1)")" \
            "$(fmt 2 "${SPEED[$type]}")" "$(fmt 2 "${CPU[$type]}")" "$(fmt 4 "${SIZE[$type]}")"
    done
    echo
    echo "Targets (informational):"
    printf '  %s\n' "${TARGET_SUMMARY[@]}"
fi
if [ "$BENCH_FAILED" = 1 ]; then
    echo
    echo "FAILED: an output image failed a check (see above)"
    exit 1
fi
