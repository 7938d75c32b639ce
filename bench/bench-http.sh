#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# HTTP benchmark: a full read of the zstd image of bench/make-image.sh
# through the filter, over nbdkit's curl plugin from nginx (Debian's
# package, started here on 127.0.0.1 with its own configuration, serving
# the image directory with byte ranges), against the same filter over
# nbdkit's file plugin reading the local file, for a few
# qcow2-request-size values and two sizes of the client's requests, in
# one run.  The filter merges clusters into one plugin read only within
# one client request: with nbdcopy's default 256 KiB requests (4
# clusters of 64 KiB) every qcow2-request-size above that reads alike.
#
#   bench/bench-http.sh                 full run (2 GiB image, 5 runs)
#   BENCH_QUICK=1 bench/bench-http.sh   smoke run (256 MiB image, 3 runs)
#
# Knobs (environment), besides those of bench/common.sh:
#   BENCH_HTTP_SIZES="1M 4M 16M"   the qcow2-request-size values
#   BENCH_HTTP_CLIENT_SIZES="256K 4M"
#                              nbdcopy's --request-size values (256K is
#                              its default; 4M lets the filter merge 64
#                              clusters into one HTTP request, and reads
#                              the local file as fast)
#   BENCH_HTTP_DOC_SIZE=16M    the size the man page's curl example uses,
#                              which the target is checked at (with the
#                              largest client request size)
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
# image is read into it first, so both read it from memory, and the
# difference is what HTTP and the curl plugin cost.  Every measurement
# starts a fresh nbdkit; nginx runs for the whole benchmark.  The two
# contenders alternate within each repetition; medians are printed, and
# the ratio nginx/file of the throughputs.  Exits 0 unless something
# broke (a server that died, a failed copy, wrong data).

source "$(dirname "${BASH_SOURCE[0]}")/make-image.sh"
source "$BENCH_TOPDIR/tests/nginx-functions.sh"

: "${BENCH_HTTP_SIZES:=1M 4M 16M}"
: "${BENCH_HTTP_CLIENT_SIZES:=256K 4M}"
: "${BENCH_HTTP_DOC_SIZE:=16M}"
: "${BENCH_NGINX_WORKERS:=1}"
: "${BENCH_VERIFY:=1}"
: "${BENCH_QUIET_WAIT:=10}"
: "${BENCH_NICE:=0}"

need_cmds nbdkit nbdcopy nbdinfo qemu-img md5sum python3 ps numfmt
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

# serve KIND SIZE: the filter with qcow2-request-size=SIZE, read-only,
# over the local file (KIND file) or over curl from nginx (KIND nginx).
serve ()
{
    case $1 in
        file)  start_server "file-$2" filter "$IMG_DIR/zstd.qcow2" -r "qcow2-request-size=$2" ;;
        nginx) start_server "nginx-$2" curl "$NGINX_URL/zstd.qcow2" "qcow2-request-size=$2" ;;
    esac
}

