#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# HTTP benchmark: a full read of the zstd and the zlib image of
# bench/make-image.sh through the filter, over nbdkit's curl plugin from
# nginx (Debian's package, started here on 127.0.0.1 with its own
# configuration, serving the image directory with byte ranges), against
# the same filter over nbdkit's file plugin reading the local file, for a
# few qcow2-request-size values (the default among them) and two sizes of
# the client's requests, in one run; then 4 KiB random reads through
# curl.  Within one client request the filter merges clusters into one
# plugin read; across requests, a connection that reads on sequentially
# fetches qcow2-request-size bytes ahead (paths/fetchahead.h).
#
#   bench/bench-http.sh                 full run (2 GiB image, 5 runs)
#   BENCH_QUICK=1 bench/bench-http.sh   smoke run (256 MiB image, 3 runs)
#
# Knobs (environment), besides those of bench/common.sh:
#   BENCH_HTTP_TYPES="zstd zlib"   the images read
#   BENCH_HTTP_SIZES="default 1M 16M"
#                              the qcow2-request-size values (default: the
#                              parameter not given, 4M)
#   BENCH_HTTP_CLIENT_SIZES="256K 4M"
#                              nbdcopy's --request-size values (256K is
#                              its default)
#   BENCH_HTTP_RANDREAD=10     seconds of fio's 4 KiB randread at QD16 of
#                              the zstd image through curl, after a 2 s
#                              ramp (0: none)
#   BENCH_FILTER2=PATH         a second build of the filter (such as
#                              main's), measured beside this one on the
#                              full reads with the default parameters and
#                              nbdcopy's first request size, and on the
#                              random reads, with the ratios of the two
#   BENCH_NGINX_WORKERS=1      nginx's worker_processes
#   BENCH_NICE=N               run everything (nginx, nbdkit, nbdcopy) at
#                              nice N, e.g. -10 on a machine shared with
#                              builds, whose scheduling delays otherwise
#                              land on every HTTP request (default 0)
#   BENCH_QUIET_WAIT=SECS      as in bench-read.sh (default 10)
#   BENCH_VERIFY=0             skip the data check
#
# Both contenders serve read-only (-r), so the filter offers multi-conn
# and nbdcopy reads over several connections; each connection of the
# curl plugin has its own HTTP connection.  The page cache is warm: the
# images are read into it first, so both read them from memory, and the
# difference is what HTTP and the curl plugin cost.  Every measurement
# starts a fresh nbdkit; nginx runs for the whole benchmark.  The two
# contenders alternate within each repetition; medians are printed, and
# the ratio nginx/file of the throughputs, with the target (>= 0.9 with
# nbdcopy's default requests and the default parameters, for each image).
# Exits 0 unless something broke (a server that died, a failed copy,
# wrong data).

source "$(dirname "${BASH_SOURCE[0]}")/make-image.sh"
source "$BENCH_TOPDIR/tests/nginx-functions.sh"

: "${BENCH_HTTP_TYPES:=zstd zlib}"
: "${BENCH_HTTP_SIZES:=default 1M 16M}"
: "${BENCH_HTTP_CLIENT_SIZES:=256K 4M}"
: "${BENCH_HTTP_RANDREAD:=10}"
: "${BENCH_NGINX_WORKERS:=1}"
: "${BENCH_VERIFY:=1}"
: "${BENCH_QUIET_WAIT:=10}"
: "${BENCH_NICE:=0}"

FILTER2=${BENCH_FILTER2:-}
need_cmds nbdkit nbdcopy nbdinfo qemu-img md5sum python3 ps numfmt
[ "$BENCH_HTTP_RANDREAD" = 0 ] || need_cmds fio
ensure_gnu_time
[ -f "$FILTER" ] || die "the filter is not built: $FILTER"
nbdkit curl --dump-plugin > /dev/null 2>&1 || die "nbdkit has no curl plugin"

