# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash disable=SC2034
# Shared helpers for the qcow2zstd benchmarks (sourced, not run).
#
# Environment knobs (all optional):
#   BENCH_DIR     work dir: cached images, sockets, logs, results
#                 (default /var/tmp/qcow2zstd-bench)
#   BENCH_QUICK   1 = small image (~256 MiB), 3 runs, short fio: a smoke run
#   BENCH_RUNS    repetitions of each measurement (default 5, quick 3)
#   FILTER        the built filter (default: the build tree next to bench/)

[ -z "${_BENCH_COMMON_SOURCED:-}" ] || return 0
_BENCH_COMMON_SOURCED=1

set -euo pipefail
export LC_ALL=C

BENCH_SRCDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BENCH_TOPDIR=$(cd "$BENCH_SRCDIR/.." && pwd)

: "${FILTER:=$BENCH_TOPDIR/filters/qcow2zstd/.libs/nbdkit-qcow2zstd-filter.so}"
: "${BENCH_DIR:=/var/tmp/qcow2zstd-bench}"
: "${BENCH_QUICK:=0}"
if [ "$BENCH_QUICK" = 1 ]; then
    : "${BENCH_RUNS:=3}"
    BENCH_VARIANT=quick
else
    : "${BENCH_RUNS:=5}"
    BENCH_VARIANT=full
fi
# Cached images live per variant so quick and full runs do not evict
# each other.
IMG_DIR=$BENCH_DIR/$BENCH_VARIANT
RAW_IMG=$IMG_DIR/raw.img

CLK_TCK=$(getconf CLK_TCK)
NPROC=$(nproc)

msg () { printf '%s\n' "$*" >&2; }
die () { printf 'bench: error: %s\n' "$*" >&2; exit 1; }

need_cmds ()
{
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || die "'$c' is not installed"
    done
}

# turns REP ITEM...: ORDER is the items turned left REP times, so that
# which contender goes first changes with every repetition.
turns ()
{
    local rep=$1
    shift
    local items=("$@")
    ORDER=("${items[@]:rep % $#}" "${items[@]:0:rep % $#}")
}

# job_cells [KIND]: cells of a table row, no newline: the median of
# $RES_DIR/JOB.KIND for each job of JOBS, or without KIND the jobs'
# names (the header of those cells).
job_cells ()
{
    local job
    for job in "${JOBS[@]}"; do
        if [ $# -eq 0 ]; then
            printf ' %10s' "$job"
        else
            printf ' %10s' "$(fmt 0 "$(median < "$RES_DIR/$job.$1")")"
        fi
    done
}

# rounds: BENCH_RUNS rounds in which every job of JOBS is measured by
# every contender of CONTENDERS (named by LABEL), in turns, each by a
# call of the script's own measure KIND JOB.
rounds ()
{
    local rep job kind
    for rep in $(seq "$BENCH_RUNS"); do
        for job in "${JOBS[@]}"; do
            turns "$rep" "${CONTENDERS[@]}"
            for kind in "${ORDER[@]}"; do
                msg "$job, ${LABEL[$kind]} (run $rep/$BENCH_RUNS)"
                measure "$kind" "$job"
            done
        done
    done
}

# GNU time is what measures the client; install it if missing (we are
# root on the bench machines).
ensure_gnu_time ()
{
    if ! /usr/bin/time -f %e true >/dev/null 2>&1; then
        msg "installing GNU time (apt-get install -y time)"
        apt-get install -y time >/dev/null 2>&1 ||
            { apt-get update >/dev/null 2>&1 && apt-get install -y time >/dev/null 2>&1; } ||
            die "GNU time (/usr/bin/time) is missing and could not be installed"
    fi
}

# Seconds since the epoch with microseconds, without forking.
now () { printf '%s' "$EPOCHREALTIME"; }

# Floating point helpers (awk).  calc 'EXPR' prints the value.
calc () { awk "BEGIN { printf \"%.6f\", $1 }"; }
# fmt PRECISION VALUE; "-" passes through.
fmt ()
{
    if [ "$2" = - ] || [ -z "$2" ]; then printf -- '-'; return; fi
    awk -v p="$1" -v v="$2" 'BEGIN { printf "%.*f", p, v }'
}
# ratio A B: A/B, or "-" when either is missing or B is 0.
ratio ()
{
    if [ "$1" = - ] || [ "$2" = - ] || [ -z "$1" ] || [ -z "$2" ]; then
        printf -- '-'; return
    fi
    awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) printf "-"; else printf "%.6f", a / b }'
}