# measure OUT KIND SIZE CLIENT: appends "wall nbdkit_cpu nbdcopy_cpu
# nginx_cpu other_cpu" to OUT, nbdcopy reading in requests of CLIENT.
measure ()
{
    local out=$1 kind=$2 size=$3 client=$4 tfile=$RUN_DIR/nbdcopy.time rc=0
    local t0 t1 c0 c1 n0 n1 b0 b1 cli
    serve "$kind" "$size"
    wait_quiet
    b0=$(sys_busy); c0=$(proc_cpu "$SERVER_PID"); n0=$(nginx_cpu)
    t0=$(now)
    /usr/bin/time -f '%U %S' -o "$tfile" \
        nbdcopy --request-size="$(numfmt --from=iec "$client")" "$SERVER_URI" null: \
        2>> "$RUN_DIR/nbdcopy.log" || rc=$?
    t1=$(now)
    server_alive
    [ "$rc" = 0 ] || { tail -n 5 "$RUN_DIR/nbdcopy.log" >&2; die "nbdcopy --request-size=$client failed (status $rc) against $kind, qcow2-request-size=$size"; }
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
echo "nginx: $NGINX_URL/zstd.qcow2 (worker_processes $BENCH_NGINX_WORKERS, sendfile on; its files in $RUN_DIR/nginx)"
echo "Contenders: nbdkit -r --filter=qcow2zstd file zstd.qcow2 qcow2-request-size=SIZE"
echo "            nbdkit -r --filter=qcow2zstd curl $NGINX_URL/zstd.qcow2 qcow2-request-size=SIZE"
echo "Client: nbdcopy --request-size=N URI null: (multi-conn), N in: $BENCH_HTTP_CLIENT_SIZES"

if [ "$BENCH_VERIFY" = 1 ]; then
    echo
    echo "Data check (nbdcopy URI - | md5sum against raw.img, qcow2-request-size=$BENCH_HTTP_DOC_SIZE, outside timing):"
    want=$(cat "$IMG_DIR/raw.md5")
    for kind in file nginx; do
        serve "$kind" "$BENCH_HTTP_DOC_SIZE"
        sum=$(nbdcopy "$SERVER_URI" - | md5sum | cut -d' ' -f1)
        server_alive
        stop_server
        [ "$sum" = "$want" ] || die "$kind: md5 $sum, raw.img has $want"
        printf '  %-6s md5 %s  OK\n' "$kind" "$sum"
    done
fi

warm_files "$IMG_DIR/zstd.qcow2"
for rep in $(seq "$BENCH_RUNS"); do
    for client in $BENCH_HTTP_CLIENT_SIZES; do
        for size in $BENCH_HTTP_SIZES; do
            msg "repetition $rep/$BENCH_RUNS: nbdcopy --request-size=$client, qcow2-request-size=$size"
            measure "$RES_DIR/$client-$size.file" file "$size" "$client"
            measure "$RES_DIR/$client-$size.nginx" nginx "$size" "$client"
        done
    done
done
ranges=$(grep -c ' 206 range=bytes=' "$NGINX_ACCESS_LOG" || true)

echo
printf 'Full read of the %s MiB disk (nbdcopy URI null:), median of %s; nginx served %s range requests\n' \
    "$(fmt 0 "$VSIZE_MIB")" "$BENCH_RUNS" "$ranges"
printf '  %-8s %-11s %11s %11s %10s   %-26s %s\n' "nbdcopy" "qcow2-" "file MiB/s" "nginx MiB/s" \
    "nginx/file" "CPU s, file: nbdkit" "nginx: nbdkit"
printf '  %-8s %-11s %11s %11s %10s   %-26s %s\n' "requests" "request-size" "" "" "" \
    "+nbdcopy" "+nbdcopy+nginx"
for client in $BENCH_HTTP_CLIENT_SIZES; do
    for size in $BENCH_HTTP_SIZES; do
        f=$RES_DIR/$client-$size
        wf=$(col_median "$f.file" 1)
        wn=$(col_median "$f.nginx" 1)
        printf '  %-8s %-11s %11s %11s %10s   %-26s %s\n' "$client" "$size" \
            "$(fmt 0 "$(calc "$VSIZE_MIB / $wf")")" "$(fmt 0 "$(calc "$VSIZE_MIB / $wn")")" \
            "$(fmt 2 "$(ratio "$wf" "$wn")")" \
            "$(fmt 2 "$(col_median "$f.file" 2)")+$(fmt 2 "$(col_median "$f.file" 3)")" \
            "$(fmt 2 "$(col_median "$f.nginx" 2)")+$(fmt 2 "$(col_median "$f.nginx" 3)")+$(fmt 2 "$(col_median "$f.nginx" 4)")"
    done
done
echo
largest=${BENCH_HTTP_CLIENT_SIZES##* }
if [[ " $BENCH_HTTP_SIZES " == *" $BENCH_HTTP_DOC_SIZE "* ]]; then
    target "nginx / local file, qcow2-request-size=$BENCH_HTTP_DOC_SIZE, nbdcopy $largest" \
        "$(ratio "$(col_median "$RES_DIR/$largest-$BENCH_HTTP_DOC_SIZE.file" 1)" \
                 "$(col_median "$RES_DIR/$largest-$BENCH_HTTP_DOC_SIZE.nginx" 1)")" ">=" 0.9
fi
echo "Load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
awk -v n="$NPROC" '{ w += $1; o += $5 } END {
    printf "Other processes during the measurements: %.1f CPU-s over %.1f s, %.0f%% of the machine\n", o, w, 100 * o / (w * n) }' \
    "$RES_DIR"/*.file "$RES_DIR"/*.nginx