RUN_DIR=$BENCH_DIR/run-http
RES_DIR=$BENCH_DIR/results/$(date +%Y%m%d-%H%M%S)-http-$BENCH_VARIANT
mkdir -p "$RUN_DIR" "$RES_DIR"
# A private copy of the filter, as bench-read.sh does.
cp -f "$FILTER" "$RUN_DIR/filter.so.tmp"
mv -f "$RUN_DIR/filter.so.tmp" "$RUN_DIR/filter.so"
FILTER_ORIG=$FILTER
FILTER=$RUN_DIR/filter.so

_pids=()
trap 'stop_nginx; _bench_cleanup' EXIT

# nginx_cpu: CPU seconds of nginx's master and workers so far.
nginx_cpu ()
{
    local master pid total=0
    master=$(cat "$RUN_DIR/nginx/nginx.pid")
    for pid in "$master" $(ps -o pid= --ppid "$master"); do
        total=$(calc "$total + $(proc_cpu "$pid")")
    done
    printf '%s' "$total"
}

# serve KIND TYPE SIZE: the filter over TYPE's image, with
# qcow2-request-size=SIZE (none for default), read-only, over the local
# file (KIND file) or over curl from nginx (KIND nginx).
serve ()
{
    local param=()
    [ "$3" = default ] || param=("qcow2-request-size=$3")
    case $1 in
        file)  start_server "file-$2-$3" filter "$IMG_DIR/$2.qcow2" -r "${param[@]}" ;;
        nginx) start_server "nginx-$2-$3" curl "$NGINX_URL/$2.qcow2" "${param[@]}" ;;
    esac
}

# measure OUT KIND TYPE SIZE CLIENT: appends "wall nbdkit_cpu nbdcopy_cpu
# nginx_cpu other_cpu" to OUT, nbdcopy reading in requests of CLIENT.
measure ()
{
    local out=$1 kind=$2 type=$3 size=$4 client=$5 tfile=$RUN_DIR/nbdcopy.time rc=0
    local t0 t1 c0 c1 n0 n1 b0 b1 cli
    serve "$kind" "$type" "$size"
    wait_quiet
    b0=$(sys_busy); c0=$(proc_cpu "$SERVER_PID"); n0=$(nginx_cpu)
    t0=$(now)
    /usr/bin/time -f '%U %S' -o "$tfile" \
        nbdcopy --request-size="$(numfmt --from=iec "$client")" "$SERVER_URI" null: \
        2>> "$RUN_DIR/nbdcopy.log" || rc=$?
    t1=$(now)
    server_alive
    [ "$rc" = 0 ] || { tail -n 5 "$RUN_DIR/nbdcopy.log" >&2; die "nbdcopy --request-size=$client failed (status $rc) against $kind, $type, qcow2-request-size=$size"; }
    c1=$(proc_cpu "$SERVER_PID"); n1=$(nginx_cpu); b1=$(sys_busy)
    stop_server
    cli=$(awk 'END { printf "%.2f", $(NF-1) + $NF }' "$tfile")
    printf '%s %s %s %s %s\n' "$(calc "$t1 - $t0")" "$(calc "$c1 - $c0")" "$cli" \
        "$(calc "$n1 - $n0")" "$(bg_cpu "$b0" "$b1" "$(calc "$c1 - $c0")" "$cli" "$(calc "$n1 - $n0")")" >> "$out"
}

echo "qcow2zstd HTTP benchmark ($BENCH_VARIANT), $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "Machine: $NPROC CPUs ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), kernel $(uname -r)"
echo "Versions: $(nbdkit --version | head -n1); $(PATH=$PATH:/usr/sbin nginx -v 2>&1); $(nbdcopy --version | head -n1)"
echo "Filter: $FILTER_ORIG (run from a copy; tree $(git -C "$BENCH_TOPDIR" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "Runs: $BENCH_RUNS per measurement, the two contenders alternating; results in $RES_DIR"
bench_nice
echo "Load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