# median: the median of the numbers on stdin (one per line), "-" if none.
median ()
{
    sort -g | awk '{ v[NR] = $1 }
        END {
            if (NR == 0) { printf "-"; exit }
            if (NR % 2) printf "%.6f", v[(NR + 1) / 2]
            else printf "%.6f", (v[NR / 2] + v[NR / 2 + 1]) / 2
        }'
}

# col_median FILE N: median of whitespace separated column N of FILE.
col_median ()
{
    if [ ! -s "$1" ]; then printf -- '-'; return; fi
    awk -v n="$2" '{ print $n }' "$1" | median
}

# target LABEL VALUE OP LIMIT: print a PASS/MISS line (informational).
target ()
{
    local label=$1 value=$2 op=$3 limit=$4 verdict
    if [ "$value" = - ]; then
        verdict="MISS (no measurement)"
    elif awk -v v="$value" -v l="$limit" -v op="$op" \
            'BEGIN { exit !((op == ">=") ? (v >= l) : (v <= l)) }'; then
        verdict=PASS
    else
        verdict=MISS
    fi
    printf '  target %-52s %7sx  (need %s %s)  %s\n' \
        "$label" "$(fmt 2 "$value")" "$op" "$limit" "$verdict"
    TARGET_SUMMARY+=("$(printf '%-52s %7sx  need %s %-4s %s' \
        "$label" "$(fmt 2 "$value")" "$op" "$limit" "$verdict")")
}
TARGET_SUMMARY=()

# bench_nice: with BENCH_NICE set (not 0), run this shell and all it
# starts at that nice value, and say so.
bench_nice ()
{
    [ "${BENCH_NICE:-0}" != 0 ] || return 0
    renice -n "$BENCH_NICE" -p $$ > /dev/null || die "renice $BENCH_NICE failed"
    echo "Priority: nice $BENCH_NICE for the servers and clients (BENCH_NICE)"
}

# ---------------------------------------------------------------------
# /proc accounting of a server process.

# CPU seconds (user + system, all threads, live and exited) of PID.
proc_cpu ()
{
    # Fields after the ")" of the command name: utime is the 12th, stime
    # the 13th of what follows "pid (comm) ".
    local stat rest
    stat=$(cat "/proc/$1/stat")
    rest=${stat##*) }
    awk -v t="$CLK_TCK" '{ printf "%.2f", ($12 + $13) / t }' <<<"$rest"
}

# Peak resident set size of PID in KiB (VmHWM).
proc_hwm_kb ()
{
    awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"
}

# ---------------------------------------------------------------------
# Whole-machine load, to tell how much other processes (a build, a test
# suite of another session on a shared machine) took during a measurement.

# Busy CPU seconds of the machine so far, all CPUs (user, nice, system,
# irq, softirq, steal from /proc/stat).
sys_busy ()
{
    awk -v t="$CLK_TCK" '/^cpu / { printf "%.2f", ($2 + $3 + $4 + $7 + $8 + $9) / t; exit }' /proc/stat
}

# wait_quiet: wait, up to $BENCH_QUIET_WAIT seconds, for a half second in
# which the machine is less than 10% busy, so that a measurement does not
# start in the middle of someone else's burst.  Counts the timeouts in
# QUIET_TIMEOUTS.  After 3 timeouts in a row the machine is taken to be
# busy for good and only one half-second look is taken until it has been
# idle again.  BENCH_QUIET_WAIT=0 disables.
QUIET_TIMEOUTS=0
QUIET_STREAK=0
wait_quiet ()
{
    local deadline b0 b1 wait=${BENCH_QUIET_WAIT:-0}
    [ "$wait" -gt 0 ] || return 0
    [ "$QUIET_STREAK" -lt 3 ] || wait=0
    deadline=$(( ${EPOCHREALTIME%.*} + wait ))
    while :; do
        b0=$(sys_busy)
        sleep 0.5
        b1=$(sys_busy)
        if awk -v a="$b0" -v b="$b1" -v n="$NPROC" \
                'BEGIN { exit !((b - a) / (0.5 * n) < 0.10) }'; then
            QUIET_STREAK=0
            return 0
        fi
        if [ "${EPOCHREALTIME%.*}" -ge "$deadline" ]; then
            QUIET_TIMEOUTS=$((QUIET_TIMEOUTS + 1))
            QUIET_STREAK=$((QUIET_STREAK + 1))
            return 0
        fi
    done
}

# bg_cpu BUSY0 BUSY1 OWN...: CPU seconds the rest of the machine used
# between two sys_busy samples, given the CPU seconds of our own processes
# (never below 0: the two clocks tick separately).
bg_cpu ()
{
    local b0=$1 b1=$2
    shift 2
    awk -v a="$b0" -v b="$b1" -v own="$*" 'BEGIN {
        n = split(own, o, " "); s = 0
        for (i = 1; i <= n; i++) s += o[i]
        v = b - a - s; if (v < 0) v = 0; printf "%.2f", v }'
}

# ---------------------------------------------------------------------
# Page cache.

# Can we drop the page cache here?  Sets CAN_DROP_CACHES=1/0.
probe_drop_caches ()
{
    CAN_DROP_CACHES=0
    if sync && { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null; then
        CAN_DROP_CACHES=1
    fi
}

drop_caches ()
{
    sync
    echo 3 > /proc/sys/vm/drop_caches
}

# Read files so that they are in the page cache for every contender.
warm_files ()
{
    local f
    for f in "$@"; do
        cat "$f" > /dev/null
    done
}

# fio_read_iops JSON: print the read IOPS of the first job in fio's
# --output-format=json output file JSON; fails on a job error.
fio_read_iops ()
{
    python3 - "$1" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
if job.get("error"):
    sys.exit("fio: error %s" % job["error"])
print("%.1f" % job["read"]["iops"])
EOF
}

# drop_pages FILE...: write the files' dirty pages and drop all their
# pages from the page cache, so that contenders start alike: a file just
# written by qemu-img (its pages fresh in the cache, in large folios)
# took 4 KiB random writes at under a third of the rate it took them at
# once its pages were dropped (36K against 127K IOPS), here.
drop_pages ()
{
    /usr/bin/python3 -c '
import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
' "$@" || die "drop_pages: cannot drop the pages of $*"
}

# ---------------------------------------------------------------------
# Servers.  Each is started in the foreground as a background job of
# this shell, on a Unix socket under $RUN_DIR, so $! is the server itself
# and /proc/$! accounts for it.

SERVER_PID=
SERVER_SOCK=
SERVER_URI=
SERVER_LOG=
_server_pids=()

_bench_cleanup ()
{
    local pid
    for pid in "${_server_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${_server_pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap _bench_cleanup EXIT
trap 'exit 130' INT TERM

# start_server NAME KIND IMAGE [EXTRA...]
#   KIND raw:    nbdkit file IMAGE                      (transport floor)
#        qemu:   qemu-nbd -r -f qcow2 --persistent -e 8 (qemu's qcow2 driver)
#        filter: nbdkit --filter=$FILTER [EXTRA...] file IMAGE
#        curl:   nbdkit -r --filter=$FILTER curl IMAGE [EXTRA...] (IMAGE a URL)
start_server ()
{
    local name=$1 kind=$2 image=$3 i
    shift 3
    SERVER_SOCK=$RUN_DIR/$name.sock
    SERVER_LOG=$RUN_DIR/$name.log
    SERVER_URI="nbd+unix:///?socket=$SERVER_SOCK"
    rm -f "$SERVER_SOCK"
    case $kind in
        raw)
            nbdkit -f -U "$SERVER_SOCK" file "$image" \
                2>>"$SERVER_LOG" </dev/null &
            ;;
        qemu)
            qemu-nbd -r -f qcow2 --persistent -e 8 -k "$SERVER_SOCK" "$image" \
                2>>"$SERVER_LOG" </dev/null &
            ;;
        filter)
            nbdkit -f -U "$SERVER_SOCK" --filter="$FILTER" file "$image" "$@" \
                2>>"$SERVER_LOG" </dev/null &
            ;;
        curl)
            nbdkit -f -r -U "$SERVER_SOCK" --filter="$FILTER" curl "$image" "$@" \
                2>>"$SERVER_LOG" </dev/null &
            ;;
        *) die "start_server: unknown kind $kind" ;;
    esac
    SERVER_PID=$!
    _server_pids+=("$SERVER_PID")
    _await_server "$name" "$kind"
}