ensure_images
print_images
VSIZE_MIB=$(calc "$(stat -c %s "$RAW_IMG") / 1048576")
start_nginx "$IMG_DIR" "$RUN_DIR/nginx" "$BENCH_NGINX_WORKERS" || die "$NGINX_SKIP"
echo "nginx: $NGINX_URL/TYPE.qcow2 (worker_processes $BENCH_NGINX_WORKERS, sendfile on; its files in $RUN_DIR/nginx)"
echo "Contenders: nbdkit -r --filter=qcow2zstd file TYPE.qcow2 [qcow2-request-size=SIZE]"
echo "            nbdkit -r --filter=qcow2zstd curl $NGINX_URL/TYPE.qcow2 [qcow2-request-size=SIZE]"
echo "Images: $BENCH_HTTP_TYPES; client: nbdcopy --request-size=N URI null: (multi-conn), N in: $BENCH_HTTP_CLIENT_SIZES"

if [ "$BENCH_VERIFY" = 1 ]; then
    echo
    echo "Data check (nbdcopy URI - | md5sum against raw.img, default parameters, outside timing):"
    want=$(cat "$IMG_DIR/raw.md5")
    for type in $BENCH_HTTP_TYPES; do
        for kind in file nginx; do
            serve "$kind" "$type" default
            sum=$(nbdcopy "$SERVER_URI" - | md5sum | cut -d' ' -f1)
            server_alive
            stop_server
            [ "$sum" = "$want" ] || die "$kind, $type: md5 $sum, raw.img has $want"
            printf '  %-6s %-5s md5 %s  OK\n' "$kind" "$type" "$sum"
        done
    done
fi

for type in $BENCH_HTTP_TYPES; do warm_files "$IMG_DIR/$type.qcow2"; done
for rep in $(seq "$BENCH_RUNS"); do
    for type in $BENCH_HTTP_TYPES; do
        for client in $BENCH_HTTP_CLIENT_SIZES; do
            for size in $BENCH_HTTP_SIZES; do
                msg "repetition $rep/$BENCH_RUNS: $type, nbdcopy --request-size=$client, qcow2-request-size=$size"
                measure "$RES_DIR/$type-$client-$size.file" file "$type" "$size" "$client"
                measure "$RES_DIR/$type-$client-$size.nginx" nginx "$type" "$size" "$client"
                if [ -n "$FILTER2" ] && [ "$size" = default ] &&
                   [ "$client" = "${BENCH_HTTP_CLIENT_SIZES%% *}" ]; then
                    FILTER=$FILTER2 measure "$RES_DIR/$type-$client-$size.file2" file "$type" "$size" "$client"
                    FILTER=$FILTER2 measure "$RES_DIR/$type-$client-$size.nginx2" nginx "$type" "$size" "$client"
                fi
            done
        done
    done
done
ranges=$(grep -c ' 206 range=bytes=' "$NGINX_ACCESS_LOG" || true)

echo
printf 'Full read of the %s MiB disk (nbdcopy URI null:), median of %s; nginx served %s range requests\n' \
    "$(fmt 0 "$VSIZE_MIB")" "$BENCH_RUNS" "$ranges"
printf '  %-5s %-8s %-11s %11s %11s %10s   %-26s %s\n' "image" "nbdcopy" "qcow2-" "file MiB/s" \
    "nginx MiB/s" "nginx/file" "CPU s, file: nbdkit" "nginx: nbdkit"
printf '  %-5s %-8s %-11s %11s %11s %10s   %-26s %s\n' "" "requests" "request-size" "" "" "" \
    "+nbdcopy" "+nbdcopy+nginx"
for type in $BENCH_HTTP_TYPES; do
    for client in $BENCH_HTTP_CLIENT_SIZES; do
        for size in $BENCH_HTTP_SIZES; do
            f=$RES_DIR/$type-$client-$size
            wf=$(col_median "$f.file" 1)
            wn=$(col_median "$f.nginx" 1)
            printf '  %-5s %-8s %-11s %11s %11s %10s   %-26s %s\n' "$type" "$client" "$size" \
                "$(fmt 0 "$(calc "$VSIZE_MIB / $wf")")" "$(fmt 0 "$(calc "$VSIZE_MIB / $wn")")" \
                "$(fmt 2 "$(ratio "$wf" "$wn")")" \
                "$(fmt 2 "$(col_median "$f.file" 2)")+$(fmt 2 "$(col_median "$f.file" 3)")" \
                "$(fmt 2 "$(col_median "$f.nginx" 2)")+$(fmt 2 "$(col_median "$f.nginx" 3)")+$(fmt 2 "$(col_median "$f.nginx" 4)")"
        done
    done
done
echo
first_client=${BENCH_HTTP_CLIENT_SIZES%% *}
if [[ " $BENCH_HTTP_SIZES " == *" default "* ]]; then
    for type in $BENCH_HTTP_TYPES; do
        f=$RES_DIR/$type-$first_client-default
        target "$type: nginx / local file, default parameters, nbdcopy $first_client" \
            "$(ratio "$(col_median "$f.file" 1)" "$(col_median "$f.nginx" 1)")" ">=" 0.9
    done
    if [ -n "$FILTER2" ]; then
        echo
        echo "The second build ($FILTER2), the same reads in the same repetitions:"
        for type in $BENCH_HTTP_TYPES; do
            f=$RES_DIR/$type-$first_client-default
            printf '  %-5s file %s MiB/s, nginx %s MiB/s, nginx/file %s; over nginx this build/the second %s, over the file %s\n' \
                "$type" "$(fmt 0 "$(calc "$VSIZE_MIB / $(col_median "$f.file2" 1)")")" \
                "$(fmt 0 "$(calc "$VSIZE_MIB / $(col_median "$f.nginx2" 1)")")" \
                "$(fmt 2 "$(ratio "$(col_median "$f.file2" 1)" "$(col_median "$f.nginx2" 1)")")" \
                "$(fmt 2 "$(ratio "$(col_median "$f.nginx2" 1)" "$(col_median "$f.nginx" 1)")")" \
                "$(fmt 2 "$(ratio "$(col_median "$f.file2" 1)" "$(col_median "$f.file" 1)")")"
        done
    fi
fi

# Random reads through curl: the fetch ahead must cost them nothing.
if [ "$BENCH_HTTP_RANDREAD" != 0 ]; then
    builds=(filter)
    [ -z "$FILTER2" ] || builds=(filter filter2)
    for rep in $(seq "$BENCH_RUNS"); do
        for b in "${builds[@]}"; do
            so=$FILTER
            [ "$b" = filter2 ] && so=$FILTER2
            msg "repetition $rep/$BENCH_RUNS: randread through curl, $b"
            FILTER=$so start_server "randread-$b" curl "$NGINX_URL/zstd.qcow2"
            json=$RUN_DIR/randread-$b.json
            (cd "$RUN_DIR" && exec fio --ioengine=nbd --uri="$SERVER_URI" \
                --time_based --runtime="$BENCH_HTTP_RANDREAD" --ramp_time=2 \
                --randrepeat=1 --norandommap --output-format=json \
                --output="$json" --name=randread --rw=randread --bs=4k \
                --iodepth=16) >>"$RUN_DIR/fio.log" 2>&1 ||
                die "fio failed against $b through curl"
            server_alive
            stop_server
            fio_read_iops "$json" >> "$RES_DIR/randread.$b" ||
                die "no result from fio ($b)"
        done
    done
    echo "zstd image through curl, fio randread 4k QD16 ${BENCH_HTTP_RANDREAD} s, IOPS, median of $BENCH_RUNS:"
    printf '  this filter  %s\n' "$(fmt 0 "$(median < "$RES_DIR/randread.filter")")"
    if [ -n "$FILTER2" ]; then
        printf '  filter (2)   %s  (%s: %s)\n' "$(fmt 0 "$(median < "$RES_DIR/randread.filter2")")" \
            "this/filter (2)" "$(fmt 2 "$(ratio "$(median < "$RES_DIR/randread.filter")" "$(median < "$RES_DIR/randread.filter2")")")"
    fi
    echo
fi
echo "Load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
awk -v n="$NPROC" '{ w += $1; o += $5 } END {
    printf "Other processes during the measurements: %.1f CPU-s over %.1f s, %.0f%% of the machine\n", o, w, 100 * o / (w * n) }' \
    "$RES_DIR"/*.file "$RES_DIR"/*.nginx