# start_command NAME COMMAND...: start any server COMMAND (with SOCK in
# its arguments standing for the socket) as start_server does.
start_command ()
{
    local name=$1 a args=()
    shift
    SERVER_SOCK=$RUN_DIR/$name.sock
    SERVER_LOG=$RUN_DIR/$name.log
    SERVER_URI="nbd+unix:///?socket=$SERVER_SOCK"
    rm -f "$SERVER_SOCK"
    for a in "$@"; do args+=("${a//SOCK/$SERVER_SOCK}"); done
    "${args[@]}" 2>>"$SERVER_LOG" </dev/null &
    SERVER_PID=$!
    _server_pids+=("$SERVER_PID")
    _await_server "$name" "$1"
}

# _await_server NAME KIND: wait for the server just started to answer.
_await_server ()
{
    local name=$1 kind=$2 i
    for i in $(seq 300); do
        if [ -S "$SERVER_SOCK" ] &&
               nbdinfo --size "$SERVER_URI" >/dev/null 2>&1; then
            return 0
        fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            tail -n 20 "$SERVER_LOG" >&2 || true
            die "server $name ($kind) exited at startup; log: $SERVER_LOG"
        fi
        sleep 0.05
    done
    tail -n 20 "$SERVER_LOG" >&2 || true
    die "server $name ($kind) did not come up in 15 s; log: $SERVER_LOG"
}

stop_server ()
{
    local pid=$SERVER_PID i rc=0
    [ -n "$pid" ] || return 0
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid" || rc=$?
        tail -n 20 "$SERVER_LOG" >&2 || true
        die "server (pid $pid) died during the run (status $rc); log: $SERVER_LOG"
    fi
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    local keep=()
    for i in "${_server_pids[@]}"; do
        [ "$i" = "$pid" ] || keep+=("$i")
    done
    _server_pids=("${keep[@]}")
    rm -f "$SERVER_SOCK"
    SERVER_PID=
}

# server_alive: die if the current server has gone (crash during a run).
server_alive ()
{
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        tail -n 20 "$SERVER_LOG" >&2 || true
        die "server (pid $SERVER_PID) crashed; log: $SERVER_LOG"
    fi
}

# multi_conn URI: "yes" or "no" as nbdinfo reports can_multi_conn.
multi_conn ()
{
    if nbdinfo --json "$1" 2>/dev/null |
            grep -q '"can_multi_conn": *true'; then
        echo yes
    else
        echo no
    fi
}
